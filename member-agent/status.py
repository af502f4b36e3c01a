"""Watching what the agent applied and reporting each job's workload status to the hub.

Owns the status side of the agent: informers over the objects labelled ``gpufed.io/job-uid``
(one per workload kind the member serves, plus one over pods with that label), small caches of
their status, and a sender that summarises each changed job with
:func:`gpufed.sync.status.summarize_workload` and sends the summary only when it differs from
the last one sent. The summary carries the job's reported checkpoint time (the
``gpufed.io/last-checkpoint`` annotation of its main object or pods,
:func:`gpufed.sync.status.last_checkpoint`); a value that is not RFC 3339 or lies in the future
is left out with one ``status.checkpoint_refused`` log line per new value. Jobs are tracked by the work manager (:mod:`gpufed.agent.work`) once applied
and untracked when deleted; after every reconnect all tracked statuses are sent again.

The member's last word counts: when a tracked job's main object is deleted in the member (its
TTL controller after ``ttlSecondsAfterFinished``, a cleanup policy, an admin) and its final
state — the object a watch's ``DELETED`` event carries, or the cached copy when a re-list shows
it gone — is terminal (:func:`gpufed.sync.status.terminal_phase`), that final state and the
pods cached at that moment keep being summarised: Succeeded stays Succeeded, Failed stays
Failed with its reason, also after the work manager finds the object gone (``missing``). Only a
copy that vanished before it finished is ``Missing``. The final state lives in this process's
memory; an agent restarted after the deletion never saw it and reports ``Missing``.

A not-Ready node or a GPU drop under a running job is first a suspicion, for the job's grace
period (``spec.placement.retry.nodeNotReadySeconds``, from the work item; default 300 s, as
Kubernetes' own not-ready tolerations), timed with the wall clock ``wall``: since the Ready
condition's ``lastTransitionTime`` (else since the agent first saw it), since the agent first
saw the GPU drop. While it lasts, the status carries it as a pod issue (reason
``NodeNotReady`` or ``GPUUnavailable``, the node and since when); the job is re-summarised
when the grace period ends (:meth:`StatusReporter.recheck`, driven by :meth:`run`), and only
then, if the trouble persists, does it get a failure cause (which sticks). A node that
recovers in time leaves nothing behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import structlog

from gpufed.agent.informer import Informer
from gpufed.agent.kube import MemberApi
from gpufed.agent.metrics import AgentMetrics
from gpufed.api.labels import (
    ATTEMPT_ANNOTATION,
    COMPUTE_DOMAIN_KIND,
    JOB_UID_LABEL,
    LAST_CHECKPOINT_ANNOTATION,
)
from gpufed.api.work import FailureCause, PodIssue, WorkloadStatus
from gpufed.sync.apply import ObjectRef
from gpufed.sync.computedomain import domain_condition
from gpufed.sync.failure import (
    DEFAULT_NODE_GRACE_S,
    NodeHealth,
    Suspicion,
    classify_failure,
    pinned_nodes,
    suspicion_conditions,
    suspicions,
)
from gpufed.sync.status import last_checkpoint, summarize_workload, terminal_phase

log = structlog.get_logger("gpufed.agent.status")

_ObjKey = tuple[str, str, str]  # (Kind.group, namespace, name)


@dataclass
class _Tracked:
    revision: int
    main: ObjectRef | None
    missing: bool
    seen: bool = False  # the main object was observed at least once
    refused: tuple[tuple[str, str, str], ...] = ()  # checkpoint values last logged as refused
    # The first failure cause observed: it sticks (pods of a broken gang are deleted and
    # replaced afterwards; the cause must not vanish with them).
    failure: FailureCause | None = None
    gpus_seen: dict[str, int] = field(default_factory=dict)  # node -> most GPUs while bound
    attempt: str = ""  # gpufed.io/attempt of the copy's pods ("": any)
    grace_s: float = DEFAULT_NODE_GRACE_S  # spec.placement.retry.nodeNotReadySeconds
    # When the agent first saw a node not Ready (used when its Ready condition has no
    # lastTransitionTime) or offering fewer GPUs than gpus_seen; dropped when it recovers.
    not_ready_seen: dict[str, float] = field(default_factory=dict)
    gpus_dropped_since: dict[str, float] = field(default_factory=dict)
    suspected: tuple[Suspicion, ...] = ()  # within the grace period, as last classified
    recheck_at: float | None = None  # wall time the earliest suspicion's grace period ends


@dataclass(frozen=True)
class _Final:
    """The last state of a tracked job's deleted main object, when it had finished."""

    key: _ObjKey
    obj: dict[str, Any]
    pods: tuple[dict[str, Any], ...]  # the job's pods (of its attempt) cached at the deletion


