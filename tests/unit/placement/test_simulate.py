"""The trace simulator and the benchmark command: trace rules, policies, metrics, CLI output."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpufed.api.fleet import FleetSpec
from gpufed.cli.main import app
from gpufed.placement.sim.simulate import (
    TraceError,
    TraceJob,
    fleet_members,
    read_trace,
    simulate,
)

ROOT = Path(__file__).resolve().parents[3]
ITP = ROOT / "manifests" / "traces" / "msft-itp-week.csv"
SIM_FLEET = ROOT / "manifests" / "fleets" / "sim-itp.yaml"
SIM_KEYS = [
    "policy",
    "jobs",
    "placed",
    "unstarted",
    "wait_mean_s",
    "wait_p50_s",
    "wait_p95_s",
    "gpu_utilization",
    "nvlink_required_single_domain",
    "stranded",
    "runtime_s",
]


def hgx_fleet(**nodes: int) -> FleetSpec:
    """A fleet of HGX H100 members: member name -> 8-GPU nodes."""
    clusters = "\n".join(
        f"""  - name: {name}
    nodePools:
      - name: h100
        nodes: {n}
        gpu: {{product: NVIDIA-H100-80GB-HBM3, count: 8}}
        nvlink: node"""
        for name, n in nodes.items()
    )
    return FleetSpec.loads("clusters:\n" + clusters)


def nvl72_fleet(cliques: int = 2) -> FleetSpec:
    return FleetSpec.loads(
        f"""clusters:
  - name: nvl
    nodePools:
      - name: gb200
        nodes: {18 * cliques}
        gpu: {{product: NVIDIA-GB200, count: 4}}
        nvlink: {{nodesPerDomain: 18}}
"""
    )


def trace(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "trace.csv"
    p.write_text(text.strip() + "\n")
    return p


def tj(job_id: str, submit: float, gpus: int, duration: float, **kw: object) -> TraceJob:
    per_pod = kw.pop("gpus_per_pod", min(gpus, 8))
    topo = kw.pop("topology", "Required" if gpus == per_pod else "Preferred")
    return TraceJob(job_id, submit, gpus, duration, per_pod, topo, **kw)  # type: ignore[arg-type]


def test_trace_defaults_and_optional_columns(tmp_path: Path) -> None:
    p = trace(
        tmp_path,
        """
job_id,submit_s,gpus,duration_s,gpus_per_pod,topology,gpu_product,priority
1,0,4,60,,,,
2,5,32,60,,,,
3,9,16,60,4,required,NVIDIA-GB200,7
""",
    )
    a, b, c = read_trace(p)
    assert (a.gpus_per_pod, a.pods, a.topology) == (4, 1, "Required")
    assert (b.gpus_per_pod, b.pods, b.topology) == (8, 4, "Preferred")
    assert (c.gpus_per_pod, c.pods, c.topology, c.gpu_product, c.priority) == (
        4,
        4,
        "Required",
        "NVIDIA-GB200",
        7,
    )


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("job_id,submit_s,gpus\n1,0,1\n", "missing column"),
        ("job_id,submit_s,gpus,duration_s\n1,0,x,60\n", "line 2: gpus: 'x' is not an integer"),
        ("job_id,submit_s,gpus,duration_s\n1,0,1,60\n2,0,1,-5\n", "line 3: duration_s"),
        ("job_id,submit_s,gpus,duration_s,gpus_per_pod\n1,0,12,60,8\n", "does not divide"),
        ("job_id,submit_s,gpus,duration_s,topology\n1,0,1,60,always\n", "topology: 'always'"),
        ("job_id,submit_s,gpus,duration_s\n", "no jobs"),
        ("", "missing column"),
        (
            "job_id,submit_s,gpus,duration_s\n7,0,1,60\n7,5,1,60\n",
            "line 3: job_id: '7' repeats line 2",
        ),
        (
            "job_id,submit_s,gpus,duration_s\n1,nan,1,60\n",
            "line 2: submit_s: 'nan' is not a finite",
        ),
        (
            "job_id,submit_s,gpus,duration_s\n1,0,1,inf\n",
            "line 2: duration_s: 'inf' is not a finite",
        ),
        ("job_id,submit_s,gpus,duration_s\n1,0,12,60\n", "gpus_per_pod column"),
    ],
)
def test_bad_trace_rows_name_line_and_column(tmp_path: Path, body: str, message: str) -> None:
    p = tmp_path / "t.csv"
    p.write_text(body)
    with pytest.raises(TraceError, match=message):
        read_trace(p)


def test_a_trace_that_is_not_text_is_a_trace_error(tmp_path: Path) -> None:
    p = tmp_path / "t.csv"
    p.write_bytes(b"\xff\xfe\x00job_id")
    with pytest.raises(TraceError, match="not a UTF-8 CSV"):
        read_trace(p)


def test_fleet_spec_nodes_become_inventory_with_domains_and_mig() -> None:
    spec = FleetSpec.loads(
        """clusters:
  - name: m
    nodePools:
      - name: gb200
        nodes: 4
        gpu: {product: NVIDIA-GB200, count: 4}
        nvlink: {nodesPerDomain: 2}
      - name: a100
        nodes: 1
        gpu: {product: NVIDIA-A100-SXM4-80GB, count: 8}
        nvlink: node
        mig: {strategy: mixed, gpus: 2, profiles: {1g.10gb: 7}}
