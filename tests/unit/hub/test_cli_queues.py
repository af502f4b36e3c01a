"""``gpufed get queues`` rows (tree order, broken queues as roots) and ``gpufed explain`` of a
job that waits for quota (gpufed.cli.queues, gpufed.cli.jobs)."""

from __future__ import annotations

from gpufed.cli.jobs import explain_text
from gpufed.cli.queues import queue_rows
from tests.unit.hub.test_queues import H100, gpuqueue, phases, team_a_term


def test_queues_are_listed_as_a_tree_with_orphans_and_cycles_as_roots() -> None:
    items = [
        gpuqueue("team-b", parent="research", nominal=8),
        gpuqueue("research", nominal=64),
        gpuqueue("team-a", parent="research", nominal=8),
        gpuqueue("lost", parent="nowhere"),
        gpuqueue("x", parent="y"),
        gpuqueue("y", parent="x"),
    ]
    rows = queue_rows(items)
    assert [(r["name"], r["depth"]) for r in rows] == [
        ("lost", 0),
        ("research", 0),
        ("team-a", 1),
        ("team-b", 1),
        ("x", 0),
        ("y", 1),
    ]
    assert rows[0]["active"] == "Unknown"


async def test_explain_of_a_job_waiting_for_quota_gives_the_quota_reason() -> None:
    t = team_a_term(8)
    await t.submit("a", "ua", gpus=8)
    await t.submit("b", "ub", gpus=8)
    await t.ctrl.scheduler.cycle()
    waiting = next(u for u, p in phases(t).items() if p == "Pending")
    job = t.ctrl.state.jobs[waiting]
    raw = job.obj.model_dump(by_alias=True, mode="json", exclude_none=True)
    raw["status"] = job.status.model_dump(by_alias=True, mode="json", exclude_none=True)
    text = explain_text(raw)
    assert f"Quota: team-a uses 8 of 8 {H100}; 8 more needed" in text
