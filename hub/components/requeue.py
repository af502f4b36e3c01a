"""Requeue: stop a placed job's member copy and return the job to Pending for a new attempt.

The one owner of "this job ran, its copy must go, and it runs again later" (docs/design.md §7
item 9). The rule of §7 item 6 stands — no reconcile re-runs a job that already ran — and this
module is its only exception: a requeue is explicit, recorded in etcd before anything is
deleted, and nothing runs twice at once (the new attempt is placed only after the old copy is
gone from the member, or its member was lost and the copy fenced).

The steps, each durable before the next:

1. **mark** — the job record gets ``stopping`` (a :class:`~gpufed.hub.rules.records.RequeueCause`):
   :meth:`Requeue.stop` writes it alone (one ``put_job``); preemption writes the marks of all
   its victims together with the preemptor's hold in one transaction
   (:meth:`gpufed.hub.adapters.ports.StateStore.preempt`) using :func:`marked`, then calls
   :meth:`Requeue.stop_copy`;
2. **delete** — the copy's work item becomes a Delete (:meth:`gpufed.hub.components.dispatch.Dispatch.
   ensure_delete`); the agent deletes its objects with background propagation, so the pods get
   their ``terminationGracePeriodSeconds`` (SIGTERM lets a trainer checkpoint);
3. **gone** — the agent acks ``Deleted`` (:meth:`Requeue.copy_deleted`, from
   :mod:`gpufed.hub.components.reports`), and then the member's inventory shows none of the job's pods
   (:meth:`Requeue.inventory_changed`, from :mod:`gpufed.hub.components.members`): the record loses
   ``stopping`` and its cluster (the cause goes to ``requeues`` and ``requeue_counts``), the
   job's reservation is released, its status turns Pending with the cause's condition True
   (``Preempted``), an Event is emitted, and the scheduler places it again — anywhere, as
   attempt + 1, through the normal queue. A member lost meanwhile (:meth:`Requeue.member_lost`)
   fences the copy and completes the requeue at once.

A hub that stops between steps resumes from etcd (:meth:`Requeue.resume`, when intake hands a
job its record): a record with ``stopping`` whose copy is not deleted yet gets its Delete again; a
requeue is never started twice (``stopping`` set means in progress). A job that finished
(``Succeeded``/``Failed``) before its copy was gone stays finished: terminal is final.

Called by the scheduling cycle (preemption), reports (Deleted acks), members (inventory, lost
members) and intake (resume); issue 13's failure recovery calls :meth:`Requeue.stop` with an
``InfrastructureFailure`` cause.
"""

from __future__ import annotations

from collections.abc import Callable

import structlog

from gpufed.hub.components.dispatch import Dispatch
from gpufed.hub.components.mirror import Mirror
from gpufed.hub.components.reservations import Reservations
from gpufed.hub.components.state import JobState
from gpufed.hub.components.term import Term
from gpufed.hub.rules import status as st
from gpufed.hub.rules.records import MAX_REQUEUE_HISTORY, JobRecord, RequeueCause

log = structlog.get_logger("gpufed.hub.components.requeue")


def marked(record: JobRecord, cause: RequeueCause) -> JobRecord:
    """``record`` with its current copy being stopped for ``cause`` (step 1; pure)."""
    return record.model_copy(update={"stopping": cause})


def requeued(record: JobRecord) -> JobRecord:
    """``record`` back in the queue after its copy is gone (step 3; pure): no cluster, no
    ``stopping``; the cause appended to ``requeues`` (bounded) and counted by kind. The
    ``attempt`` is unchanged: the next placement writes ``attempt + 1``."""
    cause = record.stopping
    if cause is None:
        return record
    counts = dict(record.requeue_counts)
    counts[cause.kind] = counts.get(cause.kind, 0) + 1
    return record.model_copy(
        update={
            "cluster": None,
            "stopping": None,
            "requeues": (*record.requeues, cause)[-MAX_REQUEUE_HISTORY:],
            "requeue_counts": counts,
        }
    )