def _ref_key(ref: ObjectRef) -> _ObjKey:
    return (ref.kind_group, ref.namespace, ref.name)


def _job_uid(obj: dict[str, Any]) -> str:
    return str(((obj.get("metadata") or {}).get("labels") or {}).get(JOB_UID_LABEL, ""))


def _attempt(pod: dict[str, Any]) -> str:
    return str(((pod.get("metadata") or {}).get("annotations") or {}).get(ATTEMPT_ANNOTATION, ""))


def _trim_pod(raw: dict[str, Any]) -> dict[str, Any]:
    meta = raw.get("metadata") or {}
    status = raw.get("status") or {}
    keep_status = {
        k: status[k]
        for k in (
            "phase",
            "reason",
            "message",
            "startTime",
            "conditions",
            "containerStatuses",
            "initContainerStatuses",
        )
        if k in status
    }
    raw_annotations = meta.get("annotations") or {}
    checkpoint = raw_annotations.get(LAST_CHECKPOINT_ANNOTATION)
    kept = {} if checkpoint is None else {LAST_CHECKPOINT_ANNOTATION: checkpoint}
    if ATTEMPT_ANNOTATION in raw_annotations:
        kept[ATTEMPT_ANNOTATION] = raw_annotations[ATTEMPT_ANNOTATION]
    return {
        "metadata": {
            "name": meta.get("name"),
            "namespace": meta.get("namespace"),
            "deletionTimestamp": meta.get("deletionTimestamp"),
            "annotations": kept,
        },
        "spec": {"nodeName": (raw.get("spec") or {}).get("nodeName")},
        "status": keep_status,
    }


class _ObjectEvents:
    """Informer handler for one workload kind."""

    def __init__(self, reporter: StatusReporter, kind_group: str) -> None:
        self.r = reporter
        self.kind = kind_group
        self._relist: set[_ObjKey] | None = None

    def _key(self, obj: dict[str, Any]) -> _ObjKey:
        meta = obj.get("metadata") or {}
        return (self.kind, str(meta.get("namespace", "")), str(meta.get("name", "")))

    def begin_relist(self) -> None:
        self._relist = set()

    def upsert(self, obj: dict[str, Any]) -> None:
        key = self._key(obj)
        if self._relist is not None:
            self._relist.add(key)
        self.r._revived(key, _job_uid(obj))
        self.r._objects[key] = {
            "metadata": obj.get("metadata") or {},
            "status": obj.get("status") or {},
        }
        self.r._objects[key]["metadata"].pop("managedFields", None)
        if self.kind == COMPUTE_DOMAIN_KIND:
            self.r._domains[_job_uid(obj)] = key
        self.r._mark(_job_uid(obj))

    def delete(self, obj: dict[str, Any]) -> None:
        key = self._key(obj)
        cached = self.r._objects.pop(key, None)
        if self.kind == COMPUTE_DOMAIN_KIND:
            self.r._domains.pop(_job_uid(obj), None)
        # The DELETED event carries the object's final state; the cache is older.
        final = obj if obj.get("status") or cached is None else cached
        self.r._gone(key, final)

    def end_relist(self) -> None:
        seen, self._relist = self._relist or set(), None
        for key in [k for k in self.r._objects if k[0] == self.kind and k not in seen]:
            # Deleted while unwatched: the last cached state is the last word we have.
            gone = self.r._objects.pop(key)
            if self.kind == COMPUTE_DOMAIN_KIND:
                self.r._domains.pop(_job_uid(gone), None)
            self.r._gone(key, gone)


class _PodEvents:
    """Informer handler for the pods labelled with a job UID."""

    def __init__(self, reporter: StatusReporter) -> None:
        self.r = reporter
        self._relist: set[tuple[str, str]] | None = None

    def begin_relist(self) -> None:
        self._relist = set()

    def upsert(self, obj: dict[str, Any]) -> None:
        uid = _job_uid(obj)
        meta = obj.get("metadata") or {}
        key = f"{meta.get('namespace')}/{meta.get('name')}"
        if self._relist is not None:
            self._relist.add((uid, key))
        self.r._pods.setdefault(uid, {})[key] = _trim_pod(obj)
        self.r._mark(uid)

    def delete(self, obj: dict[str, Any]) -> None:
        uid = _job_uid(obj)
        meta = obj.get("metadata") or {}
        pods = self.r._pods.get(uid)
        if pods is not None:
            pods.pop(f"{meta.get('namespace')}/{meta.get('name')}", None)
            if not pods:
                del self.r._pods[uid]
        self.r._mark(uid)

    def end_relist(self) -> None:
        seen, self._relist = self._relist or set(), None
        for uid in list(self.r._pods):
            pods = self.r._pods[uid]
            for key in [k for k in pods if (uid, k) not in seen]:
                del pods[key]
                self.r._mark(uid)
            if not pods:
                del self.r._pods[uid]


