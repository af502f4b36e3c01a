"""The job lifecycle of one leader term: gather a job's facts, decide, carry the steps out.

The one place a job's fate is settled (docs/design.md §9, "One job's path"). Components that
learn something about a job record it where it lives (the job's etcd record, its work item and
ack, the member's inventory and health, ``JobState.failure``) and call :meth:`Lifecycle.reconcile`
(or :meth:`Lifecycle.reconcile_locked` when they hold the job's lock already). The decision is
the pure :func:`gpufed.hub.rules.lifecycle.decide`; this module only reads the facts and applies
its steps:

- ``DeleteCopy`` — the copy's work item becomes a Delete (:meth:`Dispatch.ensure_delete`);
- ``Forget`` — a deleted job's etcd record is forgotten, its reservation released and the
  finalizer dropped (:mod:`gpufed.hub.components.finalizers`);
- ``Requeue`` — the record back in the queue, the reservation released, the job Pending with its
  cause's condition and an Event, handed to the scheduler (:meth:`HubState.want`): a preemption
  or a re-run after an infrastructure failure completes (§7 item 9);
- ``Lose`` — the job's member was lost: placed again with the copy fenced, or ``Lost``;
- ``MarkSuspects``, ``StopForRerun``, ``FailForGood`` — an infrastructure failure of the current
  copy: its nodes suspect (:mod:`gpufed.hub.components.reservations`), the ``stopping`` mark written
  in etcd (then the copy is deleted and the job requeued), or ``Failed`` with
  ``RetriesExhausted``;
- ``Release`` — a finished job's reservation released (the member reported it done);
- ``Want`` and ``AddFinalizer``;
- in a scheduling cycle (:meth:`Lifecycle.admit`, the cycle's view of the job's queue and
  priority as a fact): ``Enqueue`` (the request carries its queue and priority), ``WaitFor``
  (Pending with the reason, written once per message) or ``FailInvalid`` (``Valid=False``
  naming the field).

It also owns the job records whose GPUJob is gone (orphans: deleted before the record landed,
or while no hub ran): their member copy is deleted and the record forgotten (:meth:`job_gone`,
:meth:`sweep_orphans`).

Every step that writes etcd does so before memory follows; a conflict (the record changed since
it was read) leaves the facts as they were and the next reconcile decides again. A new term
reconciles every job intake hands its record (a requeue a previous leader started resumes).
"""

from __future__ import annotations

import structlog

from gpufed.api.gpujob import Retry
from gpufed.api.labels import FINALIZER
from gpufed.hub.adapters.store import ConflictError
from gpufed.hub.components.dispatch import Dispatch
from gpufed.hub.components.finalizers import Finalizers
from gpufed.hub.components.mirror import Mirror
from gpufed.hub.components.reservations import Reservations, SuspectNodes
from gpufed.hub.components.term import JobState, Term, WorkState
from gpufed.hub.rules import lifecycle as lc
from gpufed.hub.rules import status as st
from gpufed.hub.rules.health import silence
from gpufed.hub.rules.records import JobRecord, RequeueCause

log = structlog.get_logger("gpufed.hub.components.lifecycle")


