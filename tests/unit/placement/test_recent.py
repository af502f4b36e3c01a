"""Recently seen nodes (gpufed.placement.recent): a job ``place()`` rejects on the present fleet
is held back, not failed, exactly when the fleet as it was before its nodes left or shrank could
hold it; the memory is bounded and forgets after its window.

The reference is a second path: ``place()`` on a snapshot built afresh from the fleet as it was
before the changes (never through the memory)."""

from __future__ import annotations

import random

from placement_builders import GB200, job, member, mig_mixed_node, node

from gpufed.api.decision import Outcome
from gpufed.api.inventory import NodeInventory
from gpufed.placement import FleetSnapshot, Policy, place
from gpufed.placement.recent import RecentNodes, recent_could_hold

POLICY = Policy()


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def fleet_nodes() -> dict[str, list[NodeInventory]]:
    """Two members: HGX nodes of 8 and 4 GPUs; two GB200 trays of one NVLink clique and a
    MIG node."""
    return {
        "hgx": [node("hgx-n0"), node("hgx-n1", gpus=4)],
        "mix": [
            node("mix-t0", gpus=4, product=GB200, clique="mix.0"),
            node("mix-t1", gpus=4, product=GB200, clique="mix.0"),
            mig_mixed_node("mix-a100"),
        ],
    }


def snapshot_of(nodes: dict[str, list[NodeInventory]], clock: Clock | None = None) -> FleetSnapshot:
    s = FleetSnapshot([member(m, ns) for m, ns in sorted(nodes.items())])
    if clock is not None:
        s.recent = RecentNodes(clock)
    return s


JOBS = [
    job("one", gpus=1),
    job("eight", gpus=8),
    job("two-fours", gpus=4, pods=2),
    job("gb200-gang", gpus=4, pods=2, nvlink="Required", products=(GB200,)),
    job("gb200-big", gpus=4, pods=3, nvlink="Required", products=(GB200,)),
    job("mig", requests={"nvidia.com/mig-1g.10gb": 2}),
    job("mig-huge", requests={"nvidia.com/mig-1g.10gb": 15}),
    job("giant", gpus=64),
]


def test_held_back_exactly_when_the_fleet_before_the_changes_could_hold_the_job() -> None:
    rng = random.Random(26)
    for _ in range(60):
        clock = Clock()
        before = fleet_nodes()
        s = snapshot_of(before, clock)
        for m, ns in before.items():
            for n in ns:
                r = rng.random()
                if r < 0.35:
                    s.remove_node(m, n.name)
                elif r < 0.5:  # GPUs withdrawn
                    alloc = {**n.allocatable, "nvidia.com/gpu": 0}
                    s.upsert_node(m, n.model_copy(update={"allocatable": alloc}))
        for j in JOBS:
            now_rejected = place(j, s, POLICY, 0).outcome == Outcome.REJECTED
            ever = place(j, snapshot_of(before), POLICY, 0).outcome != Outcome.REJECTED
            why = recent_could_hold(j, s, s.recent, POLICY, 0)  # type: ignore[arg-type]
            if now_rejected:
                assert (why is not None) == ever, (j.job, why)
            if why is not None:
                assert why.startswith("waiting: nodes that left or shrank")


def test_a_node_that_comes_back_as_large_is_forgotten_and_the_window_ends_the_memory() -> None:
    clock = Clock()
    s = snapshot_of(fleet_nodes(), clock)
    assert s.recent is not None
    s.remove_node("mix", "mix-t0")
    s.remove_node("mix", "mix-t1")
    gang = JOBS[3]
    assert place(gang, s, POLICY, 0).outcome == Outcome.REJECTED
    why = recent_could_hold(gang, s, s.recent, POLICY, 0)
    assert why is not None
    assert "mix/mix-t0" in why
    assert "mix/mix-t1" in why
    s.upsert_node("mix", node("mix-t0", gpus=4, product=GB200, clique="mix.0"))
    assert len(s.recent) == 1, "a node back with what it had is forgotten"
    clock.now += 3600.5
    assert recent_could_hold(gang, s, s.recent, POLICY, 0) is None, "past the window"
    assert len(s.recent) == 0


def test_the_memory_is_bounded_oldest_first() -> None:
    clock = Clock()
    recent = RecentNodes(clock, max_nodes=2)
    for i in range(4):
        clock.now += 1
        recent.left("m", node(f"n{i}"))
    assert [inv.name for inv, _ in recent.by_cluster()["m"]] == ["n2", "n3"]


def test_a_shape_never_seen_is_rejected_at_once() -> None:
    # the demo's 06-giant-nvlink: no node of the last hour could hold it
    clock = Clock()
    s = snapshot_of(fleet_nodes(), clock)
    s.remove_node("hgx", "hgx-n0")
    assert s.recent is not None
    assert recent_could_hold(JOBS[-1], s, s.recent, POLICY, 0) is None
