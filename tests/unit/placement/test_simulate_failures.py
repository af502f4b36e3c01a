"""The simulator with node failures: jobs on a failed node lose the work since their
checkpoint, are re-placed off that node with --retry on, fail with --retry off; goodput,
restarts and failed_infra count it; a run is reproducible from its seed."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from test_simulate import hgx_fleet, tj, trace
from typer.testing import CliRunner

from gpufed.cli.main import app
from gpufed.placement.sim.simfail import SimFailures, work_kept_s
from gpufed.placement.sim.simulate import fleet_members, simulate


@pytest.mark.parametrize(
    ("run_s", "checkpoint_s", "kept"),
    [(950.0, 300.0, 900.0), (299.0, 300.0, 0.0), (950.0, None, 0.0), (0.0, 300.0, 0.0)],
)
def test_a_failure_keeps_the_work_up_to_the_last_checkpoint(
    run_s: float, checkpoint_s: float | None, kept: float
) -> None:
    assert work_kept_s(run_s, checkpoint_s) == kept


def _long_job_run(retry: bool, seed: int = 3) -> tuple[dict[str, object], SimFailures]:
    # one member of two 8-GPU nodes, one job filling a node for 20,000 s, checkpoint every
    # 100 s; a node fails every ~3,000 s and is down for 10,000 s
    members = fleet_members(hgx_fleet(a=2))
    fails = SimFailures(3000.0, repair_s=10_000.0, retry=retry, max_retries=50, seed=seed)
    r = simulate(members, [tj("long", 0, 8, 20_000, checkpoint_s=100.0)], failures=fails)
    return r.as_json(), fails


def test_with_retry_the_job_is_re_placed_off_the_failed_node_and_finishes() -> None:
    got, fails = _long_job_run(retry=True)
    assert got["node_failures"] >= 1
    assert got["restarts"] >= 1  # the seed puts a failure under the job
    assert got["failed_infra"] == 0
    assert got["placed"] == 1
    # each failure loses under one checkpoint interval of 8 GPUs
    assert 0 < fails.gpu_s_lost <= got["restarts"] * 100 * 8  # type: ignore[operator]
    assert got["goodput"] == round(20_000 * 8 / (20_000 * 8 + fails.gpu_s_lost), 4)


def test_without_retry_the_job_fails_and_counts_nothing_as_goodput() -> None:
    got, _ = _long_job_run(retry=False)
    assert (got["restarts"], got["failed_infra"], got["goodput"]) == (0, 1, 0.0)


def test_the_same_seed_gives_the_same_run_another_seed_another() -> None:
    a, _ = _long_job_run(retry=True, seed=3)
    b, _ = _long_job_run(retry=True, seed=3)
    c, _ = _long_job_run(retry=True, seed=4)
    strip = lambda d: {k: v for k, v in d.items() if k != "runtime_s"}  # noqa: E731
    assert strip(a) == strip(b)
    assert strip(a) != strip(c)


def test_a_restarted_job_never_lands_on_its_failed_node_while_it_is_down() -> None:
    # one node only: after its failure the job waits for the repair (1,000 s), then resumes
    members = fleet_members(hgx_fleet(a=1))
    fails = SimFailures(3000.0, repair_s=1000.0, retry=True, max_retries=50, seed=3)
    r = simulate(members, [tj("j", 0, 8, 5_000, checkpoint_s=100.0)], failures=fails)
    got = r.as_json()
    assert got["restarts"] >= 1
    lost_s = fails.gpu_s_lost / 8
    # the job ran 5,000 s of work plus what it lost, and waited 1,000 s per failure
    assert r.extra["end_s"] == pytest.approx(5_000 + lost_s + 1000 * got["restarts"])  # type: ignore[operator]


def test_failures_stop_once_every_job_ended() -> None:
    members = fleet_members(hgx_fleet(a=1))
    r = simulate(members, [tj("j", 0, 8, 10)], failures=SimFailures(1e6, seed=0))
    assert r.extra["end_s"] == 10.0
    assert r.as_json()["node_failures"] <= 1


def test_bad_failure_flags_are_refused_naming_the_flag() -> None:
    with pytest.raises(ValueError, match="--node-failure-interval-s"):
        SimFailures(0.0)
    with pytest.raises(ValueError, match="--repair-s"):
        SimFailures(10.0, repair_s=math.inf)
    members = fleet_members(hgx_fleet(a=1))
    with pytest.raises(ValueError, match="only the gpufed policy"):
        simulate(members, [tj("j", 0, 8, 10)], "cluster-sum", failures=SimFailures(10.0))


def test_cli_adds_the_failure_keys_and_checkpoint_default(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(hgx_fleet(a=2).model_dump_json())
    t = trace(tmp_path, "job_id,submit_s,gpus,duration_s\n1,0,8,20000\n")
    args = ["simulate", "--fleet", str(fleet), "--trace", str(t), "--json"]
    args += ["--node-failure-interval-s", "3000", "--repair-s", "10000", "--seed", "3"]
    res = CliRunner().invoke(app, [*args, "--checkpoint-s", "100"])
    assert res.exit_code == 0, res.output
    got = json.loads(res.output.strip().splitlines()[-1])
    assert list(got)[-6:] == [
        "node_failures",
        "retry",
        "goodput",
        "restarts",
        "failed_infra",
        "gpu_hours_lost_failures",
    ]
    assert got["retry"] == "on"
    bad = CliRunner().invoke(app, [*args, "--retry", "maybe"])
    assert bad.exit_code == 2
