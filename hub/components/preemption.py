"""Preemption at the hub: which waiting jobs may preempt, the running jobs they may preempt,
and carrying each plan out (docs/design.md §7 item 9, docs/hub.md "Preemption").

Called once per scheduling cycle (:meth:`gpufed.hub.components.scheduling.Scheduler.cycle`, phase 4)
with the jobs ``place()`` left Unschedulable. The rules are placement's, pure and shared with
the simulator (:class:`gpufed.placement.PreemptionCycle`, docs/placement.md "Preemption");
this module feeds them and acts on their answer:

1. **preemptors**: jobs left Unschedulable whose PriorityClass says ``PreemptLowerPriority``,
   that hold no preemption hold yet and have no victim still being stopped for them (so a job
   never preempts twice for one placement), above the lowest running priority (unless quotas
   may be reclaimed), in queue order; at most ``preemption_max_preemptors`` are planned a
   cycle, once a job of one priority and shape finds no plan the others of that shape are not
   planned in that cycle (they would get the same answer), and a job that found no plan is
   planned again only after :data:`NO_PLAN_RETRY_S` (a full fleet is not searched in every
   cycle);
2. **running**: every job whose record places it in a member (not being stopped, not
   finished), with its priority and queue from the record, the GPUs it holds per node (the
   member's ``job_requests``, else its reservation), its start (the first Applied ack, else
   the placement), its submit time (the request's ``submitted_at``, for ``withinQueue:
   LowerOrNewerEqualPriority``), ``status.lastCheckpointTime``,
   ``spec.checkpoint.intervalSeconds`` and its past preemptions (``JobRecord.requeues``, for the hourly cap and no cycles);
   kept across cycles with their index by block, read again only for the jobs that changed
   (:mod:`gpufed.hub.components.running`);
3. **plan**: one :class:`~gpufed.placement.PreemptionCycle` for all of them, in order (a
   later plan never counts GPUs an earlier one freed);
4. **commit**, per plan, in ONE etcd transaction before anything is deleted
   (:meth:`gpufed.hub.adapters.ports.StateStore.preempt`): the preemptor's hold (a reservation of
   exactly the plan's decision: no other job takes the freed GPUs) and each victim's record
   marked ``stopping`` (by whom, when, the cost); a victim whose record changed meanwhile
   drops the whole plan (nothing written). Then memory follows: the hold enters the ledger,
   metrics, Events, the preemptor's ``status.preemption``;
5. **stop**: each victim's member copy is deleted gracefully (:mod:`gpufed.hub.components.lifecycle`),
   which returns it to Pending once its copy is gone.

The preemptor is placed by the normal cycle once the member reports the freed GPUs free: its
placement attempt lifts its own hold (:meth:`gpufed.hub.components.reservations.Reservations.lifted`),
so it never sees the victims' GPUs while their pods still run, and the node is never
promised twice. A hub killed between 4 and 5 resumes 5 from the records.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from typing import Any

import structlog

from gpufed.api.decision import Decision, Outcome, Reservation
from gpufed.api.gpujob import PreemptionStatus, PreemptionVictim
from gpufed.api.labels import GPU_RESOURCE
from gpufed.api.request import PlacementRequest
from gpufed.hub.adapters.store import ConflictError
from gpufed.hub.components.lifecycle import Lifecycle
from gpufed.hub.components.mirror import Mirror
from gpufed.hub.components.reservations import Reservations
from gpufed.hub.components.running import RunningJobs, events
from gpufed.hub.components.term import JobState, Term
from gpufed.hub.rules import status as st
from gpufed.hub.rules.lifecycle import marked
from gpufed.hub.rules.records import MAX_CAUSE_NODES, JobRecord, RequeueCause
from gpufed.placement import FleetSnapshot, Policy
from gpufed.placement.preemptcycle import PreemptionCycle
from gpufed.placement.preemption import (
    NoPreemption,
    PreemptionPlan,
    Preemptor,
    QuotaView,
    Running,
    Victim,
)
from gpufed.placement.queue import queued_fit_key

log = structlog.get_logger("gpufed.hub.components.preemption")

#: Seconds before a job whose preemption plan found nothing is planned again (monotonic).
NO_PLAN_RETRY_S = 30.0

#: Nodes named in a victim's condition message (the rest are counted).
_NODES_SHOWN = 8


def _names(items: Sequence[str]) -> str:
    shown = ", ".join(items[:_NODES_SHOWN])
    return shown + (f" and {len(items) - _NODES_SHOWN} more" if len(items) > _NODES_SHOWN else "")


class Preemption:
    """Preemption for one leader term (see the module docstring)."""

    def __init__(
        self,
        term: Term,
        snapshot: FleetSnapshot,
        reservations: Reservations,
        lifecycle: Lifecycle,
        mirror: Mirror,
    ) -> None:
        self._term = term
        self._snapshot = snapshot
        self._reservations = reservations
        self._lifecycle = lifecycle
        self._mirror = mirror
        #: job uid -> monotonic time before which a job whose plan found nothing is not
        #: planned again (a full fleet would otherwise be searched in every cycle)
        self._no_plan_until: dict[str, tuple[float, NoPreemption]] = {}
        #: the running jobs and their index, kept across cycles (read by the planning worker)
        self._running = RunningJobs(term, snapshot)
        #: one worker at a time changes or reads them (a cycle's planning, the refresh)
        self._running_lock = asyncio.Lock()
        self._refreshing = False

    # --- 1. preemptors ----------------------------------------------------------------------------

    def victims_of(self, uid: str) -> list[JobState]:
        """The jobs being stopped now for preemptor ``uid``."""
        return [
            j
            for j in self._term.state.stopping()
            if j.record is not None
            and j.record.stopping is not None
            and j.record.stopping.by_uid == uid
        ]

    def preemptors(self, decisions: Sequence[tuple[PlacementRequest, Decision]]) -> list[Preemptor]:
        """The jobs of this pass that may preempt now (in the pass's order); not those whose
        last plan found nothing less than :data:`NO_PLAN_RETRY_S` ago."""
        if not self._term.config.preemption:
            return []
        mono = self._term.mono()
        self._no_plan_until = {u: v for u, v in self._no_plan_until.items() if v[0] > mono}
        stopping_for = self._term.state.stopping_for()
        out: list[Preemptor] = []
        for req, decision in decisions:
            if decision.outcome != Outcome.UNSCHEDULABLE:
                continue
            if req.preemption_policy != "PreemptLowerPriority":
                continue
            job = self._term.state.jobs.get(req.uid)
            if job is None or not job.wants_placement:
                continue
            if req.uid in stopping_for or self._reservations.held(req.uid) is not None:
                continue  # its earlier preemption is still under way: never twice
            if req.uid in self._no_plan_until:
                continue
            out.append(Preemptor(req, preempted=events(job.record)))
        return out

    # --- 2. running jobs ------------------------------------------------------------------------

    def running(self) -> list[Running]:
        """Every job placed in a member now, as a possible victim (module docstring, 2), read
        from scratch (the kept ones: :class:`~gpufed.hub.components.running.RunningJobs`)."""
        return list(self._running.build(self._running.held()).values())

    async def refresh(self) -> None:
        """Between cycles (the term's status loop): bring the kept running jobs up to date in
        a worker thread, and every :data:`~gpufed.hub.components.usage.RECOUNT_S` rebuild
        them from scratch there (the drift check), so a preempting cycle finds them ready and
        never pays the rebuild. A dict changing under the worker drops them (built again next
        time). Nothing when preemption is off."""
        if not self._term.config.preemption:
            return
        async with self._running_lock:
            with contextlib.suppress(RuntimeError, KeyError):
                await asyncio.to_thread(self._running.update)

    def refresh_soon(self) -> None:
        """:meth:`refresh` in the background (the status loop never waits for it), unless one
        is under way or a cycle's planning holds the running jobs (it brings them up to date
        itself). With preemption off, the kept running jobs and their marks are dropped."""
        if not self._term.config.preemption:
            if not self._running_lock.locked():
                self._running.drop()  # the marks it follows would only pile up
            return
        if self._refreshing or self._running_lock.locked():
            return
        self._refreshing = True

        async def run() -> None:
            try:
                await self.refresh()
            finally:
                self._refreshing = False

        self._term.spawn(run())

    # --- 3-5. one cycle ---------------------------------------------------------------------------

    async def run(
        self,
        decisions: Sequence[tuple[PlacementRequest, Decision]],
        policy: Policy,
        quota: QuotaView | None,
        now: float,
    ) -> dict[str, PreemptionPlan | NoPreemption]:
        """Plan and carry out this cycle's preemptions (``now``: wall seconds); returns each
        preemptor's answer by UID (a plan only when it was committed).

        The planning (steps 2 and 3) runs in a worker thread, so the event loop keeps
        renewing the lease, acking and writing status meanwhile; no plan is started after
        ``preemption_deadline_s`` of planning (counted once the cycle's running jobs are
        brought up to date, a cost paid once a cycle whatever the deadline; the preemptors left get no
        answer and are planned next cycle); the first is always planned, however late the
        worker starts, so every cycle makes progress. The worker reads the fleet while the
        loop may change it: each plan is re-checked on the loop before it is committed
        (:meth:`_fits`), and a worker that met a fleet changing under it plans nothing this
        cycle."""
        preemptors = self.preemptors(decisions)
        # jobs waiting out NO_PLAN_RETRY_S keep their last answer (their status stays put)
        answers: dict[str, PreemptionPlan | NoPreemption] = {
            r.uid: self._no_plan_until[r.uid][1]
            for r, _ in decisions
            if r.uid in self._no_plan_until
        }
        if not preemptors:
            return answers
        metrics = self._term.metrics
        t0 = time.perf_counter()
        try:
            async with self._running_lock:
                planned, missed = await asyncio.to_thread(
                    self._plan,
                    preemptors,
                    policy,
                    quota,
                    now,
                    self._term.config.preemption_deadline_s,
                )
        except (RuntimeError, KeyError) as exc:  # a dict changed size / a node went meanwhile
            log.warning("preemption.planning_raced", error=str(exc), preemptors=len(preemptors))
            metrics.preemption_plans_missed.labels("raced").inc(len(preemptors))
            self._term.state.kick()  # planned again in the next cycle
            return answers
        metrics.preemption_planning_seconds.observe(time.perf_counter() - t0)
        if missed:
            metrics.preemption_plans_missed.labels("deadline").inc(missed)
            self._term.state.kick()  # the rest are planned in the next cycle
        mono = self._term.mono()
        for p, answer in planned:
            uid = p.request.uid
            if isinstance(answer, NoPreemption):
                self._no_plan_until[uid] = (mono + NO_PLAN_RETRY_S, answer)
            else:
                self._no_plan_until.pop(uid, None)
            answers[uid] = answer
        for uid, answer in answers.items():
            if not isinstance(answer, PreemptionPlan):
                continue
            if not self._fits(answer):
                metrics.preemption_plans_missed.labels("stale").inc()
                answers[uid] = NoPreemption(uid, "the fleet changed while the plan was made")
            elif not await self._commit(answer, now):
                answers[uid] = NoPreemption(uid, "a victim changed while the plan was made")
        return answers

    def _plan(
        self,
        preemptors: list[Preemptor],
        policy: Policy,
        quota: QuotaView | None,
        now: float,
        deadline_s: float,
    ) -> tuple[list[tuple[Preemptor, PreemptionPlan | NoPreemption]], int]:
        """Steps 2 and 3, in the worker thread: each planned preemptor with its answer, in
        order, and how many were left for the deadline (``deadline_s`` seconds of planning,
        from when the kept running jobs and their index are brought up to date: at 10 x 5,000,
        when they were read and built from scratch each cycle, that setup alone took ~1.8 s of
        the 2 s default, so a cycle planned one preemptor although each later one of a shape
        the cycle has estimated costs ~25 ms)."""
        running = self._running.update(recount=False)
        if not len(running):
            return [], 0
        if quota is None:  # nothing to reclaim: only jobs above the lowest running priority
            lowest = min(r.priority for r in running)
            preemptors = [p for p in preemptors if p.request.priority > lowest]
        cycle = PreemptionCycle(
            self._snapshot,
            policy,
            now,
            running,
            rules=self._term.config.preemption_rules,
            quota=quota,
        )
        deadline = time.perf_counter() + deadline_s
        out: list[tuple[Preemptor, PreemptionPlan | NoPreemption]] = []
        hopeless: set[Any] = set()  # shapes that found no plan: the same answer for the rest
        cap = self._term.config.preemption_max_preemptors
        for i, p in enumerate(preemptors):
            if len(out) >= cap:
                break
            if out and time.perf_counter() > deadline:  # the first always: progress
                return out, len(preemptors) - i
            shape = (p.request.priority, queued_fit_key(p.request))
            if shape in hopeless:
                continue
            answer = cycle.plan(p)
            if isinstance(answer, NoPreemption):
                hopeless.add(shape)
            out.append((p, answer))
        return out, 0

    def _fits(self, plan: PreemptionPlan) -> bool:
        """Whether ``plan`` still fits the fleet as it is now (on the loop, before the commit):
        its member is known and every node it places on exists, offers its GPUs and has,
        once its victims there are gone, the GPUs the placement takes (allocatable less the
        requested and reserved, plus the victims' GPUs there)."""
        snap = self._snapshot
        if plan.cluster not in snap.cluster_names:
            return False
        nodes = snap.cluster(plan.cluster).nodes
        for name, req in plan.decision.node_requests().items():
            node = nodes.get(name)
            if node is None or not node.offers:
                return False
            inv = node.inv
            left = (
                inv.allocatable.get(GPU_RESOURCE, 0)
                - inv.requested.get(GPU_RESOURCE, 0)
                - (node.reserved or {}).get(GPU_RESOURCE, 0)
                + sum(v.running.gpus.get(name, 0) for v in plan.victims)
            )
            if left < req.get(GPU_RESOURCE, 0):
                return False
        return True

    async def _commit(self, plan: PreemptionPlan, now: float) -> bool:
        """Steps 4 and 5 for one plan; False when nothing was written."""
        state = self._term.state
        uids = sorted({plan.preemptor, *plan.victim_uids})
        async with contextlib.AsyncExitStack() as stack:
            for uid in uids:  # sorted: two commits never wait on each other
                await stack.enter_async_context(state.lock(uid))
            pre = state.jobs.get(plan.preemptor)
            if pre is None or not pre.wants_placement:
                return False
            victims: list[tuple[JobState, JobRecord, int]] = []
            for v in plan.victims:
                job = state.jobs.get(v.running.uid)
                rec = job.record if job is not None else None
                if (
                    job is None
                    or rec is None
                    or job.record_rev is None
                    or rec.cluster != plan.cluster
                    or rec.stopping is not None
                    or job.terminal
                    or job.deleting
                ):
                    log.info("preemption.victim_changed", job=pre.key, victim=v.running.job)
                    return False
                victims.append((job, marked(rec, self._cause(plan, v, pre, now)), job.record_rev))
            hold = Reservation.from_decision(
                plan.decision, now=now, ttl_s=self._term.config.reservation_ttl_s
            )
            try:
                rev = await self._term.store.preempt(
                    plan.preemptor,
                    hold.model_dump_json(),
                    [(rec, rev) for _, rec, rev in victims],
                )
            except ConflictError:
                log.warning("preemption.conflict", job=pre.key, cluster=plan.cluster)
                return False
            # Memory follows the commit.
            self._reservations.hold(hold)
            for job, rec, _ in victims:
                job.record, job.record_rev = rec, rev
            self._show(pre, plan)
            for v in plan.victims:
                self._term.metrics.preemptions.labels(plan.cluster, v.why).inc()
                self._term.metrics.preemption_gpu_seconds_lost.inc(v.cost_gpu_s)
            log.info(
                "preemption.committed",
                job=pre.key,
                cluster=plan.cluster,
                victims=[v.running.job for v in plan.victims],
                nodes=sorted(plan.nodes)[:_NODES_SHOWN],
                cost_gpu_s=round(plan.cost_gpu_s, 1),
            )
            # 5. stop the victims' copies (the mark is durable: a restart resumes this)
            for job, rec, _ in victims:
                assert rec.stopping is not None
                self._mirror.event(job, "Warning", "Preempting", rec.stopping.message)
                await self._lifecycle.reconcile_locked(job)
        return True

    def _cause(self, plan: PreemptionPlan, v: Victim, pre: JobState, now: float) -> RequeueCause:
        """Why victim ``v`` stops (its record's ``stopping``; its condition's message)."""
        run = v.running
        nodes = sorted(run.gpus)
        block = ", ".join(plan.domains[:4]) or _names(sorted(plan.nodes))
        prio = pre.request.priority if pre.request is not None else 0
        why = (
            f"priority {prio} over {run.priority}"
            if v.why == "priority"
            else "its queue reclaims the quota this job's queue borrowed"
        )
        return RequeueCause(
            kind="Preempted",
            reason="Preempted" if v.why == "priority" else "Reclaimed",
            message=(
                f"preempted by {pre.key} in {plan.cluster} ({why}) to free {block}: "
                f"nodes {_names(nodes)}; {v.cost_gpu_s:.0f} GPU-seconds since its last "
                "checkpoint lost"
            ),
            at=now,
            cluster=plan.cluster,
            nodes=tuple(nodes[:MAX_CAUSE_NODES]),  # the message counts all of them
            domains=tuple(plan.domains[:MAX_CAUSE_NODES]),
            by_uid=pre.uid,
            by=pre.key,
            cost_gpu_s=v.cost_gpu_s,
        )

    def _show(self, pre: JobState, plan: PreemptionPlan) -> None:
        """The preemptor's status and Event: what it preempted, where."""
        names = [v.running.job or v.running.uid for v in plan.victims]
        message = (
            f"preempting {len(names)} job(s) in {plan.cluster} to free "
            f"{', '.join(plan.domains[:4]) or _names(sorted(plan.nodes))} "
            f"({plan.cost_gpu_s:.0f} GPU-seconds lost): {_names(names)}; placed once their "
            "GPUs are free"
        )
        now = self._mirror.now()
        info = PreemptionStatus(
            cluster=plan.cluster,
            nodes=sorted(plan.nodes)[:512],
            nvlink_domains=list(plan.domains[:512]),
            victims=[
                PreemptionVictim(
                    job=v.running.job or v.running.uid,
                    priority=v.running.priority,
                    cost_gpu_seconds=round(v.cost_gpu_s, 1),
                    reason=v.why,
                )
                for v in plan.victims[:128]
            ],
            cost_gpu_seconds=round(plan.cost_gpu_s, 1),
            time=now,
            message=plan.reason,
        )
        pre.last_unschedulable = ("Preempting", message)
        self._mirror.set_status(pre, st.preempting(pre.status, info, message=message, now=now))
        self._mirror.event(pre, "Normal", "Preempting", message)

    def waiting_message(self, uid: str) -> str | None:
        """While a preemptor waits for its victims to stop: what it waits for (else None)."""
        victims = self.victims_of(uid)
        if not victims:
            return None
        names = [v.key for v in victims]
        cluster = victims[0].record.cluster if victims[0].record is not None else "?"
        return (
            f"preempted {len(names)} job(s) in {cluster}; waiting for them to stop: {_names(names)}"
        )
