"""Watching what the agent applied and reporting each job's workload status to the hub.

Owns the status side of the agent: which jobs are tracked (by the work manager,
:mod:`gpufed.agent.work`, once applied; untracked when deleted), the informers over the objects
labelled ``gpufed.io/job-uid`` (one per workload kind the member serves, plus one over pods
with that label; their caches are :mod:`gpufed.agent.status_watch`), and a sender that
summarises each changed job with :func:`gpufed.sync.status.summarize_workload` and sends the
summary only when it differs from the last one sent; after every reconnect all tracked
statuses are sent again. The summary carries the job's reported checkpoint time (the
``gpufed.io/last-checkpoint`` annotation of its main object or pods,
:func:`gpufed.sync.status.last_checkpoint`); a value that is not RFC 3339 or lies in the future
is left out with one ``status.checkpoint_refused`` log line per new value.

The member's last word counts: when a tracked job's main object is deleted in the member (its
TTL controller after ``ttlSecondsAfterFinished``, a cleanup policy, an admin) and its final
state — the object a watch's ``DELETED`` event carries, or the cached copy when a re-list shows
it gone — is terminal (:func:`gpufed.sync.status.terminal_phase`), that final state and the
pods cached at that moment keep being summarised: Succeeded stays Succeeded, Failed stays
Failed with its reason, also after the work manager finds the object gone (``missing``). Only a
copy that vanished before it finished is ``Missing``. The final state lives in this process's
memory; an agent restarted after the deletion never saw it and reports ``Missing``.

A not-Ready node or a GPU drop under a running job is first a suspicion, for the job's grace
period, and only then a failure cause (:mod:`gpufed.agent.status_trouble`); the job is
re-summarised when the grace period ends (:meth:`StatusReporter.recheck`, driven by
:meth:`run`), with the wall clock ``wall``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import structlog

from gpufed.agent.informer import Informer
from gpufed.agent.kube import MemberApi
from gpufed.agent.metrics import AgentMetrics
from gpufed.agent.status_trouble import NodeTrouble, failure_of, suspicion_issues
from gpufed.agent.status_watch import (
    PINNED,
    FinalState,
    ObjectEvents,
    ObjKey,
    PodEvents,
    attempt_of,
    job_uid_of,
    ref_key,
)
from gpufed.api.labels import JOB_UID_LABEL, LAST_CHECKPOINT_ANNOTATION
from gpufed.api.work import WorkloadStatus
from gpufed.sync.apply import ObjectRef
from gpufed.sync.computedomain import domain_condition
from gpufed.sync.failure import DEFAULT_NODE_GRACE_S, NodeHealth, suspicion_conditions
from gpufed.sync.status import last_checkpoint, summarize_workload, terminal_phase

log = structlog.get_logger("gpufed.agent.status")


@dataclass
class _Tracked:
    revision: int
    main: ObjectRef | None
    missing: bool
    seen: bool = False  # the main object was observed at least once
    refused: tuple[tuple[str, str, str], ...] = ()  # checkpoint values last logged as refused
    attempt: str = ""  # gpufed.io/attempt of the copy's pods ("": any)
    trouble: NodeTrouble = field(default_factory=NodeTrouble)  # its nodes' suspicions, cause


class StatusReporter:
    """Summarises tracked jobs and sends their :class:`WorkloadStatus` on change.

    ``send`` returns True when the status went out on a live stream (else it is sent again
    after the next reconnect). ``coalesce_s``: changes within this window go out together.
    ``wall``: the wall clock (seconds since the epoch) a checkpoint time is checked against.
    ``node_health``: a node's Ready and whole GPUs by name (None: unknown node), from the
    inventory; with it a job whose node is lost is reported with an infrastructure
    :attr:`WorkloadStatus.failure` (:mod:`gpufed.sync.failure`), and one whose node is not
    Ready or withdrew a GPU too once the job's grace period has passed (module docstring);
    call :meth:`node_changed` when a node changes. ``node_of_hostname``: the node carrying a
    ``kubernetes.io/hostname`` label value (None: none), from the inventory, to judge a failed
    copy pinned to several nodes by hostname whose pods are gone (rule 4a of
    :mod:`gpufed.sync.failure`).
    """

    def __init__(
        self,
        api: MemberApi,
        *,
        send: Callable[[WorkloadStatus], bool],
        coalesce_s: float = 0.1,
        metrics: AgentMetrics | None = None,
        wall: Callable[[], float] = time.time,
        node_health: Callable[[str], NodeHealth | None] | None = None,
        node_of_hostname: Callable[[str], str | None] | None = None,
    ) -> None:
        self.api = api
        self._wall = wall
        self._node_health = node_health
        self._node_of_hostname = node_of_hostname
        self._send = send
        self.coalesce_s = coalesce_s
        self._metrics = metrics
        self._tracked: dict[str, _Tracked] = {}
        self._objects: dict[ObjKey, dict[str, Any]] = {}
        # job UID -> key of its ComputeDomain in _objects (a job has at most one)
        self._domains: dict[str, ObjKey] = {}
        self._pods: dict[str, dict[str, dict[str, Any]]] = {}
        self._last: dict[str, WorkloadStatus] = {}
        self._final: dict[str, FinalState] = {}  # job uid -> its finished, deleted main object
        self._dirty: set[str] = set()
        self._wake = asyncio.Event()
        self._informers: dict[str, Informer] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._crashed: BaseException | None = None

    # --- tracking (called by the work manager) -------------------------------------------------

    def track(
        self,
        job_uid: str,
        *,
        revision: int,
        main: ObjectRef | None,
        missing: bool = False,
        attempt: str = "",
        node_grace_s: float = DEFAULT_NODE_GRACE_S,
    ) -> None:
        """Report ``job_uid``'s workload ``main`` (at ``revision``). ``attempt``: the
        ``gpufed.io/attempt`` of its pod templates; pods of another attempt (a previous copy's,
        still terminating on a lost node) are left out of its status ("": every pod counts).
        ``node_grace_s``: seconds a not-Ready node or a GPU drop under it is only a suspicion
        (the job's ``nodeNotReadySeconds``, :func:`gpufed.sync.manifests.node_not_ready_of`)."""
        prev = self._tracked.get(job_uid)
        same = bool(prev and prev.main == main and not missing and prev.attempt == attempt)
        seen = bool(prev and prev.seen and same)
        final = self._final.get(job_uid)
        if final is not None and (main is None or ref_key(main) != final.key):
            del self._final[job_uid]  # another main object: that copy's last word is not its
            final = None
        self._tracked[job_uid] = _Tracked(
            revision=revision,
            main=main,
            missing=missing,
            seen=seen,
            attempt=attempt,
            trouble=NodeTrouble(grace_s=node_grace_s),
        )
        # The same copy (or the finished one the work manager now finds gone): what it
        # suffered still holds.
        if prev is not None and (same or final is not None):
            self._tracked[job_uid].trouble = prev.trouble.carried(node_grace_s)
        self._mark(job_uid)

    def untrack(self, job_uid: str) -> None:
        self._tracked.pop(job_uid, None)
        self._last.pop(job_uid, None)
        self._final.pop(job_uid, None)

    def keep_only(self, job_uids: set[str]) -> None:
        """Forget tracked jobs outside ``job_uids`` (after a desired set)."""
        for uid in [u for u in self._tracked if u not in job_uids]:
            self.untrack(uid)

    def resend_all(self) -> None:
        """After a reconnect: every tracked status is sent again."""
        self._last.clear()
        for uid in self._tracked:
            self._mark(uid)

    def node_changed(self, node: str) -> None:
        """A Node changed or was deleted: re-summarise the tracked jobs with pods on it."""
        for uid, pods in self._pods.items():
            if uid in self._tracked and any(
                (p.get("spec") or {}).get("nodeName") == node for p in pods.values()
            ):
                self._mark(uid)

    def recheck(self) -> None:
        """Re-summarise the tracked jobs whose earliest suspicion's grace period has ended by
        now (``wall``): a node still not Ready then fails the job. :meth:`run` calls it."""
        now = self._wall()
        for uid, tracked in self._tracked.items():
            due = tracked.trouble.recheck_at
            if due is not None and due <= now:
                tracked.trouble.recheck_at = None
                self._mark(uid)

    def _until_recheck(self) -> float | None:
        """Seconds until the earliest grace period of a tracked job ends (None: none runs)."""
        due = [
            t.trouble.recheck_at for t in self._tracked.values() if t.trouble.recheck_at is not None
        ]
        return max(0.0, min(due) - self._wall()) if due else None

    def set_send(self, send: Callable[[WorkloadStatus], bool]) -> None:
        self._send = send

    def current(self, job_uid: str) -> WorkloadStatus | None:
        """The summary of a tracked job now (None when untracked or not observed yet)."""
        tracked = self._tracked.get(job_uid)
        if tracked is None:
            return None
        return self._summarize(job_uid, tracked)

    # --- informers -----------------------------------------------------------------------------

    async def watch_kinds(self, kinds: Iterable[str]) -> None:
        """Start informers for the served workload kinds not watched yet (and for pods)."""
        if "Pod" not in self._informers:
            self._start(
                "Pod",
                Informer(
                    self.api,
                    "/api/v1/pods",
                    PodEvents(self),
                    name="status-pods",
                    label_selector=JOB_UID_LABEL,
                    on_event=self._metrics.watch_event if self._metrics else None,
                ),
            )
        for kind in kinds:
            if kind in self._informers:
                continue
            info = await self.api.resource_for_kind_group(kind)
            if info is None:
                continue
            self._start(
                kind,
                Informer(
                    self.api,
                    info.collection_path(),
                    ObjectEvents(self, kind),
                    name=f"status-{kind}",
                    label_selector=JOB_UID_LABEL,
                    on_event=self._metrics.watch_event if self._metrics else None,
                ),
            )

    def _start(self, key: str, informer: Informer) -> None:
        self._informers[key] = informer
        task = asyncio.create_task(informer.run(), name=f"informer:{informer.name}")
        task.add_done_callback(self._informer_done)
        self._tasks.append(task)

    def _informer_done(self, task: asyncio.Task[None]) -> None:
        # Informers only end on cancellation; anything else is a bug that must not leave the
        # statuses silently stale: run() re-raises it (the agent then exits and restarts).
        if not task.cancelled() and task.exception() is not None:
            self._crashed = task.exception()
            self._wake.set()

    async def synced(self) -> None:
        """Wait until every started informer has listed once."""
        await asyncio.gather(*(i.synced.wait() for i in self._informers.values()))

    async def run(self) -> None:
        """Send changed statuses until cancelled (informers are cancelled with it)."""
        try:
            while True:
                # Wake on a change, or when a grace period ends (recheck() marks its job).
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self._until_recheck())
                if self._crashed is not None:
                    raise self._crashed
                self.recheck()
                if not self._wake.is_set():
                    continue
                await asyncio.sleep(self.coalesce_s)
                self._wake.clear()
                self.flush()
        finally:
            for t in self._tasks:
                t.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def flush(self) -> None:
        """Summarise dirty tracked jobs and send those that changed."""
        dirty, self._dirty = self._dirty, set()
        for uid in sorted(dirty):
            tracked = self._tracked.get(uid)
            if tracked is None:
                continue
            status = self._summarize(uid, tracked)
            if status is None or self._last.get(uid) == status:
                continue
            if self._send(status):
                self._last[uid] = status
                if self._metrics is not None:
                    self._metrics.status_sent.inc()
                log.info(
                    "status.sent",
                    job_uid=uid,
                    phase=status.phase,
                    active=status.active,
                    succeeded=status.succeeded,
                    failed=status.failed,
                )

    def _gone(self, key: ObjKey, final: dict[str, Any]) -> None:
        """The object ``key`` was deleted in the member, ``final`` its last known state: kept
        as the job's last word when it is the main object of a tracked job and finished."""
        uid = job_uid_of(final)
        tracked = self._tracked.get(uid)
        if (
            tracked is not None
            and tracked.main is not None
            and ref_key(tracked.main) == key
            and terminal_phase(key[0], final) is not None
        ):
            pods = tuple(self._pods.get(uid, {}).values())
            if tracked.attempt:
                pods = tuple(p for p in pods if attempt_of(p) in ("", tracked.attempt))
            meta = {k: v for k, v in (final.get("metadata") or {}).items() if k != "managedFields"}
            self._final[uid] = FinalState(
                key=key, obj={"metadata": meta, "status": final.get("status") or {}}, pods=pods
            )
            log.info("status.deleted_after_finishing", job_uid=uid, object="/".join(key))
        self._mark(uid)

    def _revived(self, key: ObjKey, uid: str) -> None:
        """The object ``key`` exists (again): what it is now counts, not a deleted copy's state."""
        final = self._final.get(uid)
        if final is not None and final.key == key:
            del self._final[uid]

    def _mark(self, uid: str) -> None:
        if uid and uid in self._tracked:
            self._dirty.add(uid)
            self._wake.set()

    def _summarize(self, uid: str, tracked: _Tracked) -> WorkloadStatus | None:
        main = tracked.main
        kind = main.kind_group if main else ""
        name = main.name if main else ""
        obj = self._objects.get((kind, main.namespace, main.name)) if main else None
        pods: Iterable[dict[str, Any]] = self._pods.get(uid, {}).values()
        final = self._final.get(uid)
        if obj is None and final is not None and main is not None and final.key == ref_key(main):
            # Deleted after it finished: the member's last word, not Missing (module doc).
            obj, pods = final.obj, final.pods
        elif tracked.attempt:
            pods = [p for p in pods if attempt_of(p) in ("", tracked.attempt)]
        if obj is not None:
            tracked.seen = True
        # Gone once seen, or found gone by the work manager: Missing unless the last state we
        # hold of it (the watch may not have delivered the DELETED yet) is terminal.
        missing = (obj is None and tracked.seen) or (
            tracked.missing and terminal_phase(kind, obj) is None
        )
        if (
            obj is None
            and not missing
            and main is not None
            and kind in {k for k in self._informers if k != "Pod"}
        ):
            return None  # applied, not observed yet: wait for the watch
        pod_informer = self._informers.get("Pod")
        if pod_informer is not None and not pod_informer.synced.is_set():
            # Pods not listed yet: "no pod left" would be a guess, and a cause sticks.
            return None
        status = summarize_workload(
            job_uid=uid,
            revision=tracked.revision,
            kind=kind,
            name=name,
            obj=obj,
            pods=pods,
            missing=missing,
        )
        if missing:
            return status
        failure = failure_of(
            uid,
            tracked.trouble,
            status,
            pods,
            self._node_health,
            self._wall,
            pins=(obj or {}).get(PINNED),
            node_of_hostname=self._node_of_hostname,
        )
        if failure is not None:
            status = status.model_copy(update={"failure": failure})
        elif tracked.trouble.suspected:
            status = status.model_copy(
                update={
                    "pod_issues": (
                        *suspicion_issues(tracked.trouble.suspected, pods),
                        *status.pod_issues,
                    ),
                    "conditions": (
                        *status.conditions,
                        *suspicion_conditions(tracked.trouble.suspected),
                    ),
                }
            )
        domain = self._domain_of(uid)
        if domain is not None:  # the job's ComputeDomain (gpufed.sync.computedomain)
            status = status.model_copy(
                update={"conditions": (*status.conditions, domain_condition(domain))}
            )
        checkpoint = last_checkpoint(obj, pods, now=self._wall())
        if checkpoint.refused != tracked.refused:
            tracked.refused = checkpoint.refused
            for where, value, why in checkpoint.refused:
                log.warning(
                    "status.checkpoint_refused",
                    job_uid=uid,
                    source=where,
                    value=value,
                    reason=why,
                    annotation=LAST_CHECKPOINT_ANNOTATION,
                )
        if not checkpoint.time:
            return status
        return status.model_copy(update={"last_checkpoint_time": checkpoint.time})

    def _domain_of(self, uid: str) -> dict[str, Any] | None:
        """The cached ComputeDomain of job ``uid`` (None when it has none or it is not seen)."""
        key = self._domains.get(uid)
        return self._objects.get(key) if key is not None else None
