"""Filter and score plugins of placement, and the ordered tuples ``place()`` runs.

Each plugin is a small object satisfying one ``typing.Protocol``; filters answer with a
:class:`Status` (a result code and a reason), never an exception, for "does not fit".

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
from enum import StrEnum
from functools import lru_cache
from typing import ClassVar, Protocol

from gpufed.api.inventory import tolerates_all
from gpufed.api.labels import GPU_PRODUCT_LABEL, GPU_RESOURCE
from gpufed.placement.devicecel import matches
from gpufed.placement.fit import Plan, plan
from gpufed.placement.index import NodeState, PoolState
from gpufed.placement.member import ClusterState
from gpufed.placement.memo import PoolMemo
from gpufed.placement.policy import Policy
from gpufed.placement.shape import JobShape
from gpufed.placement.topocost import TopologyCost


class Code(StrEnum):
    """Result codes of filter plugins (kube-scheduler / Karmada vocabulary)."""

    SUCCESS = "Success"
    #: does not fit now; may fit when jobs finish, health returns or reservations expire
    UNSCHEDULABLE = "Unschedulable"
    #: cannot fit unless the member's configuration or shape changes
    UNRESOLVABLE = "UnschedulableAndUnresolvable"
    #: broken input
    ERROR = "Error"


@dataclass(frozen=True, slots=True)
class Status:
    """A filter's answer: ``code`` and a human ``reason`` (empty on success)."""

    code: Code
    reason: str = ""

    @property
    def ok(self) -> bool:
        """True for ``Success``."""
        return self.code is Code.SUCCESS


SUCCESS: Status = Status(Code.SUCCESS)


class ClusterFilter(Protocol):
    """Judges one member as a whole from its metadata (static: memoised per generation)."""

    name: ClassVar[str]

    def filter(self, job: JobShape, cluster: ClusterState) -> Status:
        """``SUCCESS`` or why the member cannot take the job."""
        ...


class PoolFilter(Protocol):
    """Judges one pool of a member. ``static`` filters are memoised per generation."""

    name: ClassVar[str]
    static: ClassVar[bool]

    def filter(
        self, job: JobShape, cluster: ClusterState, pool: PoolState, memo: PoolMemo
    ) -> Status:
        """``SUCCESS`` or why the pool cannot take the job; ``memo`` is the pool's memo, for
        values derived from the pool that later decisions may reuse."""
        ...


class Planner(Protocol):
    """Chooses nodes for every pod of the job inside one pool (the last filter)."""

    name: ClassVar[str]

    def plan(
        self,
        job: JobShape,
        cluster: ClusterState,
        pool: PoolState | None,
        exclude: frozenset[str] = frozenset(),
    ) -> Plan | Status:
        """A :class:`Plan` that uses no node in ``exclude``, or the status saying why none
        exists."""
        ...


class Scorer(Protocol):
    """Scores a plan 0-100; ``bound`` never underestimates ``score`` for a pool's plans."""

    name: ClassVar[str]
    weight: float

    def bound(self, job: JobShape, pool: PoolState | None, memo: PoolMemo | None) -> float:
        """Upper bound of :meth:`score` over every plan in ``pool`` (lets ``place`` stop early);
        ``memo`` is the pool's memo (None: nothing remembered)."""
        ...

    def score(self, job: JobShape, plan: Plan) -> float:
        """The plan's score, 0-100."""
        ...


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
                transient = t.key.startswith(CONDITION_TAINT_PREFIX)
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
        exclude: frozenset[str] = frozenset(),
    ) -> Plan | Status:
        result = plan(job, cluster, pool, exclude)
        if isinstance(result, str):
            return Status(Code.UNSCHEDULABLE, result)
        return result


# --- scorers ----------------------------------------------------------------------------------------
class NVLinkBestFit:
    """Fewest stranded GPUs: ``100 * GPUs placed / free GPUs of the NVLink domains used``.

    1 GPU on a node with 1 free scores 100, on an idle 8-GPU node 12.5; 4 trays of an NVL72
    clique with 16 free score 100, with 72 free 22. Fully-free domains are therefore broken
    only when no tighter fit exists.
    """

    name: ClassVar[str] = "NVLinkBestFit"

    def __init__(self, weight: float) -> None:
        self.weight = weight

    def bound(self, job: JobShape, pool: PoolState | None, memo: PoolMemo | None) -> float:
        if pool is None or pool.slices or len(job.gpu_sets) != 1 or not job.grouped_only:
            return 100.0
        s = job.gpu_sets[0]
        tight = (
            memo.tightest_domain(s.gpus, s.count)
            if memo is not None
            else pool.tightest_domain(s.gpus, s.count)
        )
        return 100.0 * job.demand / tight if tight else 0.0

    def score(self, job: JobShape, plan: Plan) -> float:
        return plan.fit


class ResourceAllocation:
    """``binpack``: GPUs of the product used in the member after placement (percent);
    ``spread``: the free part left. Jobs without whole GPUs score 50. The mode is the job's
    own (``PlacementRequest.allocation``, from ``spec.placement.allocation``) when it sets one,
    else the policy's (``mode``)."""

    name: ClassVar[str] = "ResourceAllocation"

    def __init__(self, weight: float, mode: str) -> None:
        self.weight = weight
        self.mode = mode

    def bound(self, job: JobShape, pool: PoolState | None, memo: PoolMemo | None) -> float:
        return self._share(job, pool)

    def score(self, job: JobShape, plan: Plan) -> float:
        return self._share(job, plan.pool)

    def _share(self, job: JobShape, pool: PoolState | None) -> float:
        if pool is None or pool.cap <= 0:
            return 50.0
        if (job.request.allocation or self.mode) == "spread":
            return 100.0 * (pool.free - job.demand) / pool.cap
        return 100.0 * (pool.cap - pool.free + job.demand) / pool.cap


class TopologyLocality:
    """NVLink / rack / block wishes met: 100 when all GPU pods share the finest wished level,
    ``100*(k-i)/k`` when they share the i-th of k wished levels, 0 when none (100 without
    wishes)."""

    name: ClassVar[str] = "TopologyLocality"

    def __init__(self, weight: float) -> None:
        self.weight = weight

    def bound(self, job: JobShape, pool: PoolState | None, memo: PoolMemo | None) -> float:
        return 100.0

    def score(self, job: JobShape, plan: Plan) -> float:
        return plan.topo


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


def _histogram(pool: PoolState) -> str:
    return ", ".join(f"{f}:{c}" for f, c in enumerate(pool.counts) if c and f) or "none"


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