class Requeue:
    """Stop a job's member copy and requeue it, for one leader term (module docstring).

    ``want``: hands a requeued job back to the scheduler (``Scheduler.want``).
    """

    def __init__(
        self,
        term: Term,
        dispatch: Dispatch,
        reservations: Reservations,
        mirror: Mirror,
        *,
        want: Callable[[str], None],
    ) -> None:
        self._term = term
        self._dispatch = dispatch
        self._reservations = reservations
        self._mirror = mirror
        self._want = want
        #: jobs whose copy the member acknowledged deleted, waiting for their pods to be gone
        self._deleted: set[str] = set()

    # --- step 1 and 2 ---------------------------------------------------------------------------

    async def stop(self, job: JobState, cause: RequeueCause) -> bool:
        """Requeue ``job`` for ``cause``: mark its record in etcd, then delete its member copy.
        False (nothing done) when it is not placed in ``cause.cluster``, is finished or being
        deleted, or is already being stopped (terminal is final: a caller that requeues after a
        failure decides before it writes the failure as the job's phase). Call under the job's
        lock. Raises ``ConflictError`` when the record changed since it was read (re-read and
        decide again), ``NotLeaderError`` when this replica no longer leads."""
        rec = job.record
        if (
            rec is None
            or job.record_rev is None
            or rec.cluster != cause.cluster
            or rec.stopping is not None
            or job.terminal
            or job.deleting
        ):
            return False
        new = marked(rec, cause)
        job.record_rev = await self._term.store.put_job(new, expect_revision=job.record_rev)
        job.record = new
        await self.stop_copy(job)
        return True

    async def stop_copy(self, job: JobState) -> None:
        """Step 2: the record's ``stopping`` mark is in etcd; turn the copy's work item into a
        Delete and send it (idempotent). Call under the job's lock."""
        rec = job.record
        if rec is None or rec.stopping is None or rec.cluster is None:
            return
        cause = rec.stopping
        log.info(
            "hub.requeue.stopping",
            job=job.key,
            cluster=rec.cluster,
            cause=cause.kind,
            by=cause.by or None,
        )
        await self._dispatch.ensure_delete(rec.cluster, job.uid)
        if (rec.cluster, job.uid) not in self._term.state.work:
            self._deleted.add(job.uid)  # no work item left: the copy is gone already

    # --- step 3 ---------------------------------------------------------------------------------

    async def copy_deleted(self, job: JobState, cluster: str) -> bool:
        """The agent acknowledged the Delete of ``job``'s copy in ``cluster``; True when the job
        is being requeued (the caller does nothing else). Its pods may still be terminating:
        the job is requeued once the member reports none of them (call under the job's lock)."""
        rec = job.record
        if rec is None or rec.stopping is None or rec.cluster != cluster:
            return False
        self._deleted.add(job.uid)
        if not self._pods_left(cluster, job.uid):
            await self._requeue(job)
        return True

    async def inventory_changed(self, cluster: str) -> None:
        """The member's inventory changed: requeue the jobs whose copy it deleted and whose
        pods it no longer reports."""
        for uid in sorted(self._deleted):
            job = self._term.state.jobs.get(uid)
            if job is None or job.record is None or job.record.stopping is None:
                self._deleted.discard(uid)
                continue
            if job.record.cluster != cluster or self._pods_left(cluster, uid):
                continue
            async with self._term.state.lock(uid):
                if job.record is not None and job.record.stopping is not None:
                    await self._requeue(job)

    async def member_lost(self, job: JobState, cluster: str) -> bool:
        """``cluster`` was declared lost while ``job``'s copy there was being stopped: fence
        the copy (deleted when the member returns) and requeue the job now. True when the job
        was being stopped (the caller's lost policy does not apply). Call under its lock."""
        rec = job.record
        if rec is None or rec.stopping is None or rec.cluster != cluster:
            return False
        if (cluster, job.uid) in self._term.state.work:
            await self._dispatch.ensure_delete(cluster, job.uid, fenced=True)
        await self._requeue(job)
        return True

    def _pods_left(self, cluster: str, uid: str) -> bool:
        """Whether the member still reports pods of the job (terminating ones included)."""
        m = self._term.state.members.get(cluster)
        if m is None:
            return False
        return any(uid in n.job_requests for n in m.nodes.values())

    async def _requeue(self, job: JobState) -> None:
        rec = job.record
        assert rec is not None
        assert rec.stopping is not None
        assert job.record_rev is not None
        cause = rec.stopping
        self._deleted.discard(job.uid)
        if job.terminal:
            # It finished before its copy was gone: terminal is final; keep the record placed.
            log.info("hub.requeue.finished_first", job=job.key, phase=job.status.phase)
            return
        new = requeued(rec)
        job.record_rev = await self._term.store.put_job(new, expect_revision=job.record_rev)
        job.record = new
        self._term.metrics.requeues.labels(cause.kind).inc()
        self._reservations.release(job.uid, f"requeued: {cause.kind}")
        job.last_unschedulable = None
        self._mirror.set_status(
            job,
            st.requeued(
                job.status,
                cause,
                count=new.requeue_counts.get(cause.kind, 0),
                now=self._mirror.now(),
            ),
        )
        self._mirror.event(job, "Warning", cause.reason, cause.message)
        log.info(
            "hub.requeue.done",
            job=job.key,
            cluster=cause.cluster,
            cause=cause.kind,
            attempt=rec.attempt,
        )
        self._want(job.uid)

    # --- a new leader term ------------------------------------------------------------------------

    async def resume(self, uid: str) -> None:
        """A new term took in job ``uid`` whose record says a previous leader was stopping its
        copy: carry on (its Delete again, idempotent; the requeue once the copy is gone).
        Spawned by intake when it hands a job its etcd record."""
        async with self._term.state.lock(uid):
            job = self._term.state.jobs.get(uid)
            if job is None or job.record is None or job.record.stopping is None:
                return
            cluster = job.record.cluster
            log.info("hub.requeue.resumed", job=job.key, cluster=cluster)
            await self.stop_copy(job)
            if cluster is not None and uid in self._deleted and not self._pods_left(cluster, uid):
                await self._requeue(job)

    @property
    def awaiting_pods_gone(self) -> bool:
        """Whether any deleted copy waits for its pods to leave the inventory."""
        return bool(self._deleted)

    def stopping(self) -> list[JobState]:
        """The jobs whose copy is being stopped now (by UID)."""
        return [
            j
            for _, j in sorted(self._term.state.jobs.items())
            if j.record is not None and j.record.stopping is not None
        ]
