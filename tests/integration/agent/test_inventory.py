"""The agent's inventory against a real member API server, as the hub receives it over gRPC:
it matches the fleet, follows pods starting and finishing, and follows node changes (cordon,
taint, NotReady, a GPU lost from allocatable, a Terminating pod, an odd node)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from gpufed.agent.agent import read_inventory
from gpufed.agent.kube import MemberApi
from gpufed.api.fleet import FleetSpec, NodeSpec
from gpufed.api.inventory import NodeInventory, summarize
from gpufed.api.resources import to_canonical
from gpufed.sandbox.runtime import SandboxInfo

from .conftest import Member, Rig, sandbox_member, start_rig, stop_rig

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

GPU = "nvidia.com/gpu"
TEST_NODE_PREFIX = "agent-it-"


# --- helpers -------------------------------------------------------------------------------------


async def ensure_namespace(admin: MemberApi, name: str) -> None:
    try:
        await admin.request(
            "POST",
            "/api/v1/namespaces",
            body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}},
        )
    except Exception as exc:
        if getattr(exc, "status", None) != 409:
            raise


async def create_pod(
    admin: MemberApi,
    namespace: str,
    name: str,
    *,
    node: str,
    gpus: int,
    duration: str | None = None,
    finalizer: bool = False,
    bind: bool = False,
) -> None:
    """A GPU pod for ``node``: scheduled there by kube-scheduler (hostname selector) or, with
    ``bind``, bound directly through ``spec.nodeName``."""
    annotations = {"gpufed.io/sim-duration": duration} if duration else {}
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "containers": [{"name": "c", "image": "trainer:1", "resources": {"limits": {GPU: gpus}}}],
        "tolerations": [{"operator": "Exists"}],
    }
    if bind:
        spec["nodeName"] = node
    else:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "annotations": annotations}
    if finalizer:
        meta["finalizers"] = ["gpufed.io/test-hold"]
    await admin.request(
        "POST",
        f"/api/v1/namespaces/{namespace}/pods",
        body={"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec},
    )


async def patch(admin: MemberApi, path: str, body: dict[str, Any]) -> None:
    await admin.request("PATCH", path, body=body, content_type="application/merge-patch+json")


def gpu_nodes(rig: Rig) -> list[str]:
    """Fleet nodes with whole GPUs and no taints (where test pods can go)."""
    return sorted(
        n.name
        for n in rig.view.nodes.values()
        if n.allocatable.get(GPU) and not n.taints and not n.name.startswith(TEST_NODE_PREFIX)
    )


def requested_gpus(rig: Rig, node: str) -> int:
    n = rig.view.nodes.get(node)
    return n.requested.get(GPU, 0) if n else -1


@pytest_asyncio.fixture(loop_scope="module")
async def own_node(rig: Rig) -> AsyncIterator[str]:
    """A kwok GPU node of this test's own (deleted after), for changes the fleet must not see."""
    name = f"{TEST_NODE_PREFIX}{uuid.uuid4().hex[:6]}"
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {"kwok.x-k8s.io/node": "fake"},
            "labels": {
                "kubernetes.io/hostname": name,
                "type": "kwok",
                "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                "nvidia.com/gpu.count": "8",
            },
        },
        "status": {
            "capacity": {"cpu": "224", "memory": "2Ti", "pods": "110", GPU: "8"},
            "allocatable": {"cpu": "220", "memory": "1900Gi", "pods": "110", GPU: "8"},
        },
    }
    await rig.admin.request("POST", "/api/v1/nodes", body=node)
    await rig.hub.wait_for(
        lambda: (n := rig.view.nodes.get(name)) is not None and n.ready, what=f"{name} Ready"
    )
    yield name
    await rig.admin.request("DELETE", f"/api/v1/nodes/{name}")
    await rig.hub.wait_for(lambda: name not in rig.view.nodes, what=f"{name} removed")


# --- tests ---------------------------------------------------------------------------------------


