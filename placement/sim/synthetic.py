"""Seeded synthetic fleets and job mixes for the placement benchmark (``gpufed bench placement``).

Deterministic for a given seed (``random.Random(seed)``; nothing global). The fleet mixes HGX
8-GPU members (H100, H200, B200, A100 in turn) with GB200 NVL72 members (3 in 10), each 50-80%
occupied, with rack and block labels; a tenth of the members taint their GPU nodes for
inference. Nodes are built with ``model_construct`` and shared dicts, because validating
500,000 nodes would measure pydantic, not placement.

Job mix: 1-64 GPUs (35% 1, 10% 2, 15% 4, 20% 8, 8% 16, 7% 32, 5% 64), ``min(gpus, 8)`` GPUs per
pod (4 on GB200, one tray), NVLink Required / Preferred / None mixed, most jobs naming one GPU
product, some two, some any; a tenth select a region; priorities 0-2.

With ``dra`` (``gpufed bench placement --dra``): in every HGX member the nodes of every other
rack publish their GPUs through DRA (each node one :class:`~gpufed.api.inventory.DeviceGroup`;
placement pools them apart from the device-plugin nodes beside them), and 40% of the HGX jobs claim their GPUs through DRA, half of those with a CEL
selector on the product name (drawn from a second seeded generator, so the rest of the mix is
the same as without ``dra``).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from gpufed.api.inventory import (
    ClusterHealth,
    ClusterInventory,
    DeviceGroup,
    MemberClusterState,
    NodeInventory,
    Taint,
    Toleration,
)
from gpufed.api.labels import (
    DEFAULT_BLOCK_LABEL,
    DEFAULT_RACK_LABEL,
    GPU_CLIQUE_LABEL,
    GPU_PRODUCT_LABEL,
    GPU_RESOURCE,
)
from gpufed.api.request import (
    LabelSelector,
    NVLinkPolicy,
    PlacementRequest,
    PodSet,
    TopologyRequest,
)

HGX_PRODUCTS = ("NVIDIA-H100-80GB-HBM3", "NVIDIA-H200", "NVIDIA-B200", "NVIDIA-A100-SXM4-80GB")
NVL72_PRODUCT = "NVIDIA-GB200"
REGIONS = ("us-east", "us-west", "eu-west", "ap-south")
INFERENCE_TAINT = Taint(key="dedicated", value="inference", effect="NoSchedule")
_GIB = 2**30
_SIZES = (1, 2, 4, 8, 16, 32, 64)
_SIZE_WEIGHTS = (35, 10, 15, 20, 8, 7, 5)


@dataclass(frozen=True)
class FleetShape:
    """What a synthetic fleet holds (for the benchmark's JSON line)."""

    clusters: int
    nodes: int
    gpus: int
    products: tuple[str, ...]


def _cluster_kind(i: int) -> str:
    return "nvl72" if i % 10 in (2, 5, 8) else "hgx"


def synthetic_fleet(
    clusters: int, nodes_per_cluster: int, seed: int, *, dra: bool = False
) -> tuple[list[MemberClusterState], FleetShape]:
    """``clusters`` members of ``nodes_per_cluster`` nodes each, 50-80% of GPUs in use
    (``dra``: every other rack of each HGX member publishes its GPUs through DRA)."""
    rng = random.Random(seed)
    members: list[MemberClusterState] = []
    total_gpus = 0
    products: set[str] = set()
    hgx_i = 0
    empty: dict[str, dict[str, int]] = {}
    for i in range(clusters):
        kind = _cluster_kind(i)
        region = REGIONS[i % len(REGIONS)]
        name = f"{region}-{kind}-{i:03d}"
        if kind == "nvl72":
            product, gpus, per_domain = NVL72_PRODUCT, 4, 18
        else:
            product, gpus, per_domain = HGX_PRODUCTS[hgx_i % len(HGX_PRODUCTS)], 8, 1
            hgx_i += 1
        groups: tuple[DeviceGroup, ...] = ()
        if dra and kind == "hgx":
            groups = (
                DeviceGroup(
                    count=gpus,
                    attributes={"type": "gpu", "productName": product.replace("-", " ")},
                    capacity={"memory": 80 * _GIB},
                ),
            )
        products.add(product)
        tainted = i % 10 == 7
        taints = (INFERENCE_TAINT,) if tainted else ()
        cpu = 224_000 if gpus == 8 else 144_000
        mem = 2048 * _GIB if gpus == 8 else 960 * _GIB
        alloc = {GPU_RESOURCE: gpus, "cpu": cpu, "memory": mem, "pods": 110}
        requested = [
            {GPU_RESOURCE: u, "cpu": u * (cpu // gpus // 2), "memory": u * (mem // gpus // 2)}
            for u in range(gpus + 1)
        ]
        occupancy = rng.uniform(0.5, 0.8)
        p_full = occupancy - 0.15
        p_partial = 0.30
        rack_size = per_domain if per_domain > 1 else 4
        nodes: list[NodeInventory] = []
        labels_by_rack: dict[int, dict[str, str]] = {}
        for n in range(nodes_per_cluster):
            rack = n // rack_size
            block = rack // 32
            labels = labels_by_rack.get(rack)
            if labels is None:
                labels = {
                    GPU_PRODUCT_LABEL: product,
                    DEFAULT_RACK_LABEL: f"r{rack}",
                    DEFAULT_BLOCK_LABEL: f"b{block}",
                }
                if per_domain > 1:
                    labels[GPU_CLIQUE_LABEL] = f"{name}.{rack}"
                labels_by_rack[rack] = labels
            x = rng.random()
            if x < p_full:
                used = gpus
            elif x < p_full + p_partial:
                used = rng.randint(1, gpus - 1)
            else:
                used = 0
            node_name = f"{name}-n{n:05d}"
            nodes.append(
                NodeInventory.model_construct(
                    name=node_name,
                    labels=labels,
                    gpu_product=product,
                    mig_strategy="none",
                    nvlink_domain=(
                        f"clique:{name}.{rack}" if per_domain > 1 else f"node:{node_name}"
                    ),
                    rack=f"r{rack}",
                    block=f"b{block}",
                    ready=True,
                    unschedulable=False,
                    taints=taints,
                    allocatable=alloc,
                    requested=requested[used],
                    job_requests=empty,
                    degraded=None,
                    dra_gpus=groups if rack % 2 else (),
                )
            )
        total_gpus += gpus * nodes_per_cluster
        members.append(
            MemberClusterState(
                name=name,
                labels={"region": region, "gpufed.io/kind": kind},
                health=ClusterHealth(ready=True),
                inventory=ClusterInventory.model_construct(
                    cluster=name,
                    nodes=tuple(nodes),
                    served_kinds=frozenset({"Job.batch", "JobSet.jobset.x-k8s.io"}),
                    agent_version="synthetic",
                ),
            )
        )
    return members, FleetShape(
        clusters=clusters,
        nodes=clusters * nodes_per_cluster,
        gpus=total_gpus,
        products=tuple(sorted(products)),
    )


def synthetic_jobs(
    count: int, seed: int, products: tuple[str, ...], *, dra: bool = False
) -> list[PlacementRequest]:
    """``count`` seeded placement requests over ``products`` (see the module docstring)."""
    rng = random.Random(seed * 7919 + 1)
    dra_rng = random.Random(seed * 104729 + 3)
    hgx = [p for p in products if p != NVL72_PRODUCT] or list(products)
    out: list[PlacementRequest] = []
    for i in range(count):
        gpus = rng.choices(_SIZES, weights=_SIZE_WEIGHTS)[0]
        x = rng.random()
        nvl = NVL72_PRODUCT in products and x < 0.25
        if nvl:
            wanted: tuple[str, ...] = (NVL72_PRODUCT,)
            per_pod = min(gpus, 4)
        else:
            y = rng.random()
            if y < 0.6:
                wanted = (rng.choice(hgx),)
            elif y < 0.85:
                wanted = tuple(sorted(rng.sample(hgx, min(2, len(hgx)))))
            else:
                wanted = ()
            per_pod = min(gpus, 8)
        pods = gpus // per_pod
        t = rng.random()
        nvlink: NVLinkPolicy
        if pods == 1:
            nvlink = "Required" if t < 0.5 else ("Preferred" if t < 0.8 else "None")
        elif nvl:
            nvlink = "Required" if t < 0.6 else "Preferred"
        else:
            nvlink = "Preferred" if t < 0.7 else "None"
        inference = rng.random() < 0.1
        selector = (
            LabelSelector(match_labels={"region": rng.choice(REGIONS)})
            if rng.random() < 0.1
            else None
        )
        out.append(
            PlacementRequest(
                job=f"bench/job-{i}",
                uid=f"bench-{seed}-{i}",
                pod_sets=(
                    PodSet(
                        name="worker",
                        count=pods,
                        requests={
                            GPU_RESOURCE: per_pod,
                            "cpu": per_pod * 12_000,
                            "memory": per_pod * 96 * _GIB,
                        },
                        tolerations=(
                            (Toleration(key="dedicated", operator="Exists"),) if inference else ()
                        ),
                        claim_selectors=_claim(dra_rng, wanted) if dra and not nvl else None,
                    ),
                ),
                gpu_products=wanted,
                cluster_selector=selector,
                topology=TopologyRequest(nvlink=nvlink),
                priority=rng.randint(0, 2),
                submitted_at=float(i),
            )
        )
    return out


def _claim(rng: random.Random, wanted: tuple[str, ...]) -> tuple[str, ...] | None:
    """For 40% of jobs the CEL selectors of a DRA claim (empty or on one wanted product), else
    None (the extended resource)."""
    if rng.random() >= 0.4:
        return None
    if not wanted or rng.random() < 0.5:
        return ()
    name = wanted[0].replace("-", " ")
    return (f"device.attributes['gpu.nvidia.com'].productName == '{name}'",)
