"""Which nodes a starving job holds (issue 29, goal 4): ``BackfillRule.hold_nodes``
``earliest-drain`` (``hold_for``'s ``start_on``): the nodes the running jobs' time limits free
first, checked against a brute force over every node set with each node's drain counted one
second at a time (the 16 h starvation bound with the rule on: test_backfill_choice)."""

from __future__ import annotations

from itertools import combinations
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from placement_builders import hgx_cluster, job
from test_simreport import run

from gpufed.placement import BackfillRule, FleetSnapshot, Policy, hold_for
from gpufed.placement.holds import FREE_FIRST_SLACK
from gpufed.placement.sim.simulate import simulate
from gpufed.placement.sim.trace import TraceJob

POLICY = Policy()
NOW = 100

#: per node: the running jobs there, (GPUs, end second)
Node = list[tuple[int, int]]


def _free_at_second(node: Node, t: int) -> int:
    """GPUs of an 8-GPU node free at second ``t``: 8 minus the jobs still running then."""
    return 8 - sum(g for g, end in node if end > t)


def _drain_second(node: Node, gpus: int) -> int:
    """The first second from NOW at which ``gpus`` GPUs of the node are free, stepping one
    second at a time (every job has an end, so it comes)."""
    t = NOW
    while _free_at_second(node, t) < gpus:
        t += 1
    return t


@st.composite
def fleets(draw: st.DrawFn) -> list[Node]:
    out: list[Node] = []
    for _ in range(draw(st.integers(2, 5))):
        used = 0
        jobs: Node = []
        for g in draw(st.lists(st.integers(1, 8), max_size=4)):
            if used + g <= 8:
                jobs.append((g, draw(st.integers(NOW + 1, NOW + 200))))
                used += g
        out.append(jobs)
    return out


def _hold(
    nodes: list[Node], req_gpus: int, pods: int, by_drain: bool, free_first: bool = False
) -> frozenset[str]:
    names = [f"a-n{i:03d}" for i in range(len(nodes))]
    snap = FleetSnapshot([hgx_cluster("a", free=[_free_at_second(n, NOW) for n in nodes])])

    def start_on(cluster: str, node: str, gpus: int) -> float | None:
        assert cluster == "a"
        return float(_drain_second(nodes[names.index(node)], gpus))

    req = job("big", gpus=req_gpus, pods=pods)
    hold = hold_for(
        req, snap, POLICY, start_on=start_on if by_drain else None, free_first=free_first, now=NOW
    )
    assert hold is not None
    return hold.nodes


@settings(max_examples=150, deadline=None)
@given(nodes=fleets(), data=st.data())
def test_earliest_drain_holds_a_node_set_where_the_job_starts_first(
    nodes: list[Node], data: st.DataObject
) -> None:
    """A job of ``pods`` 8-GPU pods holds ``pods`` nodes whose last drain (second by second)
    is the earliest of every set of that many nodes; a one-pod job of ``g`` GPUs the node
    where ``g`` GPUs free first."""
    pods = data.draw(st.integers(1, len(nodes)))
    gpus = 8 if pods > 1 else data.draw(st.integers(1, 8))
    held = _hold(nodes, gpus, pods, by_drain=True)
    idx = [int(n.rsplit("n", 1)[1]) for n in held]
    assert len(idx) == pods

    def start(group: tuple[int, ...] | list[int]) -> int:
        return max(_drain_second(nodes[i], gpus) for i in group)

    best = min(start(c) for c in combinations(range(len(nodes)), pods))
    assert start(idx) == best


@settings(max_examples=150, deadline=None)
@given(nodes=fleets(), data=st.data())
def test_free_first_holds_the_most_free_nodes_drained_within_the_slack(
    nodes: list[Node], data: st.DataObject
) -> None:
    """``earliest-drain-multi-free``: a job of ``pods`` 8-GPU pods holds, of the nodes
    drained (second by second) within FREE_FIRST_SLACK times the earliest start's wait, a set
    with the most free GPUs now of every such set (brute force over the sets)."""
    pods = data.draw(st.integers(2, max(2, len(nodes))))
    if pods > len(nodes):
        return
    held = _hold(nodes, 8, pods, by_drain=True, free_first=True)
    idx = [int(n.rsplit("n", 1)[1]) for n in held]
    drain = [_drain_second(n, 8) for n in nodes]
    free = [_free_at_second(n, NOW) for n in nodes]
    best = min(max(drain[i] for i in c) for c in combinations(range(len(nodes)), pods))
    until = NOW + FREE_FIRST_SLACK * (best - NOW)
    allowed = [i for i in range(len(nodes)) if drain[i] <= until]
    most = max(sum(free[i] for i in c) for c in combinations(allowed, pods))
    assert len(idx) == pods
    assert all(drain[i] <= until for i in idx)
    assert sum(free[i] for i in idx) == most


