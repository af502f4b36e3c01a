"""Shape-named builders for placement tests: members, nodes and jobs as people describe them.

``hgx_cluster("a", nodes=4)`` is a member with four idle 8-GPU HGX H100 nodes;
``hgx_cluster("a", free=[1, 1, 1, 1])`` the same with one GPU free on each node;
``nvl72_cluster("b", cliques=1)`` an idle GB200 NVL72 rack (18 trays x 4 GPUs in one clique).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpufed.api.inventory import (
    ClusterHealth,
    ClusterInventory,
    MemberClusterState,
    NodeInventory,
    Taint,
    Toleration,
)
from gpufed.api.request import LabelSelector, PlacementRequest, PodSet, TopologyRequest
from gpufed.placement import FleetSnapshot

H100 = "NVIDIA-H100-80GB-HBM3"
H200 = "NVIDIA-H200"
GB200 = "NVIDIA-GB200"
A100 = "NVIDIA-A100-SXM4-80GB"
GPU = "nvidia.com/gpu"
CPU_PER_GPU = 16_000  # millicores
MEM_PER_GPU = 128 * 2**30


def node(
    name: str,
    *,
    gpus: int = 8,
    free: int | None = None,
    product: str = H100,
    clique: str | None = None,
    rack: str | None = None,
    block: str | None = None,
    ready: bool = True,
    unschedulable: bool = False,
    taints: Sequence[Taint] = (),
    labels: dict[str, str] | None = None,
    extra_alloc: dict[str, int] | None = None,
    extra_req: dict[str, int] | None = None,
    mig_strategy: str = "none",
    job_requests: dict[str, dict[str, int]] | None = None,
    alloc_gpus: int | None = None,
) -> NodeInventory:
    """One GPU node with ``gpus`` GPUs of which ``free`` (default all) are free."""
    free = gpus if free is None else free
    used = gpus - free
    alloc = {
        GPU: gpus if alloc_gpus is None else alloc_gpus,
        "cpu": gpus * CPU_PER_GPU + 8000,
        "memory": gpus * MEM_PER_GPU + 64 * 2**30,
        "pods": 110,
    }
    alloc.update(extra_alloc or {})
    req = {GPU: used, "cpu": used * CPU_PER_GPU, "memory": used * MEM_PER_GPU}
    req.update(extra_req or {})
    node_labels = {"kubernetes.io/hostname": name, "nvidia.com/gpu.product": product}
    if clique:
        node_labels["nvidia.com/gpu.clique"] = clique
    node_labels.update(labels or {})
    return NodeInventory(
        name=name,
        labels=node_labels,
        gpu_product=product,
        mig_strategy=mig_strategy,  # type: ignore[arg-type]
        nvlink_domain=f"clique:{clique}" if clique else f"node:{name}",
        rack=rack,
        block=block,
        ready=ready,
        unschedulable=unschedulable,
        taints=tuple(taints),
        allocatable=alloc,
        requested=req,
        job_requests=job_requests or {},
    )


MIG_1G5 = "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"


def mig_single_node(name: str) -> NodeInventory:
    """An A100 40GB node under the MIG ``single`` strategy: 8 GPUs x 7 slices of 1g.5gb, all
    exposed as ``nvidia.com/gpu`` (56), product label with the profile appended (as GFD does)."""
    return node(name, gpus=56, product=MIG_1G5, mig_strategy="single")


def mig_mixed_node(name: str) -> NodeInventory:
    """An A100 80GB node under the MIG ``mixed`` strategy: 2 GPUs split into 7 x 1g.10gb each,
    6 whole GPUs left (``nvidia.com/gpu`` 6, ``nvidia.com/mig-1g.10gb`` 14)."""
    return node(
        name,
        gpus=6,
        product=A100,
        mig_strategy="mixed",
        extra_alloc={"nvidia.com/mig-1g.10gb": 14},
    )


def member(
    name: str,
    nodes: Sequence[NodeInventory],
    *,
    labels: dict[str, str] | None = None,
    taints: Sequence[Taint] = (),
    ready: bool = True,
    kinds: frozenset[str] = frozenset({"Job.batch"}),
) -> MemberClusterState:
    """A member cluster state holding ``nodes``."""
    return MemberClusterState(
        name=name,
        labels=labels or {},
        taints=tuple(taints),
        health=ClusterHealth(ready=ready, reason="" if ready else "LeaseExpired"),
        inventory=ClusterInventory(cluster=name, nodes=tuple(nodes), served_kinds=kinds),
    )


def hgx_cluster(
    name: str,
    nodes: int = 4,
    *,
    free: Sequence[int] | None = None,
    product: str = H100,
    gpus: int = 8,
    rack_size: int | None = None,
    node_kw: dict[str, Any] | None = None,
    **kw: Any,
) -> MemberClusterState:
    """A member of HGX nodes (each its own NVLink domain); ``free`` per node, default idle."""
    frees = list(free) if free is not None else [gpus] * nodes
    return member(
        name,
        [
            node(
                f"{name}-n{i:03d}",
                gpus=gpus,
                free=f,
                product=product,
                rack=f"{name}-r{i // rack_size}" if rack_size else None,
                **(node_kw or {}),
            )
            for i, f in enumerate(frees)
        ],
        **kw,
    )


def nvl72_cluster(
    name: str,
    cliques: int = 1,
    *,
    trays: int = 18,
    free: Sequence[Sequence[int]] | None = None,
    product: str = GB200,
    **kw: Any,
) -> MemberClusterState:
    """A member of GB200 NVL72 racks: ``cliques`` x ``trays`` nodes of 4 GPUs, one clique each.

    ``free[c][t]``: free GPUs of tray ``t`` in clique ``c`` (default: all idle).
    """
    nodes = []
    for c in range(cliques):
        frees = list(free[c]) if free is not None else [4] * trays
        for t, f in enumerate(frees):
            nodes.append(
                node(
                    f"{name}-c{c}-t{t:02d}",
                    gpus=4,
                    free=f,
                    product=product,
                    clique=f"{name}-fabric.{c}",
                    rack=f"{name}-rack{c}",
                )
            )
    return member(name, nodes, **kw)


def fleet(*members: MemberClusterState) -> FleetSnapshot:
    """A snapshot of ``members``."""
    return FleetSnapshot(members)


def job(
    name: str = "j",
    *,
    gpus: int = 1,
    pods: int = 1,
    nvlink: str = "Preferred",
    products: Sequence[str] = (),
    cpu: int | None = None,
    memory: int | None = None,
    rack: str | None = None,
    block: str | None = None,
    selector: LabelSelector | None = None,
    tolerations: Sequence[Toleration] = (),
    node_selector: dict[str, str] | None = None,
    extra_sets: Sequence[PodSet] = (),
    requests: dict[str, int] | None = None,
    priority: int = 0,
    submitted_at: float = 0.0,
    kind: str = "Job.batch",
    allocation: str | None = None,
) -> PlacementRequest:
    """A job of ``pods`` pods with ``gpus`` GPUs each (plus CPU/memory in proportion)."""
    req = {
        GPU: gpus,
        "cpu": cpu if cpu is not None else gpus * CPU_PER_GPU // 2,
        "memory": memory if memory is not None else gpus * MEM_PER_GPU // 2,
    }
    if requests is not None:
        req = requests
    return PlacementRequest(
        job=f"ns/{name}",
        uid=f"uid-{name}",
        pod_sets=(
            PodSet(
                name="main",
                count=pods,
                requests=req,
                node_selector=node_selector or {},
                tolerations=tuple(tolerations),
            ),
            *extra_sets,
        ),
        gpu_products=tuple(products),
        cluster_selector=selector,
        topology=TopologyRequest(nvlink=nvlink, rack=rack, block=block),  # type: ignore[arg-type]
        priority=priority,
        submitted_at=submitted_at,
        workload_kind=kind,
        allocation=allocation,  # type: ignore[arg-type]
    )


def gpus_on(decision: Any) -> dict[str, int]:
    """node -> GPUs the decision puts there."""
    return {n: r.get(GPU, 0) for n, r in decision.node_requests().items()}