async def test_snapshot_matches_the_fleet(rig: Rig, member: Member) -> None:
    fleet = {n: v for n, v in rig.view.nodes.items() if not n.startswith(TEST_NODE_PREFIX)}
    assert sorted(fleet) == sorted(spec.name for spec in member.fleet_nodes)
    for spec in member.fleet_nodes:
        assert_node_matches(fleet[spec.name], spec)
    assert "Job.batch" in rig.view.served_kinds
    summary = summarize(fleet.values())
    # The tainted A100 node counts (taints are judged per job); its MIG GPUs do not.
    assert summary.gpus_total == {"NVIDIA-H100-80GB-HBM3": 16, "NVIDIA-A100-SXM4-80GB": 6}
    assert summary.largest_free_nvlink_block == 8


async def test_nvlink_cliques_of_another_member_match_its_fleet(
    sandbox: SandboxInfo, small_fleet: FleetSpec
) -> None:
    beta = sandbox_member(sandbox, small_fleet, "beta")
    async with await MemberApi.connect(kubeconfig=str(beta.kubeconfig)) as api:
        nodes = {n.name: n for n in await read_inventory(api)}
    assert sorted(nodes) == sorted(s.name for s in beta.fleet_nodes)
    for spec in beta.fleet_nodes:
        assert_node_matches(nodes[spec.name], spec)
    domains = {n.nvlink_domain for n in nodes.values()}
    assert len(domains) == 2
    assert all(d.startswith("clique:") for d in domains)
    assert summarize(nodes.values()).largest_free_nvlink_block == 8


def assert_node_matches(inv: NodeInventory, spec: NodeSpec) -> None:
    assert inv.degraded is None
    assert inv.ready
    assert not inv.unschedulable
    assert inv.gpu_product == spec.labels["nvidia.com/gpu.product"]
    assert inv.allocatable == {r: to_canonical(r, q) for r, q in spec.allocatable.items()}
    assert inv.mig_strategy == spec.labels.get("nvidia.com/mig.strategy", "none")
    assert inv.taints == spec.taints
    clique = spec.labels.get("nvidia.com/gpu.clique")
    assert inv.nvlink_domain == (f"clique:{clique}" if clique else f"node:{spec.name}")
    assert inv.rack == spec.labels.get("cloud.provider.com/topology-rack")


async def test_inventory_follows_a_pod_starting_and_finishing(rig: Rig, namespace: str) -> None:
    node = gpu_nodes(rig)[0]
    before = requested_gpus(rig, node)
    await ensure_namespace(rig.admin, namespace)
    await create_pod(rig.admin, namespace, "short", node=node, gpus=2, duration="2s")
    await rig.hub.wait_for(lambda: requested_gpus(rig, node) == before + 2, what="pod bound")
    await rig.hub.wait_for(
        lambda: requested_gpus(rig, node) == before, what="pod finished", within=60
    )
    assert rig.view.seq_errors == 0


async def test_terminating_pod_still_holds_its_gpus(rig: Rig, namespace: str) -> None:
    node = gpu_nodes(rig)[0]
    before = requested_gpus(rig, node)
    await ensure_namespace(rig.admin, namespace)
    await create_pod(rig.admin, namespace, "held", node=node, gpus=3, finalizer=True, bind=True)
    await rig.hub.wait_for(lambda: requested_gpus(rig, node) == before + 3, what="pod bound")
    path = f"/api/v1/namespaces/{namespace}/pods/held"
    await rig.admin.request("DELETE", path)
    pod = await rig.admin.request("GET", path)
    assert pod["metadata"]["deletionTimestamp"]
    await asyncio.sleep(1.0)  # several coalescing windows: the delete must not release the GPUs
    assert requested_gpus(rig, node) == before + 3
    await patch(rig.admin, path, {"metadata": {"finalizers": None}})
    await rig.hub.wait_for(lambda: requested_gpus(rig, node) == before, what="pod gone")


