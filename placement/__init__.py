"""gpufed.placement: pure, topology-aware placement of GPU jobs onto member clusters.

Public surface (used by the hub, the simulator, the benchmark and ``gpufed explain``):

* :class:`FleetSnapshot`: the indexed fleet plus the reservation ledger, updated incrementally;
* :func:`place` / :func:`explain`: one decision for one job (pure);
* :class:`Policy`, :class:`ScoreWeights`: scoring configuration;
* :func:`schedule_pass`, :func:`pass_key`, :func:`order_key`, :class:`BackfillRule`: queue order and
  backfill;
* :func:`render_explanation`: the text of ``gpufed explain``;
* :func:`plan_preemption`, :class:`PreemptionCycle` (with :class:`Running`,
  :class:`Preemptor`, :class:`PreemptionRules`, :class:`PreemptionPlan`,
  :class:`NoPreemption`): which running jobs to preempt so a waiting job fits.

See docs/placement.md.
"""

from __future__ import annotations

from gpufed.placement.engine import explain, place
from gpufed.placement.holds import hold_for
from gpufed.placement.plugins import Code, Status, plugins_for
from gpufed.placement.policy import Policy, ScoreWeights
from gpufed.placement.preemptcycle import PreemptionCycle
from gpufed.placement.preemption import (
    NoPreemption,
    PreemptionPlan,
    PreemptionRules,
    Preemptor,
    Running,
)
from gpufed.placement.queue import (
    BackfillRule,
    Hold,
    PassResult,
    order_key,
    pass_key,
    schedule_pass,
)
from gpufed.placement.render import render_explanation
from gpufed.placement.snapshot import FleetSnapshot
from gpufed.placement.victims import plan_preemption

__all__ = [
    "BackfillRule",
    "Code",
    "FleetSnapshot",
    "Hold",
    "NoPreemption",
    "PassResult",
    "Policy",
    "PreemptionCycle",
    "PreemptionPlan",
    "PreemptionRules",
    "Preemptor",
    "Running",
    "ScoreWeights",
    "Status",
    "explain",
    "hold_for",
    "order_key",
    "pass_key",
    "place",
    "plan_preemption",
    "plugins_for",
    "render_explanation",
    "schedule_pass",
]
