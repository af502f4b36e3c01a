"""Hypothesis properties of one preemption cycle over random busy fleets.

After a cycle of several preemptors (HGX nodes and small NVLink cliques full of jobs of mixed
priorities): with every plan carried out, no node's planned use exceeds its allocatable;
every victim set is necessary (putting back any one victim makes its preemptor not fit) and
enough; a plan is made only for a job that does not fit as the earlier plans leave the fleet,
and "fits without preemption" only for one that does; an exact plan is the cheapest set of its
member (every subset of that member's eligible jobs, when at most 8, tried with ``place()``;
test_preemption_optimum.py compares across members against an independent brute force); no
victim has a priority equal to or above its preemptor's (no queues here, so no reclaim); and
the snapshot is unchanged by planning.
"""

from __future__ import annotations

import itertools
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from placement_builders import GB200, GPU, H100, job, member
from preemption_builders import busy_node, running

from gpufed.api.decision import Outcome
from gpufed.placement import FleetSnapshot, Policy, place
from gpufed.placement.preemptcycle import PreemptionCycle
from gpufed.placement.preemption import (
    NoPreemption,
    PreemptionPlan,
    Preemptor,
    Running,
    Victim,
    work_lost_gpu_s,
)
from gpufed.placement.victimblocks import set_key
from gpufed.placement.whatif import OnlyMember, freed

NOW = 50_000.0
POLICY = Policy()
SETTINGS = settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def busy_fleets(draw: Any) -> tuple[FleetSnapshot, list[Running]]:
    members, runs = [], []
    for m in range(draw(st.integers(1, 2))):
        name = f"m{m}"
        nodes = []
        for i in range(draw(st.integers(1, 3))):  # HGX nodes
            nodes.append(_fill(draw, name, f"{name}-n{i}", 8, runs, product=H100))
        for c in range(draw(st.integers(0, 2))):  # cliques of 4 trays x 4 GPUs
            kw = {"product": GB200, "clique": f"{name}-fab.{c}"}
            first = 0
            if draw(st.booleans()):  # an 8-GPU job on trays 0 and 1
                uid, pair = f"{name}-c{c}-wide", [f"{name}-c{c}-t{t}" for t in (0, 1)]
                runs.append(
                    running(
                        uid,
                        name,
                        dict.fromkeys(pair, 4),
                        priority=draw(st.integers(0, 3)),
                        started_at=draw(st.floats(0, NOW)),
                        interval=draw(st.sampled_from([None, 600.0, 3600.0])),
                    )
                )
                nodes += [busy_node(t, [(uid, 4)], gpus=4, **kw) for t in pair]
                first = 2
            for t in range(first, 4):
                nodes.append(_fill(draw, name, f"{name}-c{c}-t{t}", 4, runs, **kw))
        members.append(member(name, nodes))
    return FleetSnapshot(members), runs


def _fill(draw: Any, cluster: str, n: str, gpus: int, runs: list[Running], **kw: Any) -> Any:
    left, jobs = gpus, []
    while left and draw(st.integers(0, 5)):  # mostly full nodes: most preemptors must preempt
        g = draw(st.sampled_from([x for x in (1, 2, 4, 8) if x <= left]))
        uid = f"{n}-j{len(jobs)}"
        jobs.append((uid, g))
        runs.append(
            running(
                uid,
                cluster,
                {n: g},
                priority=draw(st.integers(0, 3)),
                started_at=draw(st.floats(0, NOW)),
                interval=draw(st.sampled_from([None, 600.0, 3600.0])),
            )
        )
        left -= g
    return busy_node(n, jobs, gpus=gpus, **kw)


preemptors = st.lists(
    st.tuples(
        st.sampled_from([(1, 1), (2, 1), (4, 1), (8, 1), (4, 2), (4, 4), (2, 4)]),
        st.sampled_from(["Required", "Preferred"]),
        st.integers(1, 4),
    ),
    min_size=1,
    max_size=4,
)


def _planned_use_fits(snap: FleetSnapshot) -> list[str]:
    bad = []
    for c in snap.cluster_names:
        for name, n in snap.cluster(c).nodes.items():
            use = n.inv.requested.get(GPU, 0) + snap.outstanding(c, name).get(GPU, 0)
            if use > n.inv.allocatable.get(GPU, 0):
                bad.append(f"{c}/{name}: {use} > {n.inv.allocatable.get(GPU, 0)}")
    return bad


