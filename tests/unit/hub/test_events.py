"""The Events the hub emits (gpufed.hub.components.scheduling, gpufed.hub.components.members, gpufed.hub.components.mirror):
a job that cannot be placed gets one Warning per reason change, not one per new message; a
MemberCluster gets one Event per health transition (Ready, NotReady, Lost), naming its UID so
``kubectl describe membercluster`` shows it."""

from __future__ import annotations

from gpufed.api.stream import Heartbeat, InventorySnapshot
from gpufed.hub.components.config import HubConfig
from tests.unit.hub.builders import hgx_node
from tests.unit.hub.term import Term, settle

LEASE, LOST = 40.0, 600.0


def warnings_about(t: Term, kind: str) -> list[str]:
    return [r for k, _, type_, r in t.kube.event_refs if k == kind and type_ == "Warning"]


async def test_an_unschedulable_job_gets_one_warning_while_its_message_changes() -> None:
    t = Term()
    t.member("m1", hgx_node("m1-n0", requested=4))
    await t.submit("big", "u1", gpus=8)
    await t.ctrl.scheduler.cycle()
    await settle()
    assert warnings_about(t, "GPUJob") == ["Unschedulable"]
    first = t.ctrl.state.jobs["u1"].status.message
    # The fleet changes (fewer busy GPUs, still short): a new message, the same reason.
    m1 = t.ctrl.state.members["m1"]
    t.ctrl.members.on_snapshot(
        m1, InventorySnapshot(seq=2, nodes=(hgx_node("m1-n0", requested=2),))
    )
    t.ctrl.state.want("u1")
    await t.ctrl.scheduler.cycle()
    await settle()
    assert t.ctrl.state.jobs["u1"].status.message != first, "the status follows the fleet"
    assert warnings_about(t, "GPUJob") == ["Unschedulable"], "no second Warning"
    # Room appears: the job is placed (Normal), and a later wait warns again.
    t.member("m3", hgx_node("m3-n0"))
    t.ctrl.state.want("u1")
    await t.ctrl.scheduler.cycle()
    await settle()
    assert t.ctrl.state.jobs["u1"].placed_cluster == "m3"
    assert t.ctrl.state.jobs["u1"].last_warning is None


async def test_a_job_no_member_can_ever_hold_gets_a_rejected_warning() -> None:
    t = Term()
    t.member("m1", hgx_node("m1-n0"))
    await t.submit("huge", "u1", gpus=64)
    await t.ctrl.scheduler.cycle()
    await settle()
    assert warnings_about(t, "GPUJob") == ["Rejected"]


async def test_a_member_gets_one_event_per_health_transition_with_its_uid() -> None:
    t = Term(config=HubConfig(insecure=True, member_lease_s=LEASE, member_lost_s=LOST))
    t.member("m1", hgx_node("m1-n0"))
    s = t.connect("m1")
    for _ in range(3):  # several ticks past the lease: one NotReady
        t.clock.advance(LEASE)
        await t.ctrl.members.check_health()
    t.clock.advance(LOST)
    await t.ctrl.members.check_health()
    await t.ctrl.members.check_health()
    await settle()
    refs = [(k, uid, type_, r) for k, uid, type_, r in t.kube.event_refs if k == "MemberCluster"]
    assert refs == [
        ("MemberCluster", "mc-m1", "Warning", "NotReady"),
        ("MemberCluster", "mc-m1", "Warning", "Lost"),
    ]
    t.ctrl.heard(s)
    await settle()
    assert t.kube.event_refs[-1] == ("MemberCluster", "mc-m1", "Normal", "Ready")


async def test_a_member_whose_agent_cannot_reach_its_api_server_gets_a_warning() -> None:
    t = Term()
    t.member("m1", hgx_node("m1-n0"))
    s = t.connect("m1")
    m = t.ctrl.state.members["m1"]
    t.ctrl.members.on_heartbeat(m, Heartbeat(member_api_error="connection refused"))
    t.ctrl.members.on_heartbeat(m, Heartbeat(member_api_error="connection refused"))
    await settle()
    assert warnings_about(t, "MemberCluster") == ["NotReady"]
    t.ctrl.members.on_heartbeat(m, Heartbeat(member_api_error=""))
    await settle()
    assert t.kube.event_refs[-1][2:] == ("Normal", "Ready")
    del s
