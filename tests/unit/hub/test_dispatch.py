"""Dispatch (gpufed.hub.components.dispatch) and acks (gpufed.hub.components.reports) through a real leader term over
typed fakes and a fake clock: the in-flight cap, resends, and the desired set on reconnect."""

from __future__ import annotations

from gpufed.api.work import WorkAck
from gpufed.hub.components.config import HubConfig
from tests.unit.hub.builders import hgx_node
from tests.unit.hub.term import Term, sent, settle


async def placed(t: Term, *uids: str) -> None:
    for uid in uids:
        await t.submit(f"job-{uid}", uid, gpus=8)
    await t.ctrl.scheduler.cycle()


async def test_no_more_than_the_cap_is_unacknowledged_and_an_ack_sends_the_next() -> None:
    t = Term(config=HubConfig(insecure=True, max_unacked_per_cluster=2))
    t.member("m1", *(hgx_node(f"m1-n{i}") for i in range(3)))
    s = t.connect("m1")
    sent(s)
    await placed(t, "u1", "u2", "u3")
    first = sent(s)
    assert len(first) == 2, first
    _, uid, rev = first[0]
    t.ctrl.heard(s)
    await t.ctrl.handle(s, WorkAck(job_uid=uid, revision=rev, result="Applied"))
    await settle()
    [(op3, uid3, _)] = sent(s)
    assert op3 == "apply"
    assert uid3 not in {u for _, u, _ in first}
    assert t.store.acks[("m1", uid)].applied
    dispatched = next(c for c in t.ctrl.state.jobs[uid].status.conditions if c.type == "Dispatched")
    assert dispatched.status == "True"


async def test_work_not_acknowledged_in_time_is_sent_again() -> None:
    t = Term()
    t.member("m1", hgx_node("m1-n0"))
    s = t.connect("m1")
    sent(s)
    await placed(t, "u1")
    [item] = sent(s)
    t.ctrl.dispatch.resend_due(t.clock.mono())
    assert sent(s) == [], "not yet"
    t.clock.advance(t.config.resend_after_s + 1)
    t.ctrl.dispatch.resend_due(t.clock.mono())
    assert sent(s) == [item]


async def test_a_reconnect_gets_the_desired_set_first_without_deleted_jobs_then_the_deletes() -> (
    None
):
    t = Term()
    t.member("m1", hgx_node("m1-n0"), hgx_node("m1-n1"))
    s = t.connect("m1")
    sent(s)
    await placed(t, "keep", "gone")
    sent(s)
    async with t.ctrl.state.lock("gone"):
        await t.ctrl.dispatch.ensure_delete("m1", "gone")
    [(op, uid, delete_rev)] = sent(s)
    assert (op, uid) == ("delete", "gone")
    again = t.connect("m1")  # the agent reconnects before acknowledging the delete
    assert s.closed is not None
    assert s.closed.code == "ABORTED", "the old stream is replaced"
    assert sent(again) == [("desired_set", "keep", 0), ("delete", "gone", delete_rev)]


async def test_an_ownership_conflict_fails_the_job_with_the_agents_message_and_an_event() -> None:
    """The agent answers an Apply whose object name is someone else's in the member with a
    non-retryable Failed ack; the GPUJob turns Failed (MemberRejected) naming the object and
    the member, an Event says the same, and the job's own objects there are deleted."""
    t = Term()
    t.member("m1", hgx_node("m1-n0"))
    s = t.connect("m1")
    sent(s)
    await placed(t, "u1")
    [(_, uid, rev)] = sent(s)
    message = (
        "ConfigMap team-a/settings exists in member m1 and is not owned by this job "
        f"(gpufed.io/job-uid={uid}, gpufed.io/origin=gpufed-hub; it carries no gpufed ownership "
        "labels): rename it in the GPUJob or delete the member's object"
    )
    t.ctrl.heard(s)
    await t.ctrl.handle(
        s, WorkAck(job_uid=uid, revision=rev, result="Failed", message=message, retryable=False)
    )
    await settle()
    status = t.ctrl.state.jobs[uid].status
    assert status.phase == "Failed"
    assert message in status.message
    dispatched = next(c for c in status.conditions if c.type == "Dispatched")
    assert (dispatched.status, dispatched.reason, dispatched.message) == (
        "False",
        "MemberRejected",
        message,
    )
    assert ("job-u1", "MemberRejected", message) in t.kube.events
    assert [op for op, u, _ in sent(s) if u == uid] == ["delete"]