def _fits_in(snap: FleetSnapshot, req: Any, cluster: str) -> bool:
    d = place(req, snap, POLICY, NOW, hold=OnlyMember(cluster, snap.cluster_names))
    return d.outcome == Outcome.PLACED


def _fits_anywhere(snap: FleetSnapshot, req: Any) -> bool:
    return place(req, snap, POLICY, NOW).outcome == Outcome.PLACED


@SETTINGS
@given(busy_fleets(), preemptors)
def test_a_cycle_never_over_frees_and_every_victim_is_necessary(
    built: tuple[FleetSnapshot, list[Running]], wanted: list[Any]
) -> None:
    snap, runs = built
    before = {(c, n): snap.free(c, n) for c in snap.cluster_names for n in snap.cluster(c).nodes}
    cycle = PreemptionCycle(snap, POLICY, NOW, runs)
    reqs = {}
    results: list[tuple[Any, PreemptionPlan | NoPreemption, list[PreemptionPlan]]] = []
    for i, ((g, pods), nvl, prio) in enumerate(wanted):
        req = job(f"p{i}", gpus=g, pods=pods, nvlink=nvl, priority=prio)
        reqs[req.uid] = req
        earlier = list(cycle.plans)
        results.append((req, cycle.plan(Preemptor(req)), earlier))
    after = {(c, n): snap.free(c, n) for c in snap.cluster_names for n in snap.cluster(c).nodes}
    assert after == before
    plans = cycle.plans
    assert plans == [r for _, r, _ in results if isinstance(r, PreemptionPlan)]
    victims = [v.running for p in plans for v in p.victims]
    assert len({v.uid for v in victims}) == len(victims), "a victim chosen twice"
    with freed(snap, victims, [p.decision for p in plans], NOW):
        assert _planned_use_fits(snap) == []
    for req, r, earlier in results:
        prior = [v.running for q in earlier for v in q.victims]
        held = [q.decision for q in earlier]
        with freed(snap, prior, held, NOW):
            fits_now = _fits_anywhere(snap, req)
        if isinstance(r, NoPreemption):
            event("no preemption")
            assert fits_now == r.reason.startswith("fits without preemption"), r.reason
            continue
        event(f"plan: {r.search}")
        assert not fits_now, f"{req.uid} fit without preemption"
        assert all(v.running.priority < req.priority and v.why == "priority" for v in r.victims)
        for v in r.victims:
            rest = [x.running for x in r.victims if x is not v]
            with freed(snap, prior + rest, held, NOW):
                assert not _fits_in(snap, req, r.cluster), (
                    f"{v.running.uid} was not needed by {r.preemptor}"
                )
        with freed(snap, prior + [v.running for v in r.victims], held, NOW):
            assert _fits_in(snap, req, r.cluster)
        if r.search == "exact search":
            _assert_cheapest_in_member(snap, req, r, prior, held, runs)


def _assert_cheapest_in_member(
    snap: FleetSnapshot,
    req: Any,
    plan: PreemptionPlan,
    prior: list[Running],
    held: list[Any],
    runs: list[Running],
) -> None:
    """No subset of the plan member's eligible jobs (at most 8) that fits has a lower key."""
    gone = {r.uid for r in prior}
    taken = {v.running.uid: v for v in plan.victims}
    eligible = [
        Victim(r, work_lost_gpu_s(r, NOW), "priority")
        for r in runs
        if r.cluster == plan.cluster and r.uid not in gone and r.priority < req.priority
    ]
    if len(eligible) > 8:
        return
    event("exact plan checked against every subset of its member")
    key = set_key(plan.cluster, list(taken.values()))
    for n in range(1, len(eligible) + 1):
        for subset in itertools.combinations(eligible, n):
            k = set_key(plan.cluster, subset)
            if k >= key:
                continue
            with freed(snap, prior + [v.running for v in subset], held, NOW):
                assert not _fits_in(snap, req, plan.cluster), f"{k} is cheaper than {key}"
