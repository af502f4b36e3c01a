"""Reports: what members say about the work they were sent — acks and workload status — and
what follows from it for the work item and the GPUJob's status (what follows for the job's
fate, the lifecycle decides).

- An **ack** answers one work item revision. It is checked at once on the stream's read path
  (an ack for a job assigned to another member closes the stream) and persisted off it, so
  one slow etcd write does not hold up the agent's next messages: Applied is recorded (the
  job's objects exist: never re-create them) and the job turns dispatched; Deleted forgets the
  work item (and lets a deleted GPUJob go); Failed is retried later with backoff when
  retryable (the job's status says "retrying in <member> …"); an Apply refused for good, or
  failing ``apply_retry_limit`` times in a row, is the lifecycle's to settle (the job fails,
  whatever part was accepted is deleted).
- A **workload status** becomes the GPUJob's status through the pure rules of
  :mod:`gpufed.hub.rules.status` (terminal phases are final); a finished job is the
  lifecycle's to settle (its reservation released, rule 3). A report that shows an
  infrastructure failure of the current copy is not mirrored: it is recorded
  (``JobState.failure``) and the lifecycle decides (a re-run, or ``Failed`` for good). Its
  checkpoint time (``gpufed.io/last-checkpoint``, forwarded by the agent) is
  checked again with :func:`gpufed.sync.status.parse_checkpoint` on the hub's clock: a value
  in the future or not RFC 3339 is ignored with ``agent.checkpoint_refused`` and
  ``status.lastCheckpointTime`` keeps the last good one (it only moves forward). Agents
  reconnect to a new leader before its GPUJob list is in and send each status
  once: those reports are kept (the latest per job) and applied after the list.

Called by the controller's message routing (:meth:`gpufed.hub.components.core.Controller.handle`).
"""

from __future__ import annotations

import structlog

from gpufed.api.gpujob import GPUJobStatus
from gpufed.api.work import WorkAck, WorkloadStatus
from gpufed.hub.adapters.sessions import AgentSession, RefusedError
from gpufed.hub.components.dispatch import Dispatch
from gpufed.hub.components.lifecycle import Lifecycle
from gpufed.hub.components.mirror import Mirror
from gpufed.hub.components.term import Term, WorkState
from gpufed.hub.rules import status as st
from gpufed.hub.rules.lifecycle import infrastructure_cause
from gpufed.hub.rules.records import AckRecord
from gpufed.sync.failure import GPU_UNAVAILABLE, NODE_NOT_READY
from gpufed.sync.retry import backoff_seconds
from gpufed.sync.status import parse_checkpoint

log = structlog.get_logger("gpufed.hub.components.reports")


