"""Pure parts of ``gpufed bench scale``: the simulated members' nodes, what a simulated agent
reads from a work item, its node bookkeeping and churn, percentiles and the result line."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from pydantic import ValidationError

from gpufed.api.labels import SIM_DURATION_ANNOTATION
from gpufed.api.protocol import agent_pb2 as pb
from gpufed.api.protocol.codec import node_from_pb
from gpufed.sandbox.e2e_harness import percentile_ms
from gpufed.sandbox.scale_bench import ScaleOptions, assign, gpujob, member_names
from gpufed.sandbox.scale_clock import (
    Clock,
    etcd_db_bytes,
    schedstat_wait_s,
    summarize,
    trace_lines,
)
from gpufed.sandbox.simagent import (
    CHURN_POD_LIFETIME_S,
    DEFAULT_DURATION_S,
    Churn,
    SimAgent,
    job_pods,
    parse_duration,
    sim_cluster,
    sim_nodes,
)


def test_a_member_mixes_hgx_nodes_and_whole_nvl72_domains() -> None:
    spec = sim_cluster("sim-000", 5000)
    pools = {p.name: p for p in spec.node_pools}
    assert (pools["hgx"].nodes, pools["nvl72"].nodes) == (3758, 1242)
    assert pools["nvl72"].nodes % 18 == 0


def test_a_small_member_is_hgx_only() -> None:
    assert [p.name for p in sim_cluster("sim-000", 20).node_pools] == ["hgx"]


def test_no_member_without_nodes() -> None:
    with pytest.raises(ValueError, match="nodes_per_member"):
        sim_cluster("sim-000", 0)


def test_sim_nodes_decode_as_the_hub_checks_them() -> None:
    nodes = [node_from_pb(n) for n in sim_nodes("sim-000", 100)]
    assert len(nodes) == 100
    nvl = [n for n in nodes if n.gpu_product == "NVIDIA-GB200"]
    assert len(nvl) == 18
    assert len({n.nvlink_domain for n in nvl}) == 1
    assert all(n.whole_gpus_free == 8 for n in nodes if n not in nvl)


def _job(parallelism: int, affinity: dict[str, Any] | None, duration: str | None) -> dict[str, Any]:
    ann = {SIM_DURATION_ANNOTATION: duration} if duration else {}
    pod: dict[str, Any] = {
        "containers": [{"name": "m", "resources": {"limits": {"nvidia.com/gpu": 4}}}]
    }
    if affinity:
        pod["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [affinity]}
            }
        }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "train"},
        "spec": {
            "parallelism": parallelism,
            "template": {"metadata": {"annotations": ann}, "spec": pod},
        },
    }


def test_one_pinned_pod_by_metadata_name() -> None:
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}
    name, pods, duration = job_pods([{"kind": "ConfigMap"}, _job(1, term, "3s")])
    assert (name, duration) == ("train", 3.0)
    assert pods == [("n1", {"nvidia.com/gpu": 4, "pods": 1})]


def test_pods_spread_over_pinned_hostnames() -> None:
    term = {
        "matchExpressions": [
            {"key": "kubernetes.io/hostname", "operator": "In", "values": ["a", "b"]}
        ]
    }
    _, pods, duration = job_pods([_job(3, term, None)])
    assert [n for n, _ in pods] == ["a", "b", "a"]
    assert duration == DEFAULT_DURATION_S


def test_an_unpinned_pod_has_no_node() -> None:
    _, pods, _ = job_pods([_job(1, None, None)])
    assert pods[0][0] == ""


@pytest.mark.parametrize(
    ("text", "seconds"), [("5s", 5.0), ("2.5", 2.5), ("1m", 60.0), ("x", DEFAULT_DURATION_S)]
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


def _agent(nodes: int = 4) -> SimAgent:
    return SimAgent(
        "sim-000", "t", "127.0.0.1:1", b"", sim_nodes("sim-000", nodes), lambda _e: None
    )


def test_bind_then_release_leaves_the_node_idle() -> None:
    agent = _agent()
    node = agent.node_names[0]
    agent.bind(node, {"nvidia.com/gpu": 3, "pods": 1}, "uid-1")
    n = agent.nodes[node]
    assert (n.requested["nvidia.com/gpu"], dict(n.job_requests["uid-1"].amounts)) == (
        3,
        {"nvidia.com/gpu": 3, "pods": 1},
    )
    agent.release(node, {"nvidia.com/gpu": 3, "pods": 1}, "uid-1")
    assert (dict(n.requested), len(n.job_requests), agent.free_gpus(node)) == ({}, 0, 8)


@pytest.mark.parametrize("bound_before", [False, True])
def test_the_first_snapshot_is_what_the_nodes_are_when_it_is_sent(bound_before: bool) -> None:
    """The packed snapshot made when the agent is built goes out only while no pod changed a
    node; decoded as the hub decodes it, the snapshot is the agent's nodes at sending time."""
    from gpufed.api.protocol.packed import ShapeTable
    from gpufed.hub.adapters.sessions import AgentSession

    agent = _agent(nodes=40)
    node = agent.node_names[3]
    if bound_before:
        agent.bind(node, {"nvidia.com/gpu": 5, "pods": 1}, "uid-1")
    agent._shapes = ShapeTable()  # what the Welcome of a version-2 hub sets
    agent._snapshot()
    session = AgentSession(cluster="sim-000", protocol_version=2)
    done = None
    while not agent._out.empty():
        msg, _ = agent._out.get_nowait()
        done = session.receive(pb.AgentMessage.FromString(msg.SerializeToString()))
    assert done is not None
    want = {n.name: node_from_pb(n) for n in agent.nodes.values()}
    assert {n.name: n for n in done.nodes} == want
    assert want[node].requested.get("nvidia.com/gpu", 0) == (5 if bound_before else 0)
    # a later delta on the same stream decodes against the shapes the snapshot sent
    agent.bind(agent.node_names[0], {"nvidia.com/gpu": 1}, None)
    for body in agent._bodies([agent.nodes[agent.node_names[0]]], "upserts"):
        delta = session.receive(
            pb.AgentMessage(inventory_delta=pb.InventoryDelta(seq=agent.seq + 1, **body))
        )
    assert delta is not None
    assert [n.requested["nvidia.com/gpu"] for n in delta.upserts] == [1]


