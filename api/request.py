"""What a job asks of the fleet: pod sets, products, cluster selector, topology, priority.

The hub derives a :class:`PlacementRequest` from a GPUJob (template + ``spec.placement``); the
simulator and the benchmark build them directly. Placement reads nothing else about a job.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gpufed.api.inventory import Toleration
from gpufed.api.labels import GPU_RESOURCE

NVLinkPolicy = Literal["Required", "Preferred", "None"]
LevelPolicy = Literal["Required", "Preferred"]
AllocationPolicy = Literal["binpack", "spread"]
#: A PriorityClass's ``preemptionPolicy`` (Kubernetes' default: ``PreemptLowerPriority``).
PreemptionPolicy = Literal["PreemptLowerPriority", "Never"]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


class LabelSelectorRequirement(_Frozen):
    """One ``matchExpressions`` entry of a Kubernetes label selector.

    As the API server validates it: ``In`` / ``NotIn`` need at least one value, ``Exists`` /
    ``DoesNotExist`` take none.
    """

    key: str = Field(min_length=1)
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _values_match_operator(self) -> LabelSelectorRequirement:
        if self.operator in ("In", "NotIn") and not self.values:
            raise ValueError(
                f"values: operator {self.operator} needs at least one value (key {self.key!r})"
            )
        if self.operator in ("Exists", "DoesNotExist") and self.values:
            raise ValueError(
                f"values: operator {self.operator} takes no values (key {self.key!r}); "
                "use In to match values"
            )
        return self

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Kubernetes semantics (``NotIn`` matches when the key is absent)."""
        if self.operator == "Exists":
            return self.key in labels
        if self.operator == "DoesNotExist":
            return self.key not in labels
        if self.operator == "In":
            return labels.get(self.key) in self.values
        return self.key not in labels or labels[self.key] not in self.values


class LabelSelector(_Frozen):
    """A Kubernetes label selector (``matchLabels`` and ``matchExpressions`` are ANDed)."""

    match_labels: dict[str, str] = Field(default_factory=dict, alias="matchLabels")
    match_expressions: tuple[LabelSelectorRequirement, ...] = Field(
        default=(), alias="matchExpressions"
    )

    def matches(self, labels: Mapping[str, str]) -> bool:
        """True when ``labels`` satisfy every term; an empty selector matches everything."""
        return all(labels.get(k) == v for k, v in self.match_labels.items()) and all(
            e.matches(labels) for e in self.match_expressions
        )


class PodSet(_Frozen):
    """A group of identical pods of one job: ``count`` pods, each requesting ``requests``.

    ``requests``: per-pod effective request in canonical units
    (:func:`gpufed.api.resources.pod_requests`). ``node_selector`` / ``tolerations``: from the
    pod template (``spec.nodeSelector``, ``spec.tolerations``).

    ``claim_selectors``: None when the pods' GPUs (if any) are the ``nvidia.com/gpu`` extended
    resource; when they claim their GPUs through DRA (ResourceClaimTemplates of the
    ``gpu.nvidia.com`` class, counted into ``requests[nvidia.com/gpu]``), the CEL expressions
    every claimed device must satisfy (sorted, de-duplicated; empty when none):
    such pods go only to nodes that publish their GPUs through DRA, and those only to them.
    """

    name: str = Field(default="main", min_length=1)
    count: int = Field(ge=1)
    requests: dict[str, int] = Field(default_factory=dict)
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: tuple[Toleration, ...] = ()
    claim_selectors: tuple[str, ...] | None = None

    @field_validator("requests")
    @classmethod
    def _non_negative(cls, v: dict[str, int]) -> dict[str, int]:
        for name, amount in v.items():
            if amount < 0:
                raise ValueError(f"requests.{name}: {amount} is negative")
        return v

    @property
    def gpus_per_pod(self) -> int:
        """``nvidia.com/gpu`` per pod (0 for CPU-only or MIG-only pods)."""
        return self.requests.get(GPU_RESOURCE, 0)

    @property
    def gpus(self) -> int:
        """Whole GPUs for the whole pod set (count x per pod)."""
        return self.count * self.gpus_per_pod


class TopologyRequest(_Frozen):
    """Topology wishes (``spec.placement.topology``).

    ``nvlink``: ``Required`` = all pods of the job inside one NVLink domain (one HGX node, or
    one NVL72 clique), ``Preferred`` = try to, ``None`` = do not care. ``rack`` / ``block``:
    optionally keep every pod within one rack / block (node labels named in configuration).
    ``compute_domain``: ``Auto`` = a ``Required`` job spanning nodes of a clique gets a
    ComputeDomain where the member serves the CRD (:mod:`gpufed.placement.computedomain`);
    ``Never`` = none.
    """

    nvlink: NVLinkPolicy = "Preferred"
    rack: LevelPolicy | None = None
    block: LevelPolicy | None = None
    compute_domain: Literal["Auto", "Never"] = "Auto"


class PlacementRequest(_Frozen):
    """One job's placement request.

    ``job``: ``namespace/name`` of the GPUJob (ties and messages); ``uid``: its UID (the key of
    reservations). ``gpu_products``: allowed GFD products (``nvidia.com/gpu.product`` values);
    empty means any. ``cluster_selector``: over MemberCluster labels. ``workload_kind``:
    ``Kind.group`` of the workload (members that do not serve it are filtered out).
    ``submitted_at``: seconds since the epoch (queue order after priority). ``queue``: the
    GPUQueue the job belongs to (resolved by :func:`gpufed.placement.quota.queue_of`); None
    means not resolved yet: the namespace's queue, else the default queue. ``allocation``:
    ``binpack`` or ``spread`` for this job, over the policy's (None: the policy's). ``priority``: the
    value of the job's PriorityClass on the hub (higher is placed first; 0 without one) and
    ``preemption_policy`` its ``preemptionPolicy`` (``Never``: the job may not preempt others).
    ``checkpoint_interval_s``: seconds between the job's checkpoints
    (``spec.checkpoint.intervalSeconds``), None when it declared none. ``time_limit_s``: the
    job's declared run-time limit, seconds (``spec.placement.timeLimitSeconds``, else a Job's
    ``activeDeadlineSeconds``), None when it declared none: only a job with a limit may run
    as backfill inside a hold (docs/placement.md, "Backfill by time limit").
    """

    job: str = Field(min_length=1)
    uid: str = Field(min_length=1)
    pod_sets: tuple[PodSet, ...] = Field(min_length=1)
    gpu_products: tuple[str, ...] = ()
    cluster_selector: LabelSelector | None = None
    topology: TopologyRequest = TopologyRequest()
    priority: int = 0
    preemption_policy: PreemptionPolicy = "PreemptLowerPriority"
    checkpoint_interval_s: int | None = Field(default=None, ge=1)
    time_limit_s: float | None = Field(default=None, gt=0)
    queue: str | None = None
    allocation: AllocationPolicy | None = None
    workload_kind: str = "Job.batch"
    submitted_at: float = 0.0

    @field_validator("pod_sets")
    @classmethod
    def _unique_pod_set_names(cls, v: tuple[PodSet, ...]) -> tuple[PodSet, ...]:
        seen: set[str] = set()
        for ps in v:
            if ps.name in seen:
                raise ValueError(
                    f"pod set name {ps.name!r} appears twice; give each pod set its own name"
                )
            seen.add(ps.name)
        return v

    @property
    def gpus(self) -> int:
        """Whole GPUs over all pod sets."""
        return sum(ps.gpus for ps in self.pod_sets)

    @property
    def pods(self) -> int:
        """Pods over all pod sets."""
        return sum(ps.count for ps in self.pod_sets)
