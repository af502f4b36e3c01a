"""Status writes per job (issue 25 item 4): how many PATCHes of ``gpujobs/status`` one job's life
takes on the hub API server, and which writes are not needed.

- The steps of a transition that come close together (placed, its objects acknowledged, its
  pods running) go in one write: a change after a quiet spell is held ``status_hold_s`` before
  it is written (:class:`gpufed.hub.adapters.writer.CoalescingWriter` ``hold_s``); a terminal
  status is written at once.
- The resync does not rewrite a status the watch shows at a resourceVersion older than the
  hub's own last write (the watch lags: an echo of an earlier write of ours is no overwrite).

The count is taken from :class:`tests.unit.hub.fakes.FakeHubAPI`'s request counter, the
independent record of what reached the API server; the writer's clock is a fake one.
"""

from __future__ import annotations

import asyncio
import copy

from gpufed.api.work import WorkAck, WorkloadStatus
from gpufed.hub.adapters.ports import WatchEvent
from gpufed.hub.adapters.sessions import AgentSession
from tests.unit.fake_time import FakeClock
from tests.unit.hub.builders import hgx_node
from tests.unit.hub.term import Term, sent, settle

HOLD_S = 0.25
INTERVAL_S = 0.25  # the mirror's min_interval_s for GPUJob status


async def _advance(clock: FakeClock, seconds: float) -> None:
    await settle()  # the writer's timers are asleep before the clock moves
    clock.advance(seconds)
    await settle()


async def _placed(t: Term) -> tuple[AgentSession, int]:
    """Job u1 (8 GPUs) placed on member m1 and sent to its agent: (the stream, revision)."""
    t.member("m1", hgx_node("m1-n0"), hgx_node("m1-n1"))
    s = t.connect("m1")
    sent(s)
    await t.submit("j", "u1", gpus=8)
    await t.ctrl.scheduler.cycle()
    [(_, _, rev)] = [x for x in sent(s) if x[0] == "apply"]
    await settle()
    return s, rev


async def _job_life(t: Term, clock: FakeClock) -> list[dict[str, object]]:
    """One job through a member as the e2e bench sees it: placed; acknowledged and running
    (ready 0) within 0.1 s; ready 1 a second later; succeeded 3 s later. Returns the statuses
    written, in order."""
    s, rev = await _placed(t)
    await _advance(clock, 0.05)
    await t.ctrl.handle(s, WorkAck(job_uid="u1", revision=rev, result="Applied"))
    await _advance(clock, 0.05)
    report = WorkloadStatus(job_uid="u1", revision=rev, phase="Running", active=1)
    await t.ctrl.handle(s, report)
    await _advance(clock, 1.0)
    await t.ctrl.handle(s, report.model_copy(update={"ready": 1}))
    await _advance(clock, 3.0)
    done = WorkloadStatus(job_uid="u1", revision=rev, phase="Succeeded", succeeded=1)
    await t.ctrl.handle(s, done)
    await settle()
    await asyncio.wait_for(t.ctrl.mirror.jobs.drained(), 5)
    return [status for _, _, status in t.kube.job_statuses]


def _term_with_fake_writer_clock() -> tuple[Term, FakeClock]:
    t = Term()
    clock = FakeClock()
    writer = t.ctrl.mirror.jobs
    writer._clock = clock.time  # the writer's only sources of time (its docstring)
    writer._sleep = clock.sleep
    t.ctrl.mirror.start()
    return t, clock


async def test_a_jobs_placed_dispatched_and_running_steps_take_one_status_write() -> None:
    t, clock = _term_with_fake_writer_clock()
    try:
        written = await _job_life(t, clock)
    finally:
        await t.ctrl.mirror.stop()

    # placed + dispatched + running (ready 0) held into one; ready 1; succeeded.
    assert t.kube.requests["patch_job_status"] == 3, [w.get("phase") for w in written]
    assert [w["phase"] for w in written] == ["Running", "Running", "Succeeded"]
    first = {c["type"]: c["status"] for c in written[0]["conditions"]}  # type: ignore[attr-defined]
    assert first["Placed"] == "True"
    assert first["Dispatched"] == "True"
    assert [w.get("ready") for w in written] == [0, 1, 0]
    # What users see at the end is what every step added, and nothing was lost.
    final = t.kube.objects["gpujobs"][0]["status"]
    assert final == written[-1]
    assert final["cluster"] == "m1"
    assert final["succeeded"] == 1
    assert final["timings"]["dispatchMs"] is not None


async def test_a_terminal_status_is_not_held() -> None:
    t, clock = _term_with_fake_writer_clock()
    try:
        s, rev = await _placed(t)
        assert t.kube.requests["patch_job_status"] == 0  # held
        # It fails at once, within the hold: written without waiting for the clock.
        failed = WorkloadStatus(job_uid="u1", revision=rev, phase="Failed", failed=1)
        await t.ctrl.handle(s, WorkAck(job_uid="u1", revision=rev, result="Applied"))
        await t.ctrl.handle(s, failed)
        await settle()
        assert t.kube.requests["patch_job_status"] == 1
        assert t.kube.job_statuses[-1][2]["phase"] == "Failed"
        # The held entry, once its time comes, has nothing left to write.
        await _advance(clock, HOLD_S)
        await asyncio.wait_for(t.ctrl.mirror.jobs.drained(), 5)
        assert t.kube.requests["patch_job_status"] == 1
    finally:
        await t.ctrl.mirror.stop()


async def test_resync_leaves_alone_a_watch_echo_of_an_earlier_write_of_ours() -> None:
    # The e2e bench: the hub API server's watch lagged seconds behind the hub's writes; the
    # resync saw the echo of our Running write after we had written Succeeded, took it for
    # an overwrite and wrote Succeeded again (36 of 200 jobs in one run).
    t, clock = _term_with_fake_writer_clock()
    try:
        await _job_life(t, clock)
        obj = t.kube.objects["gpujobs"][0]
        echoes = _echoes(t)
        writes = t.kube.requests["patch_job_status"]
        for echo in echoes[:-1]:  # each earlier write's echo arrives, the last one not yet
            t.ctrl.intake.on_job_event(WatchEvent("MODIFIED", echo))
            await settle()
            assert t.ctrl.mirror.resync_jobs() == 0
        assert t.kube.requests["patch_job_status"] == writes
        assert t.kube.requests["get_job"] == 0

        # Someone else's write is still corrected.
        obj["status"] = {**obj["status"], "phase": "Running"}
        t.kube.bump(obj)
        t.ctrl.intake.on_job_event(WatchEvent("MODIFIED", copy.deepcopy(obj)))
        await settle()
        assert t.ctrl.mirror.resync_jobs() == 1
        await asyncio.wait_for(t.ctrl.mirror.jobs.drained(), 5)
        assert obj["status"]["phase"] == "Succeeded"
    finally:
        await t.ctrl.mirror.stop()


def _echoes(t: Term) -> list[dict[str, object]]:
    """The GPUJob as each of the hub's status writes left it (what the watch delivers, one
    event per write), rebuilt from the fake's record: resourceVersions are consecutive."""
    obj = t.kube.objects["gpujobs"][0]
    last = int(obj["metadata"]["resourceVersion"])
    statuses = [status for _, _, status in t.kube.job_statuses]
    out = []
    for i, status in enumerate(statuses):
        echo = copy.deepcopy(obj)
        echo["status"] = status
        echo["metadata"]["resourceVersion"] = str(last - (len(statuses) - 1 - i))
        out.append(echo)
    return out
