"""Scheduling: the cycle that places waiting GPUJobs, and the commit of each placement.

A cycle (:meth:`Scheduler.cycle`) runs soon after anything that may let a job fit changes
(a job arrives, an inventory or a member's health changes, a reservation ends: :meth:`kick`);
a burst of changes becomes one cycle. Its phases read, then decide, then act:

1. expire reservations whose pods never showed up (a preemptor's hold lasts while its victims
   stop: :meth:`HubState.stopping_for <gpufed.hub.components.term.HubState.stopping_for>`);
2. read the queue: the jobs that still want placement, each in its GPUQueue
   (:mod:`gpufed.hub.components.queues`) at its PriorityClass's value
   (:mod:`gpufed.hub.rules.admission`), and the quota ledger rebuilt from the placements;
   whether a job goes in, waits with a reason or fails is the lifecycle's rule 7, with this
   cycle's view of its queue and priority as a fact (:meth:`Lifecycle.admit`: a
   ``spec.placement.queue`` naming another queue or a class above the queue's ``maxPriority``
   fails it; a class that does not exist, or with ``--unlisted-namespaces reject`` a namespace
   no GPUQueue lists, keeps it Pending); no cycle places anything before the term's first
   GPUQueue and PriorityClass lists;
3. decide: placement's queue pass (:func:`gpufed.placement.schedule_pass`: fair-share order
   between queues, then :func:`gpufed.placement.pass_key`: priority, jobs past the starvation
   age oldest first, the others fewer GPUs first; backfill holds) calls the pure ``place()``
   on the long-lived :class:`~gpufed.placement.FleetSnapshot` with the job's ``Quota`` filter;
   a ``Placed`` decision is reserved at once as a tentative reservation and charged to its
   queue, so later jobs of the same pass see its GPUs and its quota taken;
   a job that holds a preemption hold sees its own hold lifted for its own attempt
   (:meth:`gpufed.hub.components.reservations.Reservations.lifted`), so it is placed on the GPUs its
   victims freed once the member reports them free, and nobody else is (it is always tried
   itself, never answered with the refusal of a job of its shape);
4. preempt (:mod:`gpufed.hub.components.preemption`): the jobs left Unschedulable that may preempt get
   their plans, each committed (the preemptor's hold and the victims' marks, one etcd
   transaction) before the victims' copies are deleted (:mod:`gpufed.hub.components.lifecycle`);
   skipped when the pass placed every job;
5. act: each placed job is committed (:meth:`Scheduler._commit`): its job record (with its
   queue and charge), work item and reservation are written in ONE etcd transaction
   (:meth:`gpufed.hub.adapters.store.Store.place`) before anything is sent, then it is dispatched; the
   others get their "not placed" status (a quota's refusal in its words; a preemptor's what
   it preempts or why it preempts nothing); a preemptor not placed on its hold once its
   victims are gone lets the hold go
   (:meth:`gpufed.hub.components.reservations.Reservations.let_go`);
6. the GPUQueues' status and gauges, from the ledger rebuilt from what etcd now holds.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from functools import partial

import structlog

from gpufed.api.decision import Decision, Outcome, Reservation
from gpufed.api.errors import FieldError
from gpufed.api.gpujob import Retry
from gpufed.api.labels import HOSTNAME_LABEL
from gpufed.api.request import PlacementRequest
from gpufed.hub.adapters.store import ConflictError
from gpufed.hub.components.backfill import hold_avoiding, hold_start
from gpufed.hub.components.dispatch import Dispatch
from gpufed.hub.components.lifecycle import Lifecycle
from gpufed.hub.components.mirror import Mirror
from gpufed.hub.components.preemption import Preemption
from gpufed.hub.components.queues import Queues
from gpufed.hub.components.reservations import Reservations, with_suspects
from gpufed.hub.components.term import JobState, Term, WorkState
from gpufed.hub.rules import status as st
from gpufed.hub.rules.records import JobRecord, WorkRecord
from gpufed.placement import (
    FleetSnapshot,
    Hold,
    Policy,
    hold_for,
    place,
    schedule_pass,
)
from gpufed.placement.fairshare import fair_sorted
from gpufed.placement.holds import whole_free_nodes
from gpufed.placement.preemption import NoPreemption, PreemptionPlan, QuotaView
from gpufed.placement.queue import pass_key, queued_fit_key
from gpufed.placement.quota import demand_of
from gpufed.placement.recent import recent_could_hold
from gpufed.sync.computedomain import compute_domain_of
from gpufed.sync.manifests import PodSetPinning, prepare_manifests

log = structlog.get_logger("gpufed.hub.components.scheduling")

#: Minimum pause between two scheduling cycles (a burst of changes becomes one cycle).
CYCLE_DEBOUNCE_S = 0.005
#: Jobs whose "not final because of recently seen nodes" answer is cached (oldest go first).
_MAX_RECENT_WHY = 4096
#: Seconds a cached answer stands while nothing changes (remembered nodes expire meanwhile).
_RECENT_WHY_S = 60.0


def _why(answer: NoPreemption) -> str:
    """Why nothing is preempted: the reason, then the first members' own reasons."""
    members = sorted(answer.members.items())
    if not members:
        return answer.reason
    shown = "; ".join(f"{c}: {why}" for c, why in members[:3])
    more = f"; and {len(members) - 3} more members" if len(members) > 3 else ""
    return f"{answer.reason} ({shown}{more})"


