"""The running-jobs index preemption reads (placement/runindex.py) and its use by the search:
jobs filed by pool and block, kept as jobs start and end, the same plans as a fresh index,
and blocks that cannot be among the cheapest passed over unread."""

from __future__ import annotations

from typing import Any

from placement_builders import fleet, job
from preemption_builders import hgx_full_of_jobs, nvl72_full_of_4gpu_jobs

from gpufed.placement import Policy
from gpufed.placement.preemption import PreemptionPlan, PreemptionRules, Preemptor
from gpufed.placement.runindex import RunningIndex
from gpufed.placement.victimblocks import Bound, estimates
from gpufed.placement.victims import Search, plan_preemption

NOW = 10_000.0
POLICY = Policy()


def _clique_attrs(uid: str, i: int) -> dict[str, Any]:
    return {"priority": i % 3, "started_at": NOW - 100 * (i + 1)}


def test_jobs_are_filed_by_nvlink_clique_and_by_node() -> None:
    state, runs = nvl72_full_of_4gpu_jobs("b", cliques=2)
    snap = fleet(state)
    index = RunningIndex(snap, runs)
    pool = next(iter(snap.cluster("b").pools.values())).key
    cliques = {b.key: len(b.runs) for b in index.blocks("b", "nvlink", pool)}
    assert cliques == {"clique:b-fabric.0": 18, "clique:b-fabric.1": 18}
    member = list(index.blocks("b", "", pool))
    assert len(member) == 1
    assert len(member[0].runs) == 36
    assert len(index) == 36
    assert index.members == ["b"]


def test_a_removed_job_leaves_every_block_and_an_added_one_joins() -> None:
    state, runs = hgx_full_of_jobs("a", nodes=2, per_node=2)
    snap = fleet(state)
    index = RunningIndex(snap, runs)
    index.file_levels()
    pool = next(iter(snap.cluster("a").pools.values())).key
    gone = runs[0]
    assert index.remove(gone.uid, "a") is gone
    assert index.remove(gone.uid, "a") is None
    by_node = {b.key: set(b.runs) for b in index.blocks("a", "nvlink", pool)}
    assert gone.uid not in set().union(*by_node.values())
    assert gone.uid not in index
    index.add(gone)
    by_node = {b.key: set(b.runs) for b in index.blocks("a", "nvlink", pool)}
    assert gone.uid in by_node[f"node:{next(iter(gone.gpus))}"]


def test_an_index_kept_across_decisions_plans_as_a_fresh_one() -> None:
    """Victims of a first plan removed from a kept index: the second plan equals the plan a
    freshly built index (and a plain list of jobs) gives."""
    state, runs = nvl72_full_of_4gpu_jobs("b", cliques=3, attrs=_clique_attrs)
    snap = fleet(state)
    kept = RunningIndex(snap, runs)
    req = job("big", gpus=4, pods=4, nvlink="Required", priority=1000)
    first = plan_preemption(Preemptor(req), kept, snap, POLICY, NOW)
    assert isinstance(first, PreemptionPlan)
    for v in first.victims:
        kept.remove(v.running.uid, "b")
    left = [r for r in runs if r.uid not in set(first.victim_uids)]
    # the first plan's victims stay held for it: the next job must look elsewhere
    second = job("big2", gpus=4, pods=4, nvlink="Required", priority=1000)
    kw: dict[str, Any] = {"placed": [first.decision]}
    a = plan_preemption(Preemptor(second), kept, snap, POLICY, NOW, **kw)
    b = plan_preemption(Preemptor(second), RunningIndex(snap, left), snap, POLICY, NOW, **kw)
    c = plan_preemption(Preemptor(second), left, snap, POLICY, NOW, **kw)
    assert isinstance(a, PreemptionPlan)
    assert a.victim_uids == b.victim_uids == c.victim_uids
    assert a.domains != first.domains


def test_blocks_above_the_kth_cheapest_priority_are_passed_over() -> None:
    """With one block to try, a clique whose jobs are all of a higher priority than a block
    already found is never read; the plan is the same as with every block tried."""

    def attrs(uid: str, i: int) -> dict[str, Any]:
        return {"priority": 0 if "-c0-" in uid else 5, "started_at": NOW - 100}

    state, runs = nvl72_full_of_4gpu_jobs("b", cliques=2, attrs=attrs)
    snap = fleet(state)
    req = job("big", gpus=4, pods=4, nvlink="Required", priority=1000)
    one = plan_preemption(
        Preemptor(req), runs, snap, POLICY, NOW, rules=PreemptionRules(max_blocks=1)
    )
    every = plan_preemption(Preemptor(req), runs, snap, POLICY, NOW)
    assert isinstance(one, PreemptionPlan)
    assert isinstance(every, PreemptionPlan)
    assert one.victim_uids == every.victim_uids
    assert one.domains == ("clique:b-fabric.0",)


def test_bound_reaches_the_kth_lowest_priority() -> None:
    bound = Bound(2)
    bound.add(3)
    assert bound.prio == float("inf")
    bound.add(1)
    assert bound.prio == 3
    bound.add(0)
    assert bound.prio == 1
    bound.add(7)
    assert bound.prio == 1


def test_blocks_whose_jobs_are_all_above_the_bound_are_not_read() -> None:
    """One estimate at priority 0 already found and one block wanted: the clique whose jobs
    are all of priority 5 is passed over (counted), the priority-0 clique is estimated."""

    def attrs(uid: str, i: int) -> dict[str, Any]:
        return {"priority": 0 if "-c0-" in uid else 5, "started_at": NOW - 100}

    state, runs = nvl72_full_of_4gpu_jobs("b", cliques=2, attrs=attrs)
    snap = fleet(state)
    index = RunningIndex(snap, runs)
    req = job("big", gpus=4, pods=4, nvlink="Required", priority=1000)
    s = Search(Preemptor(req), snap, POLICY, PreemptionRules(), NOW, None, None, (), ())
    every = estimates(s, snap.cluster("b"), index, set(), {}, Bound(8))
    assert sorted(r.bkey for r in every) == ["clique:b-fabric.0", "clique:b-fabric.1"]
    bound = Bound(1)
    bound.add(0)
    rows = estimates(s, snap.cluster("b"), index, set(), {}, bound)
    assert [r.bkey for r in rows] == ["clique:b-fabric.0"]
    assert bound.passed == {"b": 1}
