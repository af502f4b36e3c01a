"""Re-running jobs after infrastructure failures (issue 13): which failure report re-runs a job.

The one owner of the decision "this copy was broken by infrastructure: run the job again".
:mod:`gpufed.hub.components.reports` hands it every workload report that carries a failure cause
(:class:`gpufed.api.work.FailureCause`, classified by the agent with
:mod:`gpufed.sync.failure`) before the report is mirrored:

1. the job's declared exit codes apply (``spec.placement.retry.infrastructureExitCodes``,
   :func:`gpufed.sync.failure.with_declared_exit_codes`); an ``Application`` cause is not ours:
   the report is mirrored as usual and the job ends ``Failed`` (final, as always);
2. the nodes the cause names become suspect (:mod:`gpufed.hub.components.suspects`): no placement uses
   them during the cool-down, so the new attempt avoids them;
3. with re-runs left (``spec.placement.retry.onInfrastructureFailure``, default
   :data:`gpufed.api.gpujob.DEFAULT_INFRASTRUCTURE_RETRIES`; the job record's
   ``requeue_counts["InfrastructureFailure"]`` counts those used) the job is requeued through
   :meth:`gpufed.hub.components.requeue.Requeue.stop` with an ``InfrastructureFailure`` cause: the mark in
   etcd, then the Delete of what is left of the copy, then — once the member reports its pods
   gone, or its member was lost and the copy fenced — Pending with ``Restarting`` True,
   ``status.restarts`` and ``status.restartHistory``, placed again as attempt + 1 (any member;
   its pods see ``GPUFED_ATTEMPT`` and ``gpufed.io/attempt``, :mod:`gpufed.sync.manifests`);
   every report of the copy from the decision on is not mirrored, so the job is never shown
   ``Failed`` in between;
4. without re-runs left the job ends ``Failed`` with condition ``InfrastructureFailure``
   (reason ``RetriesExhausted``), final; its member objects stay until the GPUJob is deleted.

Only a cause observed on the job's current copy counts: a copy that finished, or disappeared
for any other reason (``Missing``), is never run again (docs/design.md §7 item 6).
"""

from __future__ import annotations

import structlog

from gpufed.api.gpujob import GPUJobStatus, Retry
from gpufed.api.work import FailureCause, WorkloadStatus
from gpufed.hub.adapters.store import ConflictError
from gpufed.hub.components.mirror import Mirror
from gpufed.hub.components.requeue import Requeue
from gpufed.hub.components.reservations import Reservations
from gpufed.hub.components.state import JobState
from gpufed.hub.components.suspects import SuspectNodes
from gpufed.hub.components.term import Term
from gpufed.hub.rules import status as st
from gpufed.hub.rules.records import RequeueCause
from gpufed.sync.failure import NODE_EVIDENCE, with_declared_exit_codes

log = structlog.get_logger("gpufed.hub.components.restarts")

#: The requeue kind (and GPUJob condition type) of a re-run after an infrastructure failure.
INFRASTRUCTURE_FAILURE = "InfrastructureFailure"


def retry_of(job: JobState) -> Retry:
    """The job's ``spec.placement.retry`` (its defaults when absent)."""
    return job.obj.spec.placement.retry or Retry()


def infrastructure_failed(
    status: GPUJobStatus, cause: FailureCause, *, cluster: str, used: int, now: str
) -> GPUJobStatus:
    """Final: infrastructure failed under the job and no re-run is left (phase Failed,
    condition ``InfrastructureFailure`` True, reason ``RetriesExhausted``)."""
    if st.is_terminal(status):
        return status
    message = (
        f"infrastructure failure in {cluster}: {cause.reason}: {cause.message}; no re-run left "
        f"({used} used, spec.placement.retry.onInfrastructureFailure)"
    )
    conds = st.set_condition(
        status.conditions,
        INFRASTRUCTURE_FAILURE,
        "True",
        reason="RetriesExhausted",
        message=message,
        now=now,
    )
    conds = st.set_condition(
        conds, "Restarting", "False", reason="RetriesExhausted", message=message, now=now
    )
    return status.model_copy(
        update={"phase": "Failed", "message": message, "conditions": conds, "completion_time": now}
    )


