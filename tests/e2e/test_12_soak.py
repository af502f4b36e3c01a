"""The chaos soak, 3 minutes (issue 26): in its own fresh sandbox (two hub replicas, the soak
fleet), a seeded job stream through GPUQueues while every fault kind may strike; the checker,
reading only the API servers' history, must find no job lost, none running twice, no quota
exceeded, and every job terminal. The result JSON is printed (``soak-result``); the history
file stays for anyone to re-check (``gpufed.sandbox.soakcheck.check``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpufed.sandbox.soak import run_soak

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]


def test_a_3_minute_soak_loses_nothing_runs_nothing_twice_and_keeps_quotas(
    tmp_path: Path,
) -> None:
    result = run_soak(
        3,
        seed=11,
        drain_s=420,
        state_dir=tmp_path / "state",
        history=tmp_path / "history.jsonl",
        progress=print,
    )
    print("soak-result " + json.dumps(result))
    assert result["faults"], "faults were injected"
    assert result["submitted"] == result["jobs_planned"]
    assert result["lost"] == 0, result["offenders"]["lost_jobs"]
    assert result["double_running"] == 0, result["offenders"]["double_running_jobs"]
    assert result["quota_overruns"] == 0, result["offenders"]["quota_overrun_samples"]
    assert result["drained"], "every job terminal"
    ended = ("succeeded", "failed_application", "failed_infrastructure", "failed_rejected")
    assert sum(result[k] for k in ended) == result["submitted"], "every job terminal"
