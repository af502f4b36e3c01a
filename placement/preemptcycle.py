"""One scheduling cycle's preemptions (pure): several preemptors, never over-freeing.

Called by the hub's scheduling cycle and the simulator, for the jobs of one pass that
``place()`` left ``Unschedulable``, in queue order. The running jobs are indexed by block once
per cycle (:mod:`.runindex`), not rescanned per preemptor. Each :meth:`PreemptionCycle.plan` runs
:func:`~gpufed.placement.victims.plan_preemption` with the cycle's earlier plans applied:
their victims are gone and cannot be chosen again, and their preemptors' what-if placements
are reserved, so the GPUs freed for one preemptor are held for it and no later preemptor
counts them (docs/placement.md, "Preemption"). The snapshot is unchanged afterwards; the
caller carries the plans out (stops the victims, holds the freed nodes for the preemptor).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping

from gpufed.placement.estimatebook import EstimateBook
from gpufed.placement.policy import Policy
from gpufed.placement.preemption import (
    NoPreemption,
    PreemptionPlan,
    PreemptionRules,
    Preemptor,
    QuotaView,
    Running,
)
from gpufed.placement.queue import Hold
from gpufed.placement.quota import demand_of
from gpufed.placement.runindex import RunningIndex
from gpufed.placement.snapshot import FleetSnapshot
from gpufed.placement.victims import plan_preemption


class PreemptionCycle:
    """The preemptions planned in one pass (see the module docstring).

    ``running``: every running or placed job, indexed once here (O(running jobs)); a
    :class:`~gpufed.placement.runindex.RunningIndex` the caller keeps is used as it is.
    ``quota``: as for ``plan_preemption``; the cycle
    keeps its own copy of the ledger, with each plan's victims released and its preemptor
    charged, so a later plan's reclaim and admission see the earlier ones.
    """

    def __init__(
        self,
        snapshot: FleetSnapshot,
        policy: Policy,
        now: float,
        running: Iterable[Running],
        *,
        rules: PreemptionRules | None = None,
        quota: QuotaView | None = None,
    ) -> None:
        self.snapshot = snapshot
        self.policy = policy
        self.now = now
        self.rules = rules or PreemptionRules()
        #: the running jobs by block, built once for the cycle (or the caller's own index)
        self.running = (
            running if isinstance(running, RunningIndex) else RunningIndex(snapshot, running)
        )
        #: the block estimates kept across this cycle's preemptors (:mod:`.estimatebook`)
        self.book = EstimateBook(self.running, now)
        self.quota = (
            QuotaView(quota.tree, copy.deepcopy(quota.usage)) if quota is not None else None
        )
        #: plans accepted so far, in order
        self.plans: list[PreemptionPlan] = []
        self._taken: set[str] = set()
        self._gone: list[Running] = []

    def plan(
        self, preemptor: Preemptor, hold: Mapping[str, Hold] | None = None
    ) -> PreemptionPlan | NoPreemption:
        """Plan for one more preemptor and keep the plan (the cycle's later plans see it)."""
        result = plan_preemption(
            preemptor,
            self.running,
            self.snapshot,
            self.policy,
            self.now,
            rules=self.rules,
            hold=hold,
            quota=self.quota,
            gone=self._gone,
            placed=[p.decision for p in self.plans],
            book=self.book,
        )
        if isinstance(result, PreemptionPlan):
            self.plans.append(result)
            self._taken.update(result.victim_uids)
            self._gone.extend(v.running for v in result.victims)
            if self.quota is not None:
                usage = self.quota.usage
                tree = self.quota.tree
                for uid in result.victim_uids:
                    usage.release(uid)
                q = preemptor.request.queue or tree.default_queue
                usage.charge_demand(
                    preemptor.request.uid,
                    q,
                    demand_of(preemptor.request, result.decision.gpu_product),
                )
        return result

    @property
    def victims(self) -> frozenset[str]:
        """Every victim chosen in this cycle."""
        return frozenset(self._taken)
