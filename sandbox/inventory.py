"""GPU inventory of a running cluster, read back from its Nodes (not from the fleet file).

Used by ``gpufed local up``/``status`` and ``gpufed demo`` to show what the member API servers
actually hold: nodes, whole GPUs by product, MIG instances by profile, NVLink domains. The
conversion of a Node into :class:`gpufed.api.inventory.NodeInventory` follows the vocabulary of
docs/design.md §3 (summaries count whole GPUs on Ready, schedulable nodes).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from pydantic import BaseModel, Field

from gpufed.api.inventory import NodeInventory, Taint, node_from_labels, summarize
from gpufed.api.labels import GPU_RESOURCE, is_mig_resource
from gpufed.api.resources import resource_list
from gpufed.sandbox.kube import node_is_ready


class ClusterGPUs(BaseModel):
    """What one cluster's Nodes report.

    ``gpus_total``/``gpus_free``: GPU product -> whole GPUs (``nvidia.com/gpu``) on Ready,
    schedulable nodes; ``mig_total``: MIG resource (``nvidia.com/mig-1g.10gb``) -> instances
    allocatable; ``nvlink_domains``: domain size in whole GPUs -> number of domains
    (``{8: 8}`` = eight 8-GPU HGX nodes, ``{72: 2}`` = two NVL72 cliques);
    ``largest_free_nvlink_block``: docs/design.md §3; ``taints``: distinct node taints.
    """

    cluster: str
    nodes: int = 0
    nodes_ready: int = 0
    gpus_total: dict[str, int] = Field(default_factory=dict)
    gpus_free: dict[str, int] = Field(default_factory=dict)
    mig_total: dict[str, int] = Field(default_factory=dict)
    nvlink_domains: dict[int, int] = Field(default_factory=dict)
    largest_free_nvlink_block: int = 0
    taints: list[str] = Field(default_factory=list)


def node_inventory(node: dict[str, Any], dra_gpus: int = 0) -> NodeInventory:
    """A Node (JSON as served by the API) as :class:`NodeInventory`, with nothing requested
    (the sandbox does not sum pods; the agent does); ``dra_gpus``: whole GPUs its
    ResourceSlices publish (:func:`gpufed.sandbox.kube.dra_gpus_by_node`), counted as
    ``nvidia.com/gpu``."""
    meta = node.get("metadata", {})
    spec = node.get("spec", {})
    status = node.get("status", {})
    name = meta["name"]
    allocatable = resource_list(status.get("allocatable"), field=f"node {name} allocatable")
    if dra_gpus:
        allocatable[GPU_RESOURCE] = dra_gpus
    return node_from_labels(
        name,
        meta.get("labels") or {},
        ready=node_is_ready(node),
        unschedulable=bool(spec.get("unschedulable")),
        taints=tuple(
            Taint(key=t["key"], value=t.get("value", ""), effect=t["effect"])
            for t in spec.get("taints") or []
            if t.get("effect") in ("NoSchedule", "PreferNoSchedule", "NoExecute")
        ),
        allocatable=allocatable,
    )


def cluster_gpus(
    cluster: str, nodes: list[dict[str, Any]], dra: dict[str, int] | None = None
) -> ClusterGPUs:
    """Summarise raw Nodes of one cluster (see :class:`ClusterGPUs`); ``dra``: node name ->
    whole GPUs published through DRA."""
    dra = dra or {}
    inv = [node_inventory(n, dra.get(n["metadata"]["name"], 0)) for n in nodes]
    summary = summarize(inv)
    mig: Counter[str] = Counter()
    domains: Counter[str] = Counter()
    for n in inv:
        for res, amount in n.allocatable.items():
            if is_mig_resource(res) and amount:
                mig[res] += amount
        domains[n.nvlink_domain] += n.whole_gpus_allocatable
    sizes = Counter(size for size in domains.values() if size)
    taints = sorted({f"{t.key}={t.value}:{t.effect}" for n in inv for t in n.taints})
    return ClusterGPUs(
        cluster=cluster,
        nodes=len(inv),
        nodes_ready=sum(1 for n in inv if n.ready),
        gpus_total=summary.gpus_total,
        gpus_free=summary.gpus_free,
        mig_total=dict(sorted(mig.items())),
        nvlink_domains=dict(sorted(sizes.items())),
        largest_free_nvlink_block=summary.largest_free_nvlink_block,
        taints=taints,
    )
