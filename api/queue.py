"""The cluster-scoped ``GPUQueue`` custom resource (``gpufed.io/v1alpha1``): docs/design.md §4.

An administrator creates one per team or organisation: the hub namespaces whose GPUJobs belong
to it (``spec.namespaces``), the queue above it (``spec.parent``: quotas nest, org -> team),
fleet-wide quotas per GPU product (``spec.quotas``: summed over every member) and its weight in
fair sharing (``spec.fairShare.weight``). The hub writes ``status``: the ``Active`` condition
(True once it accepted the queue and admits by it; False naming the broken field otherwise), the
usage per quota key, pending and admitted job counts and the current fair-share value.

The admission rules (how a job's GPU product is matched against ``quotas``, borrowing in the
tree, fair share) are pure and live in :mod:`gpufed.placement.quota` and
:mod:`gpufed.placement.fairshare`; docs/placement.md, "Queues and quotas".

:func:`load_queues` reads a YAML file of GPUQueue objects (``gpufed simulate --queues``).

Who uses it: the hub (queue list+watch, admission, status), ``gpufed simulate --queues``,
``gpufed get queues``, and the CRD generator (:mod:`gpufed.api.crdgen`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Final, Literal

import yaml
from pydantic import ConfigDict, Field, ValidationError

from gpufed.api.crdbase import CRDModel, DateTime, ObjectMeta, StatusCondition
from gpufed.api.errors import PermanentError
from gpufed.api.labels import API_VERSION

KIND: Final = "GPUQueue"
PLURAL: Final = "gpuqueues"
#: The condition type that says whether the hub admits by this queue.
ACTIVE_CONDITION: Final = "Active"
#: The quota key that matches any whole GPU (``nvidia.com/gpu``) of a product not listed by name.
ANY_GPU: Final = "*"
#: Largest quota amount (GPUs, or MIG slices) accepted in any field: far above any fleet.
MAX_QUOTA: Final = 10_000_000
#: Most quota entries per queue and namespaces per queue.
MAX_QUOTAS: Final = 64
MAX_NAMESPACES: Final = 256
#: Largest fair-share weight.
MAX_WEIGHT: Final = 1_000_000
#: Bounds of ``spec.maxPriority``: a PriorityClass value is an int32.
MAX_PRIORITY: Final = 2**31 - 1

#: A queue name (a Kubernetes object name: DNS subdomain, at most 253 characters; kept to 63 so
#: that it fits a label value).
QueueName = Annotated[
    str, Field(min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
]
#: A hub namespace name (RFC 1123 label).
NamespaceName = Annotated[
    str, Field(min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
]
#: A quota key: ``*``, a GFD ``nvidia.com/gpu.product`` value (a label value), or a MIG
#: resource name (``nvidia.com/mig-1g.10gb``).
QuotaKey = Annotated[
    str,
    Field(
        min_length=1,
        max_length=128,
        pattern=r"^(\*|nvidia\.com/mig-[0-9a-z.]+|[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)$",
    ),
]


class QueueQuota(CRDModel):
    """One ``spec.quotas[]`` entry: fleet-wide limits for one quota key.

    ``gpuProduct``: a GFD product (``NVIDIA-H100-80GB-HBM3``), ``*`` (any whole GPU whose
    product this queue does not list by name) or a MIG resource name
    (``nvidia.com/mig-1g.10gb``). ``nominal``: GPUs (or MIG slices) the queue's subtree may
    use, summed over every member. ``borrowingLimit``: how far above ``nominal`` it may go
    with unused quota of its tree (absent: unlimited). ``lendingLimit``: how much of its
    unused nominal others in the tree may borrow (absent: all of it). Counts, 0 to 10,000,000.
    """

    gpu_product: QuotaKey
    """The quota key: a GFD product (`NVIDIA-H100-80GB-HBM3`), `*` (any whole GPU whose product the
    queue does not list by name) or a MIG resource name (`nvidia.com/mig-1g.10gb`)."""
    nominal: int = Field(ge=0, le=MAX_QUOTA)
    """GPUs (or MIG slices) the queue's subtree may use, summed over every member (0 to
    10,000,000)."""
    borrowing_limit: int | None = Field(default=None, ge=0, le=MAX_QUOTA)
    """How far above `nominal` the queue may go with unused quota of its tree; absent: unlimited."""
    lending_limit: int | None = Field(default=None, ge=0, le=MAX_QUOTA)
    """How much of its unused `nominal` others in the tree may borrow; absent: all of it."""


class FairShare(CRDModel):
    """``spec.fairShare``: ``weight`` (1 to 1,000,000; default 1): a queue with twice the
    weight may use twice the decayed GPU-seconds before it goes behind a sibling."""

    weight: int = Field(default=1, ge=1, le=MAX_WEIGHT)
    """The queue's weight among its siblings, 1 to 1,000,000 (default 1)."""


