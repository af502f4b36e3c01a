"""Member edge cases through a real leader term over typed fakes and a fake clock: a member
that keeps refusing an Apply for now, and a MemberCluster deleted under running jobs."""

from __future__ import annotations

from gpufed.api.stream import Heartbeat
from gpufed.api.work import WorkAck
from gpufed.hub.components.config import HubConfig
from tests.unit.hub.builders import hgx_node
from tests.unit.hub.term import Term, sent, settle


async def placed_and_sent(t: Term, uid: str = "u1") -> tuple[str, int]:
    t.member("m1", hgx_node("m1-n0"))
    s = t.connect("m1")
    sent(s)
    await t.submit("j", uid, gpus=8)
    await t.ctrl.scheduler.cycle()
    [(_, got, rev)] = sent(s)
    return got, rev


async def fail_retryably(t: Term, uid: str, rev: int, message: str) -> None:
    s = t.ctrl.state.members["m1"].session
    assert s is not None
    t.ctrl.heard(s)
    await t.ctrl.handle(
        s, WorkAck(job_uid=uid, revision=rev, result="Failed", message=message, retryable=True)
    )
    await settle()


async def test_a_retryable_refusal_backs_off_says_so_and_gives_up_at_the_limit() -> None:
    t = Term(config=HubConfig(insecure=True, apply_retry_limit=4, apply_retry_max_s=12))
    uid, rev = await placed_and_sent(t)
    delays = []
    for attempt in (1, 2, 3):
        await fail_retryably(t, uid, rev, "namespace team-a is being terminated")
        job = t.ctrl.state.jobs[uid]
        ws = t.ctrl.state.work[("m1", uid)]
        assert ws.retry_at is not None
        delays.append(round(ws.retry_at - t.clock.mono()))
        assert job.status.phase == "Placed", "not failed while retrying"
        assert f"retrying in m1 in {delays[-1]} s (attempt {attempt} of 4)" in job.status.message
        assert "being terminated" in job.status.message
        dispatched = next(c for c in job.status.conditions if c.type == "Dispatched")
        assert (dispatched.status, dispatched.reason) == ("False", "Retrying")
    assert delays == [5, 10, 12], "5 s doubling, capped at apply_retry_max_s"
    await fail_retryably(t, uid, rev, "namespace team-a is being terminated")
    job = t.ctrl.state.jobs[uid]
    assert job.status.phase == "Failed"
    assert "gave up after 4 attempts" in job.status.message
    assert t.ctrl.state.work[("m1", uid)].record.op == "Delete", "what was accepted is deleted"


async def test_a_deleted_membercluster_hands_its_jobs_to_the_lost_policy_at_once() -> None:
    # A deleted MemberCluster used to strand its jobs (never Lost) and their GPUJob deletion
    # hung on the finalizer.
    t = Term()
    t.member("m1", hgx_node("m1-n0"), hgx_node("m1-n1"))
    t.connect("m1")
    await t.submit("stays", "u1")
    await t.submit("moves", "u2", reschedule="OnClusterLoss")
    await t.ctrl.scheduler.cycle()
    t.member("m2", hgx_node("m2-n0"))
    t.connect("m2")
    t.ctrl.members.gone("m1")
    await settle()
    lost = t.ctrl.state.jobs["u1"].status
    assert lost.phase == "Lost"
    assert "member m1 was deleted on the hub" in lost.message
    assert t.ctrl.state.jobs["u2"].status.phase == "Pending"
    await t.ctrl.scheduler.cycle()
    assert t.ctrl.state.jobs["u2"].placed_cluster == "m2"


async def test_deleting_a_job_of_a_deleted_member_completes() -> None:
    t = Term()
    t.member("m1", hgx_node("m1-n0"))
    t.connect("m1")
    await t.submit("j", "u1")
    await t.ctrl.scheduler.cycle()
    t.ctrl.members.gone("m1")
    await settle()
    obj = t.kube.objects["gpujobs"][0]
    obj["metadata"]["deletionTimestamp"] = "2026-01-01T00:10:00Z"
    from gpufed.hub.adapters.ports import WatchEvent

    t.ctrl.intake.on_job_event(WatchEvent("MODIFIED", obj))
    await settle()
    assert obj["metadata"]["finalizers"] == [], "the finalizer is dropped: the delete completes"
    assert "u1" not in t.store.jobs


async def test_a_member_whose_agent_cannot_reach_its_api_server_is_not_ready_until_it_can() -> None:
    # Its agent kept the stream open, so the member stayed Ready and work sent there was
    # retried every 5 s forever with nothing in the jobs' status.
    t = Term()
    t.member("m1", hgx_node("m1-n0"))
    s = t.connect("m1")
    t.ctrl.heard(s)
    await t.ctrl.handle(s, Heartbeat(inventory_seq=1, member_api_error="dial tcp: refused"))
    health = t.ctrl.snapshot.member("m1").health
    assert not health.ready
    assert health.reason == "MemberAPIUnreachable"
    assert "dial tcp: refused" in health.message
    await t.submit("j", "u1")
    await t.ctrl.scheduler.cycle()
    assert t.ctrl.state.jobs["u1"].status.phase == "Pending", "no new work goes there"
    t.ctrl.heard(s)
    await t.ctrl.handle(s, Heartbeat(inventory_seq=1))
    assert t.ctrl.snapshot.member("m1").health.ready
    await t.ctrl.scheduler.cycle()
    assert t.ctrl.state.jobs["u1"].status.phase == "Placed"
