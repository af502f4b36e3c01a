"""A finished job lets its reservation go (gpufed.hub.rules.lifecycle rule 3), through a real
leader term over typed fakes: reports mirror the member's terminal status and ask for a
reconcile; the lifecycle releases what the ledger still holds for the job, in memory and in
etcd. Checked on the snapshot's ledger and the fake store, not on the rule."""

from __future__ import annotations

import pytest

from gpufed.api.work import FailureCause, WorkAck, WorkloadStatus
from tests.unit.hub.builders import hgx_node
from tests.unit.hub.term import Term, sent, settle


@pytest.mark.parametrize("phase", ["Succeeded", "Failed"])
async def test_a_job_that_finishes_before_its_pods_are_seen_releases_its_reservation(
    phase: str,
) -> None:
    """Placed and applied, but no inventory has shown its pods yet: the reservation still
    holds its 8 GPUs when the member reports it finished (Failed: an application failure, not
    a re-run); once the report is handled the ledger and etcd hold nothing for it, and the
    other job fits on the node."""
    t = Term()
    t.member("m1", hgx_node("m1-n0"))
    s = t.connect("m1")
    sent(s)
    await t.submit("j", "u1", gpus=8)
    await t.ctrl.scheduler.cycle()
    [(_, _, rev)] = [x for x in sent(s) if x[0] == "apply"]
    await t.ctrl.handle(s, WorkAck(job_uid="u1", revision=rev, result="Applied"))
    await settle()
    assert t.ctrl.snapshot.reservation("u1") is not None
    assert "u1" in t.store.reservations
    await t.submit("k", "u2", gpus=8)
    await t.ctrl.scheduler.cycle()
    assert t.ctrl.state.jobs["u2"].status.phase == "Pending", "the reservation holds the node"
    failure = FailureCause(kind="Application", reason="Error", message="exit 1")
    report = WorkloadStatus(
        job_uid="u1",
        revision=rev,
        phase=phase,
        failure=failure if phase == "Failed" else None,
    )
    await t.ctrl.handle(s, report)  # type: ignore[arg-type]
    await settle()
    assert t.ctrl.state.jobs["u1"].status.phase == phase
    assert t.ctrl.snapshot.reservation("u1") is None
    assert "u1" not in t.store.reservations
    await t.ctrl.scheduler.cycle()
    assert t.ctrl.state.jobs["u2"].status.phase == "Placed"
