"""``BackfillRule.hold_keep_one_node`` (issue 29 item 4, ``backfill8``; ``hold_for``'s
``keep``): a starving job of one GPU pod holds again the node it held in the last pass, the
other rules (earliest drain, busy, most free) choosing only for a new holder. Checked against
a reference rule written out here over every kept node, every avoided node and made-up drain
times."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Any

import pytest
from placement_builders import hgx_cluster, job
from test_simreport import run

from gpufed.placement import FleetSnapshot, Policy, hold_for
from gpufed.placement.queue import BackfillRule, Hold
from gpufed.placement.sim import simulate as sim_module
from gpufed.placement.sim.simclasses import class_report
from gpufed.placement.sim.simulate import simulate
from gpufed.placement.sim.timelimits import TimeLimitModel, with_time_limits
from gpufed.placement.sim.trace import TraceJob

NODES = ["a-n000", "a-n001", "a-n002", "a-n003"]
#: made-up drain times by node (None: a job without a time limit runs there)
STARTS: dict[str, float | None] = {
    "a-n000": 500.0,
    "a-n001": 100.0,
    "a-n002": None,
    "a-n003": 300.0,
}


def _reference(kept: str | None, avoided: str | None) -> str:
    """The node the rule should hold: the kept one unless another holder of the pass took it;
    otherwise the earliest drain among the nodes not avoided (unknown last, ties by name)."""
    if kept is not None and kept != avoided:
        return kept
    free = [n for n in NODES if n != avoided]
    return min(free, key=lambda n: (math.inf if STARTS[n] is None else STARTS[n], n))


def _start_on(member: str, node: str, gpus: int) -> float | None:
    return STARTS[node]


@pytest.mark.parametrize(
    ("kept", "avoided"), list(itertools.product([None, *NODES], [None, *NODES]))
)
@pytest.mark.parametrize("free", [[0, 0, 0, 0], [2, 0, 4, 0]])
def test_a_one_node_job_keeps_its_node_unless_another_holder_took_it(
    kept: str | None, avoided: str | None, free: list[int]
) -> None:
    s = FleetSnapshot([hgx_cluster("a", free=free)])
    keep = Hold("a", frozenset({kept}), "last pass") if kept is not None else None
    avoid = {"a": Hold("a", frozenset({avoided}), "other")} if avoided is not None else None
    got = hold_for(job("one", gpus=8), s, Policy(), avoid=avoid, start_on=_start_on, keep=keep)
    assert got is not None
    assert (got.cluster, got.nodes) == ("a", frozenset({_reference(kept, avoided)}))


def test_keep_also_overrides_the_busy_and_most_free_choices() -> None:
    full = FleetSnapshot([hgx_cluster("a", free=[0, 0, 0, 0])])
    keep = Hold("a", frozenset({"a-n002"}), "last pass")
    busy = hold_for(job("one", gpus=8), full, Policy(), busy=True, keep=keep)
    assert busy is not None
    assert busy.nodes == frozenset({"a-n002"})
    some = FleetSnapshot([hgx_cluster("a", free=[0, 6, 0, 0])])
    most = hold_for(job("one", gpus=4), some, Policy(), keep=keep)
    assert most is not None
    assert most.nodes == frozenset({"a-n002"})
    # and without keep: the choices as before
    first = hold_for(job("one", gpus=8), full, Policy(), busy=True)
    assert first is not None
    assert first.nodes == frozenset({"a-n000"})
    free6 = hold_for(job("one", gpus=4), some, Policy())
    assert free6 is not None
    assert free6.nodes == frozenset({"a-n001"})


def test_keep_is_dropped_when_it_no_longer_applies() -> None:
    s = FleetSnapshot([hgx_cluster("a", free=[0, 0, 0, 0], gpus=8)])
    fresh = hold_for(job("one", gpus=8), s, Policy(), start_on=_start_on)
    assert fresh is not None
    assert fresh.nodes == frozenset({"a-n001"})
    for keep in (
        Hold("b", frozenset({"a-n003"}), "a member that left"),
        Hold("a", frozenset({"a-n009"}), "a node that left"),
        Hold("a", frozenset(), "the whole member"),
    ):
        got = hold_for(job("one", gpus=8), s, Policy(), start_on=_start_on, keep=keep)
        assert got is not None, keep
        assert got.nodes == fresh.nodes, keep
    # a member held whole by another holder of the pass: nothing there
    whole = {"a": Hold("a", frozenset(), "other")}
    keep = Hold("a", frozenset({"a-n003"}), "last pass")
    assert hold_for(job("one", gpus=8), s, Policy(), avoid=whole, keep=keep) is None
    # a job that no longer fits the kept node drained (16 GPUs on an 8-GPU node: two pods
    # ignore keep anyway, and one pod of 16 GPUs fits no node)
    assert hold_for(job("big", gpus=16), s, Policy(), keep=keep) is None


def test_a_job_of_several_pods_ignores_keep() -> None:
    s = FleetSnapshot([hgx_cluster("a", free=[0, 0, 0, 0])])
    keep = Hold("a", frozenset({"a-n000", "a-n002"}), "last pass")
    got = hold_for(job("two", gpus=8, pods=2), s, Policy(), start_on=_start_on, keep=keep)
    # the two nodes that drain first (100 s, 300 s), not the kept ones
    assert got is not None
    assert got.nodes == frozenset({"a-n001", "a-n003"})


@pytest.mark.parametrize(
    ("given", "bad"),
    [
        (
            ("--queue-hold-nodes", "earliest-drain", "--queue-keep-one-node-hold", "on"),
            ("--queue-keep-one-node-hold", "maybe"),
        ),
        (("--queue-spare-draining", "3600"), ("--queue-spare-draining", "-1")),  # simdrain
    ],
)
def test_the_simulator_takes_the_flag(
    tmp_path: Path, given: tuple[str, ...], bad: tuple[str, str]
) -> None:
    """This file's flag and test_spare_draining's: a run with it places every job and keeps
    the invariants; a bad value exits 2 naming the flag."""
    code, out = run(tmp_path, "--policy", "gpufed", "--json", "--check-invariants", *given)
    assert code == 0, out
    assert json.loads(out)["placed"] == 3
    code, out = run(tmp_path, "--policy", "gpufed", *bad)
    assert code == 2
    assert bad[0] in out


def _sim(keep: bool) -> dict[str, float | None]:
    """Two 8-GPU nodes, fifo, holds at once. X: ``x`` (8 GPUs, to 3,000 s); Y: ``y1`` (4 GPUs,
    ends at 500 s, limit 5,000 s) and ``y2`` (4 GPUs, to 1,000 s). ``big`` (8 GPUs) arrives at
    10 and holds X (drained by 3,000 s; Y by 5,000 s by the limits). At 500 s ``y1`` ends
    early: Y now drains by 1,000 s. Afresh ``big`` moves its hold to Y and ``s`` (1 GPU, limit
    20,000 s: borrows nothing), arriving at 600, waits until ``big`` (on Y from 1,000 s) ends
    at 1,100 s; kept, ``big`` still holds X and ``s`` runs on Y's free GPUs at once. ``big``
    starts on Y at 1,000 s either way. Job -> wait."""
    jobs = [
        TraceJob("x", 0.0, 8, 3_000.0, 8, "Preferred", time_limit_s=3_000.0),
        TraceJob("y1", 0.0, 4, 500.0, 4, "Preferred", time_limit_s=5_000.0),
        TraceJob("y2", 0.0, 4, 1_000.0, 4, "Preferred", time_limit_s=1_000.0),
        TraceJob("big", 10.0, 8, 100.0, 8, "Preferred", time_limit_s=100.0),
        TraceJob("s", 600.0, 1, 50.0, 1, "Preferred", time_limit_s=20_000.0),
    ]
    rule = BackfillRule(
        order="fifo",
        starvation_s=0.0,
        spare_whole_nodes_s=0.0,
        hold_nodes="earliest-drain",
        hold_keep_one_node=keep,
    )
    res = simulate([hgx_cluster("a", nodes=2)], jobs, "gpufed", backfill=rule)
    return {r.job_id: r.wait_s for r in res.records}


def test_in_the_simulator_a_one_node_holder_keeps_its_node_across_passes() -> None:
    fresh = _sim(keep=False)
    assert (fresh["big"], fresh["s"]) == (990.0, 500.0)
    kept = _sim(keep=True)
    assert (kept["big"], kept["s"]) == (990.0, 0.0)


def _one_node_stream() -> list[TraceJob]:
    """1-GPU jobs of 1,500 s every 100 s (15 at once on 16 GPUs) and an 8-GPU job at 5,000 s,
    which starves and holds a node; limits drawn by the simulator's default model."""
    small = [TraceJob(f"s{i}", i * 100.0, 1, 1_500.0, 1, "Preferred") for i in range(700)]
    big = TraceJob("big", 5_000.0, 8, 1_000.0, 8, "Preferred")
    return with_time_limits(sorted([*small, big], key=lambda j: j.submit_s), TimeLimitModel())


