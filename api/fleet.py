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

Invalid input raises :class:`FleetError`, whose message names every offending field (as a path
such as ``clusters[2].nodePools[0].mig.profiles``) and says how to fix it.

What is known about each GPU product (memory, family, MIG profiles) is the GPU catalogue,
:mod:`gpufed.api.gpus`; quantities are canonicalised by :mod:`gpufed.api.resources`.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
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

from gpufed.api.gpus import (
    GPU_FAMILIES,
    KNOWN_GPUS,
    GPUModel,
    MigProfileShape,
    compute_capability_of_family,
    family_from_product,
    mig_profile_memory_mib,
)
from gpufed.api.inventory import Taint
from gpufed.api.labels import (
    DEFAULT_BLOCK_LABEL,
    DEFAULT_RACK_LABEL,
    GPU_CLIQUE_LABEL,
    GPU_COUNT_LABEL,
    GPU_FAMILY_LABEL,
    GPU_MEMORY_LABEL,
    GPU_PRODUCT_LABEL,
    GPU_RESOURCE,
    HOSTNAME_LABEL,
    MIG_RESOURCE_PREFIX,
    MIG_STRATEGY_LABEL,
)
from gpufed.api.resources import QuantityError, canonical_quantity

__all__ = [
    "HUB_CLUSTER_NAME",
    "KNOWN_GPUS",
    "NODE_POOL_LABEL",
    "ClusterSpec",
    "FleetError",
    "FleetSpec",
    "GPUModel",
    "GPUSpec",
    "MigProfileShape",
    "MigSpec",
    "NVLinkDomains",
    "NodePoolSpec",
    "NodeSpec",
    "canonical_quantity",
    "node_specs",
]

#: Node label naming the fleet node pool a simulated node belongs to (gpufed-owned).
NODE_POOL_LABEL = "gpufed.io/node-pool"
#: Reserved: the sandbox's hub control plane uses this name and kubeconfig context.
HUB_CLUSTER_NAME = "hub"

# GFD's sanitise(): characters outside [A-Za-z0-9-_. ] are dropped and blanks become "-", so a
# product label value never contains a space; it is also a label value (<= 63 characters).
_PRODUCT_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?$")
_DNS_LABEL_RE = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")
_LABEL_VALUE_RE = re.compile(r"^([A-Za-z0-9]([A-Za-z0-9_.-]*[A-Za-z0-9])?)?$")
_MAX_LABEL_VALUE = 63


