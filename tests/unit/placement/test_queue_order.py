"""The pass order: jobs past ``oldest_first_s`` first, oldest first; the others fewer GPUs first."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest
from placement_builders import hgx_cluster, job
from pydantic import ValidationError
from typer.testing import CliRunner

from gpufed.api.decision import Decision
from gpufed.api.request import PlacementRequest
from gpufed.cli.main import app
from gpufed.hub.components.config import HubConfig
from gpufed.placement import (
    BackfillRule,
    FleetSnapshot,
    Hold,
    Policy,
    hold_for,
    order_key,
    pass_key,
    place,
    schedule_pass,
)
from gpufed.placement.sim.simulate import simulate
from gpufed.placement.sim.trace import TraceJob

POLICY = Policy()
FLEET = Path(__file__).resolve().parents[3] / "manifests" / "fleets" / "sim-itp.yaml"


class Loop:
    """A minimal scheduling loop over one snapshot: place, reserve on success."""

    def __init__(self, snapshot: FleetSnapshot) -> None:
        self.s = snapshot

    def attempt(self, req: PlacementRequest, hold: Mapping[str, Hold]) -> Decision:
        d = place(req, self.s, POLICY, 0.0, hold=hold)
        if d.placed:
            self.s.reserve(d, now=0.0, ttl_s=10**9)
        return d

    def hold_for(self, req: PlacementRequest) -> Hold | None:
        return hold_for(req, self.s, POLICY)


def test_pass_order_is_priority_then_oldest_past_the_limit_then_fewest_gpus() -> None:
    jobs = [
        job("fresh-big", gpus=8, submitted_at=1000),
        job("fresh-small", gpus=1, submitted_at=1500),
        job("old-small", gpus=1, submitted_at=100),
        job("old-big", gpus=8, submitted_at=0),
        job("vip-fresh-big", gpus=8, priority=5, submitted_at=1900),
    ]
    key = pass_key(2000.0, BackfillRule(oldest_first_s=1800))
    assert [j.job for j in sorted(jobs, key=key)] == [
        "ns/vip-fresh-big",
        "ns/old-big",
        "ns/old-small",
        "ns/fresh-small",
        "ns/fresh-big",
    ]
    # before the limit, fewer GPUs first whatever the age
    early = pass_key(2000.0, BackfillRule(oldest_first_s=43200))
    assert [j.job for j in sorted(jobs, key=early)] == [
        "ns/vip-fresh-big",
        "ns/old-small",
        "ns/fresh-small",
        "ns/old-big",
        "ns/fresh-big",
    ]
    # fifo: the first-come order of order_key, whatever the sizes
    fifo = pass_key(2000.0, BackfillRule(oldest_first_s=1800, order="fifo"))
    assert sorted(jobs, key=fifo) == sorted(jobs, key=order_key)


def test_small_jobs_start_before_a_bigger_one_and_the_held_big_job_keeps_its_node() -> None:
    # a-n000 (6 free) is the node the 8-GPU job, waiting past oldest_first_s (default 16 h),
    # holds; a-n001 has 4 free GPUs that a 4-GPU job (earlier) and three 1-GPU jobs (later),
    # all fresh, compete for. First-come (the old rule) gives them to the 4-GPU job and the
    # three small ones wait; fewer GPUs first starts the three small ones, and neither rule
    # puts anything on the held node.
    def run(order: str) -> tuple[set[str], frozenset[str], set[str]]:
        loop = Loop(FleetSnapshot([hgx_cluster("a", free=[6, 4])]))
        queue = [
            job("big", gpus=8, submitted_at=0),
            job("j4", gpus=4, submitted_at=69_000),
            *(job(f"s{i}", gpus=1, submitted_at=69_001 + i) for i in range(3)),
        ]
        rule = BackfillRule(order=order)  # type: ignore[arg-type]
        result = schedule_pass(queue, 70_000.0, loop.attempt, loop.hold_for, rule)
        placed = {r.job for r, _ in result.placed}
        used = {n for _, d in result.placed for n in d.pod_sets[0].nodes}
        return placed, result.holds["a"].nodes, used

    placed, held, used = run("smallest-first")
    assert placed == {"ns/s0", "ns/s1", "ns/s2"}
    assert held == frozenset({"a-n000"})
    assert used == {"a-n001"}
    placed, held, used = run("fifo")
    assert placed == {"ns/j4"}
    assert held == frozenset({"a-n000"})
    assert used == {"a-n001"}


def _stream(until: float) -> list[TraceJob]:
    """A 16-GPU job at t=50 among 1-GPU jobs arriving every 100 s, each running 1,500 s:
    about 15 of the 16 GPUs stay busy, so the fleet is never empty while they arrive."""
    small = [
        TraceJob(f"s{i}", i * 100.0, 1, 1500.0, 1, "Required") for i in range(int(until / 100))
    ]
    big = TraceJob("big", 50.0, 16, 1000.0, 8, "Preferred")
    return sorted([*small, big], key=lambda j: j.submit_s)


def _big_wait(rule: BackfillRule, until: float) -> float:
    res = simulate([hgx_cluster("a", nodes=2)], _stream(until), "gpufed", backfill=rule)
    assert res.placed == res.jobs
    [rec] = [r for r in res.records if r.job_id == "big"]
    assert rec.wait_s is not None
    return rec.wait_s


def test_a_big_job_among_a_stream_of_small_ones_is_not_starved() -> None:
    # smallest-first puts every 1-GPU job ahead of the 16-GPU one until it has waited
    # oldest_first_s; then it is walked first and holds both nodes, which drain within one
    # small job's run (1,500 s): it starts then, not when the stream ends
    rule = BackfillRule(oldest_first_s=7200)
    wait = _big_wait(rule, 20_000.0)
    assert 7200 <= wait <= 7200 + 1500 + 100
    # first-come: it is ahead of every later job from the start; it holds after starvation_s
    fifo = _big_wait(BackfillRule(order="fifo"), 20_000.0)
    assert 1800 <= fifo <= 1800 + 1500 + 100
    # without holds the same order starves it until the small jobs stop arriving
    assert _big_wait(rule.model_copy(update={"max_holds": 0}), 20_000.0) > 19_000


def test_with_the_default_limit_a_big_job_waits_at_most_sixteen_hours_and_a_drain() -> None:
    wait = _big_wait(BackfillRule(), 70_000.0)
    assert 57_600 <= wait <= 57_600 + 1500 + 100


def test_the_knobs_reach_the_hub_and_the_simulator_and_bad_values_name_the_flag(
    tmp_path: Path,
) -> None:
    cfg = HubConfig(insecure=True, queue_order="fifo", queue_oldest_first_s=60, queue_max_holds=1)
    assert cfg.backfill_rule == BackfillRule(order="fifo", oldest_first_s=60, max_holds=1)
    assert HubConfig(insecure=True).backfill_rule == BackfillRule()
    with pytest.raises(ValidationError, match="queue_order"):
        HubConfig(insecure=True, queue_order="lifo")  # type: ignore[arg-type]
    t = tmp_path / "t.csv"
    t.write_text("job_id,submit_s,gpus,duration_s\n1,0,8,60\n")
    for flag, value in (
        ("--queue-order", "lifo"),
        ("--oldest-first-s", "-1"),
        ("--starvation-s", "nan"),
        ("--max-holds", "-1"),
        ("--queue-oldest-first", "-1"),  # the hub's names work in the simulator too
        ("--queue-starvation", "nan"),
        ("--queue-max-holds", "-1"),
    ):
        out = CliRunner().invoke(
            app, ["simulate", "--fleet", str(FLEET), "--trace", str(t), flag, value]
        )
        assert out.exit_code == 2, (flag, out.output)
        assert flag in out.output


def test_simulate_accepts_the_hub_flag_names_and_warns_when_queue_order_cannot_apply(
    tmp_path: Path,
) -> None:
    t = tmp_path / "t.csv"
    t.write_text("job_id,submit_s,gpus,duration_s\n1,0,8,60\n")
    base = ["simulate", "--fleet", str(FLEET), "--trace", str(t), "--json"]
    new = CliRunner().invoke(app, [*base, "--queue-max-holds", "0", "--queue-oldest-first", "60"])
    old = CliRunner().invoke(app, [*base, "--max-holds", "0", "--oldest-first-s", "60"])
    assert new.exit_code == 0, new.output
    assert old.exit_code == 0, old.output
    assert "--queue-order applies" not in new.output
    other = CliRunner().invoke(app, [*base, "--policy", "first-admit", "--queue-order", "fifo"])
    assert other.exit_code == 0, other.output
    assert "warning: --queue-order applies to the gpufed policy only" in other.output