#: ``spec.preemption.withinQueue`` values (Kueue's ``withinClusterQueue``).
WithinQueuePolicy = Literal["Never", "LowerPriority", "LowerOrNewerEqualPriority"]
#: ``spec.preemption.reclaimWithinParent`` values (Kueue's ``reclaimWithinCohort``).
ReclaimPolicy = Literal["Never", "LowerPriority", "Any"]
#: ``spec.preemption.borrowWithinParent.policy`` values (Kueue's ``borrowWithinCohort``).
BorrowPolicy = Literal["Never", "LowerPriority"]


class BorrowWithinParent(CRDModel):
    """``spec.preemption.borrowWithinParent``: whether a job that must borrow (its queue, or an
    ancestor below the common one, would go above its nominal) may preempt jobs of other
    queues that borrow too. ``policy``: ``Never`` (default) or ``LowerPriority`` (victims of
    strictly lower priority, at most ``maxPriorityThreshold`` when set)."""

    model_config = ConfigDict(frozen=True)

    policy: BorrowPolicy = "Never"
    """`Never` (default): a borrowing job preempts no other queue's jobs; `LowerPriority`: it may
    preempt other queues' borrowing jobs of strictly lower priority (at most
    `maxPriorityThreshold`)."""
    max_priority_threshold: int | None = Field(default=None, ge=-MAX_PRIORITY - 1, le=MAX_PRIORITY)
    """With `LowerPriority`: only victims whose priority is at most this value (an int32)."""


class QueuePreemption(CRDModel):
    """``spec.preemption``: who this queue's jobs may preempt (docs/placement.md, "Who may
    preempt whom, when"); modelled on Kueue's ClusterQueue preemption. A queue without it
    inherits its parent's; the defaults make nominal quota a guarantee: ``withinQueue:
    LowerPriority``, ``reclaimWithinParent: Any``, ``borrowWithinParent: {policy: Never}``.

    Across queues priority never overrides nominal quota: a job of another queue is a victim
    only while its queue (and every ancestor below the common one) uses more than its
    nominal."""

    model_config = ConfigDict(frozen=True)

    within_queue: WithinQueuePolicy = "LowerPriority"
    """Victims in the same queue: `Never`, `LowerPriority` (default; strictly lower priority) or
    `LowerOrNewerEqualPriority` (also equal priority, submitted after the preemptor)."""
    reclaim_within_parent: ReclaimPolicy = "Any"
    """When the preemptor's queue stays within its nominal: victims of other queues that borrow
    (use more than their nominal): `Never`, `LowerPriority`, or `Any` (default: whatever their
    priority)."""
    borrow_within_parent: BorrowWithinParent = Field(default_factory=BorrowWithinParent)
    """When the preemptor's queue must borrow: whether it may preempt other borrowing queues'
    jobs (default `{policy: Never}`)."""


#: The preemption policy of a queue whose tree sets none.
DEFAULT_PREEMPTION: Final = QueuePreemption()


