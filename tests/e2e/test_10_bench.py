"""`gpufed bench e2e` and its `--compare multikueue`, short: a few jobs through each system in
a sandbox of its own (not the session's: the benchmark starts and stops its own), every job
timed by the one harness, with CPU and API requests per job. The full comparison (200 jobs at
25/s, three sandboxes) is a command, `gpufed bench e2e --compare multikueue`, not a test."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpufed.sandbox.e2e_bench import run_bench

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
