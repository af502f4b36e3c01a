"""`gpufed bench e2e` and its `--compare multikueue`, short: a few jobs through each system in
a sandbox of its own (not the session's: the benchmark starts and stops its own), every job
timed by the one harness, with CPU and API requests per job. The full comparison (200 jobs at
25/s, three sandboxes) is a command, `gpufed bench e2e --compare multikueue`, not a test."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from gpufed.sandbox.e2e_bench import bench_fleet, job_sizes, run_bench
from gpufed.sandbox.e2e_compare import FAST_QPS, multikueue_system
from gpufed.sandbox.e2e_harness import fresh_sandbox, measure
from gpufed.sandbox.multikueue import MultiKueueOptions, start_multikueue

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]

JOBS = 5


def _assert_timed(result: dict[str, Any], jobs: int) -> None:
    assert result["dispatched"] == jobs, result
    assert result["completed"] == jobs, result
    for key in ("dispatch_p50_ms", "dispatch_p99_ms", "status_p50_ms", "status_p99_ms"):
        assert result[key] is not None, (key, result)
        assert result[key] >= 0, (key, result)
    assert result["cpu_per_job_ms"] > 0, result
    # At least the create of each job, on the hub; its copy in a member; its pod there.
    assert result["api_requests_per_job"] >= 3, result
    assert result["api_requests_per_job_by_cluster"]["hub"] >= 1, result
    assert result["bench_api_requests_per_job"] >= 1, result


def test_bench_e2e_times_a_few_gpujobs_with_cpu_and_requests_per_job(tmp_path: Path) -> None:
    result = run_bench(JOBS, 5.0, duration_s=1.0, state_dir=tmp_path / "state")
    _assert_timed(result, JOBS)
    assert result["hub_rss_mib"] > 0
    assert set(result["agents_rss_mib"]) == {"bench-0", "bench-1"}


def test_the_multikueue_system_times_a_few_jobs_through_the_same_harness(tmp_path: Path) -> None:
    """The --compare driver's MultiKueue run, short: Kueue (QPS/burst 1000) on a clusters-only
    sandbox, queued batch Jobs on the hub, each copied to a member, run, and Complete on the
    hub; the Kueue managers' CPU and memory counted."""
    sizes = job_sizes(JOBS, seed=1)
    with fresh_sandbox(tmp_path / "state") as sandbox:
        info = sandbox.up(bench_fleet(sizes))
        mk = start_multikueue(
            sandbox, info, options=MultiKueueOptions(qps=FAST_QPS, burst=FAST_QPS)
        )
        system = multikueue_system(mk)
        result = asyncio.run(
            measure(sandbox, info, system, sizes, 5.0, 1.0, lambda _m: None, idle_s=2.0)
        )
    _assert_timed(result, JOBS)
    assert set(result["rss_mib"]) == set(mk.components)
    assert all(v > 0 for v in result["rss_mib"].values()), result