class Reports:
    """Acks and workload reports of one leader term (see the module docstring)."""

    def __init__(
        self,
        term: Term,
        dispatch: Dispatch,
        mirror: Mirror,
        lifecycle: Lifecycle,
    ) -> None:
        self._term = term
        self._dispatch = dispatch
        self._mirror = mirror
        self._lifecycle = lifecycle
        #: workload reports that came before this term's GPUJob list (latest per job uid)
        self._early: dict[str, tuple[AgentSession, WorkloadStatus]] = {}

    # --- acks ----------------------------------------------------------------------------------------

    def on_ack(self, s: AgentSession, ack: WorkAck) -> None:
        """Check an ack now (a foreign one raises :class:`RefusedError`); persist it in the
        background."""
        s.unacked.pop(ack.job_uid, None)
        try:
            ws = self._ack_target(s.cluster, ack)
            if ws is not None:
                self._term.spawn(self._persist_ack(s.cluster, ws, ack))
        finally:
            self._dispatch.pump(s.cluster)

    def _ack_target(self, cluster: str, ack: WorkAck) -> WorkState | None:
        """The work item an ack answers; None for an unknown job or an old revision."""
        ws = self._term.state.work.get((cluster, ack.job_uid))
        if ws is None:
            other = self._term.state.work_elsewhere(ack.job_uid, cluster)
            if other is not None:
                raise RefusedError(
                    f"ack for job {ack.job_uid}, which is assigned to member {other}, not {cluster}"
                )
            log.info("agent.ack.unknown", cluster=cluster, job_uid=ack.job_uid)
            return None
        if ack.revision != ws.revision:
            log.info(
                "agent.ack.stale",
                cluster=cluster,
                job=ws.record.job,
                revision=ack.revision,
                current=ws.revision,
            )
            return None
        return ws

    async def _persist_ack(self, cluster: str, ws: WorkState, ack: WorkAck) -> None:
        uid = ack.job_uid
        async with self._term.state.lock(uid):
            if self._term.state.work.get((cluster, uid)) is not ws or ack.revision != ws.revision:
                return
            op = ws.record.op
            prev = ws.ack
            if ack.result == "Applied" and op == "Apply":
                record = AckRecord(
                    revision=ack.revision,
                    result="Applied",
                    applied=True,
                    applied_at=prev.applied_at if prev and prev.applied_at else self._term.wall(),
                )
                if prev == record:
                    return
                await self._term.store.put_ack(cluster, uid, record)
                ws.ack = record
                self._term.state.touch(uid)  # its start (the kept running jobs read it)
                self._dispatched(uid, cluster)
            elif ack.result == "Deleted" and op == "Delete":
                await self._term.store.forget_work(cluster, uid)
                del self._term.state.work[(cluster, uid)]
                log.info("work.deleted", job=ws.record.job, cluster=cluster)
                job = self._term.state.jobs.get(uid)
                if job is not None:
                    # A deleted job lets go; a stopped copy's job is requeued once its pods
                    # are gone.
                    await self._lifecycle.reconcile_locked(job)
            elif ack.result == "Failed":
                record = AckRecord(
                    revision=ack.revision,
                    result="Failed",
                    message=ack.message,
                    retryable=ack.retryable,
                    applied=prev.applied if prev else False,
                    applied_at=prev.applied_at if prev else None,
                )
                await self._term.store.put_ack(cluster, uid, record)
                ws.ack = record
                log.warning(
                    "work.failed",
                    job=ws.record.job,
                    cluster=cluster,
                    op=op,
                    retryable=ack.retryable,
                    error=ack.message,
                )
                if ack.retryable or op == "Delete":
                    await self._retry_later(cluster, ws, ack.message)
                job = self._term.state.jobs.get(uid)
                if job is not None:
                    # Refused for good (or retried too often): the lifecycle fails the job.
                    await self._lifecycle.reconcile_locked(job)
            else:
                log.info(
                    "agent.ack.mismatch",
                    cluster=cluster,
                    job=ws.record.job,
                    op=op,
                    result=ack.result,
                )

    async def _retry_later(self, cluster: str, ws: WorkState, message: str) -> None:
        """A retryable failure: send again after a backoff (5 s doubling to
        ``apply_retry_max_s``), saying so in the job's status; an Apply that failed
        ``apply_retry_limit`` times in a row fails the job (call under the job's lock)."""
        cfg = self._term.config
        uid = ws.record.job_uid
        ws.failures += 1
        if ws.record.op == "Apply" and ws.failures >= cfg.apply_retry_limit:
            return  # refused for good: the lifecycle's rule 5
        base = min(cfg.resend_after_s, 5.0)
        delay = backoff_seconds(
            ws.failures, base=base, cap=max(base, cfg.apply_retry_max_s), rng=lambda: 1.0
        )
        ws.retry_at = self._term.mono() + delay
        job = self._term.state.jobs.get(uid)
        if ws.record.op == "Apply" and job is not None and job.placed_cluster == cluster:
            self._mirror.set_status(
                job,
                st.apply_retrying(
                    job.status,
                    cluster=cluster,
                    message=message,
                    attempt=ws.failures,
                    limit=cfg.apply_retry_limit,
                    retry_in_s=delay,
                    now=self._mirror.now(),
                ),
            )

    def _dispatched(self, uid: str, cluster: str) -> None:
        job = self._term.state.jobs.get(uid)
        if job is None or job.placed_cluster != cluster:
            return
        dispatch_s = None
        if job.decided_mono is not None:
            dispatch_s = self._term.mono() - job.decided_mono
            self._term.metrics.dispatch_seconds.observe(dispatch_s)
        self._mirror.set_status(
            job,
            st.dispatched(
                job.status,
                dispatch_ms=round(dispatch_s * 1000, 3) if dispatch_s is not None else None,
                now=self._mirror.now(),
            ),
        )
        log.info("dispatch.acked", job=job.key, cluster=cluster, dispatch_s=dispatch_s)

    # --- workload status -----------------------------------------------------------------------------

    def on_workload(self, s: AgentSession, report: WorkloadStatus) -> None:
        """Mirror one workload status into its GPUJob; a report about a job assigned to
        another member raises :class:`RefusedError`."""
        ws = self._term.state.work.get((s.cluster, report.job_uid))
        if ws is None:
            other = self._term.state.work_elsewhere(report.job_uid, s.cluster)
            if other is not None:
                raise RefusedError(
                    f"workload status for job {report.job_uid}, which is assigned to member "
                    f"{other}, not {s.cluster}"
                )
            return
        if report.revision == ws.revision and not ws.settled:
            # The agent processed this revision (a report without an ack: its objects were
            # Missing); stop re-sending it.
            self._dispatch.processed(s, report.job_uid)
        job = self._term.state.jobs.get(report.job_uid)
        if job is None and not self._term.state.jobs_listed.is_set():
            # Dropping it left a job that finished during a failover Running forever.
            if not self._early:
                self._term.spawn(self._replay_after_list())
            self._early[report.job_uid] = (s, report)
            return
        if ws.record.op != "Apply" or job is None or job.placed_cluster != s.cluster:
            return
        if job.record is not None and job.record.stopping is not None:
            return  # its copy is being stopped for a requeue: what it reports now is not news
        if job.failure is not None:
            return  # an infrastructure failure is being acted on: what follows is not news
        cause = (
            None  # a report that carries no failure shows none: no rule to ask
            if report.failure is None or job.terminal or job.deleting
            else infrastructure_cause(job.obj, report)
        )
        if cause is not None:
            # Infrastructure failed under it: a re-run, or failed for good; never shown
            # Failed in between.
            job.failure = (s.cluster, cause)
            self._term.spawn(self._lifecycle.reconcile(job.uid))
            return
        if report.last_checkpoint_time:
            when, why = parse_checkpoint(report.last_checkpoint_time, now=self._term.wall())
            if why:
                # An agent's clock or a bug must not move the cost of preempting this job.
                log.warning(
                    "agent.checkpoint_refused",
                    job=job.key,
                    cluster=s.cluster,
                    value=report.last_checkpoint_time,
                    reason=why,
                )
            report = report.model_copy(update={"last_checkpoint_time": when})
        before = job.status.phase
        suspected = _suspicions(job.status)
        new = st.workload(job.status, report, now=self._mirror.now())
        self._mirror.set_status(job, new)
        for kind, message in sorted(_suspicions(new).items()):
            if kind not in suspected:
                # A node under the job is not Ready (or withdrew GPUs): a suspicion, shown at
                # once; a failure only if it lasts (spec.placement.retry.nodeNotReadySeconds).
                self._mirror.event(job, "Warning", kind, message)
        if new.phase != before:
            log.info("job.phase", job=job.key, cluster=s.cluster, phase=new.phase, was=before)
            if new.phase in ("Running", "Succeeded"):
                self._mirror.event(job, "Normal", new.phase, new.message)
            elif new.phase == "Failed":
                self._mirror.event(job, "Warning", "Failed", new.message)
        if new.phase in ("Succeeded", "Failed") or (
            job.obj.spec.placement.time_limit_seconds is not None
            and new.phase == "Running"
            and before != "Running"
        ):
            # finished: the lifecycle releases its reservation (rule 3); started: it times
            # its limit (rule 6b)
            self._term.spawn(self._lifecycle.reconcile(job.uid))

    async def _replay_after_list(self) -> None:
        await self._term.state.jobs_listed.wait()
        self.replay_early()

    def replay_early(self) -> None:
        """The term's first GPUJob list is in: apply the reports that waited for it (from
        streams still current; a newer stream of that member reports again)."""
        early, self._early = self._early, {}
        for s, report in early.values():
            m = self._term.state.members.get(s.cluster)
            if m is None or m.session is not s:
                continue
            try:
                self.on_workload(s, report)
            except RefusedError as exc:
                log.warning("agent.report_refused", cluster=s.cluster, reason=str(exc))
        if early:
            log.info("hub.early_reports_applied", reports=len(early))


#: The job conditions that show a suspicion (:func:`gpufed.sync.failure.suspicion_conditions`).
_SUSPICION_TYPES = frozenset({NODE_NOT_READY, GPU_UNAVAILABLE})


def _suspicions(status: GPUJobStatus) -> dict[str, str]:
    """The job's suspicion conditions that are True: type -> message."""
    return {
        c.type: c.message
        for c in status.conditions
        if c.type in _SUSPICION_TYPES and c.status == "True"
    }
