"""Queue order and the backfill rule: no head-of-line blocking, no starvation."""

from __future__ import annotations

from collections.abc import Mapping

from placement_builders import hgx_cluster, job

from gpufed.api.decision import Decision, Outcome
from gpufed.api.request import PlacementRequest
from gpufed.placement import (
    BackfillRule,
    FleetSnapshot,
    Policy,
    nearest_member,
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

    def attempt(self, req: PlacementRequest, hold: Mapping[str, str]) -> Decision:
        self.calls += 1
        d = place(req, self.s, POLICY, 0.0, hold=hold)
        if d.placed:
            self.s.reserve(d, now=0.0, ttl_s=10**9)
        return d

    def nearest(self, req: PlacementRequest) -> str | None:
        return nearest_member(req, self.s, POLICY)


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
    result = schedule_pass(queue, 60.0, loop.attempt, loop.nearest)
    outcomes = {r.job: d.outcome for r, d in result.decisions}
    assert outcomes == {"ns/big": Outcome.UNSCHEDULABLE, "ns/small": Outcome.PLACED}
    assert result.holds == {}


def test_a_starving_job_holds_its_nearest_member_until_it_fits() -> None:
    s = FleetSnapshot([hgx_cluster("a", free=[4, 4]), hgx_cluster("b", free=[2])])
    loop = Loop(s)
    rule = BackfillRule(starvation_s=600)
    big = job("big", gpus=8, submitted_at=0)
    small = [job(f"s{i}", gpus=2, submitted_at=10 + i) for i in range(4)]
    # waited 700 s: it holds "a" (most free GPUs) and the small jobs may only use "b"
    result = schedule_pass([big, *small], 700.0, loop.attempt, loop.nearest, rule)
    assert set(result.holds) == {"a"}
    where = {r.job: d.cluster for r, d in result.decisions if d.placed}
    assert where == {"ns/s0": "b"}
    blocked = next(d for r, d in result.decisions if r.job == "ns/s1")
    assert {x.cluster: x.plugin for x in blocked.rejections}["a"] == "Backfill"
    # the running work on "a" finishes (the member reports its nodes free): the big job fits
    s.set_member(hgx_cluster("a", free=[8, 4]))
    result = schedule_pass([big, *small[1:]], 800.0, loop.attempt, loop.nearest, rule)
    assert {r.job: d.cluster for r, d in result.decisions if d.placed}["ns/big"] == "a"


def test_before_starvation_small_jobs_backfill_freely() -> None:
    loop = Loop(FleetSnapshot([hgx_cluster("a", free=[4, 4])]))
    result = schedule_pass(
        [job("big", gpus=8, submitted_at=0), job("s", gpus=4, submitted_at=1)],
        100.0,
        loop.attempt,
        loop.nearest,
        BackfillRule(starvation_s=600),
    )
    assert result.holds == {}
    assert [r.job for r, _ in result.placed] == ["ns/s"]


def test_high_priority_job_is_tried_first_and_holds_before_lower_ones() -> None:
    loop = Loop(FleetSnapshot([hgx_cluster("a", free=[4, 4])]))
    queue = [job("small", gpus=4, submitted_at=0), job("vip", gpus=8, priority=10, submitted_at=5)]
    result = schedule_pass(
        queue, 5000.0, loop.attempt, loop.nearest, BackfillRule(starvation_s=600)
    )
    assert [r.job for r, _ in result.decisions] == ["ns/vip", "ns/small"]
    assert set(result.holds) == {"a"}
    assert result.placed == []


def test_identical_failing_jobs_are_answered_without_placing_again() -> None:
    loop = Loop(FleetSnapshot([hgx_cluster("a", free=[4])]))
    queue = [job(f"j{i}", gpus=8, submitted_at=i) for i in range(5)]
    result = schedule_pass(queue, 1.0, loop.attempt, loop.nearest)
    assert loop.calls == 1
    assert [d.uid for _, d in result.decisions] == [f"uid-j{i}" for i in range(5)]
    assert all(d.outcome == Outcome.UNSCHEDULABLE for _, d in result.decisions)
