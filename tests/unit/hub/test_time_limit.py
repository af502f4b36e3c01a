"""spec.placement.timeLimitSeconds at the hub (gpufed.hub.rules.lifecycle, rule 6b): a running
copy is stopped at its limit, counted from the workload's start in the member, whatever its
kind; the job ends Failed with TimeLimitExceeded and its member copy is deleted."""

from __future__ import annotations

from gpufed.api.stream import InventoryDelta
from gpufed.api.work import WorkAck, WorkloadStatus
from gpufed.hub.rules import lifecycle as lc
from gpufed.hub.rules import status as st
from tests.unit.hub.builders import hgx_node
from tests.unit.hub.term import Term, running, sent, settle


async def test_a_running_copy_is_stopped_at_its_time_limit() -> None:
    t = Term()
    t.member("m1", hgx_node("m1-n0"))
    s = t.connect("m1")
    sent(s)
    await t.submit("j", "u1", gpus=8, placement={"timeLimitSeconds": 600})
    await t.ctrl.scheduler.cycle()
    [(_, _, rev)] = [x for x in sent(s) if x[0] == "apply"]
    await t.ctrl.handle(s, WorkAck(job_uid="u1", revision=rev, result="Applied"))
    t.ctrl.members.on_delta(
        t.ctrl.state.members["m1"],
        InventoryDelta(seq=2, upserts=(hgx_node("m1-n0", requested=8, job_uid="u1"),)),
    )
    await settle()
    started = t.clock.wall() - 100  # the member started it 100 s ago
    running = WorkloadStatus(
        job_uid="u1",
        revision=rev,
        kind="Job.batch",
        name="j",
        phase="Running",
        start_time=st.rfc3339(started),
    )
    await t.ctrl.handle(s, running)
    await settle()
    job = t.ctrl.state.jobs["u1"]
    t.clock.advance(499)
    await t.ctrl.lifecycle.due()
    await settle()
    assert job.status.phase == "Running", "stopped before its limit"
    assert sent(s) == []
    t.clock.advance(1)
    await t.ctrl.lifecycle.due()
    await settle()
    assert job.status.phase == "Failed"
    cond = next(c for c in job.status.conditions if c.type == "TimeLimitExceeded")
    assert (cond.status, cond.reason) == ("True", "DeadlineExceeded")
    assert [op for op, _, _ in sent(s)] == ["delete"], "its member copy is deleted"
    assert "TimeLimitExceeded" in {r for _, r, _ in t.kube.events}


def test_the_rule_waits_for_the_limit_and_acts_at_it() -> None:
    f = lc.Facts(has_record=True, cluster="m1", work="apply", limit_at=700.0, now=699.0)
    assert lc.decide(f) == (lc.WaitUntil(700.0),)
    at = lc.Facts(has_record=True, cluster="m1", work="apply", limit_at=700.0, now=700.0)
    assert lc.decide(at) == (lc.FailTimeLimit(), lc.DeleteCopy())
    # a failure reported once the limit is reached (the copy stopped there exits 143) ends it
    # at its limit: the limit wins over rule 6, whatever re-runs are left
    both = lc.Facts(
        has_record=True,
        cluster="m1",
        work="apply",
        limit_at=700.0,
        now=800.0,
        failure_cluster="m1",
        retries_left=1,
    )
    assert lc.decide(both) == (lc.FailTimeLimit(), lc.DeleteCopy())
    exempt = lc.Facts(**{**both.__dict__, "failure_exempt": True})
    assert lc.decide(exempt) == (lc.FailTimeLimit(), lc.DeleteCopy())
    # before the limit an infrastructure failure still re-runs it
    early = lc.Facts(**{**both.__dict__, "now": 699.0})
    assert lc.decide(early) == (lc.MarkSuspects(), lc.StopForRerun())