"""
    )
    [m] = fleet_members(spec)
    nodes = {n.name: n for n in m.inventory.nodes}
    assert len({n.nvlink_domain for n in nodes.values() if n.gpu_product == "NVIDIA-GB200"}) == 2
    a100 = next(n for n in nodes.values() if n.gpu_product == "NVIDIA-A100-SXM4-80GB")
    assert a100.allocatable["nvidia.com/gpu"] == 6
    assert a100.allocatable["nvidia.com/mig-1g.10gb"] == 14
    assert a100.mig_strategy == "mixed"


def fragmenting_jobs() -> list[TraceJob]:
    # four long 1-GPU jobs, then an 8-GPU job
    return [tj(str(i), i, 1, 10_000) for i in range(4)] + [tj("big", 10, 8, 100)]


def test_cluster_sum_strands_a_whole_node_job_where_gpus_are_scattered() -> None:
    members = fleet_members(hgx_fleet(big=4, small=1))
    base = simulate(members, fragmenting_jobs(), "cluster-sum")
    # the 1-GPU jobs went one per node into "big" (most free), so the 8-GPU job, sent to
    # "big" (28 free GPUs), cannot start there: stranded until the small jobs end
    assert base.stranded == 1
    assert base.wait_p95_s > 9_000
    ours = simulate(members, fragmenting_jobs(), "gpufed")
    assert ours.stranded == 0
    assert ours.wait_mean_s == 0.0
    assert ours.placed == ours.jobs == 5


def test_baselines_never_send_jobs_to_nodes_whose_taints_they_do_not_tolerate() -> None:
    # kube-scheduler in the member would never bind the trace's pods (no tolerations) to the
    # tainted inference nodes, so the GPU-blind baselines must not count them as eligible
    spec = FleetSpec.loads(
        """clusters:
  - name: a-inference
    nodePools:
      - name: h100
        nodes: 4
        gpu: {product: NVIDIA-H100-80GB-HBM3, count: 8}
        nvlink: node
        taints: [{key: dedicated, value: inference, effect: NoSchedule}]
  - name: b-training
    nodePools:
      - name: h100
        nodes: 1
        gpu: {product: NVIDIA-H100-80GB-HBM3, count: 8}
        nvlink: node
