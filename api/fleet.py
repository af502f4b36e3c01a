"""Fleet spec (docs/design.md §5): member clusters described as pools of GPU nodes.

The sandbox turns a fleet into kwok nodes carrying the labels and capacities that NVIDIA GPU
Feature Discovery (GFD) and the NVIDIA device plugin publish; the placement simulator reads the
same file. Both go through :func:`node_specs`, the one pure expansion of a cluster into nodes, so
what the simulator places on is exactly what the sandbox creates.

Input is YAML with camelCase keys (``nodePools``, ``memoryMiB``, ``nodesPerDomain``)::

    clusters:
      - name: us-east-hgx
        labels: {region: us-east}
        nodePools:
          - name: h100
            nodes: 16
            gpu: {product: NVIDIA-H100-80GB-HBM3, count: 8, memoryMiB: 81559}
            nvlink: node                  # or {nodesPerDomain: 18}
            rackSize: 4
            mig: {strategy: mixed, gpus: 2, profiles: {1g.10gb: 7}}
            taints: [{key: dedicated, value: inference, effect: NoSchedule}]
        operators: [jobset, training-operator]   # workload operators the sandbox runs there

Invalid input raises :class:`FleetError`, whose message names every offending field (as a path
such as ``clusters[2].nodePools[0].mig.profiles``) and says how to fix it
(:mod:`gpufed.api.fleetcheck`). The expansion into nodes is :mod:`gpufed.api.fleetnodes`.

What is known about each GPU product (memory, family, MIG profiles) is the GPU catalogue,
:mod:`gpufed.api.gpus`; quantities are canonicalised by :mod:`gpufed.api.resources`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_serializer,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

# Validation errors and checks (fleetcheck) and the expansion into nodes (fleetnodes) live in
# their own modules; their public names are re-exported here, so `from gpufed.api.fleet import
# FleetError, NodeSpec, node_specs` keeps working.
from gpufed.api.fleetcheck import (
    _LABEL_VALUE_RE,
    _MAX_LABEL_VALUE,
    _PRODUCT_RE,
    FleetError,
    FleetIssue,
    _check_dns_label,
    _issues_from,
    _IssuesError,
    _mig_issues,
)
from gpufed.api.fleetnodes import NodeSpec, _node_name, clique_id, node_specs
from gpufed.api.gpus import (
    GPU_FAMILIES,
    KNOWN_GPUS,
    GPUModel,
    MigProfileShape,
    family_from_product,
)
from gpufed.api.inventory import Taint
from gpufed.api.labels import HOSTNAME_LABEL, NODE_POOL_LABEL
from gpufed.api.resources import QuantityError, canonical_quantity

__all__ = [
    "HUB_CLUSTER_NAME",
    "KNOWN_GPUS",
    "NODE_POOL_LABEL",
    "ClusterSpec",
    "FleetError",
    "FleetIssue",
    "FleetSpec",
    "GPUModel",
    "GPUSpec",
    "MigProfileShape",
    "MigSpec",
    "NVLinkDomains",
    "NodePoolSpec",
    "NodeSpec",
    "canonical_quantity",
    "clique_id",
    "node_specs",
]

#: Reserved: the sandbox's hub control plane uses this name and kubeconfig context.
HUB_CLUSTER_NAME = "hub"


# --- the model ----------------------------------------------------------------------------------------


class _Model(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )


class GPUSpec(_Model):
    """The GPUs of every node in a pool.

    ``product``: GFD label value (``nvidia.com/gpu.product``), e.g. ``NVIDIA-H100-80GB-HBM3``;
    ``count``: GPUs per node (>= 1); ``memory_mib`` (YAML ``memoryMiB``): NVML total memory per
    GPU in MiB, taken from :data:`KNOWN_GPUS` when omitted; ``family``: GFD family, derived from
    the product when omitted.
    """

    product: str
    count: int
    memory_mib: int | None = Field(default=None, alias="memoryMiB")
    family: str | None = None

    @field_validator("product")
    @classmethod
    def _product_format(cls, v: str) -> str:
        if not _PRODUCT_RE.match(v):
            fixed = "-".join(re.sub(r"[^A-Za-z0-9_. -]", "", v).split())
            raise ValueError(
                f"{v!r} is not a GPU Feature Discovery product label value (letters, digits, "
                f"'-', '_', '.', at most 63 characters, no spaces); GFD would publish "
                f"{fixed!r}. Known products: {', '.join(KNOWN_GPUS)}"
            )
        return v

    @field_validator("count")
    @classmethod
    def _count_positive(cls, v: int) -> int:
        if v < 1:
            raise ValueError(
                f"{v} GPUs per node; count must be >= 1 (8 for an HGX node, 4 for a GB200 "
                "tray). Leave CPU-only nodes out of the fleet."
            )
        return v

    @field_validator("memory_mib")
    @classmethod
    def _memory_positive(cls, v: int | None) -> int | None:
        if v is not None and v < 1:
            raise ValueError(f"{v} MiB; give the NVML total memory per GPU in MiB (e.g. 81559)")
        return v

    @model_validator(mode="after")
    def _known_or_complete(self) -> GPUSpec:
        issues = []
        if self.known is None and self.memory_mib is None:
            issues.append(
                FleetIssue(
                    "memoryMiB",
                    f"required for {self.product!r}, which is not in the known-product table "
                    f"({', '.join(KNOWN_GPUS)}); give the NVML total memory in MiB",
                )
            )
        if self.family is not None and self.family not in GPU_FAMILIES:
            issues.append(
                FleetIssue(
                    "family",
                    f"{self.family!r} is not a GFD family; use one of {', '.join(GPU_FAMILIES)}",
                )
            )
        elif self.resolved_family is None:
            issues.append(
                FleetIssue(
                    "family",
                    f"cannot derive the GPU family from {self.product!r}; set gpu.family "
                    f"(one of {', '.join(GPU_FAMILIES)})",
                )
            )
        if issues:
            raise _IssuesError(issues)
        return self

    @property
    def known(self) -> GPUModel | None:
        """The :data:`KNOWN_GPUS` entry of this product, if any."""
        return KNOWN_GPUS.get(self.product)

    @property
    def resolved_memory_mib(self) -> int:
        """Memory per GPU in MiB: the given value, else the known product's."""
        if self.memory_mib is not None:
            return self.memory_mib
        assert self.known is not None  # validated
        return self.known.memory_mib

    @property
    def resolved_family(self) -> str | None:
        """GFD family: the given value, else the known product's, else derived from the name."""
        if self.family:
            return self.family
        if self.known is not None:
            return self.known.family
        return family_from_product(self.product)


