"""``BackfillRule.hold_busy_by_drain`` (issue 29 item 4, ``backfill7``; ``hold_for``'s
``busy_start_on``): when every node of the pool is full, a one-node job holds the full node
where it is expected to start first, not the first by name. Checked against a brute-force
minimum over the same made-up drain times."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import pytest
from placement_builders import hgx_cluster, job
from test_simreport import run

from gpufed.placement import FleetSnapshot, Policy, hold_for

NODES = ["a-n000", "a-n001", "a-n002", "a-n003"]


def _brute(starts: dict[str, float | None]) -> str:
    """The node a reference rule picks: smallest start, unknown (None) last, ties by name."""
    return min(NODES, key=lambda n: (math.inf if starts[n] is None else starts[n], n))


@pytest.mark.parametrize(
    "times",
    # every assignment of these drain times (None: no time limit there) to the four nodes
    list(dict.fromkeys(itertools.permutations([500.0, 100.0, None, 100.0]))),
)
def test_a_one_node_job_holds_the_full_node_that_drains_first(
    times: tuple[float | None, ...],
) -> None:
    s = FleetSnapshot([hgx_cluster("a", free=[0, 0, 0, 0])])
    starts = dict(zip(NODES, times, strict=True))
    asked: list[tuple[str, str, int]] = []

    def start_on(member: str, node: str, gpus: int) -> float | None:
        asked.append((member, node, gpus))
        return starts[node]

    got = hold_for(job("one", gpus=8), s, Policy(), busy=True, busy_start_on=start_on)
    assert got is not None
    assert (got.cluster, got.nodes) == ("a", frozenset({_brute(starts)}))
    assert {a[2] for a in asked} == {8}  # asked for the job's GPUs
    # without the drain times: the first by name, whatever the times
    plain = hold_for(job("one", gpus=8), s, Policy(), busy=True)
    assert plain is not None
    assert plain.nodes == frozenset({"a-n000"})


def test_drain_times_change_nothing_without_busy_or_while_a_node_has_a_free_gpu() -> None:
    full = FleetSnapshot([hgx_cluster("a", free=[0, 0, 0, 0])])

    def late_first(member: str, node: str, gpus: int) -> float:
        return 1000.0 - NODES.index(node)

    assert hold_for(job("one", gpus=8), full, Policy(), busy_start_on=late_first) is None
    some = FleetSnapshot([hgx_cluster("a", free=[0, 0, 2, 0])])
    got = hold_for(job("one", gpus=8), some, Policy(), busy=True, busy_start_on=late_first)
    assert got is not None
    assert got.nodes == frozenset({"a-n002"})  # the node with free GPUs, as before


def test_the_simulator_takes_earliest_drain_for_busy_holds(tmp_path: Path) -> None:
    code, out = run(
        tmp_path, "--policy", "gpufed", "--json", "--queue-hold-busy-nodes", "earliest-drain"
    )
    assert code == 0, out
    assert json.loads(out)["placed"] == 3
    code, out = run(tmp_path, "--policy", "gpufed", "--queue-hold-busy-nodes", "maybe")
    assert code == 2
    assert "earliest-drain" in out