def test_free_first_leaves_a_busy_node_that_drains_soon_to_others() -> None:
    """n000 (busy, drained at 110) and n002 (busy, 130) are the earliest pair; n001 has 7
    GPUs free and drains at 140, within 1.5 x the 30 s wait: free-first holds n000 and n001."""
    nodes: list[Node] = [[(8, 110)], [(1, 140)], [(8, 130)]]
    assert _hold(nodes, 8, 2, by_drain=True) == {"a-n000", "a-n002"}
    assert _hold(nodes, 8, 2, by_drain=True, free_first=True) == {"a-n000", "a-n001"}


def test_without_the_rule_the_node_with_most_free_gpus_is_held_even_if_it_drains_last() -> None:
    """The example the property needs the rule for: n000 has 7 GPUs free but a 1-GPU job
    until second 1,000; n001 has 0 free, its 8-GPU job ends at second 150."""
    nodes: list[Node] = [[(1, 1000)], [(8, 150)]]
    assert _hold(nodes, 8, 1, by_drain=False) == {"a-n000"}
    assert _hold(nodes, 8, 1, by_drain=True) == {"a-n001"}


def _week(hold_nodes: str) -> dict[str, float | None]:
    """Two 8-GPU nodes, arrival order. n000: ``long`` (1 GPU, to 10,000 s) and ``a`` (7 GPUs,
    to 100 s); n001: ``b`` (8 GPUs, to 2,000 s); every limit its runtime. ``big`` (8 GPUs)
    arrives at 10 and holds nodes at once; ``s`` (1 GPU, 50 s, limit 20,000 s: too long to
    borrow any hold) arrives at 200. Most-free: ``big`` holds n000 (7 free from 100 s, drained
    at 10,000 s), so ``s`` waits until ``big`` starts on n001 at 2,000 s. Earliest-drain:
    ``big`` holds n001 (drained at 2,000 s) and ``s`` runs on n000 at once. Job -> wait."""
    jobs = [
        TraceJob("long", 0.0, 1, 10_000.0, 1, "Preferred", time_limit_s=10_000.0),
        TraceJob("a", 0.0, 7, 100.0, 7, "Preferred", time_limit_s=100.0),
        TraceJob("b", 0.0, 8, 2_000.0, 8, "Preferred", time_limit_s=2_000.0),
        TraceJob("big", 10.0, 8, 100.0, 8, "Preferred", time_limit_s=100.0),
        TraceJob("s", 200.0, 1, 50.0, 1, "Preferred", time_limit_s=20_000.0),
    ]
    rule = BackfillRule(
        order="fifo",
        starvation_s=0.0,
        spare_whole_nodes_s=0.0,
        hold_nodes=hold_nodes,  # type: ignore[arg-type]
    )
    res = simulate([hgx_cluster("a", nodes=2)], jobs, "gpufed", backfill=rule)
    return {r.job_id: r.wait_s for r in res.records}


def test_in_the_simulator_the_starving_job_holds_the_node_that_drains_first() -> None:
    most_free = _week("most-free")
    assert (most_free["big"], most_free["s"]) == (1_990.0, 1_800.0)
    drain = _week("earliest-drain")
    assert (drain["big"], drain["s"]) == (1_990.0, 0.0)
    assert _week("earliest-drain-multi") == most_free  # a job of one pod: most-free


def test_a_bad_hold_nodes_value_names_its_flag(tmp_path: Path) -> None:
    code, out = run(tmp_path, "--policy", "gpufed", "--queue-hold-nodes", "fewest")
    text = " ".join(w for w in out.split() if w != "│")
    assert code == 2
    assert "--queue-hold-nodes" in text
    assert "use most-free or earliest-drain or earliest-drain-multi or" in text