class Scheduler:
    """The scheduling loop of one leader term (see the module docstring)."""

    def __init__(
        self,
        term: Term,
        snapshot: FleetSnapshot,
        reservations: Reservations,
        dispatch: Dispatch,
        mirror: Mirror,
        queues: Queues,
        lifecycle: Lifecycle,
    ) -> None:
        self._term = term
        self._lifecycle = lifecycle
        self._suspects = lifecycle.suspects
        self._preemption = Preemption(term, snapshot, reservations, lifecycle, mirror)
        self._queues = queues
        self._snapshot = snapshot
        #: job uid -> ((snapshot generation, remembered nodes version), why not final)
        self._recent_why: dict[str, tuple[tuple[int, int, int], str | None]] = {}
        self._reservations = reservations
        self._dispatch = dispatch
        self._mirror = mirror
        self._policy = Policy(
            allocation=term.config.allocation,
            reservation_ttl_s=term.config.reservation_ttl_s,
        )
        self._backfill = term.config.backfill_rule
        #: the last pass's backfill holds, by holder (BackfillRule.carry_holds)
        self._carried: list[tuple[PlacementRequest, Hold]] = []

    async def run(self) -> None:
        """Run a cycle each time one is due (:meth:`HubState.kick`, :meth:`HubState.want`),
        forever."""
        due = self._term.state.cycle_due
        while True:
            await due.wait()
            await asyncio.sleep(CYCLE_DEBOUNCE_S)
            due.clear()
            self._term.metrics.scheduling_cycles.inc()
            await self.cycle()

    async def refresh_preemption(self) -> None:
        """Between cycles: the kept running jobs preemption plans from, brought up to date
        (:meth:`Preemption.refresh <gpufed.hub.components.preemption.Preemption.refresh>`)."""
        await self._preemption.refresh()

    def refresh_preemption_soon(self) -> None:
        """:meth:`refresh_preemption` in the background (the term's status loop)."""
        self._preemption.refresh_soon()

    async def cycle(self) -> None:
        """One scheduling pass over every waiting job (numbered phases: module docstring)."""
        now = self._term.wall()
        # 1. drop reservations whose pods never showed up (a preemptor's hold lasts while its
        #    victims stop)
        await self._reservations.expire(now, keep=self._term.state.stopping_for())
        queues = self._queues
        if not queues.synced.is_set() or not self._term.state.priorities.synced.is_set():
            # Nothing is admitted before this term knows the quotas and the PriorityClasses
            # (each first list kicks again).
            return
        # 2. the queue: each waiting job in its GPUQueue; the quota ledger from the placements
        #    and the waiting preemptors' holds
        holds = self._reservations.hold_charges(self._term.state.wanted)
        queues.rebuild_usage(holds=holds, recount=False)  # the status loop recounts
        shares = queues.observe(now)
        waiting = []
        wanted = self._term.state.wanted
        for uid in list(wanted):
            job = self._term.state.jobs.get(uid)
            if job is None or not job.wants_placement or job.backing_off(now):
                wanted.discard(uid)  # a job in backoff comes back from the lifecycle
            elif self._lifecycle.admit(job, queues.view(job)):  # rule 7, with the view
                waiting.append(job)
        self._term.metrics.queue_depth.set(len(waiting))
        if not waiting:
            queues.publish(shares, recount=False)
            return
        gate = queues.gate()
        requests = fair_sorted(
            (j.request for j in waiting if j.request is not None),
            queues.tree,
            shares,
            pass_key(now, self._backfill),
        )
        reservations: dict[str, Reservation] = {}
        charges: dict[str, tuple[str, dict[str, int]]] = {}
        # Small fleets: record every member's score or rejection for `gpufed explain`.
        explain = len(self._snapshot.cluster_names) <= self._term.config.explain_members

        # Suspect nodes (after an infrastructure failure) are held off every job this cycle.
        suspect = self._suspects.holds(self._term.mono())

        def attempt(req: PlacementRequest, hold: Mapping[str, Hold]) -> Decision:
            t0 = time.perf_counter()
            if suspect:
                hold = with_suspects(dict(hold), suspect)
            # A waiting job's own ledger entry and quota charge are its preemption hold: not
            # counted against it.
            with self._reservations.lifted(req.uid), gate.lifted(req.uid):
                decision = place(
                    req,
                    self._snapshot,
                    self._policy,
                    now,
                    hold=hold,
                    explain=explain,
                    quota=gate.for_request(req),
                )
                if decision.outcome == Outcome.PLACED:
                    reservations[req.uid] = self._reservations.reserve(decision, now)
            self._term.metrics.placement_seconds.observe(time.perf_counter() - t0)
            if decision.outcome == Outcome.PLACED:
                # charged now: later jobs of this pass see the quota taken
                gate.charge(req, decision.gpu_product)
                charges[req.uid] = (gate.queue(req), demand_of(req, decision.gpu_product))
            return decision

        # A preemptor's own attempt lifts its hold and its quota charge: another job's refusal
        # says nothing about it, nor its refusal about another (issue 26: a preemptor answered
        # with the refusal of a job of its shape left its held node idle for minutes).
        holders = {uid for uid, _ in holds}

        def key_of(req: PlacementRequest) -> object:
            return ("holder", req.uid) if req.uid in holders else queued_fit_key(req)

        # 3. decide: placement's queue pass (fair-share order, backfill holds, quota admission,
        #    place + tentative reserve and charge)
        result = schedule_pass(
            requests,
            now,
            attempt,
            lambda r: hold_for(r, self._snapshot, self._policy, gate.for_request(r)),
            self._backfill,
            presorted=True,
            key_of=key_of,
            # bound, not built: backfill.py is entered only when the pass weighs a hold
            hold_start=partial(hold_start, self._snapshot, self._term.state.jobs, now),
            hold_avoiding=partial(hold_avoiding, self._snapshot, self._policy, gate)
            if self._backfill.holds_per_shape > 1
            else None,
            carry=self._carried,
            # the whole free nodes, read once at the pass's start (within it nodes only fill up)
            spare=whole_free_nodes(self._snapshot)
            if self._backfill.spare_whole_nodes_s > 0
            else None,
        )
        self._carried = result.taken
        # 4. preempt for the jobs left Unschedulable that may (commit first, then delete); a
        #    pass that placed every job has nothing to answer (preemption.py not entered)
        answers: dict[str, PreemptionPlan | NoPreemption] = {}
        if any(d.outcome != Outcome.PLACED for _, d in result.decisions):
            answers = await self._preemption.run(
                result.decisions,
                self._policy,
                # the usage to come (stopping victims gone): reclaim never takes more than is
                # borrowed; admission (the gate) still counts the victims until they are gone
                QuotaView(gate.tree, queues.planning_usage) if gate.enforce else None,
                now,
            )
        # 5. act: commit placed jobs (etcd first, then dispatch); report the rest
        commits = []
        for req, decision in result.decisions:
            self._term.metrics.decisions.labels(decision.outcome.value).inc()
            job = self._term.state.jobs.get(req.uid)
            if decision.outcome == Outcome.PLACED:
                commits.append(
                    self._commit(req.uid, decision, reservations[req.uid], charges[req.uid])
                )
            elif job is not None:
                answer = answers.get(req.uid)
                if isinstance(answer, PreemptionPlan):
                    continue  # its status says what it preempts
                if req.uid in holders:
                    stopping = bool(self._preemption.victims_of(req.uid))
                    decision = self._reservations.let_go(
                        job.key, decision, victims_stopping=stopping
                    )
                self._not_placed(job, decision, answer)
        if commits:
            await asyncio.gather(*commits)
            # A placed job leaves the wanted set now, not at the next cycle's walk over it:
            # every cycle, and the queue counts and hold charges read from that set, then cost
            # what changed since, not the jobs placed before (issue 25: a cycle after placing
            # 500,000 jobs walked them all three times).
            for req, decision in result.decisions:
                if decision.outcome == Outcome.PLACED:
                    placed = self._term.state.jobs.get(req.uid)
                    if placed is None or not placed.wants_placement:
                        wanted.discard(req.uid)
        # 6. the queues' status, from the placements etcd now holds
        queues.rebuild_usage(
            holds=self._reservations.hold_charges(self._term.state.wanted), recount=False
        )
        queues.publish(shares, recount=False)

    def _not_placed(
        self, job: JobState, decision: Decision, preemption: NoPreemption | None = None
    ) -> None:
        """Write why ``job`` was not placed (once per answer): the decision's reason, what its
        earlier preemption still waits for, or why it preempts nothing."""
        still = self._preemption.waiting_message(job.uid)
        if still is not None:
            self._mirror.waiting(job, "Preempting", still)
            return
        if preemption is not None and decision.outcome == Outcome.UNSCHEDULABLE:
            decision = decision.model_copy(
                update={"message": f"{decision.message}; preempting nothing: {_why(preemption)}"}
            )
        if decision.outcome == Outcome.REJECTED and (why := self._not_final(job)) is not None:
            decision = decision.model_copy(
                update={"outcome": Outcome.UNSCHEDULABLE, "message": f"{decision.message} ({why})"}
            )
        sig = (decision.outcome, decision.message, decision.rejections)
        if sig == job.last_unschedulable:
            return
        job.last_unschedulable = sig
        self._show(job, decision, placement_ms=None)
        reason = "Rejected" if decision.outcome == Outcome.REJECTED else "Unschedulable"
        if reason != job.last_warning:
            # One Warning per reason change: a waiting job's message changes with the fleet.
            job.last_warning = reason
            self._mirror.event(job, "Warning", reason, decision.message)
        if reason == "Rejected":
            log.info("placement.rejected", job=job.key, reason=decision.message)
        else:
            log.info("placement.unschedulable", job=job.key, reason=decision.message)

    def _not_final(self, job: JobState) -> str | None:
        """Why "no member could ever hold the job" is not final for ``job`` now (None when it
        is: the job fails). It is not while a member has not reported its inventory yet, while
        a member is not Ready (its nodes may come back: a stopped API server, NotReady nodes),
        and never for a job that was placed before (a re-run, a requeue): it fitted the fleet
        once, so a node or member that is gone for now makes it wait, not fail (found by the
        chaos soak: re-runs failed for good while the only node of their shape was deleted);
        nor while the nodes that left or shrank within the hour could hold it with the present
        ones (:mod:`gpufed.placement.recent`: new jobs of a shape whose nodes are away for a
        while wait for them; a shape no member had within the hour still fails at once)."""
        state = self._term.state
        if not state.fleet_complete():
            waiting = state.awaiting_inventory()
            return "waiting for member inventories: " + (
                ", ".join(waiting) or "no member cluster registered yet"
            )
        down = sorted(m.name for m in state.registered_members() if m.health != "Ready")
        if down:
            return f"waiting: member {', '.join(down)} not Ready may hold it when it comes back"
        if job.record is not None:
            return "waiting: it was placed before, so the fleet may hold it again"
        recent = self._snapshot.recent
        if recent is None or job.request is None:
            return None
        # nodes that left or shrank within the hour may come back (issue 26); judged again
        # only when the fleet or the remembered nodes changed
        key = (
            self._snapshot.generation,
            recent.version,
            int(self._term.mono() // _RECENT_WHY_S),
        )
        cached = self._recent_why.get(job.uid)
        if cached is None or cached[0] != key:
            why = recent_could_hold(
                job.request, self._snapshot, recent, self._policy, self._term.wall()
            )
            cached = self._recent_why[job.uid] = (key, why)
            if len(self._recent_why) > _MAX_RECENT_WHY:
                self._recent_why.pop(next(iter(self._recent_why)))
        return cached[1]

    def _show(
        self,
        job: JobState,
        decision: Decision,
        *,
        placement_ms: float | None,
        attempt: int | None = None,
    ) -> None:
        """Write the decision into the job's status (``placement_ms``: intake to decision, on
        the first placement only)."""
        assert job.request is not None
        self._mirror.set_status(
            job,
            st.decided(
                job.status,
                decision,
                gpus=job.request.gpus,
                placement_ms=placement_ms,
                now=self._mirror.now(),
                attempt=attempt,
            ),
        )

    def pinning(self, decision: Decision) -> dict[str, PodSetPinning]:
        """Where each pod set goes: nodes, their hostnames, the NVLink domains."""
        assert decision.cluster is not None
        member = self._term.state.members.get(decision.cluster)
        known = member.nodes if member is not None else {}
        return {
            ps.name: PodSetPinning(
                nodes=tuple(sorted(ps.nodes)),
                hostnames={
                    n: known[n].labels.get(HOSTNAME_LABEL, n) for n in ps.nodes if n in known
                },
                nvlink_domains=decision.nvlink_domains,
            )
            for ps in decision.pod_sets
        }

    async def _commit(
        self,
        uid: str,
        decision: Decision,
        res: Reservation,
        charge: tuple[str, dict[str, int]],
    ) -> None:
        """Write the placement (one etcd transaction; the job record names the queue and what
        it charges there: ``charge``), then dispatch and report it."""
        async with self._term.state.lock(uid):
            job = self._term.state.jobs.get(uid)
            if job is None or not job.wants_placement or decision.cluster is None:
                self._reservations.discard(uid, "the job no longer wants placement")
                return
            cluster = decision.cluster
            ns = job.obj.metadata.namespace or "default"
            attempt_no = (job.record.attempt + 1) if job.record is not None else 1
            try:
                manifests = prepare_manifests(
                    job.obj.spec.template,
                    job_uid=uid,
                    job_name=job.obj.metadata.name,
                    namespace=ns,
                    origin=self._term.config.origin,
                    pinning=self.pinning(decision),
                    allowed_kinds=self._term.config.allowed_kinds,
                    attempt=attempt_no,
                    node_not_ready_s=(
                        job.obj.spec.placement.retry or Retry()
                    ).node_not_ready_seconds,
                    compute_domain=compute_domain_of(decision),
                    time_limit_s=job.obj.spec.placement.time_limit_seconds,
                )
            except FieldError as exc:  # pragma: no cover - validated at intake
                self._reservations.discard(uid, "its manifests are invalid")
                self._mirror.set_status(
                    job,
                    st.invalid(
                        job.status, field=exc.field, message=str(exc), now=self._mirror.now()
                    ),
                )
                return
            assert job.request is not None
            now = self._term.wall()
            record = JobRecord(
                uid=uid,
                job=job.key,
                cluster=cluster,
                attempt=attempt_no,
                placed_at=now,
                gpus=job.request.gpus,
                queue=charge[0],
                charged=charge[1],
                priority=job.request.priority,
                preemption_policy=job.request.preemption_policy,
                # A re-placement keeps the job's past requeues: the retry budget after
                # infrastructure failures and the preemption caps count across attempts.
                requeues=job.record.requeues if job.record is not None else (),
                requeue_counts=dict(job.record.requeue_counts) if job.record is not None else {},
                budget_used=job.record.budget_used if job.record is not None else 0,
            )
            work = WorkRecord(
                job_uid=uid,
                job=job.key,
                namespace=ns,
                op="Apply",
                manifests=tuple(manifests),
                created_at=now,
                pod_security=job.pod_security,
            )
            expect = job.record_rev if job.record is not None else None
            try:
                rev, job_rev = await self._term.store.place(
                    record, work, res.model_dump_json(), expect_job_revision=expect
                )
            except ConflictError:
                got = await self._term.store.get_job(uid)
                if got is None or got[0].cluster != cluster or got[0].attempt != attempt_no:
                    # Someone else placed it: adopt what etcd says.
                    self._reservations.discard(uid, "placed by another leader")
                    if got is not None:
                        job.record, job.record_rev = got
                    log.warning("placement.conflict", job=job.key)
                    return
                stored = await self._term.store.get_work(cluster, uid)
                assert stored is not None
                rev, job_rev = stored[1], got[1]  # our own write committed; the reply was lost
            self._reservations.confirm(uid)
            job.record, job.record_rev = record, job_rev
            self._term.state.work[(cluster, uid)] = WorkState(cluster, work, rev)
            job.decided_mono = self._term.mono()
            placement_s = job.decided_mono - job.seen_mono
            if attempt_no == 1:
                self._term.metrics.placement_latency_seconds.observe(placement_s)
            first = attempt_no == 1
            self._show(
                job,
                decision,
                placement_ms=round(placement_s * 1000, 3) if first else None,
                attempt=attempt_no,
            )
            log.info(
                "placement.decided",
                job=job.key,
                cluster=cluster,
                domains=list(decision.nvlink_domains[:8]),
                score=decision.score,
                revision=rev,
                attempt=attempt_no,
            )
            job.last_warning = None
            self._mirror.event(job, "Normal", "Placed", f"placed on {cluster}: {decision.message}")
            self._dispatch.enqueue(cluster, uid)
