"""Filter plugins of placement: the member filters, the pool filters, and the planner.

Each answers with a :class:`~gpufed.placement.pluginapi.Status`, never an exception, for "does
not fit"; their order and what each says no to: :mod:`gpufed.placement.plugins`.
"""

from __future__ import annotations

from collections.abc import Set
from typing import ClassVar

from gpufed.api.inventory import Taint, tolerates_all
from gpufed.api.labels import GPU_PRODUCT_LABEL
from gpufed.placement.devicecel import matches
from gpufed.placement.fit import Plan, plan
from gpufed.placement.index import PoolState
from gpufed.placement.member import ClusterState
from gpufed.placement.memo import PoolMemo
from gpufed.placement.pluginapi import SUCCESS, Code, Status
from gpufed.placement.shape import JobShape


# --- member filters ------------------------------------------------------------------------------
class Health:
    """A member that is NotReady, or that has not reported any node yet, takes no new work."""

    name: ClassVar[str] = "Health"

    def filter(self, job: JobShape, cluster: ClusterState) -> Status:
        h = cluster.health
        if not h.ready:
            why = ": ".join(x for x in (h.reason, h.message) if x) or "no recent heartbeat"
            return Status(Code.UNSCHEDULABLE, f"member is NotReady ({why})")
        if not cluster.nodes:
            return Status(Code.UNSCHEDULABLE, "member has not reported any node yet")
        return SUCCESS


class WorkloadKind:
    """The member must serve the workload's kind (``Kind.group``, reported by the agent)."""

    name: ClassVar[str] = "WorkloadKind"

    def filter(self, job: JobShape, cluster: ClusterState) -> Status:
        kind = job.request.workload_kind
        if kind in cluster.served_kinds:
            return SUCCESS
        served = ", ".join(sorted(cluster.served_kinds)) or "nothing"
        return Status(
            Code.UNRESOLVABLE,
            f"member does not serve {kind} (serves {served}); install its controller there",
        )


class ClusterSelector:
    """``spec.placement.clusterSelector`` over the MemberCluster's labels."""

    name: ClassVar[str] = "ClusterSelector"

    def filter(self, job: JobShape, cluster: ClusterState) -> Status:
        sel = job.request.cluster_selector
        if sel is None or sel.matches(cluster.labels):
            return SUCCESS
        return Status(Code.UNRESOLVABLE, "member labels do not match clusterSelector")


class ClusterTaints:
    """Member-level taints (``MemberCluster.spec.taints``) must be tolerated by every pod set."""

    name: ClassVar[str] = "ClusterTaints"

    def filter(self, job: JobShape, cluster: ClusterState) -> Status:
        if not cluster.taints:
            return SUCCESS
        for s in job.sets:
            if not tolerates_all(s.tolerations, cluster.taints):
                t = next(
                    t
                    for t in cluster.taints
                    if t.effect != "PreferNoSchedule"
                    and not any(x.tolerates(t) for x in s.tolerations)
                )
                return Status(
                    Code.UNRESOLVABLE,
                    f"member taint {t.key}={t.value}:{t.effect} not tolerated by pod set {s.name}",
                )
        return SUCCESS


# --- pool filters ----------------------------------------------------------------------------------
class GPUProduct:
    """The pool's GPU product must be allowed; MIG-single slices only when named explicitly.

    A node with ``nvidia.com/mig.strategy=single`` exposes MIG slices under ``nvidia.com/gpu``
    (GFD then reports a product such as ``A100-SXM4-40GB-MIG-1g.5gb``); such a pool serves only
    jobs that name that product (in ``gpuProducts`` or a ``nvidia.com/gpu.product``
    nodeSelector), so slices are never taken for whole GPUs.
    """

    name: ClassVar[str] = "GPUProduct"
    static: ClassVar[bool] = True

    def filter(
        self, job: JobShape, cluster: ClusterState, pool: PoolState, memo: PoolMemo
    ) -> Status:
        allowed = job.products
        pins = job.selector_pins(GPU_PRODUCT_LABEL)
        named = (allowed is not None and pool.product in allowed) or (
            pins is not None and pool.product in pins
        )
        if pool.slices and not named:
            return Status(
                Code.UNRESOLVABLE,
                f"{pool.product} nodes use the MIG single strategy: their nvidia.com/gpu are "
                "MIG slices, not whole GPUs (name the product in gpuProducts or a "
                "nvidia.com/gpu.product nodeSelector to use them)",
            )
        if allowed is not None and pool.product not in allowed:
            return Status(Code.UNRESOLVABLE, f"{pool.product} is not in gpuProducts")
        if pins is not None and pool.product not in pins:
            return Status(Code.UNRESOLVABLE, f"nodeSelector excludes {pool.product}")
        return SUCCESS


