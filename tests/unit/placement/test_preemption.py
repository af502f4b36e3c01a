"""Victim selection rules (table-driven): which running jobs a waiting job preempts, and why.

Each case builds a fleet by shape, runs ``plan_preemption`` and checks the member, the victims
and the block the job gets; the fleet must be unchanged afterwards (what-ifs put back).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from placement_builders import GB200, GPU, fleet, gpus_on, job, member
from preemption_builders import (
    busy_node,
    hgx_full_of_jobs,
    nvl72_full_of_4gpu_jobs,
    running,
)
from quota_builders import H100, org_with_two_teams

from gpufed.api.decision import Outcome
from gpufed.placement import FleetSnapshot, Policy, place
from gpufed.placement.preemptcycle import PreemptionCycle
from gpufed.placement.preemption import (
    NoPreemption,
    PreemptionEvent,
    PreemptionPlan,
    PreemptionRules,
    Preemptor,
    QuotaView,
    Running,
    preemptible,
    work_lost_gpu_s,
)
from gpufed.placement.quota import QuotaUsage
from gpufed.placement.victims import plan_preemption

NOW = 10_000.0
POLICY = Policy()


def _frees(snap: FleetSnapshot) -> dict[tuple[str, str], int]:
    return {(c, n): snap.free(c, n) for c in snap.cluster_names for n in snap.cluster(c).nodes}


def _plan(snap: FleetSnapshot, runs: list[Running], req: Any, **kw: Any) -> Any:
    before = _frees(snap)
    assert place(req, snap, POLICY, NOW).outcome == Outcome.UNSCHEDULABLE
    out = plan_preemption(Preemptor(req), runs, snap, POLICY, NOW, **kw)
    assert _frees(snap) == before, "a what-if left the snapshot changed"
    assert snap.verify_indexes() == []
    return out


# --- cost --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        ({}, 4 * 1000.0),  # since start
        ({"interval": 300.0}, 4 * 100.0),  # (1000 s) mod 300 s
        ({"last_checkpoint": NOW - 60}, 4 * 60.0),  # reported wins over the interval
        ({"last_checkpoint": NOW - 60, "interval": 300.0}, 4 * 60.0),
        ({"last_checkpoint": 0.0}, 4 * 1000.0),  # a checkpoint of an earlier run: since start
    ],
    ids=["no-checkpoint", "interval", "reported", "reported-and-interval", "stale"],
)
def test_work_lost_is_gpus_times_seconds_since_the_last_checkpoint(
    row: dict[str, Any], expected: float
) -> None:
    r = running("v", "a", {"n": 4}, started_at=NOW - 1000, **row)
    assert work_lost_gpu_s(r, NOW) == pytest.approx(expected)


# --- block-freeing on NVL72 cliques --------------------------------------------------------------


def _cheap_clique(cheap: int) -> Callable[[str, int], dict[str, Any]]:
    """Priority 100 everywhere; clique ``cheap`` checkpointed a minute ago, the other not."""

    def attrs(uid: str, i: int) -> dict[str, Any]:
        last = NOW - 60 if f"-c{cheap}-" in uid else None
        return {"priority": 100, "started_at": NOW - 3600, "last_checkpoint": last}

    return attrs


@pytest.mark.parametrize("cheap", [0, 1])
def test_nvlink_required_job_frees_four_trays_of_one_clique_the_cheapest(cheap: int) -> None:
    state, runs = nvl72_full_of_4gpu_jobs("b", cliques=2, attrs=_cheap_clique(cheap))
    snap = fleet(state)
    req = job("big", gpus=4, pods=4, nvlink="Required", priority=1000)
    plan = _plan(snap, runs, req)
    assert isinstance(plan, PreemptionPlan), plan
    assert plan.cluster == "b"
    assert len(plan.victims) == 4
    assert {n.split("-t")[0] for n in plan.nodes} == {f"b-c{cheap}"}
    assert plan.domains == (f"clique:b-fabric.{cheap}",)
    assert set(gpus_on(plan.decision)) == plan.nodes
    assert plan.cost_gpu_s == pytest.approx(4 * 4 * 60.0)
    assert all(v.why == "priority" for v in plan.victims)


def test_partly_free_clique_needs_fewer_victims() -> None:
    state, runs = nvl72_full_of_4gpu_jobs("b", cliques=2, attrs=_cheap_clique(0))
    # two trays of clique 1 finished: clique 1 needs 2 victims, clique 0 four cheap ones
    gone = {"b-c1-t00-job", "b-c1-t01-job"}
    nodes = [
        n
        if not any(u in n.job_requests for u in gone)
        else busy_node(
            n.name,
            [],
            gpus=4,
            product=n.gpu_product,
            clique=n.labels["nvidia.com/gpu.clique"],
            rack=n.rack,
        )
        for n in state.inventory.nodes
    ]
    snap = fleet(member("b", nodes))
    runs = [r for r in runs if r.uid not in gone]
    plan = _plan(snap, runs, job("big", gpus=4, pods=4, nvlink="Required", priority=1000))
    assert isinstance(plan, PreemptionPlan)
    # clique 0 is cheaper in work (4 x 240 GPU-s) than 2 jobs of clique 1 (2 x 4 x 3600)
    assert plan.domains == ("clique:b-fabric.0",)
    assert len(plan.victims) == 4


def test_job_larger_than_any_clique_preempts_nothing() -> None:
    state, runs = nvl72_full_of_4gpu_jobs("b", cliques=2, attrs=_cheap_clique(0))
    snap = fleet(state)
    req = job("huge", gpus=4, pods=19, nvlink="Required", priority=1000)
    out = plan_preemption(Preemptor(req), runs, snap, POLICY, NOW)
    assert isinstance(out, NoPreemption)
    assert "could never hold" in out.members["b"]


def test_nothing_is_preempted_when_the_job_would_still_not_fit() -> None:
    # each clique has only 3 trays of lower priority: freeing them leaves the 4-tray job out
    def attrs(uid: str, i: int) -> dict[str, Any]:
        return {"priority": 100 if uid.split("-t")[1][:2] in ("00", "01", "02") else 5000}

    state, runs = nvl72_full_of_4gpu_jobs("b", cliques=2, attrs=attrs)
    out = _plan(fleet(state), runs, job("big", gpus=4, pods=4, nvlink="Required", priority=1000))
    assert isinstance(out, NoPreemption), out


# --- HGX nodes ---------------------------------------------------------------------------------


@dataclass
class Case:
    name: str
    rows: dict[str, dict[str, Any]]  # victim uid -> Running fields
    expect: set[str] | None  # victims, or None: no plan


HGX_CASES = [
    Case(
        "lower-priority-first",
        {
            "a-n000-j0": {"priority": 10},
            "a-n000-j1": {"priority": 10},
            "a-n001-j0": {"priority": 50, "last_checkpoint": NOW - 1},
            "a-n001-j1": {"priority": 50, "last_checkpoint": NOW - 1},
        },
        {"a-n000-j0", "a-n000-j1"},
    ),
    Case(
        "least-work-lost",
        {
            "a-n000-j0": {"priority": 10},
            "a-n000-j1": {"priority": 10},
            "a-n001-j0": {"priority": 10, "interval": 100.0},
            "a-n001-j1": {"priority": 10, "interval": 100.0},
        },
        {"a-n001-j0", "a-n001-j1"},
    ),
    Case(
        "equal-priority-never",
        {
            "a-n000-j0": {"priority": 500},
            "a-n000-j1": {"priority": 10},
            "a-n001-j0": {"priority": 600},
            "a-n001-j1": {"priority": 10},
        },
        None,
    ),
    Case("ties-by-uid", {}, {"a-n000-j0", "a-n000-j1"}),
    Case(
        "min-runtime",
        {
            "a-n000-j0": {"started_at": NOW - 10},
            "a-n000-j1": {},
        },
        {"a-n001-j0", "a-n001-j1"},
    ),
    Case(
        "hourly-cap",
        {
            "a-n000-j0": {"preempted": [(NOW - 100, "x"), (NOW - 200, "y"), (NOW - 300, "z")]},
        },
        {"a-n001-j0", "a-n001-j1"},
    ),
    Case(
        "cap-counts-the-last-hour-only",
        {
            "a-n000-j0": {"preempted": [(NOW - 4000, "x"), (NOW - 200, "y"), (NOW - 300, "z")]},
        },
        {"a-n000-j0", "a-n000-j1"},
    ),
    Case(
        "preemptible-after",
        {
            "a-n000-j1": {"preemptible_after": NOW + 1},
        },
        {"a-n001-j0", "a-n001-j1"},
    ),
]


@pytest.mark.parametrize("case", HGX_CASES, ids=lambda c: c.name)
def test_hgx_one_pod_job_frees_one_node(case: Case) -> None:
    def attrs(uid: str, i: int) -> dict[str, Any]:
        row = {"priority": 10, "started_at": 0.0}
        row.update(case.rows.get(uid, {}))
        return row

    state, runs = hgx_full_of_jobs("a", nodes=2, per_node=2, attrs=attrs)
    snap = fleet(state)
    rules = PreemptionRules(min_runtime_s=60.0)
    out = _plan(snap, runs, job("p", gpus=8, nvlink="Required", priority=500), rules=rules)
    if case.expect is None:
        assert isinstance(out, NoPreemption), out
        return
    assert isinstance(out, PreemptionPlan), out
    assert set(out.victim_uids) == case.expect


def test_fewest_victims_break_a_tie_in_work_lost() -> None:
    one = busy_node("a-n000", [("big", 8)], product=H100)
    two = busy_node("a-n001", [("s0", 4), ("s1", 4)], product=H100)
    snap = fleet(member("a", [one, two]))
    runs = [
        running("big", "a", {"a-n000": 8}, priority=1, started_at=NOW - 100),
        running("s0", "a", {"a-n001": 4}, priority=1, started_at=NOW - 100),
        running("s1", "a", {"a-n001": 4}, priority=1, started_at=NOW - 100),
    ]
    out = _plan(snap, runs, job("p", gpus=8, nvlink="Required", priority=5))
    assert isinstance(out, PreemptionPlan)
    assert out.victim_uids == ("big",)


@pytest.mark.parametrize(
    ("trays", "search"),
    [(4, "exact search"), (18, "bounded search (a block has more than 12 candidates)")],
    ids=["small-clique-exact", "full-clique-bounded"],
)
def test_one_victim_that_loses_less_work_beats_two_smaller_ones(trays: int, search: str) -> None:
    """Issue 23's bug report: in one NVLink clique a 2 x 4-GPU job needs 8 GPUs; A (8 GPUs,
    800 GPU-s since its checkpoint), B and C (4 GPUs, 600 GPU-s each), all priority 1. A alone
    loses less work than B + C (1,200 GPU-s), so A is the plan, not the cost-ordered greedy
    B + C. With 18 trays the other 14 run dearer jobs (more than 12 candidates: the bounded
    search, whose swaps find A)."""
    clique = {"product": GB200, "clique": "b-fabric.0", "rack": "b-rack0"}
    nodes = [
        busy_node("b-t00", [("A", 4)], gpus=4, **clique),
        busy_node("b-t01", [("A", 4)], gpus=4, **clique),
        busy_node("b-t02", [("B", 4)], gpus=4, **clique),
        busy_node("b-t03", [("C", 4)], gpus=4, **clique),
    ]
    start = NOW - 3600
    runs = [
        running(
            "A",
            "b",
            {"b-t00": 4, "b-t01": 4},
            priority=1,
            started_at=start,
            last_checkpoint=NOW - 100,
        ),
        running("B", "b", {"b-t02": 4}, priority=1, started_at=start, last_checkpoint=NOW - 150),
        running("C", "b", {"b-t03": 4}, priority=1, started_at=start, last_checkpoint=NOW - 150),
    ]
    for t in range(4, trays):
        nodes.append(busy_node(f"b-t{t:02d}", [(f"D{t}", 4)], gpus=4, **clique))
        runs.append(running(f"D{t}", "b", {f"b-t{t:02d}": 4}, priority=1, started_at=start))
    snap = fleet(member("b", nodes))
    out = _plan(snap, runs, job("p", gpus=4, pods=2, nvlink="Required", priority=9))
    assert isinstance(out, PreemptionPlan), out
    assert out.victim_uids == ("A",)
    assert out.cost_gpu_s == pytest.approx(800.0)
    assert gpus_on(out.decision) == {"b-t00": 4, "b-t01": 4}
    assert out.search == search
    assert search in out.reason


def test_victims_are_only_as_many_as_needed() -> None:
    # a node with 4 free and one 4-GPU job of four: one victim is enough for 8 GPUs
    n = busy_node("a-n000", [("v0", 2), ("v1", 2)], product=H100)
    snap = fleet(member("a", [n]))
    runs = [running(u, "a", {"a-n000": 2}, priority=1) for u in ("v0", "v1")]
    out = _plan(snap, runs, job("p", gpus=6, nvlink="Required", priority=5))
    assert isinstance(out, PreemptionPlan)
    assert len(out.victims) == 1


def test_priority_class_with_never_preempts_nothing() -> None:
    state, runs = hgx_full_of_jobs("a", nodes=1)
    snap = fleet(state)
    out = plan_preemption(
        Preemptor(job("p", gpus=8, priority=9), may_preempt=False), runs, snap, POLICY, NOW
    )
    assert isinstance(out, NoPreemption)
    assert "Never" in out.reason


def test_no_cycles_a_victim_does_not_preempt_back_at_once() -> None:
    state, runs = hgx_full_of_jobs("a", nodes=1, attrs=lambda u, i: {"priority": 1})
    snap = fleet(state)
    req = job("p", gpus=8, nvlink="Required", priority=9)
    back = Preemptor(req, preempted=(PreemptionEvent(NOW - 60, "a-n000-j0"),))
    out = plan_preemption(back, runs, snap, POLICY, NOW)
    assert isinstance(out, NoPreemption)
    later = plan_preemption(back, runs, snap, POLICY, NOW + 600)
    assert isinstance(later, PreemptionPlan)


def test_guard_rail_reasons_name_the_rule() -> None:
    rules = PreemptionRules(min_runtime_s=300, max_per_hour=1)
    assert "minimum" in (preemptible(running("v", "a", {}, started_at=NOW - 10), rules, NOW) or "")
    hot = running("v", "a", {}, preempted=[(NOW - 10, "x")])
    assert "last hour" in (preemptible(hot, rules, NOW) or "")


# --- reclaim -------------------------------------------------------------------------------------


def _teams_usage(runs: list[Running]) -> QuotaUsage:
    usage = QuotaUsage()
    for r in runs:
        usage.charge(r.uid, r.queue or "default", H100, r.gpu_count)
    return usage


def test_reclaim_preempts_a_borrower_of_higher_priority() -> None:
    # team-b (nominal 8) runs 16 GPUs at priority 900: it borrows team-a's 8
    tree = org_with_two_teams(nominal=8)

    def attrs(uid: str, i: int) -> dict[str, Any]:
        return {"priority": 900, "queue": "team-b", "started_at": 0.0}

    state, runs = hgx_full_of_jobs("a", nodes=2, per_node=2, attrs=attrs)
    snap = fleet(state)
    quota = QuotaView(tree, _teams_usage(runs))
    req = job("p", gpus=8, nvlink="Required", priority=100).model_copy(update={"queue": "team-a"})
    out = _plan(snap, runs, req, quota=quota)
    assert isinstance(out, PreemptionPlan), out
    assert all(v.why == "reclaim" for v in out.victims)
    assert len(out.victims) == 2
    # without queues the same borrowers are safe: priority 900 > 100
    assert isinstance(_plan(snap, runs, req), NoPreemption)


def test_no_reclaim_from_a_queue_within_its_nominal() -> None:
    tree = org_with_two_teams(nominal=16)

    def attrs(uid: str, i: int) -> dict[str, Any]:
        return {"priority": 900, "queue": "team-b"}

    state, runs = hgx_full_of_jobs("a", nodes=2, per_node=2, attrs=attrs)
    snap = fleet(state)
    req = job("p", gpus=8, nvlink="Required", priority=100).model_copy(update={"queue": "team-a"})
    out = _plan(snap, runs, req, quota=QuotaView(tree, _teams_usage(runs)))
    assert isinstance(out, NoPreemption)


# --- one cycle, several preemptors -----------------------------------------------------------------


def test_cycle_never_counts_a_victim_twice() -> None:
    state, runs = nvl72_full_of_4gpu_jobs("b", cliques=2, attrs=_cheap_clique(0))
    snap = fleet(state)
    before = _frees(snap)
    cycle = PreemptionCycle(snap, POLICY, NOW, runs)
    plans = [
        cycle.plan(Preemptor(job(f"big{i}", gpus=4, pods=16, nvlink="Required", priority=1000)))
        for i in range(3)
    ]
    assert isinstance(plans[0], PreemptionPlan)
    assert isinstance(plans[1], PreemptionPlan)
    assert {plans[0].domains, plans[1].domains} == {("clique:b-fabric.0",), ("clique:b-fabric.1",)}
    assert not set(plans[0].victim_uids) & set(plans[1].victim_uids)
    assert isinstance(plans[2], NoPreemption)  # both cliques are held for the first two
    assert _frees(snap) == before


def test_cycle_holds_freed_gpus_for_their_preemptor() -> None:
    # n0: 4 free GPUs + a 4-GPU victim; n1: one 8-GPU job. The first job takes n0 whole, so
    # the second may not count n0's 4 free GPUs as its own: it must preempt on n1
    n0 = busy_node("a-n000", [("v0", 4)], product=H100)
    n1 = busy_node("a-n001", [("v1", 8)], product=H100)
    snap = fleet(member("a", [n0, n1]))
    runs = [
        running("v0", "a", {"a-n000": 4}, priority=1, started_at=NOW - 100),
        running("v1", "a", {"a-n001": 8}, priority=1, started_at=NOW - 100),
    ]
    cycle = PreemptionCycle(snap, POLICY, NOW, runs)
    first = cycle.plan(Preemptor(job("p", gpus=8, nvlink="Required", priority=9)))
    assert isinstance(first, PreemptionPlan)
    assert first.victim_uids == ("v0",)
    assert gpus_on(first.decision) == {"a-n000": 8}
    second = cycle.plan(Preemptor(job("q", gpus=4, nvlink="Required", priority=9)))
    assert isinstance(second, PreemptionPlan), second
    assert second.victim_uids == ("v1",)
    assert snap.free("a", "a-n000") == 4
    assert cycle.victims == {"v0", "v1"}


def test_cycle_counts_what_an_earlier_victim_frees_beyond_its_preemptor() -> None:
    # v0 holds all 8 GPUs of n0; p needs 4 of them: q gets the other 4 without a victim more
    n0 = busy_node("a-n000", [("v0", 8)], product=H100)
    snap = fleet(member("a", [n0]))
    runs = [running("v0", "a", {"a-n000": 8}, priority=1)]
    cycle = PreemptionCycle(snap, POLICY, NOW, runs)
    first = cycle.plan(Preemptor(job("p", gpus=4, nvlink="Required", priority=9)))
    assert isinstance(first, PreemptionPlan)
    second = cycle.plan(Preemptor(job("q", gpus=4, nvlink="Required", priority=9)))
    assert isinstance(second, NoPreemption)
    assert second.reason.startswith("fits without preemption")


def test_prune_drops_a_cheap_victim_a_later_bigger_one_made_unneeded() -> None:
    # 3 free; the cheapest victim (1 GPU) is counted in first, then the 4-GPU one: the
    # 4-GPU one alone frees 7, so the 1-GPU one is dropped
    n0 = busy_node("a-n000", [("small", 1), ("big", 4)], product=H100)
    snap = fleet(member("a", [n0]))
    runs = [
        running("small", "a", {"a-n000": 1}, priority=1, started_at=NOW - 10),
        running("big", "a", {"a-n000": 4}, priority=1, started_at=NOW - 100),
    ]
    out = _plan(snap, runs, job("p", gpus=7, nvlink="Required", priority=9))
    assert isinstance(out, PreemptionPlan)
    assert out.victim_uids == ("big",)
    _ = GPU