class GPUQueueSpec(CRDModel):
    """``GPUQueue.spec``.

    ``parent``: the queue above (optional; absent for a root). ``namespaces``: GPUJobs in
    these hub namespaces belong to this queue (a namespace may be listed by one queue only).
    ``quotas``: at most 64 entries, one per key; an empty list means no limit of its own.
    ``fairShare``: the queue's weight among its siblings. ``maxPriority`` (optional): the
    highest PriorityClass value its jobs may use (the lowest cap of the queue and its
    ancestors applies); a job naming a class above it fails with ``Valid=False``.
    ``preemption`` (optional): who its jobs may preempt (inherited from the parent when absent).
    """

    parent: QueueName | None = None
    """The queue above this one; absent for a root queue."""
    namespaces: list[NamespaceName] = Field(
        default_factory=list,
        max_length=MAX_NAMESPACES,
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    """Hub namespaces whose GPUJobs belong to this queue (a namespace may be listed by one queue
    only; at most 256)."""
    quotas: list[QueueQuota] = Field(
        default_factory=list,
        max_length=MAX_QUOTAS,
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["gpuProduct"],
        },
    )
    """Fleet-wide limits, one entry per quota key (at most 64); empty: no limit of its own."""
    fair_share: FairShare = Field(default_factory=FairShare)
    max_priority: int | None = Field(default=None, ge=-MAX_PRIORITY - 1, le=MAX_PRIORITY)
    """The highest PriorityClass value its jobs may use (the lowest cap of the queue and its
    ancestors applies); a job naming a class above it fails with `Valid=False`."""
    preemption: QueuePreemption | None = None
    """Who this queue's jobs may preempt; absent: the parent's policy (at a root: withinQueue
    LowerPriority, reclaimWithinParent Any, borrowWithinParent Never)."""


class QueueUsage(CRDModel):
    """One ``status.usage[]`` entry for a quota key of the queue.

    ``nominal``: the queue's nominal for the key; ``used``: GPUs (or MIG slices) of the reserved
    and running jobs of the queue and its descendants charged to the key; ``borrowed``: the part
    of ``used`` above ``nominal``.
    """

    gpu_product: str = Field(max_length=128)
    """The quota key."""
    nominal: int = Field(ge=0)
    """The queue's nominal quota for the key."""
    used: int = Field(ge=0)
    """GPUs (or MIG slices) of the reserved and running jobs of the queue and its descendants
    charged to the key."""
    borrowed: int = Field(default=0, ge=0)
    """The part of `used` above `nominal`."""


#: Fair-share samples a GPUQueue status keeps: one per 15 minutes over a day.
MAX_SHARE_SAMPLES: Final = 96
#: Seconds between two fair-share samples in a GPUQueue status.
SHARE_SAMPLE_S: Final = 900


class ShareSample(CRDModel):
    """One past value of a queue's fair share."""

    time: DateTime
    """When (RFC 3339)."""
    value: str = Field(max_length=32)
    """``status.fairShare`` then."""


