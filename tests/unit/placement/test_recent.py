"""Recently seen nodes (gpufed.placement.recent): a job ``place()`` rejects on the present fleet
is held back, not failed, exactly when the fleet as it was before its nodes left or shrank could
hold it; the memory is bounded and forgets after its window.

The reference is a second path: ``place()`` on a snapshot built afresh from the fleet as it was
before the changes (never through the memory)."""

from __future__ import annotations

import random

from placement_builders import GB200, job, member, mig_mixed_node, node

from gpufed.api.decision import Outcome
from gpufed.api.inventory import NodeInventory, Taint
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
                    s.upsert_node(m, _withdrawn(n))
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


UNREACHABLE = Taint(key="node.kubernetes.io/unreachable", effect="NoSchedule")


def _not_ready(n: NodeInventory) -> NodeInventory:
    """``n`` as the node lifecycle controller leaves it when its kubelet stops answering."""
    return n.model_copy(update={"ready": False, "taints": (*n.taints, UNREACHABLE)})


def _withdrawn(n: NodeInventory) -> NodeInventory:
    return n.model_copy(update={"allocatable": {**n.allocatable, "nvidia.com/gpu": 0}})


def _fails_for_good_exactly_when_the_fleet_before_could_not(
    s: FleetSnapshot, before: dict[str, list[NodeInventory]]
) -> None:
    """Every job of JOBS fails for good on ``s`` (rejected and not held back by its memory)
    exactly when ``place()`` on the fleet ``before``, built afresh, rejects it."""
    for j in JOBS:
        ever = place(j, snapshot_of(before), POLICY, 0).outcome != Outcome.REJECTED
        rejected = place(j, s, POLICY, 0).outcome == Outcome.REJECTED
        held = rejected and recent_could_hold(j, s, s.recent, POLICY, 0) is not None  # type: ignore[arg-type]
        assert (rejected and not held) == (not ever), j.job


def test_a_node_condition_taint_alone_never_makes_a_job_fail_for_good() -> None:
    # The reference is place() on the fleet before the nodes went NotReady (built afresh, no
    # taints): a job it could hold must not be rejected while some nodes are NotReady (found
    # by the chaos soak: one GB200 tray unreachable made the 2-tray NVLink gang "never" fit).
    rng = random.Random(2626)
    for _ in range(60):
        before = fleet_nodes()
        now = {
            m: [_not_ready(n) if rng.random() < 0.4 else n for n in ns] for m, ns in before.items()
        }
        s = snapshot_of(now)
        for j in JOBS:
            ever = place(j, snapshot_of(before), POLICY, 0).outcome != Outcome.REJECTED
            rejected = place(j, s, POLICY, 0).outcome == Outcome.REJECTED
            assert rejected == (not ever), (
                j.job,
                [n.name for ns in now.values() for n in ns if not n.ready],
            )


def test_a_job_fails_for_good_exactly_when_the_fleet_before_the_faults_could_not_hold_it() -> None:
    # nodes leave, lose their GPUs or go NotReady, in any mix: the job fails for good (rejected
    # and not held back by the memory) exactly when the fleet before all of it could not hold it
    rng = random.Random(2627)
    for _ in range(60):
        clock = Clock()
        before = fleet_nodes()
        s = snapshot_of(before, clock)
        for m, ns in before.items():
            for i, n in enumerate(ns):
                r = rng.random()
                if r < 0.25 and i:  # a member with no node left is unknown, not "never"
                    s.remove_node(m, n.name)
                elif r < 0.45:  # GPUs withdrawn (the node may be NotReady too)
                    gone = _withdrawn(n)
                    s.upsert_node(m, _not_ready(gone) if rng.random() < 0.5 else gone)
                elif r < 0.7:
                    s.upsert_node(m, _not_ready(n))
        _fails_for_good_exactly_when_the_fleet_before_could_not(s, before)