@pytest.mark.parametrize(
    "rule",
    [
        BackfillRule(hold_nodes="earliest-drain", hold_keep_one_node=True),
        BackfillRule(
            hold_nodes="earliest-drain-multi",
            oldest_first_one_pod_s=14_400,
            hold_busy_nodes=True,
            hold_busy_by_drain=True,
            hold_keep_one_node=True,
        ),
    ],
    ids=["earliest-drain + keep", "busy by drain + keep"],
)
def test_with_keep_the_one_node_job_still_waits_at_most_sixteen_hours_and_a_drain(
    rule: BackfillRule, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The starvation bound (as test_backfill's, drawn limits), with the kept hold in use."""
    kept: list[Hold] = []

    def spy(*args: Any, **kw: Any) -> Hold | None:
        if kw.get("keep") is not None:
            kept.append(kw["keep"])
        return hold_for(*args, **kw)

    monkeypatch.setattr(sim_module, "hold_for", spy)
    jobs = _one_node_stream()
    drain = max(j.time_limit_s or 0.0 for j in jobs if j.job_id != "big")
    res = simulate([hgx_cluster("a", nodes=2)], jobs, "gpufed", backfill=rule)
    assert res.placed == res.jobs
    [rec] = [r for r in res.records if r.job_id == "big"]
    assert rec.wait_s is not None
    assert rec.wait_s <= 57_600 + drain
    assert kept  # the holder kept its node in some pass
    assert class_report(res.records)["backfill_limit_hits"] == 0