async def test_a_job_stopped_at_its_limit_with_exit_code_143_declared_is_not_re_run() -> None:
    """A tenant lists 143 (SIGTERM) in infrastructureExitCodes; the member's Job controller
    stops the copy at activeDeadlineSeconds (= timeLimitSeconds), its pods exit 143, and the
    agent's report comes before the hub's own timer fires: the job still ends Failed with
    TimeLimitExceeded, with no re-run and no suspect node."""
    from gpufed.api.work import FailureCause

    t, s, rev = await running(
        {"timeLimitSeconds": 600, "retry": {"infrastructureExitCodes": [143]}}
    )
    start = st.rfc3339(t.clock.wall())
    base = {"job_uid": "u1", "revision": rev, "kind": "Job.batch", "name": "j"}
    await t.ctrl.handle(s, WorkloadStatus(**base, phase="Running", start_time=start))
    await settle()
    t.clock.advance(600)  # the limit is reached; the member's report arrives first
    stopped = FailureCause(
        kind="Application", reason="DeadlineExceeded", exit_codes=(143,), nodes=("m1-n0",)
    )
    await t.ctrl.handle(
        s, WorkloadStatus(**base, phase="Failed", start_time=start, failure=stopped)
    )
    await settle()
    await t.ctrl.lifecycle.due()
    await settle()
    job = t.ctrl.state.jobs["u1"]
    assert job.status.phase == "Failed", job.status.message
    cond = next(c for c in job.status.conditions if c.type == "TimeLimitExceeded")
    assert (cond.status, cond.reason) == ("True", "DeadlineExceeded")
    assert not job.status.restarts
    assert t.store.jobs["u1"][0].stopping is None, "marked for a re-run"
    assert not [c for c in job.status.conditions if c.type == "Restarting" and c.status == "True"]
    assert t.ctrl.suspects.of_member("m1", t.ctrl._term.mono()) == []
    assert [op for op, _, _ in sent(s)] == ["delete"], "its member copy is deleted"


async def test_a_hold_lends_its_nodes_to_a_job_whose_limit_ends_before_the_holder_starts() -> None:
    """issue 29 item 1 at the hub: a starving 16-GPU job holds both nodes, which drain by the
    running jobs' own limits (+1,000 s and +2,000 s); a 4-GPU job with a 500 s limit runs on
    the held free GPUs meanwhile, one without a limit waits."""
    from gpufed.hub.adapters.ports import WatchEvent
    from gpufed.hub.components.config import HubConfig
    from tests.unit.hub.builders import batch_job, gpujob_obj

    t = Term(config=HubConfig(insecure=True, queue_starvation_s=60, queue_oldest_first_s=60))
    t.member("m1", hgx_node("m1-n0"), hgx_node("m1-n1"))
    s = t.connect("m1")
    sent(s)
    await t.submit("a", "ua", gpus=4, placement={"timeLimitSeconds": 1000})
    await t.submit("b", "ub", gpus=8, placement={"timeLimitSeconds": 2000})
    await t.ctrl.scheduler.cycle()
    assert {t.ctrl.state.jobs[u].status.phase for u in ("ua", "ub")} == {"Placed"}
    big = gpujob_obj("c", "uc", template=batch_job(8, parallelism=2, completions=2))
    t.kube.objects["gpujobs"].append(big)
    t.ctrl.intake.on_job_event(WatchEvent("ADDED", big))
    await settle()
    await t.ctrl.scheduler.cycle()
    t.clock.advance(61)  # c starves: it holds the nodes that will fit it
    await t.ctrl.scheduler.cycle()
    await t.submit("d", "ud", gpus=4, placement={"timeLimitSeconds": 500})
    await t.submit("e", "ue", gpus=4)
    await t.ctrl.scheduler.cycle()
    d, e = t.ctrl.state.jobs["ud"], t.ctrl.state.jobs["ue"]
    assert d.status.phase == "Placed", d.status.message
    explained = d.status.placement.message if d.status.placement else ""
    assert "backfill: runs on nodes held for team-a/c" in explained, explained
    assert "expected start (in 1939 s)" in explained, "b's limit: 2,000 s after its placement"
    assert e.status.phase == "Pending", "a job without a limit never runs inside a hold"
    assert t.ctrl.state.jobs["uc"].status.phase == "Pending"


async def test_a_jobs_copy_carries_its_time_limit_as_active_deadline_seconds() -> None:
    """The work item's batch/v1 Job has spec.activeDeadlineSeconds = timeLimitSeconds, so the
    member's Job controller stops it there too (gpufed.sync.manifests step 9)."""
    import json

    t = Term()
    t.member("m1", hgx_node("m1-n0"))
    await t.submit("j", "u1", gpus=8, placement={"timeLimitSeconds": 600})
    await t.submit("k", "u2", gpus=0)
    await t.ctrl.scheduler.cycle()

    def spec(uid: str) -> dict[str, object]:
        work = t.store.work[("m1", uid)][0]
        [job] = [json.loads(m) if isinstance(m, (str, bytes)) else m for m in work.manifests]
        return dict(job["spec"])

    assert spec("u1")["activeDeadlineSeconds"] == 600
    assert "activeDeadlineSeconds" not in spec("u2"), "no limit: the Job is left as it is"