class GPUQueueStatus(CRDModel):
    """``GPUQueue.status``, written only by the hub.

    ``conditions``: ``Active`` (True: accepted and admitting; False with the broken field in
    the message, e.g. ``spec.parent: cycle team-a -> research -> team-a``). ``usage``: per
    quota key. ``pendingJobs`` / ``admittedJobs``: the queue's own jobs waiting / reserved or
    running. ``fairShare``: decayed usage (GPU-seconds) / weight, as a decimal string.
    """

    conditions: list[StatusCondition] = Field(
        default_factory=list,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    """KEP-1623 conditions: `Active` (True: accepted and admitting; False with the broken field in
    the message)."""
    usage: list[QueueUsage] = Field(default_factory=list, max_length=MAX_QUOTAS + 16)
    """Usage per quota key."""
    pending_jobs: int | None = Field(default=None, ge=0)
    """The queue's own jobs waiting to be placed."""
    admitted_jobs: int | None = Field(default=None, ge=0)
    """The queue's own jobs reserved or running."""
    fair_share: str | None = Field(default=None, max_length=32)
    """Decayed usage (GPU-seconds) divided by the weight, as a decimal string."""
    fair_share_history: list[ShareSample] = Field(
        default_factory=list, max_length=MAX_SHARE_SAMPLES
    )
    """`fairShare` over the last day, one sample per 15 minutes, oldest first (the console's
    plot; a new leader carries it on)."""


class GPUQueue(CRDModel):
    """A queue of GPU jobs with fleet-wide quotas (cluster-scoped)."""

    api_version: str = API_VERSION
    kind: str = KIND
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: GPUQueueSpec = Field(default_factory=GPUQueueSpec)
    status: GPUQueueStatus | None = None


#: Printer columns of ``kubectl get gpuqueues``.
PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Parent", "type": "string", "jsonPath": ".spec.parent"},
    {
        "name": "Active",
        "type": "string",
        "jsonPath": '.status.conditions[?(@.type=="Active")].status',
    },
    {"name": "Pending", "type": "integer", "jsonPath": ".status.pendingJobs"},
    {"name": "Admitted", "type": "integer", "jsonPath": ".status.admittedJobs"},
    {"name": "Fair-Share", "type": "string", "jsonPath": ".status.fairShare", "priority": 1},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


class QueueFileError(PermanentError, ValueError):
    """A queues file that cannot be read; the message names the file, document and field."""


#: Most GPUQueue objects in one queues file.
MAX_QUEUES_IN_FILE: Final = 10_000


def load_queues(path: str | Path) -> list[GPUQueue]:
    """GPUQueues from a YAML file: one or more documents, each a GPUQueue or a ``kind: List``
    of them. Raises :class:`QueueFileError` naming the file, the document (from 0) and the
    field for anything that does not validate, a wrong ``kind``, or a name used twice."""
    where = str(path)
    try:
        docs = list(yaml.safe_load_all(Path(path).read_text(encoding="utf-8")))
    except OSError as exc:
        raise QueueFileError(f"{where}: cannot read the file: {exc.strerror or exc}") from None
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise QueueFileError(f"{where}: not valid YAML ({exc})") from None
    out: list[GPUQueue] = []
    seen: set[str] = set()
    for i, doc in enumerate(docs):
        if doc is None:
            continue
        if not isinstance(doc, dict):
            raise QueueFileError(f"{where} document {i}: expected a GPUQueue object")
        items = doc.get("items") if doc.get("kind") == "List" else [doc]
        if not isinstance(items, list):
            raise QueueFileError(f"{where} document {i}: items: expected a list of GPUQueues")
        for j, obj in enumerate(items):
            at = f"{where} document {i}" + (f" items[{j}]" if doc.get("kind") == "List" else "")
            if not isinstance(obj, dict) or obj.get("kind") != KIND:
                raise QueueFileError(f"{at}: kind: expected {KIND}")
            try:
                q = GPUQueue.model_validate(obj)
            except ValidationError as exc:
                first = exc.errors()[0]
                loc = ".".join(str(x) for x in first["loc"])
                raise QueueFileError(f"{at}: {loc}: {first['msg']}") from None
            if not q.metadata.name:
                raise QueueFileError(f"{at}: metadata.name: a GPUQueue needs a name")
            if q.metadata.name in seen:
                raise QueueFileError(f"{at}: metadata.name: {q.metadata.name} is used twice")
            seen.add(q.metadata.name)
            out.append(q)
            if len(out) > MAX_QUEUES_IN_FILE:
                raise QueueFileError(f"{where}: more than {MAX_QUEUES_IN_FILE} GPUQueues")
    if not out:
        raise QueueFileError(f"{where}: no GPUQueue objects")
    return out
