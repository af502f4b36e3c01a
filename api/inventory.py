"""GPU inventory as the agent reports it and the hub stores it: nodes, clusters, health.

The agent builds :class:`NodeInventory` from Kubernetes Nodes and the Pods bound to them; the
hub keeps the last good :class:`ClusterInventory` per member and wraps it in a
:class:`MemberClusterState` (labels, taints, health) for placement. Resource amounts are
canonical integers (:mod:`gpufed.api.resources`).

Vocabulary (docs/design.md §3): *free* = max(0, allocatable - requested) per node and resource;
*requested* sums every pod bound to the node that has not finished (Terminating pods still hold
their resources). Summaries for people count whole GPUs (``nvidia.com/gpu``) on Ready,
schedulable nodes and ignore taints; a node with the MIG ``single`` strategy exposes MIG slices
under ``nvidia.com/gpu``, so it holds no whole GPUs.

**What an agent may report** (checked by the hub where a report enters,
:func:`gpufed.api.protocol.codec.node_from_pb` and :mod:`gpufed.hub.adapters.sessions`; a report past
these is refused whole and the last good inventory kept): node names are DNS-1123 subdomains
(at most 253 characters, as Kubernetes Node names); label and taint keys are qualified names
and values label values; every amount is between 0 and 2^63 - 1, and an extended resource
(``nvidia.com/gpu``, MIG slices) at most :data:`MAX_DEVICES_PER_NODE` per node; at most
:data:`MAX_NODE_LABELS` labels, :data:`MAX_NODE_TAINTS` taints, :data:`MAX_NODE_RESOURCES`
resource names per map, :data:`MAX_NODE_JOBS` jobs per node, :data:`MAX_NODES_PER_MEMBER`
nodes per member, :data:`MAX_NODES_PER_PART` nodes per message.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_serializer

from gpufed.api.labels import (
    DEFAULT_BLOCK_LABEL,
    DEFAULT_RACK_LABEL,
    GPU_CLIQUE_LABEL,
    GPU_PRODUCT_LABEL,
    GPU_RESOURCE,
    MIG_STRATEGY_LABEL,
)

#: Most nodes one member may report (GKE's largest supported cluster is 15,000 nodes).
MAX_NODES_PER_MEMBER = 15_000
#: Most nodes in one inventory message (a snapshot part, a delta's upserts): the hub decodes and
#: checks one message in one turn of its event loop, about 0.1 ms per node (so ~3 ms a part);
#: agents split by this count as well as by size. A 15,000-node member takes 469 parts.
MAX_NODES_PER_PART = 32
#: Most of one extended resource a node may offer (an HGX node has 8 GPUs, 56 MIG slices).
MAX_DEVICES_PER_NODE = 4096
#: Most labels, taints, resource names (per map) and job entries on one reported node.
MAX_NODE_LABELS = 1024
MAX_NODE_TAINTS = 256
MAX_NODE_RESOURCES = 256
MAX_NODE_JOBS = 1024
#: Largest amount of any resource (Kubernetes' int64).
MAX_AMOUNT = 2**63 - 1
#: Most DRA device groups per node, and attributes (versions, capacities) per group.
MAX_DEVICE_GROUPS = 16
MAX_GROUP_ATTRIBUTES = 32

_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_QUALIFIED_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")


def is_dns1123_subdomain(name: str) -> bool:
    """Kubernetes object names such as Node names: lowercase alphanumerics, ``-`` and ``.``,
    alphanumeric at both ends of each dot-separated part, 1 to 253 characters."""
    return 0 < len(name) <= 253 and _DNS1123_SUBDOMAIN.fullmatch(name) is not None


def is_qualified_name(key: str) -> bool:
    """Kubernetes label, taint and resource keys: ``[prefix/]name``, a DNS-1123 subdomain
    prefix and a name of 1 to 63 characters (``nvidia.com/gpu.product``)."""
    prefix, slash, name = key.rpartition("/")
    if slash and not is_dns1123_subdomain(prefix):
        return False
    return 0 < len(name) <= 63 and _QUALIFIED_NAME.fullmatch(name) is not None


def is_label_value(value: str) -> bool:
    """Kubernetes label values: empty, or at most 63 characters of ``[A-Za-z0-9._-]``,
    alphanumeric at both ends."""
    return len(value) <= 63 and _LABEL_VALUE.fullmatch(value) is not None


TaintEffect = Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]
MigStrategy = Literal["none", "single", "mixed"]
MIG_STRATEGIES: frozenset[str] = frozenset({"none", "single", "mixed"})


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Taint(_Frozen):
    """A node or member-cluster taint (``spec.taints[]`` of a Node)."""

    key: str
    value: str = ""
    effect: TaintEffect


class Toleration(_Frozen):
    """A pod toleration (``spec.tolerations[]``), Kubernetes semantics.

    An empty ``key`` with operator ``Exists`` tolerates every taint; an empty ``effect``
    matches every effect. ``toleration_seconds`` (``tolerationSeconds``): how long a pod stays
    bound after a matching ``NoExecute`` taint appears; it does not change what the toleration
    tolerates when scheduling, so placement only carries it.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    key: str = ""
    operator: Literal["Equal", "Exists"] = "Equal"
    value: str = ""
    effect: Literal["", "NoSchedule", "PreferNoSchedule", "NoExecute"] = ""
    toleration_seconds: int | None = Field(default=None, alias="tolerationSeconds")

    def tolerates(self, taint: Taint) -> bool:
        """Whether this toleration matches ``taint`` (k8s.io/api/core/v1 ToleratesTaint)."""
        if self.effect and self.effect != taint.effect:
            return False
        if self.key and self.key != taint.key:
            return False
        if self.operator == "Exists":
            return True
        return self.value == taint.value


