"""``BackfillRule.spare_draining_s`` (issue 29 item 4, ``backfill8``;
:mod:`gpufed.placement.sim.simdrain`): a fresh small job that would run past the drain of a
node about to be free from end to end is first tried elsewhere, so the node drains for a job
that needs it whole. Waits worked out by hand."""

from __future__ import annotations

import pytest
from placement_builders import hgx_cluster
from test_hold_keep_one_node import _one_node_stream

from gpufed.placement.queue import BackfillRule
from gpufed.placement.sim.simclasses import class_report
from gpufed.placement.sim.simulate import simulate
from gpufed.placement.sim.trace import TraceJob


def _run(within_s: float, s_limit: float = 5_000.0, swap: bool = False) -> dict[str, float]:
    """Two 8-GPU nodes. ``p`` (6 GPUs, to 1,000 s) and ``q`` (6 GPUs, to 10,000 s) take one
    node each at 0; ``s`` (2 GPUs, runs 5,000 s or to ``s_limit``) arrives at 10 and fits
    beside either; ``big`` (8 GPUs, 100 s) at 20. Beside ``p`` (where placement puts it
    without the rule), ``s`` keeps that node busy to 5,010 s and ``big`` waits 4,990 s;
    spared, ``s`` goes beside ``q`` and ``big`` starts when ``p`` ends (wait 980 s). Job ->
    wait, and ``"s beside p"``: 1.0 when ``s`` ran on ``p``'s node, else 0.0."""
    jobs = [
        TraceJob("p", 0.0, 6, 1_000.0, 6, "Preferred", time_limit_s=1_000.0),
        TraceJob("q", 0.0, 6, 10_000.0, 6, "Preferred", time_limit_s=10_000.0),
        TraceJob("s", 10.0, 2, min(5_000.0, s_limit), 2, "Preferred", time_limit_s=s_limit),
        TraceJob("big", 20.0, 8, 100.0, 8, "Preferred", time_limit_s=100.0),
    ]
    if swap:
        jobs[0], jobs[1] = jobs[1], jobs[0]
    rule = BackfillRule(order="fifo", spare_draining_s=within_s)
    res = simulate([hgx_cluster("a", nodes=2)], jobs, "gpufed", backfill=rule)
    out = {r.job_id: r.wait_s for r in res.records if r.wait_s is not None}
    node = {r.job_id: r.nvlink_domains for r in res.records}
    out["s beside p"] = 1.0 if node["s"] == node["p"] else 0.0
    return out


def _waits(within_s: float, s_limit: float = 5_000.0, swap: bool = False) -> dict[str, float]:
    got = _run(within_s, s_limit, swap)
    del got["s beside p"]
    return got


@pytest.mark.parametrize("swap", [False, True])
def test_a_small_job_leaves_the_node_about_to_drain_to_the_whole_node_job(swap: bool) -> None:
    assert _waits(0.0, swap=swap) == {"p": 0.0, "q": 0.0, "s": 0.0, "big": 4_990.0}
    assert _waits(3_600.0, swap=swap) == {"p": 0.0, "q": 0.0, "s": 0.0, "big": 980.0}


def test_only_nodes_draining_within_the_window_and_only_jobs_that_would_delay_them() -> None:
    assert _run(0.0)["s beside p"] == 1.0  # placement's own choice
    assert _run(3_600.0)["s beside p"] == 0.0
    # p's node drains at 1,000 s: 990 s ahead, outside a 900 s window
    assert _run(900.0)["s beside p"] == 1.0
    assert _waits(900.0)["big"] == 4_990.0
    # s's own limit ends at 1,000 s, not past the drain: not kept off; it runs beside p (to
    # 1,000 s) and big still starts at 1,000 s
    assert _run(3_600.0, s_limit=990.0)["s beside p"] == 1.0
    assert _waits(3_600.0, s_limit=990.0)["big"] == 980.0


def test_with_spare_draining_the_one_node_job_still_waits_at_most_sixteen_hours_and_a_drain() -> (
    None
):
    """The starvation bound (as test_backfill's, drawn limits): sparing changes where a fresh
    job goes first, not whether the starving job holds."""
    jobs = _one_node_stream()
    drain = max(j.time_limit_s or 0.0 for j in jobs if j.job_id != "big")
    rule = BackfillRule(hold_nodes="earliest-drain", spare_draining_s=3_600)
    res = simulate([hgx_cluster("a", nodes=2)], jobs, "gpufed", backfill=rule)
    assert res.placed == res.jobs
    [rec] = [r for r in res.records if r.job_id == "big"]
    assert rec.wait_s is not None
    assert rec.wait_s <= 57_600 + drain
    assert class_report(res.records)["backfill_limit_hits"] == 0
