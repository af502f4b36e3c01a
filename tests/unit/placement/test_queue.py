"""Queue order and the backfill rule: no head-of-line blocking, no starvation."""

from __future__ import annotations

from collections.abc import Mapping

from placement_builders import hgx_cluster, job, member, node

from gpufed.api.decision import Decision, Outcome
from gpufed.api.request import PlacementRequest
from gpufed.placement import (
    BackfillRule,
    FleetSnapshot,
    Hold,
    Policy,
    hold_for,
    order_key,
    place,
    schedule_pass,
)

POLICY = Policy()


class Loop:
    """A minimal scheduling loop over one snapshot: place, reserve on success."""

    def __init__(self, snapshot: FleetSnapshot) -> None:
        self.s = snapshot
        self.calls = 0

    def attempt(self, req: PlacementRequest, hold: Mapping[str, Hold]) -> Decision:
        self.calls += 1
        d = place(req, self.s, POLICY, 0.0, hold=hold)
        if d.placed:
            self.s.reserve(d, now=0.0, ttl_s=10**9)
        return d

    def hold_for(self, req: PlacementRequest) -> Hold | None:
        return hold_for(req, self.s, POLICY)


def test_order_is_priority_then_submit_time_then_name() -> None:
    jobs = [
        job("late-high", priority=5, submitted_at=30),
        job("early-low", priority=0, submitted_at=10),
        job("early-high", priority=5, submitted_at=20),
        job("b-tie", submitted_at=10),
    ]
    assert [j.job for j in sorted(jobs, key=order_key)] == [
        "ns/early-high",
        "ns/late-high",
        "ns/b-tie",
        "ns/early-low",
    ]


def test_a_job_that_does_not_fit_does_not_block_smaller_ones() -> None:
    loop = Loop(FleetSnapshot([hgx_cluster("a", free=[4, 4])]))
    queue = [job("big", gpus=8, priority=9), job("small", gpus=4, submitted_at=1)]
    result = schedule_pass(queue, 60.0, loop.attempt, loop.hold_for)
    outcomes = {r.job: d.outcome for r, d in result.decisions}
    assert outcomes == {"ns/big": Outcome.UNSCHEDULABLE, "ns/small": Outcome.PLACED}
    assert result.holds == {}


def test_a_starving_job_holds_the_nodes_nearest_to_fitting_it() -> None:
    s = FleetSnapshot([hgx_cluster("a", free=[4, 6, 0]), hgx_cluster("b", free=[2])])
    loop = Loop(s)
    # past both limits: it may hold and it goes ahead of the (younger) small jobs
    rule = BackfillRule(starvation_s=600, oldest_first_s=600)
    big = job("big", gpus=8, submitted_at=0)
    small = [job(f"s{i}", gpus=2, submitted_at=10 + i) for i in range(5)]
    # waited 700 s: it holds the node of "a" with the most free GPUs (6), and the small jobs
    # backfill everywhere else: b (2 free, the tightest fit) and a-n000 (4 free, twice)
    result = schedule_pass([big, *small], 700.0, loop.attempt, loop.hold_for, rule)
    assert result.holds["a"].nodes == frozenset({"a-n001"})
    where = {
        r.job: (d.cluster, tuple(d.pod_sets[0].nodes)) for r, d in result.decisions if d.placed
    }
    assert where == {
        "ns/s0": ("b", ("b-n000",)),
        "ns/s1": ("a", ("a-n000",)),
        "ns/s2": ("a", ("a-n000",)),
    }
    blocked = next(d for r, d in result.decisions if r.job == "ns/s3")
    assert "held for ns/big" in blocked.message
    # the work on a-n001 finishes (the member reports it idle): the big job fits there
    s.upsert_node("a", s.node("a", "a-n001").model_copy(update={"requested": {}}))
    result = schedule_pass([big, *small[3:]], 800.0, loop.attempt, loop.hold_for, rule)
    placed = {r.job: d for r, d in result.decisions if d.placed}
    assert placed["ns/big"].pod_sets[0].nodes == {"a-n001": 1}