class Restarts:
    """Decides re-runs after infrastructure failures for one leader term (module docstring)."""

    def __init__(
        self,
        term: Term,
        requeue: Requeue,
        reservations: Reservations,
        mirror: Mirror,
        suspects: SuspectNodes,
    ) -> None:
        self._term = term
        self._requeue = requeue
        self._reservations = reservations
        self._mirror = mirror
        self.suspects = suspects
        #: jobs whose re-run is decided and whose stopping mark is not in etcd yet
        self._starting: set[str] = set()

    def on_report(self, job: JobState, cluster: str, report: WorkloadStatus) -> bool:
        """A workload report of ``job``'s current copy in ``cluster``; True when this module
        took it (a re-run is starting, or the job failed for good): the caller does not mirror
        it. Called under no lock; the requeue runs in the background under the job's lock."""
        if job.uid in self._starting:
            return True
        if report.failure is None or job.terminal or job.deleting or report.phase == "Succeeded":
            return False
        retry = retry_of(job)
        cause = with_declared_exit_codes(report.failure, retry.infrastructure_exit_codes)
        if cause.kind != "Infrastructure":
            return False
        # Only what Kubernetes observed of the node marks it suspect, never what the tenant can
        # cause itself (its own exit codes, a pressure eviction it provoked, a drain or a
        # member-side preemption): else one tenant could walk the fleet marking nodes and keep
        # every other tenant off them for the cool-down.
        marked = (
            self.suspects.mark(
                cluster,
                cause.nodes,
                f"{cause.reason} under {job.key}",
                mono=self._term.mono(),
                wall=self._term.wall(),
            )
            if cause.reason in NODE_EVIDENCE
            else []
        )
        used = job.record.requeue_counts.get(INFRASTRUCTURE_FAILURE, 0) if job.record else 0
        log.warning(
            "hub.restart.infrastructure_failure",
            job=job.key,
            cluster=cluster,
            reason=cause.reason,
            nodes=list(cause.nodes),
            suspect=marked,
            used=used,
            allowed=retry.on_infrastructure_failure,
        )
        if used >= retry.on_infrastructure_failure:
            now = self._mirror.now()
            new = infrastructure_failed(job.status, cause, cluster=cluster, used=used, now=now)
            self._mirror.set_status(job, new)
            self._mirror.event(job, "Warning", INFRASTRUCTURE_FAILURE, new.message)
            self._reservations.release(job.uid, "the job failed: no re-run left")
            return True
        self._starting.add(job.uid)
        self._term.spawn(self._stop(job.uid, cluster, cause, used + 1, retry))
        return True

    async def _stop(
        self, uid: str, cluster: str, cause: FailureCause, run: int, retry: Retry
    ) -> None:
        try:
            async with self._term.state.lock(uid):
                job = self._term.state.jobs.get(uid)
                if job is None or job.placed_cluster != cluster:
                    return
                requeue = RequeueCause(
                    kind="InfrastructureFailure",
                    reason=cause.reason,
                    message=(
                        f"infrastructure failure in {cluster}: {cause.message or cause.reason}; "
                        f"re-run {run} of {retry.on_infrastructure_failure}"
                    )[:1024],
                    at=self._term.wall(),
                    cluster=cluster,
                    nodes=cause.nodes,
                )
                try:
                    started = await self._requeue.stop(job, requeue)
                except ConflictError:
                    log.warning("hub.restart.conflict", job=job.key, cluster=cluster)
                    return
                if started:
                    now = self._mirror.now()
                    self._mirror.set_status(
                        job,
                        job.status.model_copy(
                            update={
                                "message": f"{requeue.message}; restarting",
                                "conditions": st.set_condition(
                                    job.status.conditions,
                                    "Restarting",
                                    "True",
                                    reason=cause.reason,
                                    message=requeue.message,
                                    now=now,
                                ),
                            }
                        ),
                    )
                    self._mirror.event(job, "Warning", "Restarting", requeue.message)
        finally:
            self._starting.discard(uid)
