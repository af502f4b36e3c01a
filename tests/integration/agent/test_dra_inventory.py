"""GPUs published through DRA, read by a running agent from a real kube-apiserver (1.36,
``resource.k8s.io/v1``) and as the hub receives them over gRPC: real ResourceSlices of
``gpu.nvidia.com`` (the newest pool generation counts), a real ResourceClaim whose allocation
holds two devices for a pod of a job, and the one-shot ``read_inventory``."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from gpufed.agent.agent import read_inventory
from gpufed.api.inventory import summarize
from tests.unit.agent.dra_objects import gpu_slice

from .conftest import Rig
from .test_inventory import ensure_namespace

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

GPU = "nvidia.com/gpu"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"


@pytest_asyncio.fixture(loop_scope="module")
async def dra_node(rig: Rig) -> AsyncIterator[str]:
    """A kwok node whose GPUs only DRA publishes (no nvidia.com/gpu, no GFD labels); its
    ResourceSlices are deleted with it."""
    name = f"dra-it-{uuid.uuid4().hex[:6]}"
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {"kwok.x-k8s.io/node": "fake"},
            "labels": {"kubernetes.io/hostname": name, "type": "kwok"},
        },
        "status": {
            "capacity": {"cpu": "144", "memory": "850Gi", "pods": "110"},
            "allocatable": {"cpu": "144", "memory": "850Gi", "pods": "110"},
        },
    }
    await rig.admin.request("POST", "/api/v1/nodes", body=node)
    await rig.hub.wait_for(
        lambda: (n := rig.view.nodes.get(name)) is not None and n.ready, what=f"{name} Ready"
    )
    yield name
    for gen in (1, 2):
        try:
            await rig.admin.request("DELETE", f"{SLICES}/{name}-gpu.nvidia.com-{gen}")
        except Exception as exc:
            if getattr(exc, "status", None) != 404:
                raise
    await rig.admin.request("DELETE", f"/api/v1/nodes/{name}")
    await rig.hub.wait_for(lambda: name not in rig.view.nodes, what=f"{name} removed")


def claim(name: str, node: str, devices: list[str], pod: dict[str, Any]) -> dict[str, Any]:
    """A claim allocated ``devices`` of ``node``'s pool, reserved for ``pod`` (the created
    object: kube-controller-manager drops a reservation whose pod UID does not match)."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpus",
                        "exactly": {
                            "deviceClassName": "gpu.nvidia.com",
                            "allocationMode": "ExactCount",
                            "count": len(devices),
                        },
                    }
                ]
            }
        },
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "gpus", "driver": "gpu.nvidia.com", "pool": node, "device": d}
                        for d in devices
                    ]
                }
            },
            "reservedFor": [
                {"resource": "pods", "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]}
            ],
        },
    }


async def test_dra_gpus_reach_the_hub_once_with_claims_and_jobs(
    rig: Rig, dra_node: str, namespace: str
) -> None:
    admin = rig.admin
    await admin.request("POST", SLICES, body=gpu_slice(dra_node, 8, "H100", generation=1))
    node = await rig.hub.wait_for(
        lambda: (n := rig.view.nodes[dra_node]).allocatable.get(GPU) == 8 and n,
        what="8 DRA GPUs",
    )
    assert node.gpu_product == "NVIDIA-H100-80GB-HBM3"
    assert node.gpus_via_dra
    assert node.dra_gpus[0].attributes["architecture"] == "Hopper"

    # The driver republishes the pool at generation 2 with 4 GPUs; generation 1 lingers.
    await admin.request("POST", SLICES, body=gpu_slice(dra_node, 4, "H100", generation=2))
    await rig.hub.wait_for(
        lambda: rig.view.nodes[dra_node].allocatable.get(GPU) == 4, what="newest generation"
    )

    # A pod of a job holds two GPUs through an allocated claim (status written as the
    # scheduler writes it).
    await ensure_namespace(admin, namespace)
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "worker-0", "labels": {"gpufed.io/job-uid": "job-dra-1"}},
        "spec": {
            "nodeName": dra_node,
            "tolerations": [{"operator": "Exists"}],
            "containers": [{"name": "c", "image": "trainer:1"}],
        },
    }
    pod = await admin.request("POST", f"/api/v1/namespaces/{namespace}/pods", body=pod)
    body = claim("worker-0-gpus", dra_node, ["gpu-0", "gpu-1"], pod)
    claims = f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims"
    created = await admin.request("POST", claims, body={**body, "status": None})
    # The API server takes reservedFor only once the claim is allocated: two writes.
    allocated = {**body, "metadata": created["metadata"]}
    allocated["status"] = {"allocation": body["status"]["allocation"]}
    allocated = await admin.request("PUT", f"{claims}/worker-0-gpus/status", body=allocated)
    await admin.request(
        "PUT",
        f"{claims}/worker-0-gpus/status",
        body={**allocated, "status": body["status"]},
    )
    node = await rig.hub.wait_for(
        lambda: (n := rig.view.nodes[dra_node]).requested.get(GPU) == 2 and n, what="2 held"
    )
    node = await rig.hub.wait_for(
        lambda: (
            (n := rig.view.nodes[dra_node]).job_requests.get("job-dra-1", {}).get(GPU) == 2 and n
        ),
        what="the claim's GPUs counted for the pod's job",
    )
    assert node.free(GPU) == 2

    # The one-shot read agrees, and the summary counts the node's GPUs once.
    one_shot = {n.name: n for n in await read_inventory(rig.agent.api)}
    assert one_shot[dra_node].allocatable[GPU] == 4
    assert one_shot[dra_node].requested[GPU] == 2
    summary = summarize([one_shot[dra_node]])
    assert summary.gpus_total == {"NVIDIA-H100-80GB-HBM3": 4}
    assert summary.gpus_free == {"NVIDIA-H100-80GB-HBM3": 2}

    await admin.request("DELETE", f"{claims}/worker-0-gpus")
    await rig.hub.wait_for(
        lambda: rig.view.nodes[dra_node].requested.get(GPU, 0) == 0, what="claim released"
    )


