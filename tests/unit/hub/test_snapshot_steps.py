"""A large inventory snapshot is applied in steps (hub/components/members.py): the event loop runs between
two steps, the result is the snapshot's nodes exactly, snapshots of one member are applied in
order, and a member that left placement meanwhile is not brought back."""

from __future__ import annotations

import asyncio

from gpufed.api.stream import InventorySnapshot
from gpufed.hub.components import members as members_module
from tests.unit.hub.builders import hgx_node, membercluster_obj
from tests.unit.hub.term import Term


def term_with(name: str = "m1") -> Term:
    t = Term()
    t.ctrl.members.on_event("ADDED", membercluster_obj(name))
    return t


def snapshot(seq: int, count: int, *, gpus: int = 8) -> InventorySnapshot:
    return InventorySnapshot(
        seq=seq, nodes=tuple(hgx_node(f"n{i:04d}", gpus=gpus) for i in range(count))
    )


def placed_nodes(t: Term, name: str = "m1") -> dict[str, int]:
    c = t.ctrl.members._snapshot.cluster(name)
    return {n: node.inv.allocatable["nvidia.com/gpu"] for n, node in c.nodes.items()}


async def test_a_large_snapshot_lets_the_loop_run_between_its_steps() -> None:
    t = term_with()
    m = t.ctrl.state.member("m1")
    turns = 0
    done = asyncio.Event()

    async def other_work() -> None:
        nonlocal turns
        while not done.is_set():
            turns += 1
            await asyncio.sleep(0)

    other = asyncio.create_task(other_work())
    await asyncio.sleep(0)
    count = 10 * members_module.SNAPSHOT_STEP_NODES
    await t.ctrl.members.take_snapshot(m, snapshot(1, count))
    done.set()
    await other
    # Diff and apply: at least one turn per step of each.
    assert turns >= 2 * count // members_module.SNAPSHOT_STEP_NODES
    assert len(placed_nodes(t)) == count
    assert len(m.nodes) == count


async def test_snapshots_of_one_member_are_applied_in_order_to_exactly_the_last_one() -> None:
    t = term_with()
    m = t.ctrl.state.member("m1")
    step = members_module.SNAPSHOT_STEP_NODES
    first = asyncio.create_task(t.ctrl.members.take_snapshot(m, snapshot(1, 6 * step)))
    await asyncio.sleep(0)
    # A newer stream's snapshot arrives while the first is part-way: fewer nodes, other sizes.
    await t.ctrl.members.take_snapshot(m, snapshot(2, 2 * step, gpus=4))
    await first
    assert placed_nodes(t) == {f"n{i:04d}": 4 for i in range(2 * step)}
    assert set(m.nodes) == set(placed_nodes(t))


async def test_a_member_that_left_placement_during_a_snapshot_is_not_brought_back() -> None:
    t = term_with()
    m = t.ctrl.state.member("m1")
    t.ctrl.members.on_snapshot(m, snapshot(1, 1))
    task = asyncio.create_task(
        t.ctrl.members.take_snapshot(m, snapshot(2, 8 * members_module.SNAPSHOT_STEP_NODES))
    )
    for _ in range(10):  # into the apply steps (the diff takes 8)
        await asyncio.sleep(0)
    t.ctrl.members._snapshot.remove_member("m1")
    await task
    assert "m1" not in t.ctrl.members._snapshot.cluster_names
