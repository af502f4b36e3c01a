"""``gpufed bench scale`` at tiny size: a real hub in a fresh clusters-only sandbox and
simulated agents over real gRPC; every member registers, every job is dispatched and completes
(no timings are asserted)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufed.sandbox.binaries import BinDir
from gpufed.sandbox.scale_bench import ScaleOptions, run_scale_bench

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_every_member_registers_and_every_job_completes(
    tmp_path: Path, sandbox_bin_dir: BinDir
) -> None:
    opts = ScaleOptions(
        members=3, nodes_per_member=20, jobs=20, rate=10, churn=5, duration_s=1, workers=2
    )
    result = run_scale_bench(opts, state_dir=tmp_path / "state")
    counts = {k: result[k] for k in ("registered", "dispatched", "completed", "streams_closed")}
    assert counts == {"registered": 3, "dispatched": 20, "completed": 20, "streams_closed": 0}
    assert result["registration_p99_ms"] is not None
    assert result["hub_rss_mib"] > 0
    assert result["etcd_db_mib"] is not None
    assert set(result["cpu_wait_s"]) >= {"hub", "hub_apiserver", "etcd", "bench", "workers"}
    trace = (tmp_path / "state" / "scale" / "jobs.jsonl").read_text().splitlines()
    assert len(trace) == 20
    assert (tmp_path / "state" / "scale" / "hub-metrics.txt").read_text().count("gpufed_") > 0