async def test_kube_scheduler_allocates_a_templated_claim_the_agent_counts(
    rig: Rig, dra_node: str, namespace: str
) -> None:
    """The member's own control plane does the DRA work: kube-controller-manager makes the
    pod's claim from the template, kube-scheduler allocates two of the node's published GPUs
    (the CEL selector evaluated by Kubernetes), and the agent reports them held by the job."""
    admin = rig.admin
    await admin.request("POST", SLICES, body=gpu_slice(dra_node, 4, "H100", generation=1))
    await rig.hub.wait_for(
        lambda: rig.view.nodes[dra_node].allocatable.get(GPU) == 4, what="4 DRA GPUs"
    )
    classes = "/apis/resource.k8s.io/v1/deviceclasses"
    device_class = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": "gpu.nvidia.com"},
        "spec": {
            "selectors": [
                {
                    "cel": {
                        "expression": "device.driver == 'gpu.nvidia.com' && "
                        "device.attributes['gpu.nvidia.com'].type == 'gpu'"
                    }
                }
            ]
        },
    }
    try:
        await admin.request("POST", classes, body=device_class)
    except Exception as exc:
        if getattr(exc, "status", None) != 409:
            raise
    try:
        await ensure_namespace(admin, namespace)
        template = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "h100x2"},
            "spec": {
                "spec": {
                    "devices": {
                        "requests": [
                            {
                                "name": "gpus",
                                "exactly": {
                                    "deviceClassName": "gpu.nvidia.com",
                                    "count": 2,
                                    "selectors": [
                                        {
                                            "cel": {
                                                "expression": "device.attributes['gpu.nvidia.com']"
                                                ".productName.startsWith('NVIDIA H100')"
                                            }
                                        }
                                    ],
                                },
                            }
                        ]
                    }
                }
            },
        }
        await admin.request(
            "POST",
            f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaimtemplates",
            body=template,
        )
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "claimer", "labels": {"gpufed.io/job-uid": "job-dra-2"}},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": dra_node},
                "tolerations": [{"operator": "Exists"}],
                "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": "h100x2"}],
                "containers": [
                    {"name": "c", "image": "trainer:1", "resources": {"claims": [{"name": "gpus"}]}}
                ],
            },
        }
        await admin.request("POST", f"/api/v1/namespaces/{namespace}/pods", body=pod)
        node = await rig.hub.wait_for(
            lambda: (
                (n := rig.view.nodes[dra_node]).job_requests.get("job-dra-2", {}).get(GPU) == 2
                and n
            ),
            what="the scheduler's allocation counted for the pod's job",
            within=60,
        )
        assert node.requested[GPU] == 2
        assert node.dra_gpus[0].allocated == 2
        await admin.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/claimer")
        await rig.hub.wait_for(
            lambda: rig.view.nodes[dra_node].requested.get(GPU, 0) == 0,
            what="the claim released with its pod",
            within=60,
        )
    finally:
        await admin.request("DELETE", f"{classes}/gpu.nvidia.com")
