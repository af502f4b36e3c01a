"""What the hub keeps in etcd, as pydantic models (JSON values under the hub's key prefix),
and all of it as a new leader loads it (:class:`Loaded`).

Written and read only through :mod:`gpufed.hub.adapters.store`; the key layout is documented there and
in docs/hub.md. Times are seconds since the epoch (wall clock of the hub that wrote them);
timers that decide anything restart from the hub's own start instead (docs/design.md §7 item 5).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from gpufed.api.inventory import NodeInventory
from gpufed.api.request import PreemptionPolicy
from gpufed.api.work import AckResult, PodSecurityLevel, WorkOp


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")


#: Past requeues kept per job record (the newest): enough for the hourly preemption cap.
MAX_REQUEUE_HISTORY = 16
#: Nodes (and NVLink domains) one :class:`RequeueCause` and one restart entry keep: a record
#: holds :data:`MAX_REQUEUE_HISTORY` causes and one preemption transaction writes every
#: victim's record, which must stay far below etcd's request limit (1.5 MiB).
MAX_CAUSE_NODES = 64

RequeueKind = Literal["Preempted", "InfrastructureFailure"]


class RequeueCause(_Record):
    """Why a placed job's member copy is stopped and the job goes back to Pending for a new
    attempt (:mod:`gpufed.hub.components.lifecycle`); stored in ``JobRecord.stopping`` while the copy is
    being deleted, then appended to ``JobRecord.requeues``.

    ``kind``: ``Preempted`` (issue 12) or ``InfrastructureFailure`` (issue 13); it is also the
    GPUJob condition type set True when the job is back in the queue. ``reason``: the
    condition's reason (CamelCase); ``message``: one line for the condition, the Event and
    ``gpufed explain``. ``at``: wall seconds the hub decided it. ``cluster``: the member whose
    copy is stopped; ``nodes`` / ``domains``: the nodes and NVLink domains it held there.
    Preemption only: ``by_uid`` / ``by``: the preemptor's UID and ``namespace/name``;
    ``cost_gpu_s``: the work lost, GPU-seconds since its last checkpoint.
    """

    kind: RequeueKind
    reason: str
    message: str
    at: float
    cluster: str
    nodes: tuple[str, ...] = ()
    domains: tuple[str, ...] = ()
    by_uid: str = ""
    by: str = ""
    cost_gpu_s: float = 0.0


class JobRecord(_Record):
    """A GPUJob the hub has placed at least once (key ``jobs/<uid>``).

    Its existence is the exactly-once guard: it is created in the same transaction as the work
    item and the reservation, so a job is never placed twice, across restarts and failovers.
    ``cluster``: where its current copy lives; ``None`` after the member was lost and the job
    waits to be placed again (``reschedule: OnClusterLoss``). ``attempt`` counts placements.
    ``placed_at``: wall seconds of the latest placement. ``gpus``: whole GPUs it asked for.
    ``queue``: the GPUQueue that admitted the placement, and ``charged``: what it charges
    there (concrete quota key -> GPUs or MIG slices, :func:`gpufed.placement.quota.demand_of`):
    a new leader rebuilds quota usage from these records (:mod:`gpufed.hub.components.queues`). Records
    written before queues existed have neither and charge nothing. ``priority`` /
    ``preemption_policy``: what the job was placed with (its PriorityClass then), which it
    keeps while placed (None in records from before PriorityClasses: the spec's integer).
    ``stopping``: set while the hub stops the current copy to requeue the job (preemption;
    written before any Delete is sent, so a restarted hub resumes it: :mod:`gpufed.hub.components.lifecycle`);
    ``requeues``: the latest past requeues, newest last (at most :data:`MAX_REQUEUE_HISTORY`);
    ``requeue_counts``: every requeue by kind (``status.preemptions`` shows ``Preempted``).
    ``budget_used``: re-runs after infrastructure failures that count against
    ``spec.placement.retry.onInfrastructureFailure`` (a drain or a member-side preemption does
    not); ``not_before``: wall seconds before which the job is not placed again (the backoff
    between re-runs; None: no wait).
    """

    uid: str
    job: str
    cluster: str | None
    attempt: int = 1
    placed_at: float = 0.0
    gpus: int = 0
    queue: str | None = None
    charged: dict[str, int] = {}
    priority: int | None = None
    preemption_policy: PreemptionPolicy | None = None
    stopping: RequeueCause | None = None
    requeues: tuple[RequeueCause, ...] = ()
    requeue_counts: dict[str, int] = {}
    budget_used: int = 0
    not_before: float | None = None


class WorkRecord(_Record):
    """What the hub wants in one member for one job (key ``work/<cluster>/<uid>``).

    The work item's revision is the etcd ``mod_revision`` of this key (strictly increasing).
    ``fenced``: a Delete for the old copy of a job placed elsewhere after its member was lost;
    it is left out of the member's desired set, so the agent deletes the copy on reconnect.
    """

    job_uid: str
    job: str
    namespace: str
    op: WorkOp
    manifests: tuple[dict[str, Any], ...] = ()
    fenced: bool = False
    created_at: float = 0.0
    pod_security: PodSecurityLevel | Literal[""] = ""


class AckRecord(_Record):
    """The member's latest answer about one job (key ``acks/<cluster>/<uid>``).

    ``applied``: the agent acknowledged an Apply of this job at some revision (so missing
    objects must never be re-created: ``WorkItem.applied_before``). ``applied_at``: wall
    seconds of the first Applied ack.
    """

    revision: int
    result: AckResult
    message: str = ""
    retryable: bool = False
    applied: bool = False
    applied_at: float | None = None


class FairShareRecord(_Record):
    """The queues' decayed usage (key ``fairshare``): queue -> GPU-seconds of its own jobs,
    decayed to ``at`` (wall seconds). Written by the leader at most every minute, so a new
    leader's fair-share order starts from history, not from zero."""

    values: dict[str, float] = {}
    at: float = 0.0


class RecentNodeRecord(_Record):
    """One node that left member ``cluster`` or shrank: its last inventory and when (wall s)."""

    cluster: str
    node: NodeInventory
    left_at: float


#: Remembered nodes a :class:`RecentNodesRecord` keeps (the newest): far below etcd's request
#: limit (1.5 MiB) at a few KiB a node.
MAX_RECENT_NODE_RECORDS = 256


class RecentNodesRecord(_Record):
    """The nodes that left a member or shrank within the hour (key ``recentnodes``;
    :mod:`gpufed.placement.recent`), so that a new leader too judges "could ever hold" on them.
    Written by the leader when they change, at most every status interval."""

    nodes: list[RecentNodeRecord] = []


class SuspectRecord(_Record):
    """One suspect node of a member as etcd keeps it: why, and until when (wall seconds)."""

    reason: str
    until: float


class MemberMeta(_Record):
    """Per-member facts besides nodes (key ``clusters/<name>/meta``)."""

    served_kinds: tuple[str, ...] = ("Job.batch",)
    agent_version: str = ""
    updated_at: float = 0.0
    #: wall seconds when the hub declared the member lost (kept until the agent reconnects)
    lost_at: float | None = None
    #: UID of the member's kube-system Namespace, from the first agent that connected ("":
    #: not known yet); a stream from an agent of another Kubernetes cluster is refused
    cluster_uid: str = ""
    #: node -> its suspect mark (:mod:`gpufed.hub.components.reservations`), so a restarted hub or a
    #: new leader keeps the marks and their expiry
    suspects: dict[str, SuspectRecord] = {}


@dataclass
class Loaded:
    """Everything the leader reads from etcd when it takes over (the store's ``load``: these
    records by key, the members' nodes by cluster and name)."""

    jobs: dict[str, JobRecord] = field(default_factory=dict)
    #: (cluster, job uid) -> (record, revision)
    work: dict[tuple[str, str], tuple[WorkRecord, int]] = field(default_factory=dict)
    acks: dict[tuple[str, str], AckRecord] = field(default_factory=dict)
    #: job uid -> JSON of the reservation ledger entry
    reservations: dict[str, str] = field(default_factory=dict)
    members: dict[str, MemberMeta] = field(default_factory=dict)
    nodes: dict[str, dict[str, NodeInventory]] = field(default_factory=dict)
    #: job uid -> mod_revision of its job record (for guarded updates)
    job_revisions: dict[str, int] = field(default_factory=dict)
    #: the ``fairshare`` key (None: absent)
    fair_share: FairShareRecord | None = None
    #: the ``recentnodes`` key (None: absent)
    recent_nodes: RecentNodesRecord | None = None
    #: the ``epoch`` key's value (None: absent, a new or wiped state) and the etcd cluster ID
    epoch_id: str | None = None
    cluster_id: int = 0

    @property
    def epoch(self) -> str | None:
        """The hub state epoch, ``<epoch id>.<etcd cluster ID in hex>`` (None without an id):
        a wiped prefix has no id, a snapshot restore has another cluster ID."""
        if self.epoch_id is None:
            return None
        return f"{self.epoch_id}.{self.cluster_id:x}"