# --- errors -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FleetIssue:
    """One problem in a fleet: ``path`` like ``clusters[0].nodePools[1].gpu.count``."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class FleetError(ValueError):
    """An invalid fleet spec. ``issues`` lists every problem; the message shows them all,
    prefixed by the file name when the fleet was loaded from a file."""

    def __init__(self, issues: list[FleetIssue], source: str | None = None) -> None:
        self.issues = issues
        self.source = source
        head = f"invalid fleet file {source}" if source else "invalid fleet spec"
        lines = "\n".join(f"  - {i}" for i in issues)
        super().__init__(f"{head}:\n{lines}")


class _IssuesError(ValueError):
    """Raised inside validators: issues with paths relative to the model being validated."""

    def __init__(self, issues: list[FleetIssue]) -> None:
        self.issues = issues
        super().__init__("; ".join(str(i) for i in issues))


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


class ClusterSpec(_Model):
    """One member cluster: ``name`` (DNS label; also its kubeconfig context), ``labels`` (the
    MemberCluster labels that ``clusterSelector`` matches) and its ``node_pools``."""

    name: str
    labels: dict[str, str] = Field(default_factory=dict)
    node_pools: tuple[NodePoolSpec, ...]

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


# --- validation helpers ---------------------------------------------------------------------------


def _check_dns_label(v: str, what: str) -> str:
    if len(v) > _MAX_LABEL_VALUE or not _DNS_LABEL_RE.match(v):
        raise ValueError(
            f"{v!r} is not a valid {what} name: use lowercase letters, digits and '-', "
            "starting and ending with a letter or digit (a DNS label, <= 63 characters)"
        )
    return v


def _mig_issues(mig: MigSpec, gpu: GPUSpec) -> list[FleetIssue]:
    model = gpu.known
    if model is None or not model.mig_profiles:
        capable = [p for p, m in KNOWN_GPUS.items() if m.mig_profiles]
        why = "is not MIG-capable" if model is not None else "has no known MIG profiles"
        return [
            FleetIssue(
                "mig",
                f"{gpu.product} {why}; remove mig, or use a MIG-capable product "
                f"({', '.join(capable)})",
            )
        ]
    issues: list[FleetIssue] = []
    unknown = [p for p in mig.profiles if p not in model.mig_profiles]
    if unknown:
        issues.append(
            FleetIssue(
                "mig.profiles",
                f"{', '.join(unknown)} not a MIG profile of {gpu.product}; its profiles are "
                f"{', '.join(model.mig_profiles)}",
            )
        )
        return issues
    if mig.strategy == "single":
        if len(mig.profiles) != 1:
            issues.append(
                FleetIssue(
                    "mig.profiles",
                    "the single strategy splits every GPU into one profile; give exactly one "
                    "(or use strategy: mixed)",
                )
            )
        if mig.gpus is not None and mig.gpus != gpu.count:
            issues.append(
                FleetIssue(
                    "mig.gpus",
                    f"{mig.gpus}: the single strategy partitions all {gpu.count} GPUs; drop "
                    "mig.gpus or use strategy: mixed",
                )
            )
    elif mig.gpus is not None and not 1 <= mig.gpus <= gpu.count:
        issues.append(
            FleetIssue(
                "mig.gpus",
                f"{mig.gpus} partitioned GPUs per node, but nodes have {gpu.count}; use 1..{gpu.count}",
            )
        )
    compute = memory = 0
    for name, n in mig.profiles.items():
        shape = model.mig_profiles[name]
        compute += shape.compute_slices * n
        memory += shape.memory_slices * n
        if n > shape.max_per_gpu:
            issues.append(
                FleetIssue(
                    f"mig.profiles.{name}",
                    f"{n} instances exceed one {gpu.product}: at most {shape.max_per_gpu} "
                    f"{name} per GPU",
                )
            )
    if not issues and (compute > model.compute_slices or memory > model.memory_slices):
        issues.append(
            FleetIssue(
                "mig.profiles",
                f"{dict(mig.profiles)} does not fit one {gpu.product}: it needs {compute} of "
                f"{model.compute_slices} compute slices and {memory} of {model.memory_slices} "
                "memory slices per GPU; use fewer instances (e.g. 2 x 1g + 1 x 2g + 1 x 3g)",
            )
        )
    return issues


def _loc_path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def _issues_from(exc: ValidationError) -> list[FleetIssue]:
    issues: list[FleetIssue] = []
    for err in exc.errors():
        base = _loc_path(err["loc"])
        inner = (err.get("ctx") or {}).get("error")
        if isinstance(inner, _IssuesError):
            for i in inner.issues:
                path = f"{base}.{i.path}" if base and i.path else base or i.path
                issues.append(FleetIssue(path, i.message))
            continue
        kind = err["type"]
        msg = err["msg"].removeprefix("Value error, ")
        if kind == "extra_forbidden":
            msg = (
                "unknown field; fields are camelCase (docs/design.md §5: nodePools, memoryMiB, "
                "nodesPerDomain, rackSize, racksPerBlock); check the spelling"
            )
        elif kind == "missing":
            msg = "required field is missing"
        issues.append(FleetIssue(base, msg))
    return issues


# --- expansion into nodes ----------------------------------------------------------------------


class NodeSpec(BaseModel):
    """One simulated node, as the sandbox creates it and the simulator places on it.

    ``labels``: GFD/device-plugin labels (``nvidia.com/gpu.*``, ``nvidia.com/mig*``),
    ``kubernetes.io/hostname``/``os``/``arch``, rack/block labels (:data:`DEFAULT_RACK_LABEL`,
    :data:`DEFAULT_BLOCK_LABEL`), ``nvidia.com/gpu.clique`` for multi-node NVLink domains, the
    pool's extra labels and :data:`NODE_POOL_LABEL`. ``taints``: ``spec.taints``.
    ``capacity``/``allocatable``: Kubernetes quantity strings as on ``Node.status``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    cluster: str
    pool: str
    labels: dict[str, str]
    taints: tuple[Taint, ...] = ()
    capacity: dict[str, str]
    allocatable: dict[str, str]


def _node_name(cluster: str, pool: str, index: int, pool_size: int) -> str:
    width = max(3, len(str(pool_size - 1)))
    return f"{cluster}-{pool}-{index:0{width}d}"


def clique_id(cluster: str, pool: str, domain: int) -> str:
    """``nvidia.com/gpu.clique`` value of NVLink domain ``domain`` (0-based) of a pool:
    ``<ClusterUUID>.<CliqueID>`` as GFD publishes it, with a UUID that is stable per pool."""
    fabric = uuid.uuid5(uuid.NAMESPACE_URL, f"gpufed.io/fleet/{cluster}/{pool}")
    return f"{fabric}.{domain}"


