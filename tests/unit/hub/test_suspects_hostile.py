"""Hostile tenant (found by the stop-19 probe): a job that declares exit code 1 as
"infrastructure" and fails on purpose was re-placed onto fresh nodes each time and marked every
node it touched suspect for the whole fleet (an hour), until the fleet was denied to every
other tenant. Only evidence about the node itself marks it now (sync/failure.py NODE_EVIDENCE)."""

from __future__ import annotations

from gpufed.api.stream import InventoryDelta
from gpufed.api.work import FailureCause, WorkAck, WorkloadStatus
from tests.unit.hub.builders import hgx_node
from tests.unit.hub.term import Term, sent, settle


def report(uid: str, rev: int, phase: str, failure: FailureCause | None) -> WorkloadStatus:
    return WorkloadStatus(
        job_uid=uid, revision=rev, kind="Job.batch", name="j", phase=phase, failure=failure
    )  # type: ignore[arg-type]


async def test_exit_1_declared_infrastructure_walks_and_denies_the_fleet() -> None:
    t = Term()
    nodes = [f"m1-n{i}" for i in range(4)]
    t.member("m1", *(hgx_node(n) for n in nodes))
    s = t.connect("m1")
    sent(s)
    # Tenant A: an ordinary crashing job (exit 1) that calls exit 1 "infrastructure".
    await t.submit("evil", "u1", gpus=8, placement={"retry": {"infrastructureExitCodes": [1]}})
    job = t.ctrl.state.jobs["u1"]
    seq = 2
    for attempt in range(1, 5):
        if attempt > 1:  # the backoff between re-runs: 60 s doubling
            t.clock.advance(60 * 2 ** (attempt - 2))
            await t.ctrl.lifecycle.due()
        await t.ctrl.scheduler.cycle()
        applies = [x for x in sent(s) if x[0] == "apply" and x[1] == "u1"]
        assert applies, f"attempt {attempt} not placed"
        rev = applies[-1][2]
        [node] = list(job.status.placement.pod_sets[0].nodes)  # type: ignore[union-attr]
        await t.ctrl.handle(s, WorkAck(job_uid="u1", revision=rev, result="Applied"))
        t.ctrl.members.on_delta(
            t.ctrl.state.members["m1"],
            InventoryDelta(seq=seq, upserts=(hgx_node(node, requested=8, job_uid="u1"),)),
        )
        seq += 1
        await settle()
        crash = FailureCause(
            kind="Application", reason="BackoffLimitExceeded", exit_codes=(1,), nodes=(node,)
        )
        await t.ctrl.handle(s, report("u1", rev, "Failed", crash))
        await settle()
        [(op, _, del_rev)] = [x for x in sent(s) if x[1] == "u1"]
        assert op == "delete"
        await t.ctrl.handle(s, WorkAck(job_uid="u1", revision=del_rev, result="Deleted"))
        t.ctrl.members.on_delta(
            t.ctrl.state.members["m1"], InventoryDelta(seq=seq, upserts=(hgx_node(node),))
        )
        seq += 1
        await settle()
    suspect = [x.node for x in t.ctrl.suspects.of_member("m1", t.ctrl._term.mono())]
    # Tenant B (another job, healthy) now finds an idle fleet it cannot use.
    await t.submit("victim", "u2", gpus=8)
    await t.ctrl.scheduler.cycle()
    b = t.ctrl.state.jobs["u2"]
    assert b.status.phase == "Placed", b.status.message
    # The property that should hold: an application exit code a tenant declares should
    # not take shared nodes away from other tenants.
    assert suspect == [], "a tenant's declared exit code marked shared nodes suspect"
