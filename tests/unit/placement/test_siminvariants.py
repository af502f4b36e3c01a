"""The invariant checker of ``gpufed simulate --check-invariants``: queue usage recomputed from
run intervals alone (caps, lending limits at every level, broken queues, MIG keys), member
capacity and overlapping runs; and the simulator's own intervals checked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from quota_builders import A100, H100, gpu_queue, quota
from test_simulate import hgx_fleet, tj
from typer.testing import CliRunner

from gpufed.api.queue import GPUQueue
from gpufed.cli.main import app
from gpufed.placement.sim.siminvariants import check_intervals
from gpufed.placement.sim.simpreempt import SimPreemption
from gpufed.placement.sim.simreport import (
    IntervalFileError,
    RunInterval,
    interval_rows,
    read_intervals,
)
from gpufed.placement.sim.simulate import fleet_members, simulate

MIG = "nvidia.com/mig-1g.10gb"


def run(
    job: str,
    queue: str,
    gpus: int,
    start: float,
    end: float,
    *,
    product: str = H100,
    n: int = 1,
    member: str = "m",
    ended: str = "succeeded",
) -> RunInterval:
    """One run interval of ``job`` in ``queue``."""
    return RunInterval(job, n, queue, member, product, gpus, start, end, ended)


def org_div_two_teams(lending_a: int | None = 0) -> list[GPUQueue]:
    """org (root, ``*`` 16) -> div (no entry) -> team-a (``*`` 8, lending ``lending_a``) and
    team-b (``*`` 8): the 3-level lending example of docs/placement.md."""
    return [
        gpu_queue("org", quota("*", 16), namespaces=()),
        gpu_queue("div", parent="org", namespaces=()),
        gpu_queue("team-a", quota("*", 8, lending=lending_a), parent="div"),
        gpu_queue("team-b", quota("*", 8), parent="div"),
    ]


def test_three_level_lending_overrun_is_flagged_at_the_root() -> None:
    """team-b runs 16 while team-a, which lends nothing, runs 0: org holds 16 + team-a's
    unlent 8 = 24 > 16, though no entry is above its own limit."""
    report = check_intervals([run("b", "team-b", 16, 0, 100)], org_div_two_teams())
    assert [(v.time_s, v.kind, v.queue, v.key, v.used, v.reserved, v.cap) for v in report.violations] == [
        (0, "quota", "org", "*", 16, 8, 16)
    ]  # fmt: skip
    assert "org *: 16 used + 8 its queues do not lend > cap 16" in report.violations[0].message


def test_lending_what_a_team_may_lend_is_within_limits() -> None:
    """The same run is fine when team-a lends its 8 (no lending limit) or lends all but 0."""
    assert check_intervals([run("b", "team-b", 16, 0, 100)], org_div_two_teams(None)).ok
    assert check_intervals([run("b", "team-b", 16, 0, 100)], org_div_two_teams(8)).ok


def test_reserved_quota_shrinks_as_the_lending_team_uses_it() -> None:
    """team-a runs 8 of its own: nothing is kept unlent, and 8 + 8 fits org's 16; 8 + 9 not."""
    ok = [run("a", "team-a", 8, 0, 100), run("b", "team-b", 8, 0, 100)]
    assert check_intervals(ok, org_div_two_teams()).ok
    over = [run("a", "team-a", 4, 0, 100), run("b", "team-b", 9, 0, 100)]
    (v,) = check_intervals(over, org_div_two_teams()).violations
    assert (v.queue, v.used, v.reserved) == ("org", 13, 4)


def test_a_broken_queues_running_usage_is_still_charged_to_its_parent() -> None:
    """team-c lists a key twice (the hub calls it broken); its 12 running GPUs still count at
    org, whose cap is 16: with team-a's 8 it is over."""
    queues = [
        gpu_queue("org", quota("*", 16), namespaces=()),
        gpu_queue("team-a", quota("*", 8), parent="org"),
        gpu_queue("team-c", quota("*", 4), quota("*", 4), parent="org"),
    ]
    report = check_intervals([run("a", "team-a", 8, 0, 10), run("c", "team-c", 12, 5, 10)], queues)
    assert [(v.time_s, v.queue, v.used) for v in report.violations] == [(5, "org", 20)]


def test_a_parent_cycle_and_an_unknown_parent_do_not_stop_the_check() -> None:
    """x -> y -> x is walked once; z's parent does not exist, so z is checked as a root."""
    queues = [
        gpu_queue("x", quota("*", 4, borrowing=0), parent="y"),
        gpu_queue("y", quota("*", 100), parent="x"),
        gpu_queue("z", quota("*", 2), parent="gone"),
    ]
    report = check_intervals([run("j", "x", 6, 0, 1), run("k", "z", 3, 0, 1)], queues)
    assert {(v.queue, v.used, v.cap) for v in report.violations} == {("x", 6, 4), ("z", 3, 2)}


