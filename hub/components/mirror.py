"""Status mirroring: what the hub writes back to its own API server (GPUJob, MemberCluster and
GPUQueue status, Events).

Every component of a leader term reports through one :class:`Mirror`: :meth:`Mirror.set_status`
for a GPUJob's new status (the pure rules that compute it are in :mod:`gpufed.hub.rules.status`),
:meth:`Mirror.member_status` for a MemberCluster's (computed by :mod:`gpufed.hub.components.members`),
:meth:`Mirror.queue_status` for a GPUQueue's (computed by :mod:`gpufed.hub.components.queues`),
:meth:`Mirror.event` for Events. Writes are coalesced per object by
:class:`gpufed.hub.adapters.writer.CoalescingWriter`, which is also their one retry layer: a GPUJob's
placed/dispatched/running steps usually come within a fraction of a second, and written at most
every 250 ms per job they take fewer writes (each write also comes back through every GPUJob
watch); a job reaching a terminal phase is written at once, ahead of the others.

Events are for people, status is state: under load, Events wait for one of two slots (and may
lag) while status writes go first (client-go rate-limits its events too).

**Fenced writes** (docs/design.md §10). A replica that no longer leads writes nothing: every
status write and Event is preceded by :meth:`gpufed.hub.components.term.Term.check_fence` (the leader
lease is known to be held, no request), and every status write carries a resourceVersion
precondition (the GPUJob as this term last saw it: the watch, or its own last write), so a
write computed from an older view fails with 409 instead of overwriting a newer status; a
conflict re-reads the object and writes again, behind the fence again. What a pause between
the fence check and the API server's commit can still let through (a stale write onto an
object nobody wrote since) is undone by :meth:`Mirror.resync_jobs`, which the term runs every
``status_resync_s``: the leader compares each GPUJob status the hub API shows with the one it
computed and writes the differences again (level-triggered, not only edge-triggered), and
:meth:`Mirror.resync_members` does the same for MemberCluster statuses.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import structlog
from pydantic import ValidationError

from gpufed.api.gpujob import GPUJob, GPUJobStatus, StatusCondition
from gpufed.api.labels import API_VERSION
from gpufed.api.membercluster import MemberClusterStatus
from gpufed.api.queue import GPUQueueStatus
from gpufed.hub.adapters.store import NotLeaderError
from gpufed.hub.adapters.writer import CoalescingWriter
from gpufed.hub.components.term import JobState, MemberState, Term
from gpufed.hub.rules import status as st
from gpufed.sync.retry import Verdict, verdict_of

log = structlog.get_logger("gpufed.hub.components.mirror")

#: resourceVersions remembered per GPUJob as older than our last status write of it
MAX_OLDER_RVS = 16


class Mirror:
    """Coalesced status writers and Events of one leader term (see the module docstring).

    ``spawn`` runs an Event's write in the background; ``wall`` is the clock of status times.
    """

    def __init__(
        self,
        term: Term,
    ) -> None:
        self._term = term
        self._event_slots = asyncio.Semaphore(2)
        self.jobs = CoalescingWriter(
            "job-status",
            self._write_job_status,
            workers=term.config.status_writers,
            min_interval_s=0.25,
            hold_s=term.config.status_hold_s,
        )
        self.members = CoalescingWriter("member-status", self._write_member_status)
        self.queues = CoalescingWriter(
            "queue-status", self._write_queue_status, min_interval_s=0.25
        )
        #: uid -> (resourceVersion our last status write returned, or None after a conflict;
        #: the GPUJob object the watch had shown when we wrote)
        self._job_rvs: dict[str, tuple[str | None, GPUJob | None]] = {}
        #: uid -> resourceVersions of the GPUJob older than our last status write of it (the
        #: ones our writes were conditioned on and those our earlier writes returned): a watch
        #: view at one of them lags behind our own write, it is no overwrite (newest last)
        self._job_older: dict[str, dict[str, None]] = {}
        #: MemberCluster -> resourceVersion our last status write returned
        self._member_rvs: dict[str, str] = {}
        #: GPUQueue -> resourceVersion our last status write returned
        self._queue_rvs: dict[str, str] = {}
        #: MemberCluster -> (how many views the watch gave, the status of the latest)
        self._member_views: dict[str, tuple[int, MemberClusterStatus]] = {}
        #: MemberCluster -> the watch's view count when our last status write landed
        self._member_written_at: dict[str, int] = {}

    def start(self) -> None:
        """Start the writers' workers."""
        self.jobs.start()
        self.members.start()
        self.queues.start()

    async def stop(self) -> None:
        """Stop the writers (pending values are dropped: the next leader rewrites them)."""
        await self.jobs.stop()
        await self.members.stop()
        await self.queues.stop()

    def now(self) -> str:
        """The wall clock as an RFC 3339 status time."""
        return st.rfc3339(self._term.wall())

    # --- GPUJobs ---------------------------------------------------------------------------------

    def set_status(self, job: JobState, status: GPUJobStatus) -> None:
        """Make ``status`` the job's status now, and write it soon (at once when terminal: a
        job that ended is what its user waits for, and its GPUs are free)."""
        job.status = st.derived(status, generation=job.obj.metadata.generation, now=self.now())
        payload = job.status.model_dump(by_alias=True, mode="json")
        self.jobs.submit(
            job.uid,
            (job.obj.metadata.namespace, job.obj.metadata.name, payload),
            urgent=st.is_terminal(job.status),
        )

    def invalid(self, job: JobState, field: str, message: str) -> None:
        """``job`` can never be placed as written: ``Valid=False`` naming ``field`` with
        ``message``, and a Warning ``InvalidSpec`` Event."""
        self.set_status(job, st.invalid(job.status, field=field, message=message, now=self.now()))
        self.event(job, "Warning", "InvalidSpec", message)
        log.info("hub.job.invalid", job=job.key, field=field, error=message)

    def waiting(
        self, job: JobState, reason: str, message: str, *, event_type: str = "Normal"
    ) -> None:
        """``job`` waits for something other than capacity: Pending with ``reason`` and
        ``message`` and an Event of ``event_type``, written once per message
        (``JobState.last_unschedulable``)."""
        sig = (reason, message)
        if sig == job.last_unschedulable:
            return
        job.last_unschedulable = sig
        self.set_status(job, st.waiting(job.status, reason=reason, message=message, now=self.now()))
        self.event(job, event_type, reason, message)
        log.info("placement.waiting", job=job.key, reason=reason)

    def forget_job(self, uid: str) -> None:
        """The GPUJob is gone: drop what is pending for it."""
        self.jobs.forget(uid)
        self._job_rvs.pop(uid, None)
        self._job_older.pop(uid, None)

    async def _write_job_status(self, uid: str, value: Any) -> None:
        ns, name, payload = value
        job = self._term.state.jobs.get(uid)
        rv = self._job_rv(uid, job)
        if rv is None:  # after a conflict: what does the API server hold now?
            self._fence("job")  # a fenced term makes no request at all, reads included
            fresh = await self._term.kube.get_job(ns, name)
            if fresh is None:
                return  # gone: its DELETED event forgets it
            rv = str(fresh.get("metadata", {}).get("resourceVersion", ""))
        seen = job.obj if job is not None else None
        try:
            self._term.check_fence()
            new_rv = await self._term.kube.patch_job_status(ns, name, payload, rv)
        except Exception as exc:
            result = _result_of(exc)
            if result == "conflict":
                self._job_rvs[uid] = (None, seen)
            self._term.metrics.status_writes.labels("job", result).inc()
            raise
        older = self._job_older.setdefault(uid, {})
        previous = self._job_rvs.get(uid, (None, None))[0]
        for v in (previous, rv):
            if v and v != new_rv:
                older.pop(v, None)
                older[v] = None
        while len(older) > MAX_OLDER_RVS:
            del older[next(iter(older))]
        self._job_rvs[uid] = (new_rv, seen)
        self._term.metrics.status_writes.labels("job", "ok").inc()

    def _job_rv(self, uid: str, job: JobState | None) -> str | None:
        """The resourceVersion the next status write of ``uid`` is conditioned on: the one our
        last write returned, unless the watch brought a newer view of the GPUJob since (or
        None: read it first, the last write conflicted)."""
        mine = self._job_rvs.get(uid)
        if job is not None and (mine is None or mine[1] is not job.obj):
            if mine is not None and mine[0] is not None and self._behind(uid, job):
                return mine[0]  # the watch shows a view older than our own last write
            return job.obj.metadata.resource_version or None
        return mine[0] if mine is not None else None

    def _behind(self, uid: str, job: JobState) -> bool:
        """The watch's view of the GPUJob predates our last status write of it (it is at a
        resourceVersion our writes were conditioned on or replaced)."""
        rv = job.obj.metadata.resource_version
        return rv is not None and rv in self._job_older.get(uid, ())

    def resync_jobs(self) -> int:
        """Level-triggered correction: every job whose status, as the hub API shows it (the
        GPUJob watch), differs from the one this term computed is written again. Skips jobs
        with a write pending, jobs the watch has shown nothing of since our last write, and
        jobs it shows at a resourceVersion older than our last write (an echo of an earlier
        write of ours, or the view that write replaced: the watch lags, and what it shows
        predates our write). Returns how many were corrected."""
        corrected = 0
        for uid, job in list(self._term.state.jobs.items()):
            mine = self._job_rvs.get(uid)
            if self.jobs.pending(uid) or (mine is not None and mine[1] is job.obj):
                continue
            if mine is not None and self._behind(uid, job):
                continue
            shown = job.obj.status or GPUJobStatus()
            if shown == job.status:
                continue
            payload = job.status.model_dump(by_alias=True, mode="json")
            self.jobs.submit(
                uid,
                (job.obj.metadata.namespace, job.obj.metadata.name, payload),
                urgent=st.is_terminal(job.status),
                force=True,
            )
            self._term.metrics.status_corrections.labels("job").inc()
            log.info(
                "hub.status.corrected", job=job.key, shown=shown.phase, computed=job.status.phase
            )
            corrected += 1
        return corrected

    def event(self, job: JobState, type_: str, reason: str, message: str) -> None:
        """Emit a core/v1 Event about the job (in the background, after status writes)."""
        involved = {
            "api_version": job.obj.api_version,
            "kind": job.obj.kind,
            "name": job.obj.metadata.name,
            "namespace": job.obj.metadata.namespace,
            "uid": job.uid,
        }
        self._emit(involved, type_, reason, message)

    def member_event(self, m: MemberState, type_: str, reason: str, message: str) -> None:
        """Emit a core/v1 Event about the member's MemberCluster (cluster-scoped: the Event
        lives in ``default``, as Kubernetes does for Nodes); ``kubectl describe membercluster``
        shows it (it matches the MemberCluster's UID)."""
        involved = {
            "api_version": API_VERSION,
            "kind": "MemberCluster",
            "name": m.name,
            "uid": m.uid or None,
        }
        self._emit(involved, type_, reason, message)

    def _emit(self, involved: dict[str, Any], type_: str, reason: str, message: str) -> None:
        async def emit() -> None:
            async with self._event_slots:
                if not self._term.leading():
                    return  # fenced: an ex-leader's Events would mislead as much as its status
                await self._term.kube.emit_event(
                    involved, type_=type_, reason=reason, message=message
                )

        self._term.spawn(emit())

    # --- MemberClusters --------------------------------------------------------------------------

    def member_status(self, name: str, status: MemberClusterStatus) -> None:
        """Write a MemberCluster's status soon (skipped when equal to the last one written)."""
        self.members.submit(name, status.model_dump(by_alias=True, mode="json"))

    def last_member_conditions(self, name: str) -> list[StatusCondition] | None:
        """The conditions of the MemberCluster status this term last wrote (None before the
        first write; empty when it does not read back)."""
        previous = self.members.last_written(name)
        if previous is None:
            return None
        if not isinstance(previous, dict):
            return []
        try:
            return MemberClusterStatus.model_validate(previous).conditions
        except ValidationError:
            return []

    def forget_member(self, name: str) -> None:
        """The MemberCluster is gone: drop what is pending for it."""
        self.members.forget(name)
        self._member_rvs.pop(name, None)
        self._member_views.pop(name, None)
        self._member_written_at.pop(name, None)

    def member_seen(self, name: str, status: MemberClusterStatus | None) -> None:
        """The MemberCluster watch showed ``name`` with ``status`` (for :meth:`resync_members`)."""
        count = self._member_views.get(name, (0, None))[0] + 1
        self._member_views[name] = (count, status or MemberClusterStatus())

    def resync_members(self) -> int:
        """Level-triggered correction, as :meth:`resync_jobs` does for GPUJobs: every
        MemberCluster whose status, as the watch shows it, differs from the one this term last
        wrote is written again. Skips members with a write pending, members this term has not
        written yet, and members the watch has shown nothing of since our last write. Returns
        how many were corrected."""
        corrected = 0
        for name, (view, shown) in list(self._member_views.items()):
            mine = self.members.last_written(name)
            if mine is None or self.members.pending(name):
                continue
            if self._member_written_at.get(name) == view:
                continue
            try:
                computed = MemberClusterStatus.model_validate(mine)
            except ValidationError:
                continue
            if shown == computed:
                continue
            self.members.submit(name, mine, force=True)
            self._term.metrics.status_corrections.labels("member").inc()
            log.info(
                "hub.status.corrected", cluster=name, shown=_ready(shown), computed=_ready(computed)
            )
            corrected += 1
        return corrected

    async def _write_member_status(self, name: str, payload: Any) -> None:
        kube = self._term.kube
        if await self._write_cluster_status(
            "member", name, payload, self._member_rvs, kube.get_member, kube.patch_member_status
        ):  # the watch's views so far predate this write
            self._member_written_at[name] = self._member_views.get(name, (0, None))[0]

    # --- GPUQueues -------------------------------------------------------------------------------

    def queue_status(self, name: str, status: GPUQueueStatus) -> None:
        """Write a GPUQueue's status soon (skipped when equal to the last one written)."""
        self.queues.submit(name, status.model_dump(by_alias=True, mode="json", exclude_none=True))

    def forget_queue(self, name: str) -> None:
        """The GPUQueue is gone: drop what is pending for it."""
        self.queues.forget(name)
        self._queue_rvs.pop(name, None)

    async def _write_queue_status(self, name: str, payload: Any) -> None:
        kube = self._term.kube
        await self._write_cluster_status(
            "queue", name, payload, self._queue_rvs, kube.get_queue, kube.patch_queue_status
        )

    async def _write_cluster_status(
        self,
        kind: str,
        name: str,
        payload: Any,
        rvs: dict[str, str],
        read: Callable[[str], Awaitable[dict[str, Any] | None]],
        patch: Callable[[str, dict[str, Any], str], Awaitable[str]],
    ) -> bool:
        """One fenced status write of a cluster-scoped object at the resourceVersion our last
        write returned (read first on the term's first write or after a conflict). False when
        the object is gone (nothing written); a failed write raises."""
        rv = rvs.get(name)
        if rv is None:  # first write of the term, or the last one conflicted
            self._fence(kind)
            fresh = await read(name)
            if fresh is None:
                return False  # gone: its DELETED event forgets it
            rv = str(fresh.get("metadata", {}).get("resourceVersion", ""))
        try:
            self._term.check_fence()
            rvs[name] = await patch(name, payload, rv)
        except Exception as exc:
            rvs.pop(name, None)
            result = _result_of(exc)
            if result != "gone":
                self._term.metrics.status_writes.labels(kind, result).inc()
            raise
        self._term.metrics.status_writes.labels(kind, "ok").inc()
        return True

    def _fence(self, kind: str) -> None:
        try:
            self._term.check_fence()
        except NotLeaderError:
            self._term.metrics.status_writes.labels(kind, "fenced").inc()
            raise


def _ready(status: MemberClusterStatus) -> str:
    """The Ready condition's status of a MemberCluster status, for logs ("" without one)."""
    return next((c.status for c in status.conditions if c.type == "Ready"), "")


def _result_of(exc: Exception) -> str:
    """The ``result`` label of a failed status write."""
    if isinstance(exc, NotLeaderError):
        return "fenced"
    verdict = verdict_of(exc)
    if verdict is Verdict.GONE:
        return "gone"
    return "conflict" if verdict is Verdict.RECONCILE else "error"
