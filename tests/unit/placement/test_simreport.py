"""The simulator's reports for people (placement/sim/simreport.py, cli/simulate.py): several
policies in one run, mean wait by job size, per-job CSV, utilisation over time, the plot."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpufed.cli.main import app
from gpufed.placement.sim.simreport import (
    JobRecord,
    size_bucket,
    utilization_series,
    wait_by_size,
    waits,
)
from tests.unit.placement.test_simulate import SIM_FLEET, SIM_KEYS, trace


def record(
    job_id: str, gpus: int, submit: float, start: float | None, end: float | None
) -> JobRecord:
    runs = ((start, end),) if start is not None and end is not None else ()
    return JobRecord(job_id, gpus, submit, start, end, "m", ("node:n1",), runs)


@pytest.mark.parametrize(("gpus", "bucket"), [(1, 1), (2, 2), (3, 4), (8, 8), (9, 16), (64, 64)])
def test_sizes_group_by_the_next_power_of_two(gpus: int, bucket: int) -> None:
    assert size_bucket(gpus) == bucket


def test_mean_wait_by_size_counts_started_jobs_only() -> None:
    records = [
        record("a", 1, 0, 10, 20),
        record("b", 1, 0, 30, 40),
        record("c", 8, 0, 100, 200),
        record("d", 8, 0, None, None),  # never started: no wait to average
    ]
    assert wait_by_size(records) == {1: (2, 20.0), 8: (1, 100.0)}
    assert waits(records) == [10, 30, 100]


def test_utilization_is_the_mean_of_busy_gpus_per_interval() -> None:
    # 16 GPUs: 8 busy over [0, 50), 16 over [50, 100)
    records = [record("a", 8, 0, 0, 100), record("b", 8, 0, 50, 100)]
    assert utilization_series(records, 16, points=2) == [(25.0, 0.5), (75.0, 1.0)]
    # an interval split by an edge is averaged: 8 GPUs for half of it, 16 for the other half
    assert utilization_series(records, 16, points=1) == [(50.0, 0.75)]
    assert utilization_series([], 16) == []


def run(tmp_path: Path, *args: str) -> tuple[int, str]:
    t = trace(tmp_path, "job_id,submit_s,gpus,duration_s\n1,0,8,60\n2,0,64,60\n3,5,3,30\n")
    out = CliRunner().invoke(app, ["simulate", "--fleet", str(SIM_FLEET), "--trace", str(t), *args])
    return out.exit_code, out.output


def test_json_prints_one_line_per_policy_in_the_order_given_and_nothing_else(
    tmp_path: Path,
) -> None:
    code, out = run(tmp_path, "--policy", "round-robin,gpufed,cluster-sum", "--json")
    assert code == 0, out
    lines = [json.loads(line) for line in out.strip().splitlines()]
    assert [x["policy"] for x in lines] == ["round-robin", "gpufed", "cluster-sum"]
    assert all(list(x) == SIM_KEYS for x in lines)
    code, out = run(tmp_path, "--policy", "gpufed", "--json", "--per-size")
    assert json.loads(out)["wait_mean_s_by_size"] == {"4": 0.0, "8": 0.0, "64": 0.0}


@pytest.mark.parametrize(
    ("policy", "why"), [("gpufed,nope", "'nope' is not one of"), ("gpufed,gpufed", "once")]
)
def test_a_bad_policy_list_is_refused(tmp_path: Path, policy: str, why: str) -> None:
    code, out = run(tmp_path, "--policy", policy)
    assert code == 2
    assert why in out


def test_the_table_has_a_column_per_policy_and_the_size_table(tmp_path: Path) -> None:
    code, out = run(tmp_path, "--policy", "gpufed,cluster-sum", "--per-size")
    assert code == 0, out
    header = next(line for line in out.splitlines() if "cluster-sum" in line)
    assert "gpufed" in header
    assert "mean wait by job size" in out
    assert "64" in out.split("mean wait by job size")[1]


def test_per_class_adds_the_class_tables_and_bad_time_limit_knobs_name_their_flag(
    tmp_path: Path,
) -> None:
    code, out = run(tmp_path, "--policy", "gpufed", "--json", "--per-class")
    assert code == 0, out
    classes = json.loads(out)["classes"]
    assert set(classes["by_size"]) == {"4", "8", "64"}
    assert set(classes["by_topology"]) == {"one-pod", "Preferred"}
    assert classes["time_limited"] == 3  # drawn for every job by default
    assert list(classes["idle"]) == ["no-job-waiting", "held", "fragment", "kept-off", "down"]
    shares = sum(row["share"] for row in classes["idle"].values())
    assert shares + json.loads(out)["gpu_utilization"] == pytest.approx(1.0, abs=5e-4)
    code, out = run(
        tmp_path, "--policy", "gpufed", "--json", "--per-class", "--time-limit-factor", "0"
    )
    assert json.loads(out)["classes"]["time_limited"] == 0
    code, out = run(tmp_path, "--policy", "gpufed", "--per-class")
    assert code == 0, out
    assert "gpufed: by size" in out
    assert "pool GPU-hours by class" in out
    assert "idle GPU time by reason" in out
    for flag, value in (("--time-limit-factor", "0.5"), ("--scatter-slowdown", "0.9")):
        code, out = run(tmp_path, "--policy", "gpufed", flag, value)
        assert code == 2
        assert flag in out


def test_jobs_out_writes_each_jobs_run_per_policy(tmp_path: Path) -> None:
    path = tmp_path / "jobs.csv"
    code, out = run(tmp_path, "--policy", "gpufed,round-robin", "--jobs-out", str(path), "--json")
    assert code == 0, out
    rows = list(csv.DictReader(path.open()))
    assert [r["policy"] for r in rows] == ["gpufed"] * 3 + ["round-robin"] * 3
    big = next(r for r in rows if r["policy"] == "gpufed" and r["job_id"] == "2")
    assert (big["submit_s"], big["start_s"], big["end_s"], big["wait_s"]) == (
        "0.0",
        "0.0",
        "60.0",
        "0.0",
    )
    assert big["member"]
    assert len(big["nvlink_domain"].split(";")) == 8  # 64 GPUs on eight 8-GPU nodes


def test_plot_writes_a_png(tmp_path: Path) -> None:
    path = tmp_path / "sim.png"
    code, out = run(tmp_path, "--policy", "gpufed,cluster-sum", "--plot", str(path), "--json")
    assert code == 0, out
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
