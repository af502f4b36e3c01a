"""The scheduling cycle and its commit (gpufed.hub.components.scheduling) through a real leader term over
typed fakes: one etcd transaction per placement, reservations that follow the commit, and
"not placed" answers written once."""

from __future__ import annotations

import json

from tests.unit.hub.builders import hgx_node
from tests.unit.hub.term import Term, sent, settle


async def test_a_placed_job_is_written_in_one_transaction_before_anything_is_sent() -> None:
    t = Term()
    t.member("m1", hgx_node("m1-n0"))
    s = t.connect("m1")
    sent(s)  # the (empty) desired set
    await t.submit("j", "u1", gpus=8)
    await t.ctrl.scheduler.cycle()
    assert t.store.calls.count("place") == 1
    record, job_rev = t.store.jobs["u1"]
    work, work_rev = t.store.work[("m1", "u1")]
    assert record.cluster == "m1"
    assert work.op == "Apply"
    assert job_rev == work_rev, "job record and work item come from one transaction"
    assert json.loads(t.store.reservations["u1"])["nodes"] == {"m1-n0": {"nvidia.com/gpu": 8}}
    assert sent(s) == [("apply", "u1", work_rev)]
    assert not t.ctrl.reservations.is_tentative("u1"), "the commit landed: confirmed"
    assert t.ctrl.state.jobs["u1"].status.phase == "Placed"


async def test_a_placement_etcd_refuses_leaves_no_reservation_behind() -> None:
    # Another leader placed the job first: the tentative reservation goes, nothing is sent,
    # and the GPUs are free for the next cycle.
    t = Term()
    t.member("m1", hgx_node("m1-n0"))
    s = t.connect("m1")
    sent(s)
    t.store.conflict_on_place.add("u1")
    await t.submit("j", "u1", gpus=8)
    await t.ctrl.scheduler.cycle()
    assert t.ctrl.reservations.of_cluster("m1") == []
    assert not t.ctrl.reservations.is_tentative("u1")
    assert "u1" not in t.store.reservations
    assert sent(s) == []
    assert t.ctrl.snapshot.free("m1", "m1-n0") == 8


async def test_gpus_placed_in_a_cycle_are_not_handed_out_again_in_the_same_cycle() -> None:
    t = Term()
    t.member("m1", hgx_node("m1-n0"))
    await t.submit("a", "ua", gpus=8)
    await t.submit("b", "ub", gpus=8)
    await t.ctrl.scheduler.cycle()
    phases = {uid: t.ctrl.state.jobs[uid].status.phase for uid in ("ua", "ub")}
    assert sorted(phases.values()) == ["Pending", "Placed"]
    assert t.store.calls.count("place") == 1
    waiting = next(u for u, p in phases.items() if p == "Pending")
    assert "8 GPUs" in t.ctrl.state.jobs[waiting].status.message


async def test_an_unchanged_unschedulable_answer_is_written_once() -> None:
    t = Term()
    t.member("m1", hgx_node("m1-n0", requested=4))  # 4 of 8 GPUs busy: fits later, not now
    await t.submit("big", "u1", gpus=8)
    await t.ctrl.scheduler.cycle()
    await settle()
    first = t.ctrl.state.jobs["u1"].status
    assert first.phase == "Pending"
    events = list(t.kube.events)
    assert [reason for _, reason, _ in events] == ["Unschedulable"]
    t.ctrl.state.want("u1")
    await t.ctrl.scheduler.cycle()
    await settle()
    assert t.ctrl.state.jobs["u1"].status == first
    assert t.kube.events == events, "no second Event for the same answer"


async def test_a_job_too_big_for_the_reported_members_waits_for_the_others() -> None:
    # A job no reported member can ever hold is not Failed while another member has not sent
    # its inventory yet: that member may hold it.
    t = Term()
    t.member("m1", hgx_node("m1-n0"))
    t.ctrl.members.on_event(
        "ADDED", {"metadata": {"name": "m2"}, "spec": {"joinTokenRef": {"name": "t2"}}}
    )
    await t.submit("huge", "u1", gpus=64)
    await t.ctrl.scheduler.cycle()
    status = t.ctrl.state.jobs["u1"].status
    assert status.phase == "Pending"
    assert "m2" in status.message
    assert "not reported any node yet" in status.message


async def test_a_placed_job_leaves_the_wanted_set_in_the_cycle_that_places_it() -> None:
    # The next cycle, the queue counts and the hold charges read the wanted set: a job placed
    # stays out of it, so what they read is what changed, not every job placed before (issue
    # 25: a cycle after 500,000 placements walked them all).
    t = Term()
    t.member("m1", hgx_node("m1-n0"))
    await t.submit("a", "ua", gpus=8)
    await t.submit("b", "ub", gpus=8)
    assert t.ctrl.state.wanted == {"ua", "ub"}
    await t.ctrl.scheduler.cycle()
    placed = {u for u, j in t.ctrl.state.jobs.items() if j.status.phase == "Placed"}
    assert len(placed) == 1
    assert t.ctrl.state.wanted == {"ua", "ub"} - placed
