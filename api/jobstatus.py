"""``GPUJob.status`` (docs/design.md §4): the phase, the placement explanation, conditions, restarts.

The status models the hub writes (``hub/rules/status.py``, ``hub/components/mirror.py``) and ``gpufed get jobs`` /
``explain`` read: :class:`GPUJobStatus` and its parts (:class:`PlacementStatus` with each
member's score or rejection, :class:`PreemptionStatus`, :class:`RestartRecord`, :class:`Timings`,
:class:`WorkloadRef`, :class:`PodIssueStatus`), and the phase vocabulary (:data:`JobPhase`,
:data:`TERMINAL_PHASES`). Split out of :mod:`gpufed.api.gpujob`, which re-exports every name, so
``from gpufed.api.gpujob import GPUJobStatus`` keeps working.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from gpufed.api.crdbase import CRDModel, DateTime, StatusCondition

#: GPUJob lifecycle (``status.phase``). Succeeded, Failed and Lost are terminal: once written,
#: no later report changes them (docs/design.md §7 items 2 and 5).
JobPhase = Literal["Pending", "Placed", "Running", "Succeeded", "Failed", "Lost"]
TERMINAL_PHASES: frozenset[str] = frozenset({"Succeeded", "Failed", "Lost"})
PlacementOutcome = Literal["Placed", "Unschedulable", "Rejected"]


class PodSetPlacement(CRDModel):
    """Where one pod set goes: node name -> pods (``nodes``); ``requests`` per pod."""

    name: str
    """The pod set's name (the replicated job or replica type it comes from, or `main`)."""
    requests: dict[str, int] = Field(default_factory=dict)
    """Resource name -> amount each pod of the set requests (GPUs as whole counts)."""
    nodes: dict[str, int] = Field(default_factory=dict)
    """Node name -> how many of the set's pods were placed on it."""


class ClusterScoreStatus(CRDModel):
    """A member that could take the job: total score (0-100) and each scorer's part."""

    cluster: str
    """The member cluster."""
    score: float
    """Total score, 0-100 (higher wins; ties break on the cluster name)."""
    gpu_product: str | None = None
    """The GPU product the job would use there."""
    parts: dict[str, float] = Field(default_factory=dict)
    """Scorer name -> its weighted part of the total."""


class ClusterRejectionStatus(CRDModel):
    """A member that cannot take the job: the placement plugin that said no, and why.

    ``code``: ``Unschedulable`` (may change as jobs finish), ``UnschedulableAndUnresolvable``
    (only a change of the member's shape or configuration would help) or ``Error``.
    """

    cluster: str
    """The member cluster that cannot take the job."""
    plugin: str
    """The placement filter plugin that rejected it (e.g. `GPUProduct`, `TopologyFit`, `Quota`)."""
    code: Literal["Unschedulable", "UnschedulableAndUnresolvable", "Error"]
    """`Unschedulable` (may change as jobs finish), `UnschedulableAndUnresolvable` (only a change of
    the member's shape or configuration would help) or `Error`."""
    reason: str
    """Why, for people."""


class PlacementStatus(CRDModel):
    """``status.placement``: the latest placement decision with its explanation.

    The same fields as placement's ``Decision`` (camelCase), so ``gpufed explain`` renders it
    exactly as placement explains it. ``outcome``: ``Placed`` (``cluster`` set),
    ``Unschedulable`` (waits for the fleet to change) or ``Rejected`` (no member could ever
    hold it). ``scores``: members that could take it, best first; ``rejections``: per member,
    the plugin and reason (always filled when the job did not fit).
    """

    outcome: PlacementOutcome
    """`Placed` (`cluster` is set), `Unschedulable` (the job waits for the fleet to change) or
    `Rejected` (no member could ever hold it: the job fails)."""
    cluster: str | None = None
    """The member chosen (when `Placed`)."""
    gpu_product: str | None = None
    """The GPU product of the pool the job's GPU pods were placed in."""
    nvlink_domains: list[str] = Field(default_factory=list)
    """The NVLink domains the pods landed in (`node:<name>` for an HGX node, `clique:<id>` for a
    multi-node NVLink rack)."""
    pod_sets: list[PodSetPlacement] = Field(default_factory=list)
    """Per pod set: the nodes its pods were pinned to."""
    score: float | None = None
    """The chosen member's total score, 0-100."""
    scores: list[ClusterScoreStatus] = Field(default_factory=list)
    """Members that could take the job, best first."""
    rejections: list[ClusterRejectionStatus] = Field(default_factory=list)
    """Per member that cannot take the job: the plugin, code and reason (always filled when the job
    did not fit)."""
    message: str = ""
    """One-line summary of the decision."""
    compute_domain: str | None = None
    """The ComputeDomain (`resource.nvidia.com/v1beta1`) gpufed creates for the job in `cluster`,
    named after the job, when its pods need one NVLink domain and span several nodes of a clique
    (`spec.placement.topology.computeDomain: Auto`); its readiness is the workload condition
    `ComputeDomainReady`."""
    explained: bool = False
    """True when every member's score or rejection was recorded (fleets up to the hub's
    `--explain-members`); false when only the winner was."""
    policy: str = ""
    """The allocation policy the decision used (`binpack`, `spread`)."""
    decided_time: DateTime | None = None
    """When the decision was made (RFC 3339)."""