class NVLinkDomains(_Model):
    """A multi-node NVLink domain: ``nodes_per_domain`` nodes (YAML ``nodesPerDomain``) share one
    ``nvidia.com/gpu.clique`` value (18 for a GB200 NVL72 rack of 4-GPU trays)."""

    nodes_per_domain: int

    @field_validator("nodes_per_domain")
    @classmethod
    def _at_least_two(cls, v: int) -> int:
        if v < 2:
            raise ValueError(
                f"{v}; a multi-node NVLink domain has >= 2 nodes (write nvlink: node when each "
                "node is its own NVLink domain)"
            )
        return v


class MigSpec(_Model):
    """MIG partitioning of a pool's GPUs (NVIDIA device plugin strategies).

    ``mixed``: ``gpus`` GPUs per node (default: all) are each split into ``profiles`` (profile ->
    instances per GPU); the node then offers ``nvidia.com/gpu`` = count - gpus and
    ``nvidia.com/mig-<profile>`` = instances x gpus. ``single``: every GPU is split into one
    profile and the instances are offered as ``nvidia.com/gpu``.
    """

    strategy: Literal["mixed", "single"]
    gpus: int | None = None
    profiles: dict[str, int]

    @field_validator("profiles")
    @classmethod
    def _profiles_positive(cls, v: dict[str, int]) -> dict[str, int]:
        if not v:
            raise ValueError("no profiles given; e.g. profiles: {1g.10gb: 7}")
        bad = {k: n for k, n in v.items() if n < 1}
        if bad:
            raise ValueError(f"{bad}: instances per GPU must be >= 1; drop unused profiles")
        return v