def test_a_timeline_within_limits_passes() -> None:
    """Borrowing within the limit, a product listed by name next to ``*``, the default queue
    (not in the file: no limit)."""
    queues = [
        gpu_queue("org", quota("*", 16), namespaces=()),
        gpu_queue("team-a", quota("*", 8, borrowing=4), quota(A100, 2), parent="org"),
        gpu_queue("team-b", quota("*", 4), parent="org"),
    ]
    timeline = [
        run("a1", "team-a", 12, 0, 100),
        run("a2", "team-a", 2, 0, 50, product=A100),
        run("b1", "team-b", 2, 10, 200),
        run("d", "default", 500, 0, 300),
    ]
    report = check_intervals(timeline, queues)
    assert report.ok
    assert report.summary()["instants"] == 6  # 0, 10, 50, 100, 200, 300


def test_borrowing_limit_is_the_cap_of_a_non_root_entry() -> None:
    queues = [
        gpu_queue("org", quota("*", 100), namespaces=()),
        gpu_queue("team-a", quota("*", 8, borrowing=4), parent="org"),
    ]
    (v,) = check_intervals([run("a", "team-a", 13, 0, 1)], queues).violations
    assert (v.queue, v.used, v.cap) == ("team-a", 13, 12)


def test_touching_intervals_do_not_double_count() -> None:
    """A run ending at t and another starting at t (a preemption, a finish and the next job)
    hold the quota one after the other, never together."""
    queues = [gpu_queue("org", quota("*", 8))]
    timeline = [
        run("v", "org", 8, 0, 100, ended="preempted"),
        run("p", "org", 8, 100, 200),
        run("v", "org", 8, 200, 300, n=2),
    ]
    report = check_intervals(timeline, queues, {("m", H100): 8})
    assert report.ok
    assert report.summary()["instants"] == 4


def test_mig_keys_never_resolve_to_the_any_gpu_entry() -> None:
    """``*`` covers whole GPUs only: MIG slices are charged to their own entry, or to none."""
    queues = [gpu_queue("org", quota("*", 1), quota(MIG, 7))]
    assert check_intervals([run("m", "org", 7, 0, 1, product=MIG)], queues).ok
    (v,) = check_intervals([run("m", "org", 8, 0, 1, product=MIG)], queues).violations
    assert (v.key, v.cap) == (MIG, 7)
    no_mig = [gpu_queue("org", quota("*", 1))]  # a leaf listing quotas but not this key: 0
    (v,) = check_intervals([run("m", "org", 1, 0, 1, product=MIG)], no_mig).violations
    assert (v.key, v.cap) == (MIG, 0)


def test_member_capacity_and_overlapping_runs_are_flagged() -> None:
    timeline = [
        run("j", "", 8, 0, 100),
        run("j", "", 8, 50, 150, n=2),  # run 2 starts before run 1 ended
        run("k", "", 4, 60, 70),
    ]
    report = check_intervals(timeline, (), {("m", H100): 16})
    kinds = [(v.kind, v.time_s, v.used, v.cap) for v in report.violations]
    assert kinds == [("overlap", 50, 2, None), ("member", 60, 20, 16)]
    assert report.summary()["overlap"] == 1


def test_intervals_round_trip_through_the_csv(tmp_path: Path) -> None:
    rows = [run("j", "q", 8, 0.1 + 0.2, 1e6 / 3, ended="still-running")]
    path = tmp_path / "i.csv"
    path.write_text(
        "policy,job_id,run,queue,member,gpu_product,gpus,start_s,end_s,ended\n"
        + "\n".join(",".join(["gpufed", *r]) for r in interval_rows(rows))
        + "\n"
    )
    assert read_intervals(path) == {"gpufed": rows}
    path.write_text("policy,job_id\ngpufed,j\n")
    with pytest.raises(IntervalFileError, match="missing columns"):
        read_intervals(path)


# --- the simulator's own intervals ----------------------------------------------------------------


def test_a_simulation_with_queues_and_preemption_has_no_violations() -> None:
    """Two tenants over two 8-GPU nodes, borrowing and reclaim by preemption: every run
    interval is written and the checker finds nothing."""
    queues = [
        gpu_queue("org", namespaces=()),
        gpu_queue("vc1", quota("*", 8, borrowing=8), parent="org"),
        gpu_queue("vc2", quota("*", 8, borrowing=8), parent="org"),
    ]
    jobs = [
        tj("a1", 0, 8, 3600, queue="vc1", priority=1, checkpoint_s=600.0),
        tj("a2", 0, 8, 3600, queue="vc1", priority=1, checkpoint_s=600.0),
        tj("b1", 100, 8, 600, queue="vc2", priority=1),
        tj("a3", 200, 4, 600, queue="vc1"),
    ]
    members = fleet_members(hgx_fleet(m=2))
    result = simulate(members, jobs, queues=queues, preemption=SimPreemption())
    assert result.as_json()["preemptions"] >= 1
    assert {"preempted", "succeeded"} <= {i.ended for i in result.intervals}
    report = check_intervals(result.intervals, queues, result.capacity)
    assert report.ok, report.violations
    # every GPU-second run is in the intervals
    assert sum(i.gpus * (i.end_s - i.start_s) for i in result.intervals) == sum(
        r.gpus * (e - s) for r in result.records for s, e in r.runs
    )