def test_the_soak_s_two_gb200_trays_one_unreachable_the_other_without_gpus_wait() -> None:
    # seed 2 of the 30-minute soak: soak-mix's kwok came back while tray 000 still carried the
    # unreachable taint, and tray 001's GPUs were withdrawn at that moment: the 2-tray gang
    # was failed for good (soak-2-0154-nvlink, soak-2-0158-nvlink)
    clock = Clock()
    s = snapshot_of(fleet_nodes(), clock)
    t0, t1 = (n for n in fleet_nodes()["mix"] if n.name in ("mix-t0", "mix-t1"))
    s.upsert_node("mix", _not_ready(t0))
    s.upsert_node("mix", _withdrawn(t1))
    gang = JOBS[3]
    assert place(gang, s, POLICY, 0).outcome == Outcome.REJECTED  # on the nodes as they are
    why = recent_could_hold(gang, s, s.recent, POLICY, 0)  # type: ignore[arg-type]
    assert why is not None
    assert "mix/mix-t1" in why


def _ready(n: NodeInventory) -> NodeInventory:
    """``n`` once its kubelet answers again: Ready, the node-condition taints gone."""
    return n.model_copy(
        update={"ready": True, "taints": tuple(t for t in n.taints if t != UNREACHABLE)}
    )


def test_a_tray_withdrawn_while_unreachable_is_remembered_whole_once_it_is_ready() -> None:
    # seed 2 of the 30-minute soak, again (after the fix above): soak-mix's kwok was stopped
    # (both trays unreachable), tray 001's GPUs were withdrawn the moment kwok came back, and
    # the tray then turned Ready without GPUs. That last change (its taints) replaced the
    # remembered 4-GPU tray with the 0-GPU one, and the 2-tray gangs failed for good.
    clock = Clock()
    s = snapshot_of(fleet_nodes(), clock)
    t0, t1 = (n for n in fleet_nodes()["mix"] if n.name in ("mix-t0", "mix-t1"))
    s.upsert_node("mix", _not_ready(t0))
    s.upsert_node("mix", _not_ready(t1))
    clock.now += 1
    s.upsert_node("mix", _withdrawn(_not_ready(t1)))
    clock.now += 1
    s.upsert_node("mix", _ready(t0))
    s.upsert_node("mix", _withdrawn(t1))
    gang = JOBS[3]
    assert place(gang, s, POLICY, 0).outcome == Outcome.REJECTED  # on the nodes as they are
    why = recent_could_hold(gang, s, s.recent, POLICY, 0)  # type: ignore[arg-type]
    assert why is not None
    assert "mix/mix-t1" in why


def test_a_job_fails_for_good_exactly_when_the_fleet_before_any_sequence_of_faults_could_not() -> (
    None
):
    # each node goes through a random sequence of changes (leave and come back, GPUs withdrawn
    # or given back, NotReady, Ready again): the job fails for good exactly when the fleet
    # before all of it could not hold it. The reference is place() on that fleet, built afresh.
    rng = random.Random(2628)
    for _ in range(80):
        clock = Clock()
        before = fleet_nodes()
        s = snapshot_of(before, clock)
        for m, ns in before.items():
            for i, n in enumerate(ns):
                cur: NodeInventory | None = n
                for _step in range(rng.randint(1, 4)):
                    clock.now += 1
                    r = rng.random()
                    if r < 0.2 and i:  # a member with no node left is unknown, not "never"
                        if cur is not None:
                            s.remove_node(m, n.name)
                        cur = None
                        continue
                    base = cur if cur is not None else n
                    if r < 0.45:
                        cur = _withdrawn(base)
                    elif r < 0.7:
                        cur = _not_ready(base) if base.ready else _ready(base)
                    else:  # back as it was before, or its GPUs given back
                        cur = base.model_copy(update={"allocatable": dict(n.allocatable)})
                    s.upsert_node(m, cur)
        _fails_for_good_exactly_when_the_fleet_before_could_not(s, before)