class StatusReporter:
    """Summarises tracked jobs and sends their :class:`WorkloadStatus` on change.

    ``send`` returns True when the status went out on a live stream (else it is sent again
    after the next reconnect). ``coalesce_s``: changes within this window go out together.
    ``wall``: the wall clock (seconds since the epoch) a checkpoint time is checked against.
    ``node_health``: a node's Ready and whole GPUs by name (None: unknown node), from the
    inventory; with it a job whose node is lost is reported with an infrastructure
    :attr:`WorkloadStatus.failure` (:mod:`gpufed.sync.failure`), and one whose node is not
    Ready or withdrew a GPU too once the job's grace period has passed (module docstring);
    call :meth:`node_changed` when a node changes.
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
    ) -> None:
        self.api = api
        self._wall = wall
        self._node_health = node_health
        self._send = send
        self.coalesce_s = coalesce_s
        self._metrics = metrics
        self._tracked: dict[str, _Tracked] = {}
        self._objects: dict[_ObjKey, dict[str, Any]] = {}
        # job UID -> key of its ComputeDomain in _objects (a job has at most one)
        self._domains: dict[str, _ObjKey] = {}
        self._pods: dict[str, dict[str, dict[str, Any]]] = {}
        self._last: dict[str, WorkloadStatus] = {}
        self._final: dict[str, _Final] = {}  # job uid -> its finished, deleted main object
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
        if final is not None and (main is None or _ref_key(main) != final.key):
            del self._final[job_uid]  # another main object: that copy's last word is not its
            final = None
        self._tracked[job_uid] = _Tracked(
            revision=revision,
            main=main,
            missing=missing,
            seen=seen,
            attempt=attempt,
            grace_s=node_grace_s,
        )
        # The same copy (or the finished one the work manager now finds gone): what it
        # suffered still holds.
        if prev is not None and (same or final is not None):
            self._tracked[job_uid].failure = prev.failure
            self._tracked[job_uid].gpus_seen = prev.gpus_seen
            self._tracked[job_uid].not_ready_seen = prev.not_ready_seen
            self._tracked[job_uid].gpus_dropped_since = prev.gpus_dropped_since
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
            if tracked.recheck_at is not None and tracked.recheck_at <= now:
                tracked.recheck_at = None
                self._mark(uid)

    def _until_recheck(self) -> float | None:
        """Seconds until the earliest grace period of a tracked job ends (None: none runs)."""
        due = [t.recheck_at for t in self._tracked.values() if t.recheck_at is not None]
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
                    _PodEvents(self),
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
                    _ObjectEvents(self, kind),
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

    def _gone(self, key: _ObjKey, final: dict[str, Any]) -> None:
        """The object ``key`` was deleted in the member, ``final`` its last known state: kept
        as the job's last word when it is the main object of a tracked job and finished."""
        uid = _job_uid(final)
        tracked = self._tracked.get(uid)
        if (
            tracked is not None
            and tracked.main is not None
            and _ref_key(tracked.main) == key
            and terminal_phase(key[0], final) is not None
        ):
            pods = tuple(self._pods.get(uid, {}).values())
            if tracked.attempt:
                pods = tuple(p for p in pods if _attempt(p) in ("", tracked.attempt))
            meta = {k: v for k, v in (final.get("metadata") or {}).items() if k != "managedFields"}
            self._final[uid] = _Final(
                key=key, obj={"metadata": meta, "status": final.get("status") or {}}, pods=pods
            )
            log.info("status.deleted_after_finishing", job_uid=uid, object="/".join(key))
        self._mark(uid)

    def _revived(self, key: _ObjKey, uid: str) -> None:
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
        if obj is None and final is not None and main is not None and final.key == _ref_key(main):
            # Deleted after it finished: the member's last word, not Missing (module doc).
            obj, pods = final.obj, final.pods
        elif tracked.attempt:
            pods = [p for p in pods if _attempt(p) in ("", tracked.attempt)]
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
        failure = self._failure(uid, tracked, status, pods)
        if failure is not None:
            status = status.model_copy(update={"failure": failure})
        elif tracked.suspected:
            status = status.model_copy(
                update={
                    "pod_issues": (*_suspicion_issues(tracked.suspected, pods), *status.pod_issues),
                    "conditions": (
                        *status.conditions,
                        *suspicion_conditions(tracked.suspected),
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

    def _failure(
        self, uid: str, tracked: _Tracked, status: WorkloadStatus, pods: Iterable[dict[str, Any]]
    ) -> FailureCause | None:
        """The job's failure cause (sticky once observed), classified over its pods and the
        inventory's view of their nodes."""
        before, tracked.suspected, tracked.recheck_at = tracked.suspected, (), None
        if tracked.failure is not None or status.phase == "Succeeded":
            return tracked.failure
        now = self._wall()
        pod_list = list(pods)
        nodes: dict[str, NodeHealth] | None = None
        unfinished: set[str] = set()
        if self._node_health is not None:
            nodes = {}
            for p in pod_list:
                node = str((p.get("spec") or {}).get("nodeName") or "")
                if not node:
                    continue
                if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
                    unfinished.add(node)
                health = self._node_health(node)
                if health is not None:
                    nodes[node] = self._timed(tracked, node, health, now)
            for p in pod_list:
                # the nodes a replacement pod is pinned to (gone ones make it NodeLost)
                for node in pinned_nodes(p):
                    health = self._node_health(node)
                    if health is not None and node not in nodes:
                        nodes[node] = self._timed(tracked, node, health, now)
        cause = classify_failure(
            phase=status.phase,
            conditions=status.conditions,
            pods=pod_list,
            nodes=nodes,
            gpus_seen=tracked.gpus_seen,
            now=now,
            grace_s=tracked.grace_s,
            gpus_dropped_since=tracked.gpus_dropped_since,
        )
        if nodes is not None:  # after classifying: a drop is measured against the past
            for node in unfinished & set(nodes):
                tracked.gpus_seen[node] = max(tracked.gpus_seen.get(node, 0), nodes[node].gpus)
            if cause is None:
                tracked.suspected = suspicions(
                    pods=pod_list,
                    nodes=nodes,
                    gpus_seen=tracked.gpus_seen,
                    now=now,
                    grace_s=tracked.grace_s,
                    gpus_dropped_since=tracked.gpus_dropped_since,
                )
                if tracked.suspected:
                    tracked.recheck_at = min(s.deadline for s in tracked.suspected)
                    self._log_suspicions(uid, tracked.suspected, before)
        if cause is not None:
            tracked.failure = cause
            log.warning(
                "status.failure_classified",
                job_uid=uid,
                kind=cause.kind,
                reason=cause.reason,
                nodes=list(cause.nodes),
            )
        return cause

    def _timed(self, tracked: _Tracked, node: str, health: NodeHealth, now: float) -> NodeHealth:
        """``health`` with the "since" times classification needs: a not-Ready node without
        a Ready ``lastTransitionTime`` counts from when this job first saw it so; a GPU drop
        (fewer GPUs than while the job ran there) from when this job first saw it. Both are
        forgotten when the node recovers."""
        if health.ready:
            tracked.not_ready_seen.pop(node, None)
        else:
            first = tracked.not_ready_seen.setdefault(node, now)
            if health.not_ready_since is None:
                health = replace(health, not_ready_since=first)
        if health.ready and health.gpus < tracked.gpus_seen.get(node, 0):
            tracked.gpus_dropped_since.setdefault(node, now)
        else:
            tracked.gpus_dropped_since.pop(node, None)
        return health

    def _log_suspicions(
        self, uid: str, suspected: tuple[Suspicion, ...], before: tuple[Suspicion, ...]
    ) -> None:
        """One ``status.node_suspected`` line per new suspicion (not per re-summary)."""
        known = {(s.node, s.reason, s.since) for s in before}
        for s in suspected:
            if (s.node, s.reason, s.since) in known:
                continue
            log.info(
                "status.node_suspected",
                job_uid=uid,
                node=s.node,
                reason=s.reason,
                since=s.since,
                deadline=s.deadline,
            )


def _suspicion_issues(
    suspected: tuple[Suspicion, ...], pods: Iterable[dict[str, Any]]
) -> list[PodIssue]:
    """One pod issue per suspicion, on the first pod (by name) bound to its node."""
    on: dict[str, str] = {}
    for p in sorted(pods, key=lambda p: str((p.get("metadata") or {}).get("name") or "")):
        node = str((p.get("spec") or {}).get("nodeName") or "")
        on.setdefault(node, str((p.get("metadata") or {}).get("name") or ""))
    return [PodIssue(pod=on.get(s.node, ""), reason=s.reason, message=s.message) for s in suspected]
