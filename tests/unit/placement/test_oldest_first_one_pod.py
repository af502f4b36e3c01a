"""``BackfillRule.oldest_first_one_pod_s`` (issue 29 item 4, ``backfill6``): a job of one GPU
pod (an 8-GPU job is one whole HGX node) counts as past the oldest-first bound sooner, so it is
walked ahead of the starving small jobs and holds whatever the cap they took; every job's
starvation bound stays ``oldest_first_s`` or less. And ``BackfillRule.hold_busy_nodes``
(``hold_for``'s ``busy``): a one-node job may hold a full node when every node is full."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import pytest
from placement_builders import hgx_cluster, job
from test_simreport import run

from gpufed.api.decision import Decision, Outcome
from gpufed.api.request import PlacementRequest
from gpufed.placement import BackfillRule, FleetSnapshot, Hold, Policy, hold_for, schedule_pass
from gpufed.placement.queue import gpu_pods_of, pass_key

NOW = 20_000.0


def _queue() -> list[PlacementRequest]:
    # 8 GPUs, one pod, waited 5 h; 1 GPU waited 1 h (size key 1/3, ahead of the 8-GPU job's
    # 8/11 under the default order); 64 GPUs in 8 pods, waited 5.5 h (not past 16 h)
    return [
        job("one-node", gpus=8, submitted_at=NOW - 18_000),
        job("small", gpus=1, submitted_at=NOW - 3_600),
        job("big", gpus=8, pods=8, submitted_at=NOW - 19_800),
    ]


def _never_fits(req: PlacementRequest, held: Mapping[str, Hold]) -> Decision:
    return Decision(job=req.job, uid=req.uid, outcome=Outcome.UNSCHEDULABLE, message="full")


def _own_node(req: PlacementRequest) -> Hold:
    return Hold("a", frozenset({f"node-of-{req.job}"}), "")


def test_gpu_pods_counts_the_pods_that_ask_for_gpus() -> None:
    assert [gpu_pods_of(r) for r in _queue()] == [1, 1, 8]


@pytest.mark.parametrize(
    ("rule", "order"),
    [
        # the default: the 1-GPU job (1 / 3), then the 8-GPU (8 / 11), then the 64 (64 / 12)
        (BackfillRule(), ["ns/small", "ns/one-node", "ns/big"]),
        # one-pod jobs past 4 h are walked first, oldest first; the others as before
        (BackfillRule(oldest_first_one_pod_s=14_400), ["ns/one-node", "ns/small", "ns/big"]),
        # never later than oldest_first_s: a bound above it changes nothing
        (BackfillRule(oldest_first_one_pod_s=100_000), ["ns/small", "ns/one-node", "ns/big"]),
        # the 64-GPU job past oldest_first_s (5 h) is walked first, being the oldest
        (
            BackfillRule(oldest_first_s=18_000, oldest_first_one_pod_s=14_400),
            ["ns/big", "ns/one-node", "ns/small"],
        ),
    ],
    ids=["default", "one pod at 4 h", "above oldest-first", "both old"],
)
def test_the_pass_order(rule: BackfillRule, order: list[str]) -> None:
    assert [r.job for r in sorted(_queue(), key=pass_key(NOW, rule))] == order


@pytest.mark.parametrize(
    ("one_pod_s", "holders"),
    [(None, ["ns/small"]), (14_400.0, ["ns/one-node", "ns/small"])],
    ids=["default: the cap goes to the small job", "one pod at 4 h: it holds past the cap"],
)
def test_a_one_pod_job_past_its_bound_holds_whatever_the_cap(
    one_pod_s: float | None, holders: list[str]
) -> None:
    """One capped hold fleet-wide: under the default the starving 1-GPU job, walked first,
    takes it and neither the 8-GPU nor the 64-GPU job holds; with the rule the 8-GPU job is
    past its bound, walked first, holds uncapped, and the cap is still the small job's."""
    rule = BackfillRule(max_holds=1, oldest_first_one_pod_s=one_pod_s)
    result = schedule_pass(_queue(), NOW, _never_fits, _own_node, rule)
    assert [r.job for r, _ in result.taken] == holders
    assert result.holds["a"].nodes == frozenset(f"node-of-{j}" for j in holders)


def test_a_younger_one_pod_job_past_its_bound_never_holds_back_an_older_big_job() -> None:
    """The 8-GPU job (past its 4 h) is walked before the older 64-GPU job (not past 16 h) and
    holds, but its hold does not bind the older job: the big job's attempt sees no hold."""
    seen: dict[str, Mapping[str, Hold]] = {}

    def attempt(req: PlacementRequest, held: Mapping[str, Hold]) -> Decision:
        seen[req.job] = dict(held)  # the pass goes on filling its mapping
        return _never_fits(req, held)

    rule = BackfillRule(oldest_first_one_pod_s=14_400)
    schedule_pass(_queue(), NOW, attempt, _own_node, rule)
    assert seen["ns/big"] == {}
    assert set(seen["ns/small"]["a"].nodes) == {"node-of-ns/one-node"}


def test_the_simulator_takes_the_flag(tmp_path: Path) -> None:
    code, out = run(
        tmp_path, "--policy", "gpufed", "--json", "--queue-oldest-first-one-pod", "14400"
    )
    assert code == 0, out
    assert json.loads(out)["placed"] == 3


@pytest.mark.parametrize("gpus", [1, 8])
def test_a_one_node_job_holds_a_full_node_only_with_busy(gpus: int) -> None:
    """Every node full: ``hold_for`` finds no node with a free GPU for a job of one pod and
    holds nothing (so on a saturated fleet one-node jobs never hold); with ``busy`` it holds
    the first full node by name. A job of two pods holds full nodes either way."""
    s = FleetSnapshot([hgx_cluster("a", free=[0, 0, 0])])
    one = job("one", gpus=gpus)
    assert hold_for(one, s, Policy()) is None
    got = hold_for(one, s, Policy(), busy=True)
    assert got is not None
    assert (got.cluster, got.nodes) == ("a", frozenset({"a-n000"}))
    two = hold_for(job("two", gpus=8, pods=2), s, Policy())
    assert two is not None
    assert len(two.nodes) == 2


def test_busy_changes_nothing_while_a_node_has_a_free_gpu() -> None:
    s = FleetSnapshot([hgx_cluster("a", free=[0, 3, 0])])
    plain = hold_for(job("one", gpus=8), s, Policy())
    assert plain is not None
    assert plain.nodes == frozenset({"a-n001"})
    assert hold_for(job("one", gpus=8), s, Policy(), busy=True) == plain


def test_the_simulator_takes_the_busy_flag(tmp_path: Path) -> None:
    code, out = run(tmp_path, "--policy", "gpufed", "--json", "--queue-hold-busy-nodes", "on")
    assert code == 0, out
    assert json.loads(out)["placed"] == 3
    code, out = run(tmp_path, "--policy", "gpufed", "--queue-hold-busy-nodes", "maybe")
    assert code == 2
    assert "--queue-hold-busy-nodes" in out
