"""The simulator with preemption: victims requeue and redo lost work, the two victim rules, the
trace's checkpoint column and the priority mix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_simulate import hgx_fleet, tj, trace
from typer.testing import CliRunner

from gpufed.cli.main import app
from gpufed.placement.sim.priomix import BUILTIN, load_mix
from gpufed.placement.sim.simpreempt import SimPreemption
from gpufed.placement.sim.simulate import TraceError, fleet_members, read_trace, simulate


def test_a_high_priority_job_preempts_and_the_victim_redoes_its_lost_work() -> None:
    members = fleet_members(hgx_fleet(a=1))
    jobs = [
        tj("low", 0, 8, 1000, priority=100, checkpoint_s=300.0),
        tj("high", 400, 8, 100, priority=1000),
    ]
    off = simulate(members, jobs, preemption=SimPreemption(on=False))
    on = simulate(members, jobs, preemption=SimPreemption(on=True))
    assert off.as_json()["wait_p95_s_by_priority"] == {"1000": 600.0, "100": 0.0}
    got = on.as_json()
    assert got["wait_p95_s_by_priority"] == {"1000": 0.0, "100": 0.0}
    assert got["preemptions"] == 1
    # 400 s run, checkpoint at 300 s: 100 s x 8 GPUs lost
    assert got["gpu_hours_lost"] == round(800 / 3600, 2)
    assert got["placed"] == 2
    assert got["unstarted"] == 0
    # low restarts at 500 with 1000 - 300 s left: it ends at 1200, after redoing 100 s
    assert on.extra["end_s"] == 1200.0


def test_without_the_flag_the_json_keys_stay_as_before() -> None:
    members = fleet_members(hgx_fleet(a=1))
    r = simulate(members, [tj("x", 0, 8, 10)])
    assert "preemptions" not in r.as_json()


def test_priority_only_takes_the_most_recent_jobs_topology_blind() -> None:
    # two nodes, each running two 4-GPU low jobs; a0 ends and c takes its place, so the two
    # most recent (c, b1) sit on different nodes: priority-only frees 8 GPUs that hold no
    # 8-GPU pod and must take a third victim; gpufed frees one node (c and a1)
    members = fleet_members(hgx_fleet(a=2))
    jobs = [
        tj("a0", 0, 4, 100, priority=1),
        tj("c", 200, 4, 10_000, priority=1),
        tj("a1", 1, 4, 10_000, priority=1),
        tj("b0", 2, 4, 10_000, priority=1),
        tj("b1", 3, 4, 10_000, priority=1),
        tj("high", 5000, 8, 100, priority=9),
    ]
    ours = simulate(members, jobs, preemption=SimPreemption(victims="gpufed")).as_json()
    base = simulate(members, jobs, preemption=SimPreemption(victims="priority-only")).as_json()
    assert ours["preemptions"] == 2
    assert base["preemptions"] == 3
    assert ours["gpu_hours_lost"] < base["gpu_hours_lost"]


def test_preemption_needs_the_gpufed_policy() -> None:
    members = fleet_members(hgx_fleet(a=1))
    with pytest.raises(ValueError, match="only the gpufed policy preempts"):
        simulate(members, [tj("x", 0, 8, 10)], "cluster-sum", preemption=SimPreemption())
    with pytest.raises(ValueError, match="victims"):
        SimPreemption(victims="random")  # type: ignore[arg-type]


def test_trace_checkpoint_column(tmp_path: Path) -> None:
    p = trace(tmp_path, "job_id,submit_s,gpus,duration_s,checkpoint_s\n1,0,4,60,\n2,0,4,60,30\n")
    assert [j.checkpoint_s for j in read_trace(p)] == [None, 30.0]
    bad = trace(tmp_path, "job_id,submit_s,gpus,duration_s,checkpoint_s\n1,0,4,60,0\n")
    with pytest.raises(TraceError, match="line 2: checkpoint_s: must be > 0"):
        read_trace(bad)


def test_builtin_mix_is_deterministic_and_near_its_shares() -> None:
    jobs = [tj(str(i), 0, 1, 3600 if i % 2 else 60) for i in range(3000)]
    mixed = BUILTIN.apply(jobs)
    assert mixed == BUILTIN.apply(jobs)
    share = sum(1 for j in mixed if j.priority == 1000) / len(mixed)
    assert 0.08 < share < 0.12
    assert {j.checkpoint_s for j in mixed if j.duration_s >= 1800} == {1800.0}
    assert {j.checkpoint_s for j in mixed if j.duration_s < 1800} == {None}


def test_mix_file_errors_name_the_field(tmp_path: Path) -> None:
    f = tmp_path / "mix.json"
    f.write_text(json.dumps({"classes": [{"priority": 5, "share": 0.5}]}))
    with pytest.raises(ValueError, match=r"shares sum to 0\.5"):
        load_mix(str(f))
    with pytest.raises(ValueError, match="cannot read"):
        load_mix(str(tmp_path / "none.json"))


def test_cli_prints_the_preemption_keys(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(
        "clusters:\n  - name: a\n    nodePools:\n      - name: h\n        nodes: 1\n"
        "        gpu: {product: NVIDIA-H100-80GB-HBM3, count: 8}\n        nvlink: node\n"
    )
    t = trace(tmp_path, "job_id,submit_s,gpus,duration_s,priority\n1,0,8,600,1\n2,10,8,60,9\n")
    out = CliRunner().invoke(
        app,
        ["simulate", "--fleet", str(fleet), "--trace", str(t), "--preemption", "on", "--json"],
    )
    assert out.exit_code == 0, out.output
    got = json.loads(out.output)
    assert got["preemptions"] == 1
    assert got["wait_p95_s_by_priority"] == {"9": 0.0, "1": 0.0}
    bad = CliRunner().invoke(
        app, ["simulate", "--fleet", str(fleet), "--trace", str(t), "--preemption", "maybe"]
    )
    assert bad.exit_code == 2


def test_bench_placement_with_preemption_prints_both_runs() -> None:
    out = CliRunner().invoke(
        app,
        [
            "bench",
            "placement",
            "--clusters",
            "2",
            "--nodes-per-cluster",
            "30",
            "--decisions",
            "40",
            "--preemption",
            "--json",
        ],
    )
    assert out.exit_code == 0, out.output
    result = json.loads(out.output.strip())
    assert set(result) == {"no_preemption", "with_preemption", "p99_ratio", "cpu_p99_ratio"}
    w = result["with_preemption"]
    # a full fleet: jobs fit only where an earlier preemption freed more than its job used
    assert w["preempted"] > w["placed"]
    assert w["placed"] + w["preempted"] + w["not_placed"] == 40
    assert w["victims"] >= w["preempted"]
