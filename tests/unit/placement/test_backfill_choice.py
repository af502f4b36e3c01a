"""Which hold a starving job takes and how far ahead its start is put (issue 29, goal 4):
``BackfillRule.hold_choice`` ``least-idle`` (:func:`gpufed.placement.backfill.idle_until_start`,
checked against a second-by-second count) and ``BackfillRule.start_accuracy`` (a hold lends
less, never more), and the 16 h starvation bound with both."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from placement_builders import GPU, hgx_cluster, job
from test_backfill import _stream
from test_queue_order import Loop as QueueLoop
from test_simreport import run

from gpufed.api.request import PlacementRequest
from gpufed.placement import BackfillRule, FleetSnapshot, Hold, schedule_pass
from gpufed.placement.backfill import expected_start, idle_until_start
from gpufed.placement.sim.simclasses import class_report
from gpufed.placement.sim.simulate import simulate
from gpufed.placement.sim.timelimits import TimeLimitModel, with_time_limits
from gpufed.placement.sim.trace import TraceJob


def _idle_by_seconds(
    now: int, demand: int, free: int, releases: list[tuple[int | None, int]]
) -> tuple[int, int] | None:
    """(start, idle GPU-seconds) counted one second at a time: the first second at which the
    free GPUs (free now, plus every release whose end has come) reach ``demand``, and the free
    GPUs summed over the seconds before it; None when that second never comes."""
    total = free + sum(g for end, g in releases if end is not None)
    if total < demand:
        return None
    idle = 0
    t = now
    while True:
        have = free + sum(g for end, g in releases if end is not None and end <= t)
        if have >= demand:
            return t, idle
        idle += have
        t += 1


release = st.tuples(st.one_of(st.none(), st.integers(0, 60)), st.integers(1, 8))


@given(
    now=st.integers(0, 30),
    demand=st.integers(1, 16),
    free=st.integers(0, 8),
    releases=st.lists(release, max_size=5),
)
def test_idle_until_start_is_the_free_gpus_summed_until_the_expected_start(
    now: int, demand: int, free: int, releases: list[tuple[int | None, int]]
) -> None:
    ref = _idle_by_seconds(now, demand, free, releases)
    got = idle_until_start(now, demand, free, releases)
    start = expected_start(now, demand, free, releases)
    if ref is None or start is None:
        # expected_start also gives up where the demand needs a job without a limit
        assert got is None
        assert start is None or ref is not None
        return
    assert start == ref[0]
    assert got == pytest.approx(ref[1])


NODES = ("a-n000", "a-n001", "a-n002")


@pytest.mark.parametrize(
    ("choice", "starts", "idle", "node"),
    [
        # earliest-start ranks by start, whatever the idle GPU-seconds
        ("earliest-start", (5000.0, 3000.0, 4000.0), (10.0, 900.0, 50.0), "a-n001"),
        # least-idle ranks by idle GPU-seconds; the hold keeps that candidate's own start
        ("least-idle", (5000.0, 3000.0, 4000.0), (10.0, 900.0, 50.0), "a-n000"),
        ("least-idle", (5000.0, 3000.0, 4000.0), (900.0, 900.0, 50.0), "a-n002"),
        ("least-idle", (5000.0, 3000.0, 4000.0), (50.0, 50.0, 50.0), "a-n000"),  # tie: first
        ("least-idle", (None, 3000.0, 4000.0), (None, 900.0, 50.0), "a-n002"),  # unknown last
    ],
)
def test_a_starving_job_holds_the_candidate_of_least_rank(
    choice: str,
    starts: tuple[float | None, ...],
    idle: tuple[float | None, ...],
    node: str,
) -> None:
    """hold_for names a-n000, hold_avoiding then a-n001 and a-n002 in turn; with
    ``hold_choice="least-idle"`` the pass holds the one of least ``hold_rank``."""
    loop = QueueLoop(FleetSnapshot([hgx_cluster("a", free=[4, 4, 4])]))

    def first(req: PlacementRequest) -> Hold | None:
        return Hold("a", frozenset({NODES[0]}), "held")

    def avoiding(req: PlacementRequest, held: Mapping[str, Hold]) -> Hold | None:
        taken = held["a"].nodes if "a" in held else frozenset()
        free = [n for n in NODES if n not in taken]
        return Hold("a", frozenset(free[:1]), "held") if free else None

    def start(req: PlacementRequest, hold: Hold) -> float | None:
        (n,) = hold.nodes
        return starts[NODES.index(n)]

    def rank(req: PlacementRequest, hold: Hold) -> float | None:
        (n,) = hold.nodes
        return idle[NODES.index(n)]

    big = job("big", gpus=8, requests={GPU: 8}, submitted_at=0.0)
    rule = BackfillRule(hold_candidates=3, holds_per_shape=1, hold_choice=choice)  # type: ignore[arg-type]
    result = schedule_pass(
        [big],
        4000.0,
        loop.attempt,
        first,
        rule,
        hold_start=start,
        hold_avoiding=avoiding,
        hold_rank=rank,
    )
    assert result.holds["a"].nodes == {node}
    assert result.holds["a"].starts_at == starts[NODES.index(node)]


def _one_node_week(accuracy: float) -> dict[str, tuple[float | None, str | None]]:
    """One 8-GPU node. ``run`` (4 GPUs, 1,000 s, limit 4,000 s) starts at 0; ``big`` (8 GPUs)
    arrives at 10 and holds the node at once: its expected start there is 4,000 s by the
    limit, 2,000 s with accuracy 0.5; ``small`` (2 GPUs, 500 s, limit 2,500 s) arrives at 20:
    its limit ends at 2,520 s. Job -> (wait, borrowed hold)."""
    jobs = [
        TraceJob("run", 0.0, 4, 1000.0, 4, "Preferred", time_limit_s=4000.0),
        TraceJob("big", 10.0, 8, 100.0, 8, "Preferred", time_limit_s=100.0),
        TraceJob("small", 20.0, 2, 500.0, 2, "Preferred", time_limit_s=2500.0),
    ]
    rule = BackfillRule(order="fifo", starvation_s=0.0, start_accuracy=accuracy)
    res = simulate([hgx_cluster("a", nodes=1)], jobs, "gpufed", backfill=rule)
    return {r.job_id: (r.wait_s, r.backfill) for r in res.records}


def test_start_accuracy_lends_a_hold_to_fewer_jobs() -> None:
    """By the limit (accuracy 1) ``small`` ends before ``big``'s expected start and runs inside
    its hold at once; with accuracy 0.5 the start is 2,000 s, ``small``'s limit ends after it,
    and it waits until ``big`` has run (``run`` ends at 1,000 s, ``big`` at 1,100 s). ``big``
    starts at 1,000 s either way: borrowing delayed nobody."""
    full = _one_node_week(1.0)
    assert full["small"][0] == 0.0
    assert full["small"][1] is not None
    assert full["big"][0] == 990.0
    half = _one_node_week(0.5)
    assert half["small"] == (1080.0, None)
    assert half["big"][0] == 990.0


@pytest.mark.parametrize(
    "rule",
    [
        BackfillRule(hold_candidates=4, hold_choice="least-idle"),
        BackfillRule(start_accuracy=0.4),
        BackfillRule(hold_candidates=4, hold_choice="least-idle", start_accuracy=0.4),
        BackfillRule(hold_nodes="earliest-drain"),
        BackfillRule(hold_nodes="earliest-drain-multi"),
        BackfillRule(hold_nodes="earliest-drain-multi-free"),
        BackfillRule(hold_nodes="earliest-drain-multi", oldest_first_one_pod_s=14_400),
    ],
    ids=[
        "least-idle",
        "accuracy 0.4",
        "both",
        "earliest-drain",
        "earliest-drain-multi",
        "earliest-drain-multi-free",
        "one pod at 4 h",
    ],
)
def test_with_either_rule_the_big_job_still_waits_at_most_sixteen_hours_and_a_drain(
    rule: BackfillRule,
) -> None:
    """The starvation bound (as test_backfill's, drawn limits): neither rule lets a hold lend
    past the limit-based start, so the 16-GPU job still starts within 16 h plus one drain; nor
    does holding the nodes that drain first (``hold_nodes``, test_hold_nodes), which moves
    which nodes drain, not whether the job holds once it has waited 16 h."""
    jobs = with_time_limits(_stream(70_000.0), TimeLimitModel())
    drain = max(j.time_limit_s or 0.0 for j in jobs if j.job_id != "big")
    res = simulate([hgx_cluster("a", nodes=3)], jobs, "gpufed", backfill=rule)
    assert res.placed == res.jobs
    [rec] = [r for r in res.records if r.job_id == "big"]
    assert rec.wait_s is not None
    assert rec.wait_s <= 57_600 + drain
    assert class_report(res.records)["backfill_limit_hits"] == 0


@pytest.mark.parametrize(
    ("flag", "value", "says"),
    [
        ("--queue-hold-choice", "latest", "use earliest-start or least-idle"),
        ("--queue-start-accuracy", "0", "must be a number > 0 and <= 1"),
        ("--queue-start-accuracy", "1.5", "must be a number > 0 and <= 1"),
    ],
)
def test_a_bad_hold_choice_or_start_accuracy_names_its_flag(
    tmp_path: Path, flag: str, value: str, says: str
) -> None:
    code, out = run(tmp_path, "--policy", "gpufed", flag, value)
    text = " ".join(out.split())
    assert code == 2
    assert flag in text
    assert says in text


def test_the_simulator_runs_both_rules_from_its_flags(tmp_path: Path) -> None:
    flags = ("--queue-hold-candidates", "4", "--queue-hold-choice", "least-idle")
    code, out = run(
        tmp_path, "--policy", "gpufed", "--json", *flags, "--queue-start-accuracy", "0.5"
    )
    assert code == 0, out
    assert json.loads(out)["placed"] == 3