def test_a_work_item_is_acked_at_once_and_held() -> None:
    async def go() -> None:
        agent = _agent()
        term = {"matchFields": [{"key": "metadata.name", "values": [agent.node_names[1]]}]}
        item = pb.WorkItem(
            job_uid="u",
            job="ns/j",
            revision=2,
            op=pb.WorkItem.APPLY,
            manifests=[json.dumps(_job(1, term, "0s")).encode()],
        )
        agent._work(item)
        msg, event = agent._out.get_nowait()
        assert (msg.WhichOneof("body"), msg.work_ack.result, event and event["job"]) == (
            "work_ack",
            pb.WorkAck.APPLIED,
            "ns/j",
        )
        for t in list(agent._tasks):
            t.cancel()

    asyncio.run(go())


def test_churn_starts_pods_at_its_rate_and_ends_them_later() -> None:
    agent = _agent(10)
    agent.welcomed.set()
    churn = Churn([agent], per_s=20, seed=1)
    carry = churn.tick(now=0.0, dt=0.25, carry=0.0)
    assert (churn.started, carry) == (5, 0.0)
    assert sum(agent.nodes[n].requested.get("nvidia.com/gpu", 0) for n in agent.node_names) == 5
    churn.tick(now=CHURN_POD_LIFETIME_S, dt=0.0, carry=0.0)
    assert sum(agent.nodes[n].requested.get("nvidia.com/gpu", 0) for n in agent.node_names) == 0


def test_churn_waits_for_welcomed_agents() -> None:
    churn = Churn([_agent()], per_s=100, seed=1)
    churn.tick(now=0.0, dt=1.0, carry=0.0)
    assert churn.started == 0


def test_percentile_is_nearest_rank_in_ms() -> None:
    xs = [i / 1000 for i in range(1, 101)]
    assert (percentile_ms(xs, 0.5), percentile_ms(xs, 0.99), percentile_ms([], 0.5)) == (
        50.0,
        99.0,
        None,
    )


def test_assign_round_robin_without_empty_workers() -> None:
    names = member_names(5)
    assert assign(names, 2) == [
        [(0, "sim-000"), (2, "sim-002"), (4, "sim-004")],
        [(1, "sim-001"), (3, "sim-003")],
    ]
    assert len(assign(names[:1], 4)) == 1


def test_etcd_db_size_from_metrics_text() -> None:
    text = "# HELP x\netcd_mvcc_db_total_size_in_bytes 2.097152e+06\nother 1\n"
    assert (etcd_db_bytes(text), etcd_db_bytes("nothing 1")) == (2097152, None)


def test_gpujob_names_its_gpus_and_duration() -> None:
    obj = gpujob("job-00001", 4, 2.0)
    pod = obj["spec"]["template"]["spec"]["template"]
    assert pod["metadata"]["annotations"][SIM_DURATION_ANNOTATION] == "2s"
    assert pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 4