def tolerates_all(tolerations: Iterable[Toleration], taints: Iterable[Taint]) -> bool:
    """True when every scheduling-blocking taint (NoSchedule, NoExecute) is tolerated.

    ``PreferNoSchedule`` never blocks scheduling, so it is ignored here.
    """
    tols = tuple(tolerations)
    return all(
        any(t.tolerates(taint) for t in tols)
        for taint in taints
        if taint.effect != "PreferNoSchedule"
    )


class DeviceGroup(_Frozen):
    """Whole GPUs of one node that NVIDIA's DRA driver (``gpu.nvidia.com``) publishes in a
    ResourceSlice with the same attributes and capacity; the agent groups a node's devices so
    that a report grows with the kinds of GPU on a node, not with their number.

    ``count``: devices of the group (``type: gpu`` devices of the pool's newest generation);
    ``allocated``: how many of them ResourceClaims hold (``status.allocation``). Attributes
    are those of :data:`gpufed.api.dra.KEPT_ATTRIBUTES` (per-device identities such as
    ``uuid`` and ``pciBusID`` are not kept), keyed by their name without the driver's domain
    (``productName``): ``attributes`` holds string, int and bool values, ``versions`` the
    semantic versions (``driverVersion`` -> ``"580.82.7"``); ``capacity`` = canonical
    integers (``memory`` in bytes).
    """

    count: int = Field(ge=1, le=MAX_DEVICES_PER_NODE)
    allocated: int = Field(default=0, ge=0, le=MAX_DEVICES_PER_NODE)
    attributes: dict[str, bool | int | str] = Field(default_factory=dict)
    versions: dict[str, str] = Field(default_factory=dict)
    capacity: dict[str, int] = Field(default_factory=dict)


