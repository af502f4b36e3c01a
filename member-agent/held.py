"""Held jobs: the agent's guard on garbage collection across hub state epochs.

The hub's etcd state has an identity, its **epoch** (the Welcome's ``hub_epoch``; a hub that
lost its etcd state, or was restored from an old backup, has another one). The agent stamps
the epoch on every object it applies (annotation ``gpufed.io/hub-epoch``, :func:`stamp`), and
its full reconcile (:mod:`gpufed.agent.work`) asks :class:`EpochGuard` before it deletes the
objects of a job the hub's desired set leaves out:

- objects all applied under the **current** epoch: the hub that placed them no longer wants
  them (a fenced copy, a job deleted while the agent was away): delete at once, as before;
- objects of **another or no** epoch: the desired set comes from a hub state that may simply
  not know them (lost or restored etcd). The job is **held**: kept, reported in the next Hello
  (:func:`held_jobs`) so that the hub can claim it, and evicted only once it stayed unclaimed
  for the eviction grace period (``--eviction-grace-period``, default 60 min; Open Cluster
  Management's work agent guards AppliedManifestWork eviction the same way). A desired set or
  work item that names the job claims it: the apply adopts the objects (server-side applied
  kinds take the new epoch; a create-only batch Job is never patched, so the claim is also
  remembered here, for this process and epoch).

Explicit Delete work items never ask the guard: a GPUJob deleted on the hub is deleted at once.
The held-since times live in memory (monotonic clock): an agent restart starts the grace period
again, which only delays an eviction. Docs: docs/agent.md, docs/design.md §7 item 7.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import structlog

from gpufed.api.bounds import MAX_HELD_JOBS
from gpufed.api.labels import HUB_EPOCH_ANNOTATION
from gpufed.api.stream import HeldJob
from gpufed.sync.apply import ref_of
from gpufed.sync.manifests import WORKLOAD_KINDS
from gpufed.sync.ownership import job_uid_of

log = structlog.get_logger("gpufed.agent.held")

#: The default eviction grace period (seconds): how long objects of another hub state epoch
#: stay after a desired set left them out.
DEFAULT_EVICTION_GRACE_S = 3600.0


def epoch_of(obj: Mapping[str, Any]) -> str:
    """The ``gpufed.io/hub-epoch`` annotation of a member object ("" when absent)."""
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    return str(annotations.get(HUB_EPOCH_ANNOTATION, ""))


def stamp(obj: Mapping[str, Any], epoch: str) -> dict[str, Any]:
    """A copy of manifest ``obj`` carrying ``epoch`` as its ``gpufed.io/hub-epoch`` annotation
    (unchanged when ``epoch`` is "": a hub without epochs)."""
    out = copy.deepcopy(dict(obj))
    if epoch:
        meta = out.setdefault("metadata", {})
        meta["annotations"] = {**(meta.get("annotations") or {}), HUB_EPOCH_ANNOTATION: epoch}
    return out


def held_jobs(objects: Iterable[Mapping[str, Any]]) -> list[HeldJob]:
    """What a Hello reports: one :class:`HeldJob` per job UID among ``objects`` (labelled
    objects of this origin), by UID, at most :data:`MAX_HELD_JOBS`. ``hub_epoch`` is the
    epoch all its objects share ("" when they differ); the main workload is its first
    workload-kind object by name."""
    by_job: dict[str, list[Mapping[str, Any]]] = {}
    for obj in objects:
        uid = job_uid_of(obj)
        if uid:
            by_job.setdefault(uid, []).append(obj)
    out = []
    for uid in sorted(by_job)[:MAX_HELD_JOBS]:
        objs = by_job[uid]
        epochs = {epoch_of(o) for o in objs}
        refs = sorted((ref_of(o) for o in objs), key=str)
        main = next((r for r in refs if r.kind_group in WORKLOAD_KINDS), None)
        out.append(
            HeldJob(
                job_uid=uid,
                hub_epoch=epochs.pop() if len(epochs) == 1 else "",
                kind=main.kind_group if main else "",
                name=main.name if main else "",
                namespace=refs[0].namespace if refs else "",
            )
        )
    if len(by_job) > MAX_HELD_JOBS:
        log.warning("work.held.truncated", jobs=len(by_job), reported=MAX_HELD_JOBS)
    return out


class EpochGuard:
    """The current hub epoch and the jobs held since a desired set left them out.

    ``grace_s``: the eviction grace period (seconds, >= 0); ``clock``: monotonic seconds
    (tests pass a fake one).
    """

    def __init__(
        self, grace_s: float = DEFAULT_EVICTION_GRACE_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if grace_s < 0:
            raise ValueError(f"eviction grace period {grace_s} s: must be >= 0")
        self.grace_s = grace_s
        self._clock = clock
        self.epoch = ""
        #: job uid -> monotonic seconds when a desired set first left it out
        self._held_since: dict[str, float] = {}
        #: jobs the hub of the current epoch named (desired set or work item), in this process:
        #: a create-only object it adopted keeps its old annotation (it is never patched)
        self._claimed: set[str] = set()

    def welcome(self, epoch: str) -> bool:
        """A hub welcomed this agent with ``epoch``; True when it differs from the last one seen
        by this process (work revisions of the old epoch then compare with nothing)."""
        changed = bool(self.epoch) and epoch != self.epoch
        if changed:
            log.warning("work.hub_epoch.changed", previous=self.epoch, epoch=epoch)
            self._claimed.clear()
        self.epoch = epoch
        return changed

    def may_delete(self, uid: str, objects: Iterable[Mapping[str, Any]]) -> bool:
        """Whether the undesired objects of job ``uid`` may be deleted now: all applied under the
        current epoch (or claimed by this epoch's hub in this process), or held for the whole
        grace period. Otherwise the job is (still) held."""
        epochs = {epoch_of(o) for o in objects}
        if epochs == {self.epoch} or uid in self._claimed:
            self._held_since.pop(uid, None)
            return True
        since = self._held_since.setdefault(uid, self._clock())
        if self._clock() - since < self.grace_s:
            return False
        del self._held_since[uid]
        log.warning("work.held.evicted", job_uid=uid, epochs=sorted(epochs), grace_s=self.grace_s)
        return True

    def left_s(self, uid: str) -> float:
        """Seconds until held job ``uid`` may be evicted (0 when it is not held)."""
        since = self._held_since.get(uid)
        return 0.0 if since is None else max(0.0, since + self.grace_s - self._clock())

    def claimed(self, uid: str) -> None:
        """The hub named job ``uid`` again (desired set or work item): it is not held."""
        self._held_since.pop(uid, None)
        self._claimed.add(uid)

    def keep_only(self, uids: Iterable[str]) -> None:
        """Forget held jobs whose objects are gone."""
        keep = set(uids)
        for uid in [u for u in self._held_since if u not in keep]:
            del self._held_since[uid]

    def present(self, uids: Iterable[str]) -> None:
        """Forget the claims of jobs that have no objects in the member any more."""
        self._claimed &= set(uids)

    @property
    def held(self) -> list[str]:
        """Job uids held now."""
        return sorted(self._held_since)
