"""The simulator's preemption step (``gpufed simulate --preemption on``): who preempts whom.

Called by :mod:`.simulate` after each scheduling pass, with the jobs the pass left waiting and
the jobs running; answers the preemptions to carry out, in order. Two victim rules
(``--victims``):

* ``gpufed``: the hub's rule, :class:`~gpufed.placement.preemptcycle.PreemptionCycle` over
  :func:`~gpufed.placement.victims.plan_preemption` (the same code the hub runs);
* ``priority-only``: the topology-blind baseline of in-cluster preemption: in a member, victims
  by priority (lowest first), then most recent start, until the member has enough free GPUs of
  the job's products summed; if the job still does not fit (its block, its nodes) more victims
  are taken one by one until it does, or the member gives up; among members the one with the
  fewest victims (then name) wins. The same guard rails apply (:func:`.preemption.preemptible`).

Pure: the snapshot is borrowed for what-ifs and put back (:mod:`.whatif`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from gpufed.api.decision import Decision, Outcome
from gpufed.api.labels import GPU_RESOURCE
from gpufed.placement.engine import place
from gpufed.placement.policy import Policy
from gpufed.placement.preemptcycle import PreemptionCycle
from gpufed.placement.preemption import (
    PreemptionEvent,
    PreemptionPlan,
    PreemptionRules,
    Preemptor,
    QuotaView,
    Running,
    preemptible,
    work_lost_gpu_s,
)
from gpufed.placement.queue import order_key
from gpufed.placement.shape import JobShape
from gpufed.placement.sim.simquota import QueueSim
from gpufed.placement.snapshot import FleetSnapshot
from gpufed.placement.whatif import OnlyMember, freed

if TYPE_CHECKING:
    from gpufed.placement.sim.simstate import _Run as Run
    from gpufed.placement.sim.simstate import _Sim as Sim

VictimRule = Literal["gpufed", "priority-only"]
VICTIM_RULES: tuple[VictimRule, ...] = ("gpufed", "priority-only")


@dataclass(frozen=True)
class Carried:
    """One preemption to carry out: stop ``victims`` (uid, GPU-seconds lost), then place the
    preemptor as ``decision`` says."""

    preemptor: str
    victims: tuple[tuple[str, float], ...]
    decision: Decision


def preemptions(
    rule: VictimRule,
    preemptors: Sequence[Preemptor],
    running: Sequence[Running],
    snapshot: FleetSnapshot,
    policy: Policy,
    now: float,
    rules: PreemptionRules,
    quota: QuotaView | None = None,
) -> list[Carried]:
    """The preemptions of one pass for ``preemptors`` (in queue order); see the module doc."""
    if rule == "gpufed":
        cycle = PreemptionCycle(snapshot, policy, now, running, rules=rules, quota=quota)
        out = []
        for p in preemptors:
            r = cycle.plan(p)
            if isinstance(r, PreemptionPlan):
                out.append(
                    Carried(
                        r.preemptor,
                        tuple((v.running.uid, v.cost_gpu_s) for v in r.victims),
                        r.decision,
                    )
                )
        return out
    return _priority_only(preemptors, running, snapshot, policy, now, rules)


def _priority_only(
    preemptors: Sequence[Preemptor],
    running: Sequence[Running],
    snapshot: FleetSnapshot,
    policy: Policy,
    now: float,
    rules: PreemptionRules,
) -> list[Carried]:
    out: list[Carried] = []
    gone: list[Running] = []
    placed: list[Decision] = []
    names = snapshot.cluster_names
    for p in preemptors:
        req = p.request
        with freed(snapshot, gone, placed, now):
            if place(req, snapshot, policy, now).outcome == Outcome.PLACED:
                continue
        job = JobShape.of(req)
        taken = {r.uid for r in gone}
        best: tuple[int, str, list[Running], Decision] | None = None
        for cluster in names:
            c = snapshot.cluster(cluster)
            cands = sorted(
                (
                    r
                    for r in running
                    if r.cluster == cluster
                    and r.uid not in taken
                    and r.priority < req.priority
                    and preemptible(r, rules, now) is None
                    and _on_products(snapshot, r, job.products)
                ),
                key=lambda r: (r.priority, -r.started_at, r.uid),
            )
            if not cands:
                continue
            with freed(snapshot, gone, placed, now):
                pools = [pl for pl in c.pools.values() if not pl.slices]
                if job.products is not None:
                    pools = [pl for pl in pools if pl.product in job.products]
                free = sum(pl.free for pl in pools)
            chosen: list[Running] = []
            decision: Decision | None = None
            for r in cands:
                chosen.append(r)
                free += r.gpu_count
                if free < job.demand:
                    continue
                with freed(snapshot, gone + chosen, placed, now):
                    d = place(req, snapshot, policy, now, hold=OnlyMember(cluster, names))
                if d.outcome == Outcome.PLACED:
                    decision = d
                    break
            if decision is None:
                continue
            if best is None or (len(chosen), cluster) < (best[0], best[1]):
                best = (len(chosen), cluster, chosen, decision)
        if best is None:
            continue
        _, _, chosen, decision = best
        gone.extend(chosen)
        placed.append(decision)
        out.append(
            Carried(req.uid, tuple((r.uid, work_lost_gpu_s(r, now)) for r in chosen), decision)
        )
    return out


def _on_products(snapshot: FleetSnapshot, r: Running, products: frozenset[str] | None) -> bool:
    if products is None:
        return True
    nodes = snapshot.cluster(r.cluster).nodes
    return any(
        (n := nodes.get(name)) is not None and n.pool is not None and n.pool.product in products
        for name in r.gpus
    )


@dataclass
class SimPreemption:
    """``--preemption`` and ``--victims`` of one run, and what it counted.

    ``on``: preempt (False: only report the per-priority waits, for the run to compare with).
    ``max_preemptors``: waiting jobs that may preempt per pass (one per shape and priority),
    which bounds the simulator's work per event.
    """

    on: bool = True
    victims: VictimRule = "gpufed"
    rules: PreemptionRules = field(default_factory=PreemptionRules)
    max_preemptors: int = 4
    preemptions: int = 0
    gpu_s_lost: float = 0.0

    def __post_init__(self) -> None:
        if self.victims not in VICTIM_RULES:
            raise ValueError(f"victims: {self.victims!r} is not one of {', '.join(VICTIM_RULES)}")

    def count(self, lost_gpu_s: float) -> None:
        """One victim stopped, losing ``lost_gpu_s`` GPU-seconds of work."""
        self.preemptions += 1
        self.gpu_s_lost += lost_gpu_s

    def metrics(self) -> dict[str, object]:
        """The JSON keys this adds (``wait_p95_s_by_priority`` comes from the simulator)."""
        return {
            "preemption": "on" if self.on else "off",
            "victims": self.victims,
            "preemptions": self.preemptions,
            "gpu_hours_lost": round(self.gpu_s_lost / 3600.0, 2),
        }


def preempt_after_pass(
    sim: Sim,
    pending: dict[str, Run],
    now: float,
    policy: Policy,
    qs: QueueSim | None,
    pre: SimPreemption,
) -> None:
    """After a scheduling pass of the simulator (``sim``, its ``pending`` jobs): the waiting
    jobs that may preempt do, at most ``pre.max_preemptors``, one per shape and priority; each
    victim returns to ``pending`` with its work since the last checkpoint to redo, and each
    preemptor starts as its plan says."""
    if not sim.live:
        return
    quota = QuotaView(qs.gate.tree, qs.gate.usage) if qs is not None and qs.gate.enforce else None
    low = min(r.request.priority for r in sim.live.values())
    wanting = sorted(
        (r.request for r in pending.values() if quota is not None or r.request.priority > low),
        key=order_key,
    )
    chosen: list[Preemptor] = []
    shapes: set[Any] = set()
    for req in wanting:
        run = sim.by_uid[req.uid]
        if (req.priority, run.key) in shapes:
            continue  # one job of a shape and priority per pass: the others would do the same
        shapes.add((req.priority, run.key))
        chosen.append(Preemptor(req, preempted=tuple(run.preempted)))
        if len(chosen) >= pre.max_preemptors:
            break
    if not chosen:
        return
    running = [_running(sim, r, qs) for r in sim.live.values()]
    for c in preemptions(pre.victims, chosen, running, sim.snapshot, policy, now, pre.rules, quota):
        for uid, lost in c.victims:
            v = sim.live.pop(uid)
            sim.snapshot.release(uid)
            if qs is not None:
                qs.finish(v.request)
                qs.arrive(v.request)
            v.stop(now, "preempted")
            kept = (now - v.seg_start) - lost / v.job.gpus
            v.remaining = max(0.0, v.remaining - kept)
            v.seg_start = v.end = math.inf
            v.preempted.append(PreemptionEvent(now, c.preemptor))
            pending[uid] = v
            pre.count(lost)
        run = pending.pop(c.preemptor)
        sim.start(run, c.decision, now)
        if qs is not None:
            qs.start(run.request, c.decision.gpu_product)


def _running(sim: Sim, r: Run, qs: QueueSim | None) -> Running:
    res = sim.snapshot.reservation(r.request.uid)
    gpus = {n: a.get(GPU_RESOURCE, 0) for n, a in res.nodes.items()} if res is not None else {}
    return Running(
        uid=r.request.uid,
        job=r.request.job,
        cluster=r.cluster or "",
        priority=r.request.priority,
        gpus=gpus,
        started_at=r.seg_start,
        queue=qs.queue(r.request) if qs is not None else r.request.queue,
        checkpoint_interval_s=r.job.checkpoint_s,
        preempted=tuple(r.preempted),
    )
