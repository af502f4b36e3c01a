"""The checkpoint an agent reports (WorkloadStatus.last_checkpoint_time) lands in the GPUJob's
status.lastCheckpointTime (gpufed.hub.components.reports, gpufed.hub.rules.status): only forward, and a value in
the future or not RFC 3339 is ignored (logged), the last good one kept."""

from __future__ import annotations

from gpufed.api.work import WorkloadStatus
from tests.unit.hub.builders import hgx_node
from tests.unit.hub.term import Term


async def placed_term() -> tuple[Term, int]:
    t = Term()
    t.member("m1", hgx_node("m1-n0"))
    await t.submit("a", "ua", gpus=8)
    await t.ctrl.scheduler.cycle()
    return t, t.store.work[("m1", "ua")][1]


async def test_a_reported_checkpoint_is_shown_and_only_moves_forward() -> None:
    t, rev = await placed_term()
    s = t.connect("m1")
    t.ctrl.heard(s)
    job = t.ctrl.state.jobs["ua"]

    async def report(when: str) -> str | None:
        await t.ctrl.handle(
            s,
            WorkloadStatus(job_uid="ua", revision=rev, phase="Running", last_checkpoint_time=when),
        )
        return job.status.last_checkpoint_time

    # the term's wall clock is 2026-01-01T00:00:00Z
    assert await report("2025-12-31T23:00:00Z") == "2025-12-31T23:00:00Z"
    assert await report("2025-12-31T22:00:00Z") == "2025-12-31T23:00:00Z"  # older: kept
    assert await report("2026-01-02T00:00:00Z") == "2025-12-31T23:00:00Z"  # future: ignored
    assert await report("garbage") == "2025-12-31T23:00:00Z"  # not RFC 3339: ignored
    assert await report("") == "2025-12-31T23:00:00Z"  # none reported: kept
    assert await report("2025-12-31T23:59:00Z") == "2025-12-31T23:59:00Z"
    assert job.status.to_k8s()["lastCheckpointTime"] == "2025-12-31T23:59:00Z"