async def test_cordon_and_taint_are_reported(rig: Rig, own_node: str) -> None:
    path = f"/api/v1/nodes/{own_node}"
    await patch(rig.admin, path, {"spec": {"unschedulable": True}})
    await rig.hub.wait_for(lambda: rig.view.nodes[own_node].unschedulable, what="cordoned")
    taint = {"key": "gpu-health", "value": "xid-79", "effect": "NoSchedule"}
    await patch(rig.admin, path, {"spec": {"unschedulable": False, "taints": [taint]}})
    node = await rig.hub.wait_for(
        lambda: (n := rig.view.nodes[own_node]).taints and not n.unschedulable and n,
        what="tainted",
    )
    assert [(t.key, t.value, t.effect) for t in node.taints] == [
        ("gpu-health", "xid-79", "NoSchedule")
    ]


async def test_gpu_lost_from_allocatable_is_reported(
    rig: Rig, own_node: str, namespace: str
) -> None:
    await ensure_namespace(rig.admin, namespace)
    await create_pod(rig.admin, namespace, "all-eight", node=own_node, gpus=8, bind=True)
    await rig.hub.wait_for(lambda: requested_gpus(rig, own_node) == 8, what="8 GPUs requested")
    status = (await rig.admin.request("GET", f"/api/v1/nodes/{own_node}"))["status"]
    await patch(
        rig.admin,
        f"/api/v1/nodes/{own_node}/status",
        {
            "status": {
                "allocatable": {**status["allocatable"], GPU: "7"},
                "capacity": {**status["capacity"], GPU: "7"},
            }
        },
    )
    node = await rig.hub.wait_for(
        lambda: (n := rig.view.nodes[own_node]).allocatable.get(GPU) == 7 and n,
        what="7 allocatable",
    )
    assert node.free(GPU) == 0  # 8 requested on 7: never negative


async def test_odd_node_degrades_only_itself(rig: Rig, own_node: str) -> None:
    await patch(
        rig.admin,
        f"/api/v1/nodes/{own_node}",
        {"metadata": {"labels": {"nvidia.com/mig.strategy": "sometimes"}}},
    )
    node = await rig.hub.wait_for(
        lambda: (n := rig.view.nodes[own_node]).degraded and n, what="degraded"
    )
    assert "nvidia.com/mig.strategy" in (node.degraded or "")
    assert all(n.degraded is None for name, n in rig.view.nodes.items() if name != own_node)


async def test_not_ready_node_is_reported(member: Member, own_node: str, tmp_path: Any) -> None:
    """kwok turns a node Ready again at once, so this uses an agent that sends every change
    (coalesce 0) and looks for the NotReady version among the deltas the hub received.

    The flip back can land in the same watch read as the flip (on a loaded machine, many times
    running), so the node is flipped again until the hub saw it NotReady, within a generous
    deadline; the normal case sees it on the first flip."""
    quick = await start_rig(member, tmp_path, cluster=f"{member.name}-quick", coalesce_ms=0)
    try:
        path = f"/api/v1/nodes/{own_node}/status"

        def versions_since(start: int) -> list[bool]:
            return [n.ready for n in list(quick.view.history)[start:] if n.name == own_node]

        deadline = time.monotonic() + 90.0
        while (left := deadline - time.monotonic()) > 0:
            status = (await quick.admin.request("GET", f"/api/v1/nodes/{own_node}"))["status"]
            conditions = [
                {**c, "status": "False", "reason": "KubeletNotReady", "message": "test"}
                if c["type"] == "Ready"
                else c
                for c in status["conditions"]
            ]
            start = len(quick.view.history)
            await quick.admin.request(
                "PATCH",
                path,
                body={"status": {"conditions": conditions}},
                content_type="application/strategic-merge-patch+json",
            )
            await quick.hub.wait_for(
                lambda start=start: any(versions_since(start)), what="Ready again", within=left
            )
            if False in versions_since(start):
                break
        else:
            pytest.fail("the hub never received the node as NotReady within 90 s of flips")
    finally:
        await stop_rig(quick)
