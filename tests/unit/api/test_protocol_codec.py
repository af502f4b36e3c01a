"""Round trips and refusals of the protocol codec (gpufed.api.protocol.codec)."""

from __future__ import annotations

import pytest

from gpufed.api.inventory import NodeInventory, Taint
from gpufed.api.protocol import agent_pb2 as pb
from gpufed.api.protocol.codec import (
    ProtocolError,
    node_from_pb,
    node_to_pb,
    work_ack_from_pb,
    work_item_from_pb,
    work_item_to_pb,
    workload_status_from_pb,
    workload_status_to_pb,
)
from gpufed.api.work import Condition, FailureCause, PodIssue, WorkItem, WorkloadStatus


def test_node_round_trip_keeps_every_field() -> None:
    node = NodeInventory(
        name="gb200-07",
        labels={"nvidia.com/gpu.clique": "abc.1"},
        gpu_product="NVIDIA-GB200",
        mig_strategy="mixed",
        nvlink_domain="clique:abc.1",
        rack="r1",
        ready=True,
        unschedulable=True,
        taints=(Taint(key="dedicated", value="x", effect="NoSchedule"),),
        allocatable={"nvidia.com/gpu": 4, "cpu": 72000},
        requested={"nvidia.com/gpu": 2},
        job_requests={"uid-1": {"nvidia.com/gpu": 2}},
        degraded=None,
    )
    assert node_from_pb(pb.Node.FromString(node_to_pb(node).SerializeToString())) == node


def test_bad_node_is_refused_with_its_name() -> None:
    with pytest.raises(ProtocolError, match=r"'n1'.*mig_strategy"):
        node_from_pb(pb.Node(name="n1", mig_strategy="bogus"))


def test_work_item_round_trip_and_bad_json() -> None:
    item = WorkItem(
        job_uid="u1",
        job="team-a/llama",
        revision=7,
        op="Apply",
        namespace="team-a",
        manifests=({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "llama"}},),
        pod_security="restricted",
    )
    assert work_item_from_pb(work_item_to_pb(item)) == item
    with pytest.raises(ProtocolError, match="pod_security"):
        work_item_from_pb(
            pb.WorkItem(job_uid="u", op=pb.WorkItem.APPLY, revision=1, pod_security="lax")
        )
    broken = work_item_to_pb(item)
    broken.manifests[0] = b"{not json"
    with pytest.raises(ProtocolError, match="not JSON"):
        work_item_from_pb(broken)
    with pytest.raises(ProtocolError, match="revision"):
        work_item_from_pb(pb.WorkItem(job_uid="u", op=pb.WorkItem.APPLY, revision=0))


def test_status_round_trip_keeps_condition_order() -> None:
    status = WorkloadStatus(
        job_uid="u1",
        revision=3,
        kind="Job.batch",
        name="llama",
        phase="Failed",
        conditions=(
            Condition(type="FailureTarget", status="True", reason="BackoffLimitExceeded"),
            Condition(type="Failed", status="True", reason="BackoffLimitExceeded"),
        ),
        failed=2,
        pod_issues=(PodIssue(pod="p", reason="Error", message="exit code 1"),),
        last_checkpoint_time="2026-01-01T00:00:00Z",
    )
    assert workload_status_from_pb(workload_status_to_pb(status)) == status
    broken = status.model_copy(
        update={
            "failure": FailureCause(
                kind="Infrastructure", reason="NodeLost", nodes=("n1",), exit_codes=(134,)
            )
        }
    )
    assert workload_status_from_pb(workload_status_to_pb(broken)) == broken
    with pytest.raises(ProtocolError, match="kind: Input should be 'Infrastructure'"):
        workload_status_from_pb(
            pb.WorkloadStatus(
                job_uid="u", phase="Failed", failure=pb.FailureCause(kind="Cosmic", reason="x")
            )
        )
    with pytest.raises(ProtocolError, match="phase"):
        workload_status_from_pb(pb.WorkloadStatus(job_uid="u", phase="Exploded"))


def test_ack_with_unknown_result_is_refused() -> None:
    with pytest.raises(ProtocolError, match="result"):
        work_ack_from_pb(pb.WorkAck(job_uid="u", revision=1))


def _dra_node(**group: object) -> NodeInventory:
    from gpufed.api.inventory import DeviceGroup

    g = {
        "count": 4,
        "allocated": 1,
        "attributes": {"type": "gpu", "productName": "NVIDIA GB200", "index": 3, "ok": True},
        "versions": {"driverVersion": "580.82.7"},
        "capacity": {"memory": 189471 * 2**20},
        **group,
    }
    return NodeInventory(
        name="gb200-08",
        nvlink_domain="node:gb200-08",
        allocatable={"nvidia.com/gpu": 4},
        dra_gpus=(DeviceGroup.model_validate(g),),
    )


def test_dra_groups_keep_their_attribute_types_through_the_protocol() -> None:
    node = _dra_node()
    back = node_from_pb(pb.Node.FromString(node_to_pb(node).SerializeToString()))
    assert back == node
    attrs = back.dra_gpus[0].attributes
    assert (type(attrs["index"]), type(attrs["ok"]), type(attrs["type"])) == (int, bool, str)
    assert back.dra_gpus[0].versions == {"driverVersion": "580.82.7"}


def test_dra_groups_past_the_reporting_limits_are_refused_naming_the_field() -> None:
    many = node_to_pb(_dra_node())
    for _ in range(16):
        many.dra_gpus.add(count=1)
    with pytest.raises(ProtocolError, match=r"'gb200-08'.*dra_gpus: 17 groups"):
        node_from_pb(many)
    long = node_to_pb(_dra_node(attributes={"productName": "x" * 65}))
    with pytest.raises(ProtocolError, match=r"dra_gpus\[0\].attributes\[productName\]"):
        node_from_pb(long)
    bad = node_to_pb(_dra_node(capacity={"bad key!": 1}))
    with pytest.raises(ProtocolError, match=r"dra_gpus\[0\].capacity"):
        node_from_pb(bad)