"""
    )
    jobs = [tj(str(i), i, 8, 100) for i in range(3)]
    for policy in ("cluster-sum", "round-robin", "gpufed"):
        result = simulate(fleet_members(spec), jobs, policy)  # type: ignore[arg-type]
        assert result.placed == 3, policy
        # one node runs them one after the other
        assert result.wait_p95_s >= 100, policy


def test_round_robin_takes_members_in_turn() -> None:
    members = fleet_members(hgx_fleet(a=1, b=1))
    jobs = [tj(str(i), 0, 8, 100) for i in range(2)] + [tj("x", 1, 8, 100)]
    r = simulate(members, jobs, "round-robin")
    # job x goes to member a (third in turn) where job 0 still runs
    assert r.stranded == 1
    assert r.wait_mean_s == pytest.approx(99 / 3)


def test_nvlink_required_jobs_stay_in_one_clique_only_with_gpufed_placement() -> None:
    """gpufed, and first-admit (gpufed's placement inside each member), keep them in one."""
    members = fleet_members(nvl72_fleet(cliques=2))
    jobs = [
        tj("a", 0, 64, 1000, gpus_per_pod=4, topology="Required"),
        tj("b", 1, 16, 1000, gpus_per_pod=4, topology="Required"),
    ]
    assert simulate(members, jobs, "gpufed").nvlink_required_single_domain == 1.0
    assert simulate(members, jobs, "first-admit").nvlink_required_single_domain == 1.0
    # spread takes trays by name once free GPUs tie: job b gets the two trays left in the
    # first clique and two of the second
    assert simulate(members, jobs, "cluster-sum").nvlink_required_single_domain == 0.5


def test_horizon_counts_jobs_never_started_and_rejects_impossible_ones() -> None:
    members = fleet_members(hgx_fleet(a=1))
    jobs = [
        tj("long", 0, 8, 10**9),
        tj("waits", 1, 8, 10),
        tj("never", 2, 16, 10, gpus_per_pod=16),
    ]
    for policy in ("gpufed", "cluster-sum", "round-robin"):
        r = simulate(members, jobs, policy, horizon_s=1000)  # type: ignore[arg-type]
        assert (r.placed, r.unstarted) == (1, 2), policy


def test_utilization_counts_gpu_seconds_while_jobs_arrive() -> None:
    members = fleet_members(hgx_fleet(a=1))
    r = simulate(members, [tj("x", 0, 4, 100), tj("y", 100, 1, 10)], "gpufed")
    assert r.gpu_utilization == pytest.approx(4 * 100 / (8 * 100))


def test_itp_trace_is_in_the_project_with_its_attribution() -> None:
    jobs = read_trace(ITP)
    assert len(jobs) == 13_706
    assert {j.gpus for j in jobs} == {1, 2, 4, 8, 16, 32, 64}
    assert "microsoft/elasticflow-traces" in (ITP.parent / "README.md").read_text()


def test_first_hours_of_itp_replay_without_stranding() -> None:
    members = fleet_members(FleetSpec.load(SIM_FLEET))
    jobs = [j for j in read_trace(ITP) if j.submit_s < 6 * 3600]
    r = simulate(members, jobs, "gpufed")
    assert r.stranded == 0
    assert r.unstarted == 0
    assert r.nvlink_required_single_domain == 1.0


def test_simulate_cli_prints_one_json_line_with_the_documented_keys(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(SIM_FLEET.read_text())
    t = trace(tmp_path, "job_id,submit_s,gpus,duration_s\n1,0,8,60\n2,0,64,60\n")
    out = CliRunner().invoke(
        app,
        ["simulate", "--fleet", str(fleet), "--trace", str(t), "--policy", "cluster-sum", "--json"],
    )
    assert out.exit_code == 0, out.output
    [line] = out.output.strip().splitlines()
    result = json.loads(line)
    assert list(result) == SIM_KEYS
    assert result["policy"] == "cluster-sum"
    assert result["jobs"] == 2


def test_simulate_cli_reports_bad_input_and_exits_2(tmp_path: Path) -> None:
    t = trace(tmp_path, "job_id,submit_s,gpus,duration_s\n1,0,0.5,60\n")
    out = CliRunner().invoke(app, ["simulate", "--fleet", str(SIM_FLEET), "--trace", str(t)])
    assert out.exit_code == 2
    assert "line 2: gpus" in out.output
    out = CliRunner().invoke(
        app, ["simulate", "--fleet", str(SIM_FLEET), "--trace", str(t), "--policy", "x"]
    )
    assert out.exit_code != 0
    for body, message in (
        ("job_id,submit_s,gpus,duration_s\n", "no jobs"),
        (b"\xff\xfe", "not a UTF-8 CSV"),
    ):
        if isinstance(body, bytes):
            t.write_bytes(body)
        else:
            t.write_text(body)
        out = CliRunner().invoke(app, ["simulate", "--fleet", str(SIM_FLEET), "--trace", str(t)])
        assert out.exit_code == 2
        assert message in out.output
        assert "Traceback" not in out.output
    out = CliRunner().invoke(
        app, ["simulate", "--fleet", str(SIM_FLEET), "--trace", str(tmp_path / "nope.csv")]
    )
    assert out.exit_code == 2
    assert "nope.csv" in out.output


def test_bench_placement_prints_the_documented_json_line() -> None:
    out = CliRunner().invoke(
        app,
        [
            "bench",
            "placement",
            "--clusters",
            "3",
            "--nodes-per-cluster",
            "40",
            "--decisions",
            "60",
            "--json",
        ],
    )
    assert out.exit_code == 0, out.output
    result = json.loads(out.output.strip())
    for key in (
        "clusters",
        "nodes",
        "gpus",
        "decisions",
        "p50_ms",
        "p99_ms",
        "decisions_per_s",
        "peak_rss_mib",
    ):
        assert key in result
    assert (result["clusters"], result["nodes"], result["decisions"]) == (3, 120, 60)
    assert result["placed"] + result["unschedulable"] + result["rejected"] == 60


def test_queues_enforce_keeps_quota_and_none_only_accounts(tmp_path: Path) -> None:
    """Two tenants on 16 GPUs, quota 8 each without borrowing: a burst of the first tenant
    runs past its quota under none (quota_exceeded > 0) and within it under enforce, where
    the other tenant's job waits for nobody."""
    from gpufed.api.queue import load_queues
    from gpufed.placement.sim.trace import read_trace

    trace = tmp_path / "t.csv"
    rows = ["job_id,submit_s,gpus,duration_s,tenant"]
    rows += [f"a{i},0,8,3600,1" for i in range(2)] + ["b0,10,8,600,2"]
    trace.write_text("\n".join(rows) + "\n")
    queues = tmp_path / "q.yaml"
    queues.write_text(
        "\n---\n".join(
            "apiVersion: gpufed.io/v1alpha1\nkind: GPUQueue\n"
            f"metadata: {{name: vc{i}}}\nspec:\n  namespaces: [vc{i}]\n"
            '  quotas: [{gpuProduct: "*", nominal: 8}]\n'
            for i in (1, 2)
        )
    )
    members = fleet_members(hgx_fleet(m=2))
    jobs = read_trace(trace, queue_column="tenant", queue_prefix="vc")
    qs = load_queues(queues)
    none = simulate(members, jobs, queues=qs, quota_mode="none").as_json()
    enforce = simulate(members, jobs, queues=qs, quota_mode="enforce").as_json()
    assert none["quota_exceeded"] > 0
    assert enforce["quota_exceeded"] == 0
    assert enforce["placed"] == 3
    assert enforce["queues"]["vc2"]["wait_mean_s"] == 0.0
    assert none["queues"]["vc2"]["wait_mean_s"] > 0
    assert enforce["share_attainment_min"] > none["share_attainment_min"]
    assert enforce["queues"]["vc1"] == {
        "jobs": 2,
        "wait_mean_s": 1800.0,
        "gpu_hours": 16.0,
        "nominal_gpus": 8,
    }
