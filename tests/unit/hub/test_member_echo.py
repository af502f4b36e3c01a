"""MemberCluster watch events (gpufed.hub.components.members ``Members.on_event``): the echo of
the hub's own status write asks for no scheduling cycle and marks no status due; a change of
what the hub reads (labels, taints, joinTokenRef, uid, deletion) still does.

The echo is the object as the fake hub API server holds it after the hub's own status write
went through the real writer (not a status built by the test)."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest

from gpufed.hub.components import scheduling
from gpufed.hub.components.term import MemberState
from tests.unit.hub.builders import hgx_node, membercluster_obj
from tests.unit.hub.term import Term, settle


async def _written(t: Term) -> tuple[MemberState, dict[str, Any]]:
    """Member m1 with one node, its status written by the hub; the stored object after it."""
    obj = membercluster_obj("m1")
    t.kube.objects["memberclusters"].append(obj)
    t.member("m1", hgx_node("m1-n0"))
    t.ctrl.mirror.start()
    m = t.ctrl.state.members["m1"]
    t.ctrl.members.write_status(m)
    await t.ctrl.mirror.members.drained()
    assert t.kube.requests["patch_member_status"] == 1
    assert obj.get("status"), "the hub's status write reached the fake API server"
    return m, copy.deepcopy(obj)


def _cycles(t: Term) -> float:
    return t.ctrl.metrics.scheduling_cycles._value.get()  # type: ignore[attr-defined,no-any-return]


def _quiet(t: Term, m: MemberState) -> int:
    """Forget earlier asks; the fleet generation now."""
    t.ctrl.state.cycle_due.clear()
    return t.ctrl.snapshot.generation


async def test_the_echo_of_our_own_status_write_asks_for_nothing() -> None:
    t = Term()
    m, echo = await _written(t)
    gen = _quiet(t, m)
    for _ in range(3):  # the echo, a relist's ADDED, a later status write's echo
        t.ctrl.members.on_event("MODIFIED", echo)
        t.ctrl.members.on_event("ADDED", echo)
    assert not t.ctrl.state.cycle_due.is_set(), "no scheduling cycle for a status echo"
    assert t.ctrl.snapshot.generation == gen
    t.ctrl.members.write_all_statuses()  # the next status interval
    await t.ctrl.mirror.members.drained()
    assert t.kube.requests["patch_member_status"] == 1, "nothing new to write"


async def test_a_status_written_by_someone_else_asks_for_no_cycle() -> None:
    t = Term()
    m, echo = await _written(t)
    _quiet(t, m)
    foreign = copy.deepcopy(echo)
    foreign["status"]["gpuSummary"] = "edited"
    foreign["metadata"]["resourceVersion"] = "99"
    t.ctrl.members.on_event("MODIFIED", foreign)
    assert not t.ctrl.state.cycle_due.is_set()
    # The level-triggered resync still sees it and writes ours again.
    assert t.ctrl.mirror.resync_members() == 1


def _with_labels(obj: dict[str, Any]) -> None:
    obj["spec"]["labels"] = {"region": "eu"}


def _with_taint(obj: dict[str, Any]) -> None:
    obj["spec"]["taints"] = [{"key": "k", "value": "v", "effect": "NoSchedule"}]


def _with_token(obj: dict[str, Any]) -> None:
    obj["spec"]["joinTokenRef"] = {"name": "other"}


def _with_uid(obj: dict[str, Any]) -> None:
    obj["metadata"]["uid"] = "mc-m1-recreated"


@pytest.mark.parametrize(
    ("change", "moves_placement"),
    [(_with_labels, True), (_with_taint, True), (_with_token, False), (_with_uid, False)],
)
async def test_a_change_the_hub_reads_still_asks_for_a_cycle(
    change: Any, moves_placement: bool
) -> None:
    t = Term()
    m, echo = await _written(t)
    gen = _quiet(t, m)
    changed = copy.deepcopy(echo)
    change(changed)
    t.ctrl.members.on_event("MODIFIED", changed)
    assert t.ctrl.state.cycle_due.is_set()
    assert (t.ctrl.snapshot.generation != gen) == moves_placement
    if moves_placement:
        member = t.ctrl.snapshot.member("m1")
        assert (member.labels, member.taints) != ({}, ()), "placement sees the new spec"


async def test_deletion_still_takes_the_member_out() -> None:
    t = Term()
    m, echo = await _written(t)
    _quiet(t, m)
    t.ctrl.members.on_event("MODIFIED", echo)
    t.ctrl.members.on_event("DELETED", echo)
    assert "m1" not in t.ctrl.snapshot.cluster_names
    assert m.spec is None


async def test_the_scheduling_loop_runs_no_cycle_for_echoes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Counted by ``gpufed_hub_scheduling_cycles_total`` with the real scheduling loop."""
    monkeypatch.setattr(scheduling, "CYCLE_DEBOUNCE_S", 0)
    t = Term()
    m, echo = await _written(t)
    _quiet(t, m)
    loop = asyncio.create_task(t.ctrl.scheduler.run())
    try:
        await settle()
        before = _cycles(t)
        for _ in range(5):
            t.ctrl.members.on_event("MODIFIED", echo)
            await settle()
        assert _cycles(t) == before
        changed = copy.deepcopy(echo)
        _with_labels(changed)
        t.ctrl.members.on_event("MODIFIED", changed)
        await settle()
        assert _cycles(t) == before + 1
    finally:
        loop.cancel()
        with pytest.raises(asyncio.CancelledError):
            await loop