def _pool_nodes(cluster: ClusterSpec, pool: NodePoolSpec) -> Iterator[NodeSpec]:
    gpu = pool.gpu
    model = gpu.known
    family = gpu.resolved_family or "undefined"
    major, minor = model.compute_capability if model else compute_capability_of_family(family)
    arch = model.cpu_arch if model else "amd64"
    # Canonical forms, so capacity/allocatable equal what the API server prints back.
    cpu = canonical_quantity(pool.cpu or str(16 * gpu.count))
    memory = canonical_quantity(pool.memory or f"{256 * gpu.count}Gi")

    base: dict[str, str] = dict(pool.labels)
    base.update(
        {
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": arch,
            "type": "kwok",
            NODE_POOL_LABEL: pool.name,
            "nvidia.com/gpu.present": "true",
            GPU_FAMILY_LABEL: family,
            "nvidia.com/gpu.compute.major": str(major),
            "nvidia.com/gpu.compute.minor": str(minor),
            "nvidia.com/mig.capable": "true" if model and model.mig_profiles else "false",
            MIG_STRATEGY_LABEL: pool.mig.strategy if pool.mig else "none",
        }
    )
    resources: dict[str, str] = {"cpu": cpu, "memory": memory, "pods": str(pool.pods)}
    mig = pool.mig
    if mig is None:
        base.update(
            {
                GPU_PRODUCT_LABEL: gpu.product,
                GPU_COUNT_LABEL: str(gpu.count),
                GPU_MEMORY_LABEL: str(gpu.resolved_memory_mib),
            }
        )
        resources[GPU_RESOURCE] = str(gpu.count)
    elif mig.strategy == "single":
        # GFD single strategy: the MIG devices are published as nvidia.com/gpu and the product
        # label names the profile, e.g. NVIDIA-A100-SXM4-80GB-MIG-1g.10gb.
        (profile, per_gpu), *_ = mig.profiles.items()
        devices = per_gpu * gpu.count
        base.update(
            {
                GPU_PRODUCT_LABEL: f"{gpu.product}-MIG-{profile}",
                GPU_COUNT_LABEL: str(devices),
                GPU_MEMORY_LABEL: str(mig_profile_memory_mib(profile)),
            }
        )
        resources[GPU_RESOURCE] = str(devices)
    else:
        partitioned = pool.partitioned_gpus
        base.update(
            {
                GPU_PRODUCT_LABEL: gpu.product,
                GPU_COUNT_LABEL: str(gpu.count),
                GPU_MEMORY_LABEL: str(gpu.resolved_memory_mib),
            }
        )
        resources[GPU_RESOURCE] = str(gpu.count - partitioned)
        for profile, per_gpu in mig.profiles.items():
            base[f"{MIG_RESOURCE_PREFIX}{profile}.count"] = str(per_gpu * partitioned)
            resources[f"{MIG_RESOURCE_PREFIX}{profile}"] = str(per_gpu * partitioned)

    rack_size = pool.effective_rack_size
    for i in range(pool.nodes):
        name = _node_name(cluster.name, pool.name, i, pool.nodes)
        labels = dict(base)
        labels[HOSTNAME_LABEL] = name
        if pool.nvlink is not None:
            labels[GPU_CLIQUE_LABEL] = clique_id(
                cluster.name, pool.name, i // pool.nvlink.nodes_per_domain
            )
        if rack_size is not None:
            rack = i // rack_size
            block = rack // pool.racks_per_block if pool.racks_per_block else 0
            labels[DEFAULT_RACK_LABEL] = f"{pool.name}-rack{rack}"
            labels[DEFAULT_BLOCK_LABEL] = f"{pool.name}-block{block}"
        yield NodeSpec(
            name=name,
            cluster=cluster.name,
            pool=pool.name,
            labels=labels,
            taints=pool.taints,
            capacity=dict(resources),
            allocatable=dict(resources),
        )


def node_specs(cluster: ClusterSpec) -> list[NodeSpec]:
    """Expand a member cluster into its nodes: pools in file order, nodes numbered from 0.

    Node ``i`` of pool ``p`` in cluster ``c`` is named ``c-p-<i>`` (zero-padded to 3 digits or
    more). Pure and deterministic: the same spec always yields the same nodes, labels and
    clique ids. Resources follow the device plugin: without MIG ``nvidia.com/gpu`` = count; with
    mixed MIG ``nvidia.com/gpu`` = count - partitioned GPUs and ``nvidia.com/mig-<profile>`` =
    instances per GPU x partitioned GPUs; with single MIG ``nvidia.com/gpu`` = instances x count.
    """
    return [node for pool in cluster.node_pools for node in _pool_nodes(cluster, pool)]