class PodIssueStatus(CRDModel):
    """A pod of the job in the member that is not running, and why."""

    pod: str
    """The pod's name in the member."""
    reason: str
    """The waiting reason of a container (`ImagePullBackOff`, `CrashLoopBackOff`) or the scheduler's
    `Unschedulable`."""
    message: str = ""
    """The member's message, if any."""


class WorkloadRef(CRDModel):
    """The main workload object in the member (``Kind.group`` and name)."""

    kind: str = ""
    """`Kind.group` of the main workload object (`Job.batch`, `JobSet.jobset.x-k8s.io`,
    `PyTorchJob.kubeflow.org`)."""
    name: str = ""
    """Its name in the member."""
    namespace: str = ""
    """Its namespace in the member (empty: the GPUJob's namespace)."""


class Timings(CRDModel):
    """Hub-measured latencies in milliseconds (one monotonic clock, not 1 s timestamps).

    ``placementMs``: hub intake -> placement decision; ``dispatchMs``: decision -> the
    agent acknowledged the objects exist in the member.
    """

    placement_ms: float | None = None
    """Milliseconds from hub intake to the placement decision."""
    dispatch_ms: float | None = None
    """Milliseconds from the decision to the agent's acknowledgement that the objects exist in the
    member."""


class PreemptionVictim(CRDModel):
    """One job preempted to place this one: ``job`` (``namespace/name``), its ``priority``,
    ``costGpuSeconds`` (the work it lost: GPUs x seconds since its last checkpoint) and
    ``reason`` (``priority``: lower priority; ``reclaim``: its queue borrowed from ours)."""

    job: str
    """The preempted GPUJob, `namespace/name`."""
    priority: int = 0
    """The victim's priority when it was preempted."""
    cost_gpu_seconds: float = 0.0
    """The work it lost: GPUs x seconds since its last checkpoint."""
    reason: Literal["priority", "reclaim"] = "priority"
    """`priority`: it had a lower priority; `reclaim`: its queue borrowed from the preemptor's."""


class PreemptionStatus(CRDModel):
    """What the hub preempted to place this job (set on the preemptor, kept once placed):
    the member ``cluster``, the ``nodes`` and ``nvlinkDomains`` freed for it, the ``victims``,
    ``costGpuSeconds`` in all, when (``time``) and one line (``message``)."""

    cluster: str
    """The member cluster the victims ran in."""
    nodes: list[str] = Field(default_factory=list, max_length=512)
    """The nodes freed for this job."""
    nvlink_domains: list[str] = Field(default_factory=list, max_length=512)
    """The NVLink domains (cliques) freed for this job."""
    victims: list[PreemptionVictim] = Field(default_factory=list, max_length=128)
    """The jobs preempted."""
    cost_gpu_seconds: float = 0.0
    """GPU-seconds lost by all victims together."""
    time: DateTime | None = None
    """When the preemption was committed (RFC 3339)."""
    message: str = ""
    """One line for people."""


#: Restarts kept in ``status.restartHistory`` (the newest).
MAX_RESTART_HISTORY = 16


class RestartRecord(CRDModel):
    """One re-run after an infrastructure failure: the ``attempt`` that failed, its
    ``cluster`` and the ``nodes`` involved, the ``reason`` (``NodeLost``, ``NodeNotReady``,
    ``GPUUnavailable``, a ``DisruptionTarget`` reason, ``InfrastructureExitCode``), one line
    (``message``) and when the hub decided it (``time``)."""

    attempt: int = Field(ge=1)
    """The attempt that failed (1 is the first run)."""
    cluster: str
    """The member cluster it ran in."""
    nodes: list[str] = Field(default_factory=list, max_length=64)
    """The nodes involved in the failure."""
    reason: str
    """Why it was an infrastructure failure (`NodeLost`, `NodeNotReady`, `GPUUnavailable`, a
    `DisruptionTarget` reason, `InfrastructureExitCode`)."""
    message: str = ""
    """One line for people."""
    time: DateTime | None = None
    """When the hub decided to re-run it (RFC 3339)."""