class DeviceSelectors:
    """How the pods get their GPUs must be how the pool's nodes offer them, and a claim's
    device selectors must accept the pool's GPUs.

    A pod that asks for ``nvidia.com/gpu`` cannot use GPUs a DRA driver publishes (unless the
    DeviceClass maps the extended resource, not read yet), and a pod that claims GPUs
    through DRA cannot use the device plugin's; the selectors (CEL,
    :mod:`gpufed.placement.devicecel`) must hold for every kind of GPU the pool's nodes have.
    """

    name: ClassVar[str] = "DeviceSelectors"
    static: ClassVar[bool] = True

    def filter(
        self, job: JobShape, cluster: ClusterState, pool: PoolState, memo: PoolMemo
    ) -> Status:
        for s in job.gpu_sets:
            if s.claim_selectors is None:
                if pool.dra:
                    return Status(
                        Code.UNRESOLVABLE,
                        f"{pool.product} nodes publish their GPUs through DRA; pod set {s.name} "
                        "asks for nvidia.com/gpu (claim them with a ResourceClaimTemplate of "
                        "device class gpu.nvidia.com)",
                    )
                continue
            if not pool.dra:
                return Status(
                    Code.UNRESOLVABLE,
                    f"{pool.product} nodes offer GPUs as nvidia.com/gpu, not through DRA; pod "
                    f"set {s.name} claims its GPUs through DRA",
                )
            for expr in s.claim_selectors:
                if not all(matches((expr,), kind) for kind in pool.dra):
                    return Status(
                        Code.UNRESOLVABLE,
                        f"pod set {s.name}: selector {_short(expr)} rejects the {pool.product} "
                        "GPUs",
                    )
        return SUCCESS


def _short(expr: str) -> str:
    return repr(expr) if len(expr) <= 120 else repr(expr[:100] + "…")


#: Taints the node lifecycle controller sets for a node condition (``node.kubernetes.io/not-ready``,
#: ``unreachable``, ``memory-pressure``, ``unschedulable``...) and removes when it clears.
CONDITION_TAINT_PREFIX = "node.kubernetes.io/"


def is_condition_taint(t: Taint) -> bool:
    """``t`` is a node-condition taint (not-ready, unreachable, pressure, ...): it goes when
    the condition clears, so it never decides "could ever hold"."""
    return t.key.startswith(CONDITION_TAINT_PREFIX)


class NodeTaints:
    """The pool's node taints must be tolerated by every GPU pod set."""

    name: ClassVar[str] = "NodeTaints"
    static: ClassVar[bool] = True

    def filter(
        self, job: JobShape, cluster: ClusterState, pool: PoolState, memo: PoolMemo
    ) -> Status:
        if not pool.taints:
            return SUCCESS
        for s in job.gpu_sets:
            if not tolerates_all(s.tolerations, pool.taints):
                t = next(t for t in pool.taints if not any(x.tolerates(t) for x in s.tolerations))
                # a node-condition taint (not-ready, unreachable, pressure) goes when the
                # condition clears: the job waits, it is not rejected for ever
                transient = is_condition_taint(t)
                return Status(
                    Code.UNSCHEDULABLE if transient else Code.UNRESOLVABLE,
                    f"{pool.product} nodes carry taint {t.key}={t.value}:{t.effect} that pod set "
                    f"{s.name} does not tolerate",
                )
        return SUCCESS


class ResourceFit:
    """Free GPUs of the pool, node by node (from the histogram), must hold every GPU pod.

    An upper bound: passing does not promise a plan (node selectors, CPU, memory and topology
    are judged by TopologyFit), failing proves there is none.
    """

    name: ClassVar[str] = "ResourceFit"
    static: ClassVar[bool] = False

    def filter(
        self, job: JobShape, cluster: ClusterState, pool: PoolState, memo: PoolMemo
    ) -> Status:
        if pool.free < job.demand:
            return Status(
                Code.UNSCHEDULABLE,
                f"{pool.free} {pool.product} GPUs free, the job needs {job.demand}",
            )
        if job.grouped_only and len(job.gpu_sets) == 1 and not pool.slices:
            s = job.gpu_sets[0]
            if memo.tightest_domain(s.gpus, s.count) is None:
                if s.count == 1:
                    return Status(
                        Code.UNSCHEDULABLE,
                        f"no {pool.product} node has {s.gpus} free GPUs (at most "
                        f"{pool.max_free}; free GPUs by node: {_histogram(pool)})",
                    )
                best = max(pool.max_free, pool.max_group_free("nvlink"))
                return Status(
                    Code.UNSCHEDULABLE,
                    f"no {pool.product} NVLink domain has room for {s.count} pods of "
                    f"{s.gpus} GPUs (largest free domain: {best} GPUs)",
                )
        for s in job.gpu_sets:
            if pool.slots(s.gpus) < s.count:
                return Status(
                    Code.UNSCHEDULABLE,
                    f"{pool.product}: room for {pool.slots(s.gpus)} of {s.count} pods of "
                    f"{s.gpus} GPUs (at most {pool.max_free} free on one node; free GPUs by "
                    f"node: {_histogram(pool)})",
                )
        return SUCCESS


class TopologyFit:
    """Chooses the nodes: gang all-or-nothing, NVLink / rack / block wishes, best fit."""

    name: ClassVar[str] = "TopologyFit"

    def plan(
        self,
        job: JobShape,
        cluster: ClusterState,
        pool: PoolState | None,
        exclude: Set[str] = frozenset(),
    ) -> Plan | Status:
        result = plan(job, cluster, pool, exclude)
        if isinstance(result, str):
            return Status(Code.UNSCHEDULABLE, result)
        return result


def _histogram(pool: PoolState) -> str:
    return ", ".join(f"{f}:{c}" for f, c in enumerate(pool.counts) if c and f) or "none"