def test_the_simulator_keeps_a_deep_lending_limit() -> None:
    """team-b's two 8-GPU jobs arrive first; team-a lends nothing, so only one may run until
    team-a's own job takes its 8."""
    queues = org_div_two_teams()
    jobs = [
        tj("b1", 0, 8, 3600, queue="team-b"),
        tj("b2", 0, 8, 3600, queue="team-b"),
        tj("a1", 10, 8, 3600, queue="team-a"),
    ]
    result = simulate(fleet_members(hgx_fleet(m=2)), jobs, queues=queues)
    assert check_intervals(result.intervals, queues, result.capacity).ok


def test_node_failures_and_the_horizon_end_runs_with_their_reason() -> None:
    from gpufed.placement.sim.simfail import SimFailures

    members = fleet_members(hgx_fleet(m=4))
    jobs = [tj(f"j{i}", 0, 8, 40_000, checkpoint_s=600.0) for i in range(4)]
    fails = SimFailures(3000.0, repair_s=600.0, seed=1)
    result = simulate(members, jobs, failures=fails, horizon_s=20_000)
    endings = {i.ended for i in result.intervals}
    assert endings == {"node-failure", "still-running"}
    assert max(i.end_s for i in result.intervals) == 20_000
    assert max(i.run for i in result.intervals) >= 2
    assert check_intervals(result.intervals, (), result.capacity).ok


def test_cli_intervals_out_and_check_invariants(tmp_path: Path) -> None:
    """``--intervals-out`` writes one row per run; ``--check-invariants`` adds
    ``invariant_violations`` and exits 1 with the violations on stderr when any is found;
    the file alone gives the same answer."""
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(
        "clusters:\n  - name: m\n    nodePools:\n      - name: h100\n        nodes: 2\n"
        "        gpu: {product: NVIDIA-H100-80GB-HBM3, count: 8}\n        nvlink: node\n"
    )
    trace = tmp_path / "t.csv"
    trace.write_text(
        "job_id,submit_s,gpus,duration_s,queue\nb1,0,8,3600,team-b\nb2,0,8,3600,team-b\n"
        "a1,10,8,3600,team-a\n"
    )
    queues = tmp_path / "q.yaml"
    queues.write_text(
        "\n---\n".join(
            json.dumps(q.model_dump(by_alias=True, exclude_none=True))
            for q in org_div_two_teams(None)
        )
    )
    out = tmp_path / "i.csv"
    args = ["simulate", "--fleet", str(fleet), "--trace", str(trace), "--queues", str(queues)]
    res = CliRunner().invoke(
        app, [*args, "--json", "--check-invariants", "--intervals-out", str(out)]
    )
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["invariant_violations"] == 0
    rows = read_intervals(out)["gpufed"]
    assert [(i.job_id, i.queue, i.gpus, i.ended) for i in rows] == [
        ("b1", "team-b", 8, "succeeded"),
        ("b2", "team-b", 8, "succeeded"),
        ("a1", "team-a", 8, "succeeded"),
    ]
    # the same run read against team-a lending nothing: the file alone shows the overrun
    assert [v.queue for v in check_intervals(rows, org_div_two_teams()).violations] == ["org"]
    # an over-quota run (two root queues of 8, --quota-mode none): exit 1, the first on stderr
    queues.write_text(
        "\n---\n".join(
            json.dumps(q.model_dump(by_alias=True, exclude_none=True))
            for q in [gpu_queue("team-b", quota("*", 8)), gpu_queue("team-a", quota("*", 8))]
        )
    )
    res = CliRunner().invoke(app, [*args, "--quota-mode", "none", "--json", "--check-invariants"])
    assert res.exit_code == 1
    assert json.loads(res.stdout)["invariant_violations"] == 1
    assert "queue team-b *: 16 used > cap 8" in res.stderr


@pytest.mark.parametrize("policy", ["cluster-sum", "round-robin", "first-admit"])
def test_baseline_runs_name_their_pools_product_and_fit_each_member(policy: str) -> None:
    """The baselines' decisions name no product: the interval takes the pool's, and the
    member check holds for them too."""
    members = fleet_members(hgx_fleet(a=1, b=1))
    jobs = [tj(f"j{i}", i, 4, 100) for i in range(6)]
    result = simulate(members, jobs, policy)  # type: ignore[arg-type]
    assert {i.gpu_product for i in result.intervals} == {H100}
    assert len(result.intervals) == 6
    assert check_intervals(result.intervals, (), result.capacity).ok