class GPUJobStatus(CRDModel):
    """``GPUJob.status``, written only by the hub.

    ``conditions``: the hub's own conditions (``Valid``, ``Placed``, ``Dispatched``,
    ``ClusterLost``) followed by the member workload's conditions in the member's order.
    ``active``/``succeeded``/``failed``/``ready``: pod counts from the member object;
    ``startTime``/``completionTime``: from the member object. ``gpus``: whole GPUs the job
    asks for (all pod sets). ``attempt``: the placement attempt ``cluster`` holds (1, then 2
    after a re-placement; the hub's ``jobs/<uid>`` record counts the same), so a hub that
    lost or restored its etcd state can tell which of its record and this status is newer
    (docs/design.md §7 item 7). ``lastCheckpointTime``: the latest checkpoint the job
    reported in its member (annotation ``gpufed.io/last-checkpoint``, forwarded by the agent).
    ``preemptions``: how many times the hub preempted the job (its copy stopped to free GPUs
    for a higher-priority job; condition ``Preempted``); each returned it to Pending.
    ``preemption``: what the hub preempted to place this job (its victims and the block freed).
    ``restarts``: how many times the hub re-ran the job after an infrastructure failure
    (``spec.placement.retry``); ``restartHistory``: the latest of them (at most 16, oldest
    first), each with the attempt, member, nodes and reason; while a re-run is pending the
    job is Pending with condition ``Restarting`` True, never Failed.
    Terminal phases (Succeeded, Failed, Lost) are final.
    """

    phase: JobPhase = "Pending"
    """Lifecycle: `Pending`, `Placed`, `Running`, `Succeeded`, `Failed` or `Lost`; the last three
    are terminal and final."""
    message: str = ""
    """What is happening, for people (why it waits, where it runs, how it ended)."""
    cluster: str | None = None
    """The member cluster the job is placed on."""
    attempt: int | None = Field(default=None, ge=1)
    """The placement attempt `cluster` holds (1, then 2 after a re-placement)."""
    gpus: int | None = None
    """Whole GPUs the job asks for, over all its pod sets."""
    placement: PlacementStatus | None = None
    conditions: list[StatusCondition] = Field(
        default_factory=list,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    """KEP-1623 conditions: the hub's own first (`Valid`, `Placed`, `Dispatched`, `ClusterLost`,
    `Finished`: True once the job ended, reason `Succeeded`, `Failed` or `Lost`, whatever the
    workload kind), then the member workload's conditions in the member's order."""
    workload: WorkloadRef | None = None
    active: int | None = None
    """Active pods of the member workload."""
    succeeded: int | None = None
    """Succeeded pods of the member workload."""
    failed: int | None = None
    """Failed pods of the member workload."""
    ready: int | None = None
    """Ready pods of the member workload."""
    pod_issues: list[PodIssueStatus] = Field(default_factory=list, max_length=64)
    """Pods of the job in the member that are not running, and why (at most 20 are copied)."""
    start_time: DateTime | None = None
    """When the member workload started (from the member object, RFC 3339)."""
    completion_time: DateTime | None = None
    """When the member workload completed (from the member object, RFC 3339)."""
    last_checkpoint_time: DateTime | None = None
    """The latest checkpoint the job reported in its member (annotation `gpufed.io/last-checkpoint`,
    RFC 3339)."""
    preemptions: int | None = Field(default=None, ge=0)
    """Times this job was preempted (its member copy stopped to place a job of higher priority, or
    reclaimed by a queue below its nominal quota)."""
    preemption: PreemptionStatus | None = None
    """On a preemptor: what the hub preempted to place it (kept once it is placed)."""
    restarts: int | None = Field(default=None, ge=0)
    """Times the job was re-run after an infrastructure failure."""
    restart_history: list[RestartRecord] = Field(
        default_factory=list, max_length=MAX_RESTART_HISTORY
    )
    """The newest 16 re-runs: attempt, cluster, nodes, reason, message, time."""
    next_attempt_at: DateTime | None = None
    """While the job waits out the backoff between re-runs after infrastructure failures: when it
    may be placed again (RFC 3339; `--rerun-backoff-base` doubling per re-run up to
    `--rerun-backoff-max`)."""
    timings: Timings | None = None
    observed_generation: int | None = None
    """The `metadata.generation` this status was computed from."""