class NodeInventory(_Frozen):
    """One member node as placement sees it.

    Sources: ``name`` = Node ``metadata.name``; ``labels`` = Node labels (a dict, or a
    read-only :class:`~gpufed.api.nodelabels.NodeLabels` in nodes the hub decoded); ``gpu_product`` =
    label ``nvidia.com/gpu.product``; ``mig_strategy`` = label ``nvidia.com/mig.strategy``
    ("none" when absent); ``nvlink_domain`` = ``"clique:<nvidia.com/gpu.clique>"`` for nodes of
    a multi-node NVLink domain, else ``"node:<name>"`` (an 8-GPU HGX node is its own domain);
    ``rack``/``block`` = values of the configured topology labels; ``ready`` = Node condition
    Ready is True; ``unschedulable`` = ``spec.unschedulable`` (cordoned); ``taints`` =
    ``spec.taints``; ``allocatable`` = ``status.allocatable``; ``requested`` = sum of the
    effective requests of unfinished pods bound to the node; ``job_requests`` = the part of
    ``requested`` held by pods carrying the ``gpufed.io/job-uid`` label, by job UID (lets the
    reservation ledger see that a dispatched job's pods are bound). ``degraded`` carries the
    reason when the agent could not read the node fully (it then offers nothing).

    ``dra_gpus``: the node's whole GPUs as NVIDIA's DRA driver publishes them (ResourceSlices
    of ``gpu.nvidia.com``), empty for a node whose GPUs are the device plugin's extended
    resource. On a DRA node ``allocatable[nvidia.com/gpu]`` is their count and
    ``requested[nvidia.com/gpu]`` the ones ResourceClaims hold, so everything that counts GPUs
    counts them once; only pods that claim GPUs through DRA can use them (placement keeps the
    two kinds of node in separate pools).
    """

    name: str
    labels: Mapping[str, str] = Field(default_factory=dict)
    gpu_product: str | None = None
    mig_strategy: MigStrategy = "none"
    nvlink_domain: str
    rack: str | None = None
    block: str | None = None
    ready: bool = True
    unschedulable: bool = False
    taints: tuple[Taint, ...] = ()
    allocatable: dict[str, int] = Field(default_factory=dict)
    requested: dict[str, int] = Field(default_factory=dict)
    job_requests: dict[str, dict[str, int]] = Field(default_factory=dict)
    degraded: str | None = None
    dra_gpus: tuple[DeviceGroup, ...] = ()

    @field_serializer("labels")
    def _labels_out(self, labels: Mapping[str, str]) -> dict[str, str]:
        # decoded nodes hold read-only :class:`gpufed.api.nodelabels.NodeLabels`
        return labels if type(labels) is dict else dict(labels.items())

    @property
    def gpus_via_dra(self) -> bool:
        """True when the node's GPUs are claimed through DRA (it publishes ResourceSlices)."""
        return bool(self.dra_gpus)

    @property
    def offers_capacity(self) -> bool:
        """Ready, not cordoned and not degraded (taints are judged per job)."""
        return self.ready and not self.unschedulable and self.degraded is None

    def free(self, resource: str) -> int:
        """``max(0, allocatable - requested)`` for one resource; never negative."""
        return max(0, self.allocatable.get(resource, 0) - self.requested.get(resource, 0))

    @property
    def whole_gpus_allocatable(self) -> int:
        """Allocatable whole GPUs: ``nvidia.com/gpu``, except 0 under the MIG single strategy."""
        return 0 if self.mig_strategy == "single" else self.allocatable.get(GPU_RESOURCE, 0)

    @property
    def whole_gpus_free(self) -> int:
        """Free whole GPUs (0 under the MIG single strategy, whose GPUs are slices)."""
        return 0 if self.mig_strategy == "single" else self.free(GPU_RESOURCE)


def _share_field_keys(cls: type[BaseModel]) -> None:
    """Register ``cls``'s field names, in field order, as the keys its instances' ``__dict__``
    share (CPython's key-sharing dictionaries): a node the hub decodes
    (:func:`gpufed.api.protocol.packed.unpack_nodes`) then holds its field values without a
    dict table of its own (~190 bytes instead of 464; issue 25's hub RSS). Must run before
    the first instances are made: CPython stops adding shared keys after a few dozen."""
    probe = object.__new__(cls)
    for name in cls.model_fields:
        object.__setattr__(probe, name, None)


_share_field_keys(NodeInventory)


class ClusterInventory(_Frozen):
    """The last good inventory report of one member cluster, as the agent sent it.

    ``served_kinds``: workload kinds the member's API serves, as ``Kind.group`` strings
    (``Job.batch``, ``JobSet.jobset.x-k8s.io``, ``PyTorchJob.kubeflow.org``); see
    :func:`workload_kind`.
    """

    cluster: str
    nodes: tuple[NodeInventory, ...] = ()
    served_kinds: frozenset[str] = frozenset({"Job.batch"})
    agent_version: str = ""


class ClusterHealth(_Frozen):
    """Hub-side health of a member, from the hub's own receive times (never member clocks)."""

    ready: bool
    reason: str = ""
    message: str = ""


class MemberClusterState(_Frozen):
    """Everything placement needs about one member: identity, labels, taints, health, nodes.

    ``labels`` and ``taints`` come from the hub's MemberCluster object (``spec.labels``,
    ``spec.taints``), not from the member; ``inventory`` is the agent's last good report.
    """

    name: str
    labels: dict[str, str] = Field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    health: ClusterHealth = ClusterHealth(ready=True)
    inventory: ClusterInventory


class GPUSummary(_Frozen):
    """Per-product summary for people (docs/design.md §3): whole GPUs on Ready, schedulable nodes.

    ``gpus_total`` / ``gpus_free``: GPU product -> whole GPUs; taints are ignored.
    ``largest_free_nvlink_block``: the most free whole GPUs inside one NVLink domain (8 for an
    idle HGX node, 72 for an idle NVL72 clique); ``largest_free_nvlink_block_by_product``: the
    same per GPU product (a domain's GPUs counted under each node's product).
    """

    gpus_total: dict[str, int] = Field(default_factory=dict)
    gpus_free: dict[str, int] = Field(default_factory=dict)
    largest_free_nvlink_block: int = 0
    largest_free_nvlink_block_by_product: dict[str, int] = Field(default_factory=dict)