def test_result_line_shape() -> None:
    clock = Clock(
        first={"m": 1.0},
        registered={"m": 1.5},
        created={"ns/a": 10.0},
        acked={"ns/a": 10.2},
        reported={"ns/a": 15.0},
        succeeded={"ns/a": 15.1},
        placement_ms={"ns/a": 30.0},
    )
    out = summarize(clock, ScaleOptions(members=1, nodes_per_member=10, jobs=1), {"hub_rss_mib": 5})
    assert json.loads(json.dumps(out)) == out
    assert {k: out[k] for k in ("registration_p99_ms", "dispatch_p99_ms", "placement_p99_ms")} == {
        "registration_p99_ms": 500.0,
        "dispatch_p99_ms": 200.0,
        "placement_p99_ms": 30.0,
    }
    assert {
        "status_p99_ms",
        "hub_rss_mib",
        "members",
        "nodes_per_member",
        "jobs",
        "dispatched",
        "completed",
    } <= set(out)


def test_decoded_nodes_share_their_repeated_strings() -> None:
    """node_from_pb interns label keys and values (memory of a hub holding 500,000 nodes)."""
    a, b = (node_from_pb(n) for n in sim_nodes("sim-000", 2))
    key_a = next(k for k in a.labels if k == "nvidia.com/gpu.product")
    key_b = next(k for k in b.labels if k == "nvidia.com/gpu.product")
    assert key_a is key_b
    assert a.labels[key_a] is b.labels[key_b]


def test_schedstat_wait_sums_the_threads_waiting_time() -> None:
    texts = ["100 2000000000 5\n", "7 500000000 1", "garbage", ""]
    assert schedstat_wait_s(texts) == 2.5


def test_trace_lines_give_each_stage_on_the_wall_clock() -> None:
    c = Clock()
    c.created = {"scale/job-00000": 10.0, "scale/job-00001": 11.0}
    c.placed = {"scale/job-00000": 10.5}
    c.acked = {"scale/job-00000": 10.25}
    c.reported = {"scale/job-00000": 15.0}
    c.succeeded = {"scale/job-00000": 16.0}
    lines = [json.loads(line) for line in trace_lines(c, 1000.0)]
    assert lines == [
        {
            "job": "scale/job-00000",
            "created": 1010.0,
            "placed": 1010.5,
            "acked": 1010.25,
            "reported": 1015.0,
            "succeeded": 1016.0,
        },
        {"job": "scale/job-00001", "created": 1011.0},
    ]


@pytest.mark.parametrize("field", ["duration_s", "churn", "rate", "join_rate", "ready_timeout_s"])
def test_infinite_options_are_refused(field: str) -> None:
    # --duration inf never ended (jobs ran forever, the wait had no bound); --churn inf
    # overflowed the churn clock in every worker.
    with pytest.raises(ValidationError, match=field):
        ScaleOptions(members=1, nodes_per_member=1, **{field: float("inf")})


def test_the_hubs_own_figures_come_from_its_cpu_and_metrics() -> None:
    """CPU per 1,000 nodes and per job by division (worked here by hand), the loop stall, missed
    renewals and drift summed over the label sets of the hub's /metrics text."""
    from gpufed.sandbox.scale_clock import hub_figures

    text = "\n".join(
        [
            "# HELP gpufed_hub_event_loop_stall_max_seconds x",
            "gpufed_hub_event_loop_stall_max_seconds 0.125",
            "gpufed_hub_event_loop_stall_cpu_max_seconds 0.05",
            "gpufed_hub_event_loop_stall_seconds_count 4.0",
            "gpufed_hub_lease_renewals_missed_total 0.0",
            'gpufed_hub_incremental_drift_total{kind="member_gpus"} 0.0',
            'gpufed_hub_incremental_drift_total{kind="queue_usage"} 2.0',
        ]
    )
    got = hub_figures(text, ingest_cpu_s=30.0, nodes=20_000, jobs_cpu_s=4.0, jobs=200)
    assert got == {
        "hub_cpu_s_per_1000_nodes": 1.5,
        "hub_cpu_ms_per_job": 20.0,
        "loop_stall_max_ms": 125.0,
        "loop_stall_cpu_max_ms": 50.0,
        "lease_renewals_missed": 0.0,
        "incremental_drift": 2.0,
    }
    old = hub_figures(None, ingest_cpu_s=1.0, nodes=0, jobs_cpu_s=0.0, jobs=0)
    assert old["loop_stall_max_ms"] is None
    assert old["hub_cpu_s_per_1000_nodes"] is None
