"""Kubernetes quantity semantics carried through to placement (pod spec -> request -> node).

Nodes are built from Kubernetes ``status.allocatable`` strings with
:func:`gpufed.api.resources.resource_list`; pod sets from pod specs with
:func:`gpufed.api.resources.pod_requests`. Placement then sees only canonical integers.
"""

from __future__ import annotations

from typing import Any

import pytest
from placement_builders import member

from gpufed.api.decision import Outcome
from gpufed.api.inventory import NodeInventory
from gpufed.api.request import PlacementRequest, PodSet
from gpufed.api.resources import QuantityError, pod_requests, resource_list
from gpufed.placement import FleetSnapshot, Policy, place


def k8s_node(name: str, allocatable: dict[str, Any], requested: dict[str, Any]) -> NodeInventory:
    return NodeInventory(
        name=name,
        gpu_product="NVIDIA-H100-80GB-HBM3",
        nvlink_domain=f"node:{name}",
        allocatable=resource_list(allocatable, field="status.allocatable"),
        requested=resource_list(requested, field="requested"),
    )


def request_for(pod_spec: dict[str, Any], count: int = 1) -> PlacementRequest:
    return PlacementRequest(
        job="ns/q",
        uid="uid-q",
        pod_sets=(PodSet(count=count, requests=pod_requests(pod_spec)),),
    )


def fits(node: NodeInventory, pod_spec: dict[str, Any]) -> bool:
    snapshot = FleetSnapshot([member("m", [node])])
    return place(request_for(pod_spec), snapshot, Policy(), 0).outcome == Outcome.PLACED


def gpu_pod(gpus: Any, **res: Any) -> dict[str, Any]:
    return {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": gpus, **res}}}]}


def test_string_and_integer_gpu_quantities_are_the_same_request() -> None:
    node = k8s_node("n", {"nvidia.com/gpu": "8"}, {})
    snapshot = FleetSnapshot([member("m", [node])])
    a = place(request_for(gpu_pod("8")), snapshot, Policy(), 0)
    b = place(request_for(gpu_pod(8)), snapshot, Policy(), 0)
    assert a.placed
    assert a.model_dump() == b.model_dump()


@pytest.mark.parametrize(
    ("node_requested_cpu", "expected"),
    [("80m", True), ("81m", False)],
)
def test_millicore_cpu_decides_fit(node_requested_cpu: str, expected: bool) -> None:
    node = k8s_node("n", {"nvidia.com/gpu": 8, "cpu": "4"}, {"cpu": node_requested_cpu})
    assert fits(node, gpu_pod(1, cpu="3920m")) is expected


@pytest.mark.parametrize(
    ("pod_memory", "expected"),
    [
        ("937500k", True),  # exactly the node's 937,500,000 bytes
        ("915527Ki", True),  # 937,499,648 bytes
        ("915528Ki", False),  # 937,500,672 bytes: 672 bytes too many
    ],
)
def test_decimal_and_binary_memory_suffixes_compare_in_bytes(
    pod_memory: str, expected: bool
) -> None:
    node = k8s_node("n", {"nvidia.com/gpu": 8, "memory": "937500k"}, {})
    assert fits(node, gpu_pod(1, memory=pod_memory)) is expected


def test_limits_only_container_requests_its_limits() -> None:
    node = k8s_node("n", {"nvidia.com/gpu": 8, "cpu": "2"}, {})
    assert not fits(node, gpu_pod(1, cpu="3"))
    assert fits(node, gpu_pod(1, cpu="2"))


def test_init_containers_count_as_their_max_not_their_sum() -> None:
    node = k8s_node("n", {"nvidia.com/gpu": 8, "cpu": "4"}, {})
    spec = {
        "initContainers": [
            {"name": "a", "resources": {"requests": {"cpu": "3"}}},
            {"name": "b", "resources": {"requests": {"cpu": "3"}}},
        ],
        "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": 1, "cpu": "1"}}}],
    }
    assert pod_requests(spec)["cpu"] == 3000
    assert fits(node, spec)


def test_pod_overhead_is_added() -> None:
    node = k8s_node("n", {"nvidia.com/gpu": 8, "cpu": "2"}, {})
    spec = gpu_pod(1, cpu="2")
    assert fits(node, spec)
    assert not fits(node, {**spec, "overhead": {"cpu": "100m"}})


def test_fractional_gpu_is_rejected_naming_the_field() -> None:
    with pytest.raises(
        QuantityError, match=r"containers\[0\]\.resources\.limits\.nvidia\.com/gpu.*fractional"
    ):
        request_for(gpu_pod("0.5"))
