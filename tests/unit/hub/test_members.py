"""Member health (gpufed.hub.components.members) through a real leader term over typed fakes and a fake
clock: the lease, the lost timeout, and what happens to a lost member's jobs."""

from __future__ import annotations

from gpufed.hub.components.config import HubConfig
from tests.unit.hub.builders import hgx_node
from tests.unit.hub.term import Term, sent, settle

LEASE, LOST = 40.0, 600.0


def term() -> Term:
    return Term(config=HubConfig(insecure=True, member_lease_s=LEASE, member_lost_s=LOST))


async def test_a_silent_member_turns_not_ready_after_its_lease_and_leaves_placement() -> None:
    t = term()
    t.member("m1", hgx_node("m1-n0"))
    s = t.connect("m1")
    t.clock.advance(LEASE - 1)
    await t.ctrl.members.check_health()
    assert t.ctrl.state.members["m1"].health == "Ready"
    t.clock.advance(2)
    await t.ctrl.members.check_health()
    assert t.ctrl.state.members["m1"].health == "NotReady"
    assert not t.ctrl.snapshot.member("m1").health.ready
    await t.submit("j", "u1")
    await t.ctrl.scheduler.cycle()
    assert t.ctrl.state.jobs["u1"].status.phase == "Pending", "no new work to a NotReady member"
    t.ctrl.heard(s)  # the agent speaks again
    assert t.ctrl.state.members["m1"].health == "Ready"


async def test_a_lost_members_jobs_become_lost_unless_they_ask_to_be_placed_again() -> None:
    t = term()
    t.member("m1", hgx_node("m1-n0"), hgx_node("m1-n1"))
    s1 = t.connect("m1")
    await t.submit("stays", "u1")
    await t.submit("moves", "u2", reschedule="OnClusterLoss")
    await t.ctrl.scheduler.cycle()
    assert {t.ctrl.state.jobs[u].placed_cluster for u in ("u1", "u2")} == {"m1"}
    # A second member joins and keeps talking; m1 falls silent.
    t.member("m2", hgx_node("m2-n0"))
    s2 = t.connect("m2")
    for _ in range(int(LOST // 10) + 1):
        t.clock.advance(10)
        t.ctrl.heard(s2)
        await t.ctrl.members.check_health()
    await settle()
    assert t.ctrl.state.members["m1"].health == "Lost"
    assert t.ctrl.state.members["m2"].health == "Ready"
    assert t.ctrl.state.members["m1"].meta.lost_at is not None
    assert t.store.metas[-1][1].lost_at is not None, "the lost mark is stored"
    assert t.ctrl.state.jobs["u1"].status.phase == "Lost"
    moved = t.ctrl.state.jobs["u2"]
    assert moved.record is not None
    assert moved.record.cluster is None, "waits to be placed again"
    assert t.ctrl.state.work[("m1", "u2")].record.fenced, "its old copy is fenced"
    await t.ctrl.scheduler.cycle()
    assert t.ctrl.state.jobs["u2"].placed_cluster == "m2"
    assert t.ctrl.state.jobs["u2"].record is not None
    assert t.ctrl.state.jobs["u2"].record.attempt == 2
    # When m1 returns, the fenced copy is absent from its desired set and deleted first.
    sent(s1)
    back = t.connect("m1")
    kinds = sent(back)
    assert kinds[0][0] == "desired_set"
    assert "u2" not in kinds[0][1].split(","), "the fenced copy is not desired"
    assert ("delete", "u2") in [(op, uid) for op, uid, _ in kinds[1:]]