def test_a_job_without_gpus_holds_its_whole_member() -> None:
    s = FleetSnapshot([hgx_cluster("a", free=[8])])
    cpu_job = job("cpu", requests={"cpu": 10**9}, submitted_at=0)
    hold = hold_for(cpu_job, s, POLICY)
    assert hold is None  # no member could ever hold it: nothing to wait for
    assert place(cpu_job, s, POLICY, 0).outcome == Outcome.REJECTED


def test_before_starvation_small_jobs_backfill_freely() -> None:
    loop = Loop(FleetSnapshot([hgx_cluster("a", free=[4, 4])]))
    result = schedule_pass(
        [job("big", gpus=8, submitted_at=0), job("s", gpus=4, submitted_at=1)],
        100.0,
        loop.attempt,
        loop.hold_for,
        BackfillRule(starvation_s=600),
    )
    assert result.holds == {}
    assert [r.job for r, _ in result.placed] == ["ns/s"]


def test_high_priority_job_is_tried_first_and_holds_before_lower_ones() -> None:
    loop = Loop(FleetSnapshot([hgx_cluster("a", free=[4, 4])]))
    queue = [job("small", gpus=4, submitted_at=0), job("vip", gpus=8, priority=10, submitted_at=5)]
    result = schedule_pass(
        queue, 5000.0, loop.attempt, loop.hold_for, BackfillRule(starvation_s=600)
    )
    assert [r.job for r, _ in result.decisions] == ["ns/vip", "ns/small"]
    assert result.holds["a"].nodes == frozenset({"a-n000"})
    [(_, d)] = result.placed
    assert d.pod_sets[0].nodes == {"a-n001": 1}


def test_identical_failing_jobs_are_answered_without_placing_again() -> None:
    loop = Loop(FleetSnapshot([hgx_cluster("a", free=[4])]))
    queue = [job(f"j{i}", gpus=8, submitted_at=i) for i in range(5)]
    result = schedule_pass(queue, 1.0, loop.attempt, loop.hold_for)
    assert loop.calls == 1
    assert [d.uid for _, d in result.decisions] == [f"uid-j{i}" for i in range(5)]
    assert all(d.outcome == Outcome.UNSCHEDULABLE for _, d in result.decisions)


def test_a_starving_job_no_node_could_ever_take_holds_nothing() -> None:
    # nodeSelector that no node matches: draining cannot help, so holding would only block
    # every later job on the held nodes (or, for a job without GPUs, the whole member) forever
    s = FleetSnapshot([hgx_cluster("a", nodes=2)])
    loop = Loop(s)
    rule = BackfillRule(starvation_s=600)
    for stuck in (
        job("stuck-gpu", gpus=8, node_selector={"zone": "nowhere"}, submitted_at=0),
        job("stuck-cpu", requests={"cpu": 1000}, node_selector={"zone": "nowhere"}),
    ):
        assert hold_for(stuck, s, POLICY) is None
        small = job("small", gpus=8, submitted_at=10)
        result = schedule_pass([stuck, small], 5000.0, loop.attempt, loop.hold_for, rule)
        assert result.holds == {}
        assert [r.job for r, _ in result.placed] == ["ns/small"]


def test_a_starving_job_holds_only_nodes_its_node_selector_allows() -> None:
    other = node("a-n000", free=6)
    mine = node("a-n001", free=4, labels={"zone": "z1"})
    s = FleetSnapshot([member("a", [other, mine])])
    big = job("big", gpus=8, node_selector={"zone": "z1"}, submitted_at=0)
    hold = hold_for(big, s, POLICY)
    assert hold is not None
    assert hold.nodes == frozenset({"a-n001"})


def test_a_starving_job_spanning_nodes_holds_enough_nodes_its_selector_allows() -> None:
    nodes = [
        node(f"a-n{i}", free=6 - i, labels={"zone": "z1" if i % 2 else "z2"}) for i in range(6)
    ]
    s = FleetSnapshot([member("a", nodes)])
    big = job("big", gpus=8, pods=2, nvlink="None", node_selector={"zone": "z1"})
    hold = hold_for(big, s, POLICY)
    assert hold is not None
    assert hold.nodes == frozenset({"a-n1", "a-n3"})