class NodePoolSpec(_Model):
    """A group of identical nodes in one member cluster.

    ``nodes``: node count; ``gpu``: per-node GPUs; ``nvlink``: ``None`` (YAML ``node``, each
    node is one NVLink domain) or :class:`NVLinkDomains`; ``rack_size``: nodes per rack label
    value (defaults to ``nodesPerDomain`` for multi-node NVLink pools, else no rack labels);
    ``racks_per_block``: racks per block label value (default: all racks of the pool in one
    block); ``mig``; ``taints`` and extra node ``labels``; ``cpu``/``memory`` (Kubernetes
    quantities per node, default 16 cores and 256Gi per GPU) and ``pods`` (max pods per node).
    ``dra``: the pool's GPUs are published through DRA (ResourceSlices of ``gpu.nvidia.com``
    with the driver's device names and attributes, by the sandbox's simulated driver) instead
    of the ``nvidia.com/gpu`` extended resource; not with ``mig``.
    """

    name: str
    nodes: int
    gpu: GPUSpec
    nvlink: NVLinkDomains | None = None
    rack_size: int | None = None
    racks_per_block: int | None = None
    mig: MigSpec | None = None
    taints: tuple[Taint, ...] = ()
    labels: dict[str, str] = Field(default_factory=dict)
    cpu: str | None = None
    memory: str | None = None
    pods: int = 110
    dra: bool = False

    @field_validator("name")
    @classmethod
    def _dns_name(cls, v: str) -> str:
        return _check_dns_label(v, "pool")

    @field_validator("nodes")
    @classmethod
    def _nodes_positive(cls, v: int) -> int:
        if v < 1:
            raise ValueError(f"{v}; a pool needs >= 1 node (remove the pool instead)")
        return v

    @field_validator("nvlink", mode="before")
    @classmethod
    def _nvlink_shorthand(cls, v: Any) -> Any:
        if v is None or v == "node":
            return None
        if isinstance(v, str):
            raise ValueError(
                f"{v!r}; use 'node' (each node is one NVLink domain, HGX/DGX) or "
                "{nodesPerDomain: N} (N nodes share one nvidia.com/gpu.clique, e.g. 18 for NVL72)"
            )
        return v

    @field_serializer("nvlink")
    def _nvlink_out(self, v: NVLinkDomains | None) -> Any:
        return "node" if v is None else v.model_dump(by_alias=True)

    @field_validator("rack_size", "racks_per_block", "pods")
    @classmethod
    def _positive(cls, v: int | None) -> int | None:
        if v is not None and v < 1:
            raise ValueError(f"{v}; must be >= 1")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> NodePoolSpec:
        issues: list[FleetIssue] = []
        if self.nvlink is not None and self.nodes % self.nvlink.nodes_per_domain:
            n, k = self.nodes, self.nvlink.nodes_per_domain
            lower, upper = (n // k) * k, (n // k + 1) * k
            fix = f"nodes: {upper}" if lower == 0 else f"nodes: {lower} or {upper}"
            issues.append(
                FleetIssue(
                    "nvlink.nodesPerDomain",
                    f"{k} does not divide nodes ({n}); every NVLink domain must be whole: "
                    f"use {fix}, or a nodesPerDomain that divides {n}",
                )
            )
        if self.mig is not None:
            issues.extend(_mig_issues(self.mig, self.gpu))
            if self.dra:
                issues.append(
                    FleetIssue(
                        "dra",
                        "MIG through DRA is not simulated (gpufed reads whole GPUs only); "
                        "remove mig, or dra",
                    )
                )
        for key, value in self.labels.items():
            if key.startswith("nvidia.com/") or key in (HOSTNAME_LABEL, NODE_POOL_LABEL):
                issues.append(
                    FleetIssue(
                        f"labels.{key}",
                        "set by the sandbox from the pool (GFD, device plugin, hostname); "
                        "remove it",
                    )
                )
            elif len(value) > _MAX_LABEL_VALUE or not _LABEL_VALUE_RE.match(value):
                issues.append(FleetIssue(f"labels.{key}", f"{value!r} is not a label value"))
        for q_field in ("cpu", "memory"):
            q = getattr(self, q_field)
            if q is None:
                continue
            try:
                canonical_quantity(q, field=q_field)
            except QuantityError:
                issues.append(
                    FleetIssue(q_field, f"{q!r} is not a Kubernetes quantity (e.g. '128', '2Ti')")
                )
        if issues:
            raise _IssuesError(issues)
        return self

    @property
    def partitioned_gpus(self) -> int:
        """GPUs per node split into MIG instances (0 without MIG)."""
        if self.mig is None:
            return 0
        if self.mig.strategy == "single":
            return self.gpu.count
        return self.gpu.count if self.mig.gpus is None else self.mig.gpus

    @property
    def effective_rack_size(self) -> int | None:
        """Nodes per rack label value, or None when the pool has no rack labels."""
        if self.rack_size is not None:
            return self.rack_size
        return self.nvlink.nodes_per_domain if self.nvlink is not None else None


#: Workload operators the sandbox can run in a member (``clusters[].operators``), each serving
#: its kinds there: ``jobset`` (JobSet), ``training-operator`` (PyTorchJob), ``kuberay``
#: (RayJob, RayCluster). The sandbox's :mod:`gpufed.sandbox.operators` builds and runs them.
KNOWN_OPERATORS: tuple[str, ...] = ("jobset", "training-operator", "kuberay")


class ClusterSpec(_Model):
    """One member cluster: ``name`` (DNS label; also its kubeconfig context), ``labels`` (the
    MemberCluster labels that ``clusterSelector`` matches), its ``node_pools``, the workload
    ``operators`` the sandbox runs in it (names from :data:`KNOWN_OPERATORS`, each at most once;
    none by default: the member then serves ``batch/v1`` Jobs only), and ``computeDomains``:
    install NVIDIA's ComputeDomain CRD in it, with the sandbox's simulated ComputeDomain
    controller (:mod:`gpufed.sandbox.cddriver`), so multi-node NVLink jobs get ComputeDomains
    there."""

    name: str
    labels: dict[str, str] = Field(default_factory=dict)
    node_pools: tuple[NodePoolSpec, ...]
    compute_domains: bool = False
    operators: tuple[str, ...] = ()

    @field_validator("operators")
    @classmethod
    def _known_operators(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for i, name in enumerate(v):
            if name not in KNOWN_OPERATORS:
                raise ValueError(
                    f"operators[{i}]: unknown operator {name!r}; choose from "
                    f"{', '.join(KNOWN_OPERATORS)}"
                )
            if name in v[:i]:
                raise ValueError(f"operators[{i}]: {name!r} is listed twice; list it once")
        return v

    @field_validator("name")
    @classmethod
    def _dns_name(cls, v: str) -> str:
        _check_dns_label(v, "cluster")
        if v == HUB_CLUSTER_NAME:
            raise ValueError(
                f"{v!r} is reserved for the sandbox's hub cluster; choose another name"
            )
        return v

    @field_validator("node_pools")
    @classmethod
    def _some_pools(cls, v: tuple[NodePoolSpec, ...]) -> tuple[NodePoolSpec, ...]:
        if not v:
            raise ValueError("a cluster needs at least one node pool")
        return v

    @model_validator(mode="after")
    def _unique_pools_and_names(self) -> ClusterSpec:
        issues: list[FleetIssue] = []
        seen: dict[str, int] = {}
        for i, pool in enumerate(self.node_pools):
            if pool.name in seen:
                issues.append(
                    FleetIssue(
                        f"nodePools[{i}].name",
                        f"duplicate pool name {pool.name!r} (also nodePools[{seen[pool.name]}]); "
                        "pool names must be unique within a cluster",
                    )
                )
            seen.setdefault(pool.name, i)
            longest = _node_name(self.name, pool.name, pool.nodes - 1, pool.nodes)
            if len(longest) > _MAX_LABEL_VALUE:
                issues.append(
                    FleetIssue(
                        f"nodePools[{i}].name",
                        f"node names such as {longest!r} exceed 63 characters (they are also "
                        "the kubernetes.io/hostname label); shorten the cluster or pool name",
                    )
                )
        if issues:
            raise _IssuesError(issues)
        return self

    @property
    def node_count(self) -> int:
        """Nodes in all pools."""
        return sum(p.nodes for p in self.node_pools)


class FleetSpec(_Model):
    """A fleet: the member clusters (at least one, unique names)."""

    clusters: tuple[ClusterSpec, ...]

    @field_validator("clusters")
    @classmethod
    def _some_clusters(cls, v: tuple[ClusterSpec, ...]) -> tuple[ClusterSpec, ...]:
        if not v:
            raise ValueError("a fleet needs at least one member cluster")
        return v

    @model_validator(mode="after")
    def _unique_clusters(self) -> FleetSpec:
        issues: list[FleetIssue] = []
        seen: dict[str, int] = {}
        for i, c in enumerate(self.clusters):
            if c.name in seen:
                issues.append(
                    FleetIssue(
                        f"clusters[{i}].name",
                        f"duplicate cluster name {c.name!r} (also clusters[{seen[c.name]}]); "
                        "cluster names must be unique in a fleet",
                    )
                )
            seen.setdefault(c.name, i)
        if issues:
            raise _IssuesError(issues)
        return self

    # --- loading -------------------------------------------------------------------------------

    @classmethod
    def from_dict(cls, data: Any, *, source: str | None = None) -> FleetSpec:
        """Validate parsed YAML/JSON. Raises :class:`FleetError` listing every problem."""
        if not isinstance(data, Mapping):
            raise FleetError(
                [
                    FleetIssue(
                        "", f"expected a mapping with a 'clusters' list, got {type(data).__name__}"
                    )
                ],
                source,
            )
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise FleetError(_issues_from(exc), source) from None

    @classmethod
    def loads(cls, text: str, *, source: str | None = None) -> FleetSpec:
        """Parse YAML text. Raises :class:`FleetError` (bad YAML included)."""
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise FleetError([FleetIssue("", f"not valid YAML: {exc}")], source) from None
        return cls.from_dict(data, source=source)

    @classmethod
    def load(cls, path: str | Path) -> FleetSpec:
        """Read and validate a fleet file. Raises :class:`FleetError` naming the file when it
        cannot be read or is invalid."""
        p = Path(path)
        try:
            text = p.read_text(encoding="utf-8")
        except OSError as exc:
            reason = exc.strerror or str(exc)
            raise FleetError([FleetIssue("", f"cannot read the file: {reason}")], str(p)) from None
        return cls.loads(text, source=str(p))

    def to_yaml(self) -> str:
        """The fleet as YAML with the camelCase keys of the input format."""
        data = self.model_dump(by_alias=True, exclude_none=True, exclude_defaults=True)
        return yaml.safe_dump(data, sort_keys=False)

    def cluster(self, name: str) -> ClusterSpec:
        """The member named ``name``; KeyError naming the known clusters otherwise."""
        for c in self.clusters:
            if c.name == name:
                return c
        raise KeyError(f"no cluster {name!r} in the fleet (clusters: {', '.join(self.names)})")

    @property
    def names(self) -> list[str]:
        """Member cluster names in file order."""
        return [c.name for c in self.clusters]