class Lifecycle:
    """Reconciles jobs for one leader term (see the module docstring)."""

    def __init__(
        self,
        term: Term,
        dispatch: Dispatch,
        reservations: Reservations,
        mirror: Mirror,
        finalizers: Finalizers,
        suspects: SuspectNodes,
    ) -> None:
        self._term = term
        self._dispatch = dispatch
        self._reservations = reservations
        self._mirror = mirror
        self._finalizers = finalizers
        self.suspects = suspects
        #: jobs whose deleted copy waits for its pods to leave the inventory: uid -> member
        self._awaiting: dict[str, str] = {}
        #: jobs whose finalizer is being added (one patch at a time)
        self._adding: set[str] = set()
        #: jobs waiting out a backoff: uid -> wall seconds when to reconcile them again
        self._timers: dict[str, float] = {}
        #: job records in etcd whose GPUJob this term has not seen (yet): uid -> (record, rev)
        self._orphans: dict[str, tuple[JobRecord, int]] = {}

    # --- entry points ----------------------------------------------------------------------------

    async def reconcile(self, uid: str) -> lc.Steps:
        """Take job ``uid``'s lock, decide its next steps from its facts and carry them out;
        returns the steps taken (none for a job the term does not know). Raises
        ``NotLeaderError`` when this replica no longer leads."""
        async with self._term.state.lock(uid):
            job = self._term.state.jobs.get(uid)
            if job is None:
                self._awaiting.pop(uid, None)
                return ()
            return await self.reconcile_locked(job)

    async def reconcile_locked(self, job: JobState) -> lc.Steps:
        """:meth:`reconcile` for a caller that holds the job's lock."""
        facts = self.facts(job)
        if facts.stopping and facts.work == "none" and facts.pods_left and facts.cluster:
            self._awaiting[job.uid] = facts.cluster
        else:
            self._awaiting.pop(job.uid, None)
        steps = lc.decide(facts)
        for step in steps:
            try:
                await self._apply(job, step)
            except ConflictError:
                # The record changed since it was read: the facts are as they were in etcd's
                # eyes; whoever changed it asks for the next reconcile.
                log.warning("hub.lifecycle.conflict", job=job.key, step=type(step).__name__)
                break
        return steps

    def admit(self, job: JobState, view: lc.QueueView) -> bool:
        """Rule 7 inside a scheduling cycle: with ``view`` (the cycle's view of ``job``'s queue
        and priority) decide whether ``job`` goes in its queue this cycle and carry that out.
        True: its request now carries the queue and priority; False: it waits with a reason
        (written once per message) or failed for good. Synchronous (nothing here awaits), so
        the cycle needs no lock."""
        entered = False
        for step in lc.decide(self.facts(job, queue=view)):
            if isinstance(step, lc.Enqueue | lc.WaitFor | lc.FailInvalid):
                entered = self._admission(job, step) or entered
        return entered

    async def stop(self, job: JobState, cause: RequeueCause) -> bool:
        """Requeue ``job`` for ``cause``: its record's ``stopping`` mark in etcd, then (rule 2)
        the Delete of its copy, and the requeue once the copy and its pods are gone. False
        (nothing done) when it is not placed in ``cause.cluster``, is finished or being
        deleted, or is being stopped already. Call under the job's lock. Raises
        ``ConflictError`` when the record changed since it was read, ``NotLeaderError`` when
        this replica no longer leads."""
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
        await self._put(job, lc.marked(rec, cause))
        await self.reconcile_locked(job)
        return True

    async def due(self) -> None:
        """Reconcile the jobs whose backoff has passed (the term's tick)."""
        now = self._term.wall()
        for uid in sorted(u for u, at in self._timers.items() if at <= now):
            self._timers.pop(uid, None)
            await self.reconcile(uid)

    async def member_lost(self, cluster: str) -> None:
        """Member ``cluster`` was declared lost (recorded in its meta): reconcile every job
        placed there (rule 4, or rule 2 for a copy being stopped)."""
        uids = sorted(u for u, j in self._term.state.jobs.items() if j.placed_cluster == cluster)
        for uid in uids:
            await self.reconcile(uid)

    # --- job records without a GPUJob ------------------------------------------------------------

    def restore(self, records: dict[str, JobRecord], revisions: dict[str, int]) -> None:
        """A new term: every job record read from etcd is an orphan until its GPUJob is
        listed."""
        for uid, rec in records.items():
            self._orphans[uid] = (rec, revisions[uid])

    def adopt(self, job: JobState) -> None:
        """Intake took in ``job``: hand it its orphaned etcd record, if any (a requeue a
        previous leader started resumes at the job's first reconcile)."""
        adopted = self._orphans.pop(job.uid, None)
        if adopted is not None:
            job.record, job.record_rev = adopted

    def orphan_records(self) -> list[JobRecord]:
        """The job records whose GPUJob this term has not seen (yet): their copies may run."""
        return [rec for rec, _ in self._orphans.values()]

    def job_gone(self, uid: str) -> None:
        """The GPUJob is gone from the hub API (DELETED, or missing from a re-list)."""
        job = self._term.state.jobs.pop(uid, None)
        self._mirror.forget_job(uid)
        if job is None:
            if uid in self._orphans:  # deleted before intake took it in (namespace unknown)
                self._term.spawn(self._cleanup_orphan(uid))
            return
        log.info("hub.job.gone", job=job.key)
        if job.record is not None:
            self._orphans[uid] = (job.record, job.record_rev or 0)
            self._term.spawn(self._cleanup_orphan(uid))
        else:
            self._reservations.release(uid, "job deleted")

    def sweep_orphans(self, listed: set[str]) -> None:
        """After a GPUJob list: delete the member copies of records whose GPUJob is not among
        the ``listed`` UIDs. A listed job counts even before intake has taken it in (it may
        wait for its namespace's Pod Security level): its copy is running, not orphaned."""
        for uid in list(self._orphans):
            if uid not in listed and uid not in self._term.state.jobs:
                self._term.spawn(self._cleanup_orphan(uid))

    async def _cleanup_orphan(self, uid: str) -> None:
        async with self._term.state.lock(uid):
            rec = self._orphans.pop(uid, None)
            if rec is None or uid in self._term.state.jobs:
                return
            record, _ = rec
            log.info("hub.job.orphan_cleanup", job=record.job, cluster=record.cluster)
            if record.cluster is not None:
                await self._dispatch.ensure_delete(record.cluster, uid)
            await self._term.store.forget_job(uid)
            self._reservations.release(uid, "orphaned job record")

    # --- members -----------------------------------------------------------------------------------

    def awaiting_pods_gone(self, cluster: str) -> bool:
        """Whether a stopped copy in ``cluster`` waits for its pods to leave the inventory
        (cheap: asked on every inventory change)."""
        return cluster in self._awaiting.values()

    async def inventory_changed(self, cluster: str) -> None:
        """Member ``cluster``'s inventory changed: reconcile the jobs whose deleted copy waited
        for its pods to be gone."""
        for uid in sorted(u for u, c in self._awaiting.items() if c == cluster):
            await self.reconcile(uid)

    def facts(self, job: JobState, *, queue: lc.QueueView | None = None) -> lc.Facts:
        """What is recorded about ``job`` now (the input of the pure rule); ``queue``: a
        scheduling cycle's view of its queue and priority (:meth:`admit`)."""
        rec = job.record
        terminal = job.terminal
        retry = lc.retry_of(job.obj)
        cluster = rec.cluster if rec is not None else None
        work: lc.WorkOp = "none"
        pods_left = lost = refused = False
        held_until: float | None = None
        if cluster is not None:
            ws = self._term.state.work.get((cluster, job.uid))
            if ws is not None:
                work = (
                    "apply"
                    if ws.record.op == "Apply"
                    else ("fenced" if ws.record.fenced else "delete")
                )
                refused = work == "apply" and self.refusal(ws) is not None
            m = self._term.state.members.get(cluster)
            if m is not None:
                lost = m.lost
            if m is not None and rec is not None and rec.stopping is not None and work == "none":
                # Only rule 2 asks, and only then (a scan of the member's nodes).
                hold_until = _unready_hold(rec.stopping, retry)
                unready = hold_until is not None and self._term.wall() < hold_until
                pods_left = any(
                    job.uid in n.job_requests and (n.ready or unready) for n in m.nodes.values()
                )
                if unready and hold_until is not None and hold_until != float("inf"):
                    held_until = hold_until
        return lc.Facts(
            deleting=job.deleting,
            terminal=terminal,
            valid=job.request is not None,
            claimed=job.claim is not None,
            has_record=rec is not None,
            cluster=cluster,
            stopping=rec is not None and rec.stopping is not None,
            work=work,
            pods_left=pods_left,
            pods_held_until=held_until,
            member_lost=lost,
            refused=refused,
            failure_cluster=job.failure[0] if job.failure is not None else None,
            failure_exempt=job.failure is not None
            and job.failure[1].reason in lc.NO_BUDGET_REASONS,
            limit_at=job.time_limit_at,
            now=self._term.wall(),
            not_before=rec.not_before if rec is not None else None,
            retries_left=max(0, retry.on_infrastructure_failure - self._used(job)),
            reschedule_on_loss=job.obj.spec.placement.reschedule == "OnClusterLoss",
            has_finalizer=FINALIZER in job.obj.metadata.finalizers,
            # only rule 3 (finished) asks
            reserved=terminal and self._reservations.held(job.uid) is not None,
            queue=queue,
        )

    # --- the steps ---------------------------------------------------------------------------------

    async def _apply(self, job: JobState, step: lc.Step | lc.AddFinalizer) -> None:
        match step:
            case lc.DeleteCopy(fenced=fenced):
                rec = job.record
                assert rec is not None
                assert rec.cluster is not None
                if rec.stopping is not None:
                    log.info(
                        "hub.requeue.stopping",
                        job=job.key,
                        cluster=rec.cluster,
                        cause=rec.stopping.kind,
                        by=rec.stopping.by or None,
                    )
                await self._dispatch.ensure_delete(rec.cluster, job.uid, fenced=fenced)
            case lc.Forget():
                if job.record is not None:
                    await self._term.store.forget_job(job.uid)
                    job.record = None
                self._reservations.release(job.uid, "job deleted")
                await self._finalizers.drop_finalizer(job)
            case lc.Requeue():
                await self._requeue(job)
            case lc.Release():
                self._reservations.release(job.uid, f"the job {job.status.phase.lower()}")
            case lc.Lose(reschedule=reschedule):
                await self._lose(job, reschedule)
            case lc.FailRefused():
                self._fail_refused(job)
            case lc.FailTimeLimit():
                self._fail_time_limit(job)
            case lc.MarkSuspects():
                self._mark_suspects(job)
            case lc.StopForRerun():
                await self._stop_for_rerun(job)
            case lc.FailForGood():
                self._fail_for_good(job)
            case lc.Want():
                self._timers.pop(job.uid, None)
                if job.status.next_attempt_at is not None:
                    self._mirror.set_status(
                        job, job.status.model_copy(update={"next_attempt_at": None})
                    )
                self._term.state.want(job.uid)
            case lc.WaitUntil(at=at):
                self._timers[job.uid] = at
                self._term.state.wanted.discard(job.uid)
            case lc.Enqueue() | lc.WaitFor() | lc.FailInvalid():
                self._admission(job, step)
            case lc.AddFinalizer():
                # Off the placement path: a job deleted before its finalizer landed is cleaned
                # up from its etcd record (DELETED event, or the orphan sweep after a restart).
                if job.uid not in self._adding:
                    self._adding.add(job.uid)
                    self._term.spawn(self._add_finalizer(job.uid))

    def _admission(self, job: JobState, step: lc.Enqueue | lc.WaitFor | lc.FailInvalid) -> bool:
        """Carry out a step of rule 7 in a scheduling cycle; True when the job is in its
        queue."""
        match step:
            case lc.Enqueue(queue=queue, priority=priority, preemption_policy=policy):
                assert job.request is not None
                update: dict[str, object] = {
                    "queue": queue,
                    "priority": priority,
                    "preemption_policy": policy,
                }
                if any(getattr(job.request, k) != v for k, v in update.items()):
                    job.request = job.request.model_copy(update=update)
                return True
            case lc.WaitFor(reason=reason, message=message, warning=warning):
                self._mirror.waiting(
                    job, reason, message, event_type="Warning" if warning else "Normal"
                )
            case lc.FailInvalid(field=field, message=message):
                if not message.startswith(f"{field}: "):
                    message = f"{field}: {message}"
                job.request = None
                job.error, job.error_field = message, field
                self._reservations.release(job.uid, "the job is invalid")  # a hold, if any
                self._mirror.invalid(job, field, message)
        return False

    async def _add_finalizer(self, uid: str) -> None:
        try:
            await self._finalizers.add_finalizer(uid)
        finally:
            self._adding.discard(uid)

    async def _put(self, job: JobState, new: JobRecord) -> None:
        assert job.record_rev is not None
        job.record_rev = await self._term.store.put_job(new, expect_revision=job.record_rev)
        job.record = new

    async def _requeue(self, job: JobState) -> None:
        rec = job.record
        assert rec is not None
        assert rec.stopping is not None
        cause = rec.stopping
        cfg = self._term.config
        self._mark_unconfirmed(job, rec.cluster)
        new = lc.requeued(
            rec,
            now=self._term.wall(),
            base_s=cfg.rerun_backoff_base_s,
            max_s=cfg.rerun_backoff_max_s,
        )
        await self._put(job, new)
        job.failure = None
        self._term.metrics.requeues.labels(cause.kind).inc()
        self._reservations.release(job.uid, f"requeued: {cause.kind}")
        job.last_unschedulable = None
        status = lc.requeued_status(job.status, cause, record=new, now=self._mirror.now())
        self._mirror.set_status(job, status)
        self._mirror.event(job, "Warning", cause.reason, cause.message)
        log.info(
            "hub.requeue.done",
            job=job.key,
            cluster=cause.cluster,
            cause=cause.kind,
            attempt=rec.attempt,
            not_before=new.not_before,
        )
        await self.reconcile_locked(job)  # placed again now, or after its backoff

    def _fail_time_limit(self, job: JobState) -> None:
        limit = job.obj.spec.placement.time_limit_seconds or 0
        new = lc.time_limit_exceeded(job.status, limit_s=limit, now=self._mirror.now())
        self._mirror.set_status(job, new)
        self._mirror.event(job, "Warning", "TimeLimitExceeded", new.message)
        self._reservations.release(job.uid, "the job reached its time limit")
        self._timers.pop(job.uid, None)
        log.info("hub.job.time_limit", job=job.key, limit_s=limit)

    def refusal(self, ws: WorkState) -> str | None:
        """Why the member refused this Apply for good (:func:`lc.refusal`); None while not."""
        return lc.refusal(ws.ack, ws.revision, ws.failures, self._term.config.apply_retry_limit)

    def _fail_refused(self, job: JobState) -> None:
        rec = job.record
        assert rec is not None
        assert rec.cluster is not None
        ws = self._term.state.work[(rec.cluster, job.uid)]
        message = self.refusal(ws) or ""
        self._mirror.set_status(
            job, st.member_refused(job.status, message=message, now=self._mirror.now())
        )
        self._mirror.event(job, "Warning", "MemberRejected", message)
        self._reservations.release(job.uid, "the member refused the job")

    async def _lose(self, job: JobState, reschedule: bool) -> None:
        rec = job.record
        assert rec is not None
        assert rec.cluster is not None
        cluster = rec.cluster
        m = self._term.state.member(cluster)
        lost_for = silence(
            now=self._term.mono(), last_heard=m.last_heard, hub_start=self._term.started
        )
        self._reservations.release(job.uid, "the member was lost")
        if reschedule:
            await self._put(job, rec.model_copy(update={"cluster": None}))
            await self._dispatch.ensure_delete(cluster, job.uid, fenced=True)
            job.last_unschedulable = None
            self._term.state.want(job.uid)
        self._mirror.set_status(
            job,
            st.cluster_lost(
                job.status,
                cluster=cluster,
                rescheduled=reschedule,
                lost_for_s=lost_for,
                now=self._mirror.now(),
                deleted=m.spec is None,
            ),
        )
        self._mirror.event(job, "Warning", "ClusterLost", job.status.message)
        log.warning(
            "job.lost",
            job=job.key,
            cluster=cluster,
            rescheduled=reschedule,
            deleted=m.spec is None,
        )

    def _mark_suspects(self, job: JobState) -> None:
        assert job.failure is not None
        cluster, cause = job.failure
        marked = self.suspects.mark_failure(
            self._term.state.member(cluster),
            cause,
            job.key,
            mono=self._term.mono(),
            wall=self._term.wall(),
        )
        log.warning(
            "hub.restart.infrastructure_failure",
            job=job.key,
            cluster=cluster,
            reason=cause.reason,
            nodes=list(cause.nodes),
            suspect=marked,
            used=self._used(job),
            allowed=lc.retry_of(job.obj).on_infrastructure_failure,
        )

    def _mark_unconfirmed(self, job: JobState, cluster: str | None) -> None:
        """The old copy's pods left on nodes that are not Ready do not hold the re-run back;
        those nodes become suspect and their GPUs stay counted as used by the inventory."""
        m = self._term.state.members.get(cluster) if cluster is not None else None
        if m is None or m.lost:
            return
        nodes, marked = self.suspects.mark_unconfirmed(
            m, job.uid, job.key, mono=self._term.mono(), wall=self._term.wall()
        )
        if nodes:
            log.warning(
                "hub.requeue.unconfirmed_pods",
                job=job.key,
                cluster=m.name,
                nodes=nodes,
                suspect=marked,
            )

    async def _persist_marks(self, cluster: str) -> None:
        """Write the member's meta record (its suspect marks) now, before the re-run decision
        is stored: a leader that dies right after that decision must not leave the next one a
        re-run without the marks (it would place it on the broken node again). The flush loop
        writes any later change."""
        m = self._term.state.members.get(cluster)
        if m is not None and m.meta_dirty:
            await self._term.persist_meta(m)

    def _used(self, job: JobState) -> int:
        return job.record.budget_used if job.record is not None else 0

    async def _stop_for_rerun(self, job: JobState) -> None:
        rec = job.record
        assert rec is not None
        assert rec.cluster is not None
        assert job.failure is not None
        cluster, failure = job.failure
        retry = lc.retry_of(job.obj)
        cause = RequeueCause(
            kind=lc.INFRASTRUCTURE_FAILURE,
            reason=failure.reason,
            message=(
                f"infrastructure failure in {cluster}: {failure.message or failure.reason}; "
                + (
                    "re-run without using the budget (the member's own disruption)"
                    if failure.reason in lc.NO_BUDGET_REASONS
                    else f"re-run {self._used(job) + 1} of {retry.on_infrastructure_failure}"
                )
            )[:1024],
            at=self._term.wall(),
            cluster=cluster,
            nodes=failure.nodes,
        )
        await self._persist_marks(cluster)
        await self._put(job, lc.marked(rec, cause))
        job.failure = None
        self._mirror.set_status(job, lc.restarting(job.status, cause, now=self._mirror.now()))
        self._mirror.event(job, "Warning", "Restarting", cause.message)
        # The mark is durable: the copy's Delete follows (rule 2), now or after a restart.
        await self.reconcile_locked(job)

    def _fail_for_good(self, job: JobState) -> None:
        assert job.failure is not None
        cluster, cause = job.failure
        job.failure = None
        new = lc.infrastructure_failed(
            job.status, cause, cluster=cluster, used=self._used(job), now=self._mirror.now()
        )
        self._mirror.set_status(job, new)
        self._mirror.event(job, "Warning", lc.INFRASTRUCTURE_FAILURE, new.message)
        self._reservations.release(job.uid, "the job failed: no re-run left")


def _unready_hold(stop: RequeueCause, retry: Retry) -> float | None:
    """Until when (wall seconds) the stopped copy's pods on nodes that are not Ready still hold
    the job's next attempt back; None: they do not.

    Such pods may never be confirmed gone (their kubelet is unreachable), but that kubelet may
    still be running them: a node NotReady for a few seconds (a member API server that was
    down, a network blip) is not a dead node (found by the chaos soak: a job preempted 16 s
    after its node went NotReady ran 8.7 s in two members at once). So they hold a preempted
    job back for the job's ``nodeNotReadySeconds`` from the preemption (the time after which a
    node that stays not Ready is an infrastructure failure anyway), for ever when the job asks
    for confirmed termination, and not at all when the copy is stopped for an infrastructure
    failure (its nodes were judged gone already)."""
    if retry.require_confirmed_termination:
        return float("inf")
    if stop.kind != "Preempted":
        return None
    return stop.at + retry.node_not_ready_seconds
