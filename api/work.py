"""Work items, acks and workload status: what flows between hub and agent about jobs.

These pydantic models mirror the protocol messages of ``api/protocol/agent.proto``; the codec
in :mod:`gpufed.api.protocol.codec` converts between the two at the transport edge, so neither
hub nor agent logic touches protobuf types.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

WorkOp = Literal["Apply", "Delete"]
AckResult = Literal["Applied", "Deleted", "Failed"]
#: Phase of a job's workload in the member. ``Missing``: the agent applied it once, the objects
#: are gone, and it will not re-create them (a job that already ran is never re-run).
WorkloadPhase = Literal["Pending", "Running", "Succeeded", "Failed", "Missing"]
#: A Pod Security Standard level (the ``pod-security.kubernetes.io/enforce`` label values).
PodSecurityLevel = Literal["privileged", "baseline", "restricted"]


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class WorkItem(_Model):
    """What the hub wants to exist in one member for one job, at one revision.

    ``revision`` strictly increases per job (the hub's etcd revision of the work item);
    agents ignore revisions older than the newest they have acknowledged. ``manifests`` are
    complete Kubernetes objects prepared by :mod:`gpufed.sync` (origin labels, job UID label,
    node pinning, namespace set). ``applied_before``: the agent acknowledged an Apply of this
    job earlier; missing objects must then not be created again. ``pod_security``: the Pod
    Security level of the GPUJob's hub namespace, which the agent sets as the
    ``pod-security.kubernetes.io/enforce`` label of a member namespace it creates ("" from a
    hub that does not send it: no label).
    """

    job_uid: str
    job: str
    revision: int = Field(ge=1)
    op: WorkOp
    namespace: str
    manifests: tuple[dict[str, Any], ...] = ()
    applied_before: bool = False
    pod_security: PodSecurityLevel | Literal[""] = ""

    def manifests_json(self) -> list[bytes]:
        """Manifests as compact JSON bytes (the wire form)."""
        return [
            json.dumps(m, separators=(",", ":"), sort_keys=True).encode() for m in self.manifests
        ]


class WorkAck(_Model):
    """The agent's answer to one work item revision.

    ``Applied``: the objects exist in the member (durably, the API server accepted them);
    ``Deleted``: they are gone; ``Failed``: the member API refused them, ``message`` carries the
    API's message and ``retryable`` whether a later retry may succeed (5xx, 429, timeouts).
    """

    job_uid: str
    revision: int
    result: AckResult
    message: str = ""
    retryable: bool = False


class Condition(_Model):
    """A condition of the member workload object (``status.conditions[]``), kept in order."""

    type: str
    status: str
    reason: str = ""
    message: str = ""
    last_transition_time: str = ""


class PodIssue(_Model):
    """Why a pod of the job is not running: a waiting reason (``ImagePullBackOff``) or the
    scheduler's ``Unschedulable`` (from ``status.conditions[PodScheduled]``)."""

    pod: str
    reason: str
    message: str = ""


#: Why a job's member copy failed or broke: ``Infrastructure`` (the node, the GPU or the
#: cluster failed under it: the job may be re-run, docs/design.md §7 item 6) or
#: ``Application`` (its own code failed: final).
FailureKind = Literal["Infrastructure", "Application"]
#: Longest failure message carried (characters).
MAX_FAILURE_MESSAGE = 1024
#: At most this many nodes or exit codes per failure cause.
MAX_FAILURE_ITEMS = 64


class FailureCause(_Model):
    """Why a job's workload failed or broke in the member (:mod:`gpufed.sync.failure`).

    ``kind``: ``Infrastructure`` or ``Application``; ``reason``: one word (a Kubernetes
    ``DisruptionTarget`` reason such as ``DeletionByPodGC``, ``NodeLost``, ``NodeNotReady``,
    ``GPUUnavailable``, ``InfrastructureExitCode``; for an application failure the member
    object's ``Failed`` condition reason, e.g. ``BackoffLimitExceeded``, else ``Failed``);
    ``nodes``: the nodes involved (sorted); ``exit_codes``: the non-zero exit codes of the
    job's terminated containers (sorted, at most 64).
    """

    kind: FailureKind
    reason: str = Field(min_length=1, max_length=128)
    message: str = Field(default="", max_length=MAX_FAILURE_MESSAGE)
    nodes: tuple[str, ...] = Field(default=(), max_length=MAX_FAILURE_ITEMS)
    exit_codes: tuple[int, ...] = Field(default=(), max_length=MAX_FAILURE_ITEMS)


class WorkloadStatus(_Model):
    """Summary of one job's workload in a member, sent by the agent whenever it changes.

    Sources: ``conditions``, ``active``/``succeeded``/``failed``/``ready``, ``start_time``,
    ``completion_time`` from the member object's ``status`` (batch/v1 Job fields; JobSet and
    PyTorchJob map onto them); ``pod_issues`` from its pods; ``nodes`` from the pods'
    ``spec.nodeName``; ``last_checkpoint_time``: the latest valid ``gpufed.io/last-checkpoint``
    annotation of the object or its pods (:func:`gpufed.sync.status.last_checkpoint`);
    ``failure``: why the job failed or broke (None while it runs well or once it succeeded;
    :func:`gpufed.sync.failure.classify_failure`; an ``Infrastructure`` cause may come while
    the phase is still ``Running``: a gang that lost a pod is broken as a whole). Times are
    RFC 3339 strings ("" when unknown).
    """

    job_uid: str
    revision: int
    kind: str = ""
    name: str = ""
    phase: WorkloadPhase
    conditions: tuple[Condition, ...] = ()
    active: int = 0
    succeeded: int = 0
    failed: int = 0
    ready: int = 0
    start_time: str = ""
    completion_time: str = ""
    pod_issues: tuple[PodIssue, ...] = ()
    nodes: tuple[str, ...] = ()
    last_checkpoint_time: str = Field(default="", max_length=64)
    failure: FailureCause | None = None