def summarize(nodes: Iterable[NodeInventory]) -> GPUSummary:
    """Build the :class:`GPUSummary` of a set of nodes (one cluster's, usually)."""
    total: dict[str, int] = {}
    free: dict[str, int] = {}
    blocks: dict[tuple[str, str], int] = {}
    # The properties (offers_capacity, whole_gpus_allocatable, whole_gpus_free) inlined: the
    # hub summarises every member's nodes for each MemberCluster status write, and at 5,000
    # nodes a member the property calls were most of the time (`gpufed bench scale`).
    for node in nodes:
        if not node.ready or node.unschedulable or node.degraded is not None:
            continue
        if node.mig_strategy == "single":
            continue
        alloc = node.allocatable.get(GPU_RESOURCE, 0)
        if alloc == 0:
            continue
        free_gpus = max(0, alloc - node.requested.get(GPU_RESOURCE, 0))
        product = node.gpu_product or "unknown"
        total[product] = total.get(product, 0) + alloc
        free[product] = free.get(product, 0) + free_gpus
        key = (node.nvlink_domain, product)
        blocks[key] = blocks.get(key, 0) + free_gpus
    domains: dict[str, int] = {}
    by_product: dict[str, int] = {}
    for (domain, product), n in blocks.items():
        domains[domain] = domains.get(domain, 0) + n
        by_product[product] = max(by_product.get(product, 0), n)
    return GPUSummary(
        gpus_total=total,
        gpus_free=free,
        largest_free_nvlink_block=max(domains.values(), default=0),
        largest_free_nvlink_block_by_product=by_product,
    )


def workload_kind(api_version: str, kind: str) -> str:
    """``Kind.group`` for an object's ``apiVersion``/``kind`` (``batch/v1``, ``Job`` -> ``Job.batch``).

    The core group has no suffix (``v1``, ``ConfigMap`` -> ``ConfigMap``).
    """
    group = api_version.rsplit("/", 1)[0] if "/" in api_version else ""
    return f"{kind}.{group}" if group else kind


def nvlink_domain_id(node_name: str, labels: Mapping[str, str], clique_label: str) -> str:
    """The NVLink domain id of a node: ``clique:<value>`` when it has a clique label, else
    ``node:<name>``."""
    clique = labels.get(clique_label)
    return f"clique:{clique}" if clique else f"node:{node_name}"


@dataclass(frozen=True, slots=True)
class TopologyLabels:
    """Node label keys of the topology levels (configurable; docs/design.md §3): the rack and block
    network levels, and the multi-node NVLink domain (GFD's ``nvidia.com/gpu.clique``)."""

    rack: str = DEFAULT_RACK_LABEL
    block: str = DEFAULT_BLOCK_LABEL
    clique: str = GPU_CLIQUE_LABEL


def node_from_labels(
    name: str,
    labels: Mapping[str, str],
    *,
    topology: TopologyLabels | None = None,
    gpu_product: str | None = None,
    **fields: Any,
) -> NodeInventory:
    """A :class:`NodeInventory` whose label-derived fields come from the Node's labels.

    ``gpu_product`` = ``nvidia.com/gpu.product``; ``mig_strategy`` = ``nvidia.com/mig.strategy``
    ("none" when absent or not a known strategy — callers that must flag odd values check
    :data:`MIG_STRATEGIES` themselves); ``nvlink_domain`` = the clique or the node
    (:func:`nvlink_domain_id`); ``rack`` / ``block`` = the configured topology labels.
    ``gpu_product``: the product when the node has no ``nvidia.com/gpu.product`` label (a DRA
    node's devices name it). ``fields`` sets everything else (``ready``, ``taints``,
    ``allocatable``, ``requested`` …).
    The one place that reads these labels, for the agent, the sandbox and the simulator.
    """
    keys = topology or TopologyLabels()
    mig = labels.get(MIG_STRATEGY_LABEL, "none")
    return NodeInventory(
        name=name,
        labels=dict(labels),
        gpu_product=labels.get(GPU_PRODUCT_LABEL) or gpu_product or None,
        mig_strategy=mig if mig in MIG_STRATEGIES else "none",
        nvlink_domain=nvlink_domain_id(name, labels, keys.clique),
        rack=labels.get(keys.rack) or None,
        block=labels.get(keys.block) or None,
        **fields,
    )
