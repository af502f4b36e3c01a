"""The plugins ``place()`` runs, in order (:func:`plugins_for`), and whether a pool could ever hold a job.

Each plugin is a small object satisfying one ``typing.Protocol`` (:mod:`.pluginapi`); filters
(:mod:`.filters`) answer with a :class:`Status` (a result code and a reason), never an
exception, for "does not fit"; scorers are :mod:`.scorers` and :mod:`.topocost`. This module
re-exports them all. :func:`never_reason`: why no state of a pool could ever hold a job.

Order (``cluster_filters`` then ``pool_filters`` then ``TopologyFit``):

====================  ========  =====================================================================
plugin                judges    says no when
====================  ========  =====================================================================
Health                member    the member is NotReady or has reported no nodes yet (may change)
WorkloadKind          member    the member's API does not serve the job's workload kind
ClusterSelector       member    the member's labels do not match ``clusterSelector``
ClusterTaints         member    the member carries a taint some pod set does not tolerate
GPUProduct            pool      the pool's GPU product is not allowed (MIG-single slices only when named)
DeviceSelectors       pool      a GPU pod set claims through DRA and the pool's GPUs are the extended
                                resource, or the other way round, or a claim's CEL selectors reject the
                                pool's DRA GPUs
NodeTaints            pool      the pool's nodes carry a taint some GPU pod set does not tolerate
                                (a ``node.kubernetes.io/`` condition taint such as not-ready: may change)
ResourceFit           pool      the pool's free GPUs (histogram by node) cannot hold the pods
TopologyFit           pool      no nodes / NVLink domain / rack / block hold every pod at once
====================  ========  =====================================================================

The ``Quota`` filter (:class:`gpufed.placement.quota.JobQuota`, given to ``place()`` per job)
judges each pool after NodeTaints: the job's queue cannot admit its GPUs of the pool's product.

Member filters and the first three pool filters are *static*: they read only the job's constraints
and the member's metadata, so ``place()`` memoises their results per fleet generation and runs
them once per job shape, not once per decision. Scores (0-100 each, weighted mean):
NVLinkBestFit, ResourceAllocation (binpack / spread), TopologyLocality, TopologyCost
(:mod:`.topocost`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from gpufed.api.labels import GPU_RESOURCE
from gpufed.placement.filters import (
    CONDITION_TAINT_PREFIX,
    ClusterSelector,
    ClusterTaints,
    DeviceSelectors,
    GPUProduct,
    Health,
    NodeTaints,
    ResourceFit,
    TopologyFit,
    WorkloadKind,
)
from gpufed.placement.index import NodeState, PoolState
from gpufed.placement.member import ClusterState
from gpufed.placement.memo import PoolMemo
from gpufed.placement.pluginapi import (
    SUCCESS,
    ClusterFilter,
    Code,
    Planner,
    PoolFilter,
    Scorer,
    Status,
)
from gpufed.placement.policy import Policy
from gpufed.placement.scorers import NVLinkBestFit, ResourceAllocation, TopologyLocality
from gpufed.placement.shape import JobShape
from gpufed.placement.topocost import TopologyCost

__all__ = [
    "CONDITION_TAINT_PREFIX",
    "SUCCESS",
    "ClusterFilter",
    "ClusterSelector",
    "ClusterTaints",
    "Code",
    "DeviceSelectors",
    "GPUProduct",
    "Health",
    "NVLinkBestFit",
    "NodeTaints",
    "Planner",
    "Plugins",
    "PoolFilter",
    "ResourceAllocation",
    "ResourceFit",
    "Scorer",
    "Status",
    "TopologyCost",
    "TopologyFit",
    "TopologyLocality",
    "WorkloadKind",
    "never_reason",
    "plugins_for",
]


@dataclass(frozen=True)
class Plugins:
    """The ordered plugin tuples ``place()`` runs for one policy."""

    cluster_filters: tuple[ClusterFilter, ...]
    pool_filters: tuple[PoolFilter, ...]
    dynamic_pool_filters: tuple[PoolFilter, ...]
    planner: Planner
    scorers: tuple[Scorer, ...]
    total_weight: float


@lru_cache(maxsize=32)
def plugins_for(policy: Policy) -> Plugins:
    """The plugins of ``policy`` (weights from ``policy.weights``), built once per policy."""
    w = policy.weights
    pool_filters: tuple[PoolFilter, ...] = (
        GPUProduct(),
        DeviceSelectors(),
        NodeTaints(),
        ResourceFit(),
    )
    return Plugins(
        cluster_filters=(Health(), WorkloadKind(), ClusterSelector(), ClusterTaints()),
        pool_filters=pool_filters,
        dynamic_pool_filters=tuple(f for f in pool_filters if not f.static),
        planner=TopologyFit(),
        scorers=(
            NVLinkBestFit(w.nvlink_fit),
            ResourceAllocation(w.allocation, policy.allocation),
            TopologyLocality(w.topology),
            TopologyCost(w.topology_cost),
        ),
        total_weight=w.total,
    )


# --- could it ever fit? ------------------------------------------------------------------------------
def never_reason(
    job: JobShape, cluster: ClusterState, pool: PoolState | None, memo: PoolMemo | None
) -> str | None:
    """Why no state of this pool (or member) could ever hold the job, or None if one could.
    ``memo``: the pool's memo (None: nothing remembered).

    Judged on allocatable alone (every node empty, Ready or not, node selectors and CPU-pod
    taints aside): pod sizes against node sizes, and with a Required NVLink / rack / block
    level, the pods against the largest such group. Reads the pool's distinct node shapes, so
    it costs O(shapes); the grouped check is memoised while the pool's set of nodes is the same.
    """
    if pool is not None and job.gpu_sets:
        for s in job.gpu_sets:
            slots = sum(
                cnt * _capacity(shape, s.gpus, s.other) for shape, cnt in pool.alloc_shapes.items()
            )
            if slots < s.count:
                biggest = max(
                    (dict(sh).get(GPU_RESOURCE, 0) for sh in pool.alloc_shapes), default=0
                )
                if biggest < s.gpus:
                    return (
                        f"pod set {s.name} needs {s.gpus} GPUs in one pod; the largest "
                        f"{pool.product} node has {biggest}"
                    )
                return (
                    f"pod set {s.name} needs {s.count} pods of {s.gpus} GPUs "
                    f"({_per_pod(s.other)}); all {pool.product} nodes together hold {slots}"
                )
        if len(job.gpu_sets) > 1:
            why = _never_together(job, pool)
            if why:
                return why
        if not pool.slices:
            for level in ("nvlink", "rack", "block"):
                # one pod always sits in one NVLink domain, but only a labelled node is in a
                # rack or block
                if level in job.required and (job.gpu_pods > 1 or level != "nvlink"):
                    why = _never_grouped(job, pool, memo, level)
                    if why:
                        return why
    for s in job.other_sets:
        slots = sum(
            cnt * min(_capacity(shape, 0, s.other), s.count)
            for shape, cnt in cluster.alloc_shapes.items()
        )
        if slots < s.count:
            return (
                f"pod set {s.name}: no nodes could ever hold {s.count} pods of {_per_pod(s.other)}"
            )
    return None


def _never_together(job: JobShape, pool: PoolState) -> str | None:
    """Several GPU pod sets that each fit the pool alone but not all at once (totals of GPUs
    and of every other resource they request, over every node's allocatable)."""
    names = " + ".join(s.name for s in job.gpu_sets)
    have = sum(cnt * dict(shape).get(GPU_RESOURCE, 0) for shape, cnt in pool.alloc_shapes.items())
    if have < job.demand:
        return (
            f"pod sets {names} need {job.demand} GPUs together; all {pool.product} nodes "
            f"together have {have}"
        )
    need: dict[str, int] = {}
    for s in job.gpu_sets:
        for r, a in s.other:
            need[r] = need.get(r, 0) + a * s.count
    for r, amount in sorted(need.items()):
        have = sum(cnt * dict(shape).get(r, 0) for shape, cnt in pool.alloc_shapes.items())
        if have < amount:
            return (
                f"pod sets {names} need {r}={amount} together; all {pool.product} nodes "
                f"together have {have}"
            )
    return None


def _per_pod(other: tuple[tuple[str, int], ...]) -> str:
    return ", ".join(f"{r}={a}" for r, a in other) or "no other resources"


def _capacity(
    shape: tuple[tuple[str, int], ...], gpus: int, other: tuple[tuple[str, int], ...]
) -> int:
    alloc = dict(shape)
    k = alloc.get(GPU_RESOURCE, 0) // gpus if gpus else 10**9
    for r, a in other:
        k = min(k, alloc.get(r, 0) // a)
    return k


def _never_grouped(job: JobShape, pool: PoolState, memo: PoolMemo | None, level: str) -> str | None:
    if memo is None:
        return _never_grouped_scan(job, pool, level)
    key = ("grouped", level, tuple((s.gpus, s.count) for s in job.gpu_sets))
    found, hit = memo.recall_static(key)
    if found:
        return hit  # type: ignore[no-any-return]
    why = _never_grouped_scan(job, pool, level)
    memo.remember_static(key, why)
    return why


def _never_grouped_scan(job: JobShape, pool: PoolState, level: str) -> str | None:
    groups: dict[str, list[NodeState]] = {}
    for n in pool.nodes.values():
        if level == "nvlink":
            key: str | None = n.inv.nvlink_domain
        else:
            key = n.inv.rack if level == "rack" else n.inv.block
        if key is not None:
            groups.setdefault(key, []).append(n)
    largest = 0
    for members in groups.values():
        total = sum(n.gpu_alloc for n in members)
        largest = max(largest, total)
        if total < job.demand:
            continue
        if all(sum(n.gpu_alloc // s.gpus for n in members) >= s.count for s in job.gpu_sets):
            return None
    what = {"nvlink": "NVLink domain", "rack": "rack", "block": "block"}[level]
    shape = " + ".join(f"{s.count}x{s.gpus}" for s in job.gpu_sets)
    if not groups:
        return (
            f"{level} is Required but no {pool.product} node carries a {level} label, so no "
            f"{what} could ever hold {shape} GPUs"
        )
    return (
        f"{level} is Required but no {pool.product} {what} could ever hold {shape} GPUs "
        f"(largest {what}: {largest} GPUs)"
    )
