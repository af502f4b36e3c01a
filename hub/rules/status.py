"""GPUJob status as the hub writes it: pure functions from events to ``GPUJobStatus``.

Called by the leader (:mod:`gpufed.hub.components.core`) whenever something about a job changes: a
placement decision, an ack, a workload status report, a lost member. Each function takes the
current status and returns the next one; none of them does I/O, so the rules are unit-tested
directly:

- **terminal phases are final** (docs/design.md §7 item 2): once ``Succeeded``, ``Failed`` or
  ``Lost`` is written, no later event changes the phase, the conditions or the counts;
- conditions: the hub's own (:data:`HUB_CONDITIONS`, in that order) first, then the member
  workload's conditions **in the member's order**; a condition's ``lastTransitionTime`` only
  moves when its status changes; every condition is a KEP-1623 ``metav1.Condition`` (reason
  CamelCase and never empty: :func:`condition_reason`, the one place that makes it so);
- ``Finished`` is derived from the phase in one place, :func:`derived` (called by the mirror
  on every status it writes): ``True`` with reason ``Succeeded``, ``Failed`` or ``Lost`` once
  the phase is terminal, else ``False`` with the phase as reason; whatever the workload kind
  (Job, JobSet, PyTorchJob), ``kubectl wait --for=condition=Finished gpujob/NAME`` returns
  when the job ended; ``derived`` also stamps each condition's ``observedGeneration``;
- phase from the member: ``Pending`` -> ``Placed``, ``Running`` -> ``Running``,
  ``Succeeded``/``Failed`` -> the same (with the member's reason and times), ``Missing`` (the
  agent applied the job once and its objects went before they finished; a copy deleted after
  it finished is reported with its outcome) -> ``Failed`` with reason
  ``MemberObjectsMissing``.

Also the conversions between placement's ``Decision`` and ``status.placement``.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

from gpufed.api.decision import (
    ClusterRejection,
    ClusterScore,
    Decision,
    Outcome,
    PodSetAssignment,
)
from gpufed.api.gpujob import (
    CONDITION_REASON_PATTERN,
    CONDITION_TYPE_PATTERN,
    TERMINAL_PHASES,
    ClusterRejectionStatus,
    ClusterScoreStatus,
    GPUJobStatus,
    JobPhase,
    PlacementStatus,
    PodIssueStatus,
    PodSetPlacement,
    PreemptionStatus,
    StatusCondition,
    Timings,
    WorkloadRef,
)
from gpufed.api.work import WorkloadStatus

#: Kind-independent: True once the job ended (derived from the phase by :func:`derived`).
FINISHED_CONDITION = "Finished"
#: The hub's own condition types, in the order they appear in ``status.conditions``.
HUB_CONDITIONS: tuple[str, ...] = (
    "Valid",
    "Placed",
    "Dispatched",
    "ClusterLost",
    "Preempted",
    "InfrastructureFailure",
    "Restarting",
    FINISHED_CONDITION,
)
#: The reason of a condition whose source gave none (KEP-1623: a reason is required).
NO_REASON = "Unspecified"
_REASON_RE = re.compile(CONDITION_REASON_PATTERN)
_TYPE_RE = re.compile(CONDITION_TYPE_PATTERN)
_MEMBER_PHASES: dict[str, JobPhase] = {
    "Pending": "Placed",
    "Running": "Running",
    "Succeeded": "Succeeded",
    "Failed": "Failed",
    "Missing": "Failed",
}
#: At most this many pod issues are copied into the status (the rest are counted).
MAX_POD_ISSUES = 20


def rfc3339(ts: float) -> str:
    """Seconds since the epoch -> ``2026-01-02T03:04:05.123456Z``."""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_rfc3339(value: str) -> float:
    """RFC 3339 (as Kubernetes writes it, with or without fraction) -> epoch seconds."""
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def is_terminal(status: GPUJobStatus | None) -> bool:
    """True once the status holds a terminal phase (Succeeded, Failed, Lost)."""
    return status is not None and status.phase in TERMINAL_PHASES


# --- conditions ----------------------------------------------------------------------------------


def condition_reason(raw: str) -> str:
    """``raw`` as a KEP-1623 reason: kept when already CamelCase (``BackoffLimitExceeded``),
    else its words joined CamelCase (``"image pull back-off"`` -> ``ImagePullBackOff``), at
    most 1,024 characters; :data:`NO_REASON` when nothing is left."""
    if _REASON_RE.match(raw) and len(raw) <= 1024:
        return raw
    words = re.findall(r"[A-Za-z0-9]+", raw)
    out = "".join(w[:1].upper() + w[1:] for w in words).lstrip("0123456789")[:1024]
    return out or NO_REASON


def derived(status: GPUJobStatus, *, generation: int | None, now: str) -> GPUJobStatus:
    """``status`` with what is derived from the rest of it, in one place: the ``Finished``
    condition (from the phase) and every condition's ``observedGeneration`` (``generation``,
    the GPUJob's ``metadata.generation``). Idempotent; called on every status the hub writes."""
    if status.phase in TERMINAL_PHASES:
        finished = ("True", status.phase)
    else:
        finished = ("False", status.phase)
    conds = set_condition(
        status.conditions,
        FINISHED_CONDITION,
        finished[0],
        reason=finished[1],
        message=status.message,
        now=now,
    )
    if generation is not None:
        conds = [c.model_copy(update={"observed_generation": generation}) for c in conds]
    return status.model_copy(update={"conditions": conds, "observed_generation": generation})


def set_condition(
    conditions: list[StatusCondition],
    type_: str,
    status: str,
    *,
    reason: str,
    message: str,
    now: str,
) -> list[StatusCondition]:
    """``conditions`` with ``type_`` set; kept in place, time moves only when status changes.

    A new hub condition goes at its place in :data:`HUB_CONDITIONS` order, before every member
    condition. ``reason`` goes through :func:`condition_reason` (CamelCase, never empty). The
    one writer of every condition the hub writes (GPUJob, MemberCluster, GPUQueue).
    """
    reason = condition_reason(reason)
    out = list(conditions)
    for i, c in enumerate(out):
        if c.type == type_:
            when = c.last_transition_time if c.status == status else now
            out[i] = StatusCondition(
                type=type_,
                status=status,
                observed_generation=c.observed_generation,
                reason=reason,
                message=message,
                last_transition_time=when or now,
            )
            return out
    new = StatusCondition(
        type=type_,
        status=status,
        reason=reason,
        message=message,
        last_transition_time=now,
    )
    rank = HUB_CONDITIONS.index(type_) if type_ in HUB_CONDITIONS else len(HUB_CONDITIONS)
    pos = 0
    for i, c in enumerate(out):
        if c.type in HUB_CONDITIONS and HUB_CONDITIONS.index(c.type) < rank:
            pos = i + 1
    out.insert(pos, new)
    return out


def _member_conditions(ws: WorkloadStatus, now: str) -> list[StatusCondition]:
    seen: set[str] = set(HUB_CONDITIONS)
    out: list[StatusCondition] = []
    for c in ws.conditions:
        # A type the API server would refuse (not a KEP-1623 type) is left out.
        if c.type in seen or len(c.type) > 316 or not _TYPE_RE.match(c.type):
            continue
        seen.add(c.type)
        status = c.status if c.status in ("True", "False", "Unknown") else "Unknown"
        out.append(
            StatusCondition(
                type=c.type,
                status=status,
                reason=condition_reason(c.reason),
                message=c.message,
                last_transition_time=c.last_transition_time or now,
            )
        )
    return out


# --- transitions ---------------------------------------------------------------------------------


def invalid(status: GPUJobStatus, *, field: str, message: str, now: str) -> GPUJobStatus:
    """An invalid GPUJob: phase Failed, condition ``Valid=False`` naming the field."""
    if is_terminal(status):
        return status
    conds = set_condition(
        status.conditions, "Valid", "False", reason="InvalidSpec", message=message, now=now
    )
    return status.model_copy(
        update={"phase": "Failed", "message": f"invalid: {message}", "conditions": conds}
    )


def waiting(status: GPUJobStatus, *, reason: str, message: str, now: str) -> GPUJobStatus:
    """A job that waits for something other than capacity (its PriorityClass to exist): phase
    Pending, ``Placed=False`` with ``reason``, ``message`` prefixed ``waiting:``."""
    if is_terminal(status):
        return status
    msg = f"waiting: {message}"
    conds = set_condition(status.conditions, "Valid", "True", reason="Valid", message="", now=now)
    conds = set_condition(conds, "Placed", "False", reason=reason, message=msg, now=now)
    return status.model_copy(
        update={"phase": "Pending", "cluster": None, "message": msg, "conditions": conds}
    )


def preempting(
    status: GPUJobStatus, preemption: PreemptionStatus, *, message: str, now: str
) -> GPUJobStatus:
    """The job preempts others to be placed: waiting (``Placed=False``, reason
    ``Preempting``) with ``status.preemption`` naming its victims and the block freed (kept
    once it is placed, for ``gpufed explain``)."""
    if is_terminal(status):
        return status
    out = waiting(status, reason="Preempting", message=message, now=now)
    return out.model_copy(update={"preemption": preemption})


def decided(
    status: GPUJobStatus,
    decision: Decision,
    *,
    gpus: int,
    placement_ms: float | None,
    now: str,
    attempt: int | None = None,
) -> GPUJobStatus:
    """A placement decision: ``Placed`` (phase Placed, cluster set, ``attempt`` the placement
    attempt of the job record), ``Unschedulable`` (phase Pending with the reason) or
    ``Rejected`` (phase Failed: no member could ever hold it)."""
    if is_terminal(status):
        return status
    placement = placement_status(decision)
    conds = set_condition(status.conditions, "Valid", "True", reason="Valid", message="", now=now)
    update: dict[str, object] = {"placement": placement, "gpus": gpus}
    if decision.outcome == Outcome.PLACED:
        domains = ", ".join(decision.nvlink_domains[:4])
        msg = f"placed on {decision.cluster}" + (f" ({domains})" if domains else "")
        conds = set_condition(conds, "Placed", "True", reason="Placed", message=msg, now=now)
        timings = (status.timings or Timings()).model_copy(update={"placement_ms": placement_ms})
        update.update(
            phase="Placed", cluster=decision.cluster, message=msg, timings=timings, attempt=attempt
        )
    elif decision.outcome == Outcome.REJECTED:
        msg = "no member cluster can ever hold this job: " + decision.message.removeprefix(
            "rejected: "
        )
        conds = set_condition(conds, "Placed", "False", reason="Rejected", message=msg, now=now)
        update.update(phase="Failed", cluster=None, message=msg)
    else:
        msg = f"waiting: {decision.message.removeprefix('waiting: ')}"
        conds = set_condition(
            conds, "Placed", "False", reason="Unschedulable", message=msg, now=now
        )
        update.update(phase="Pending", cluster=None, message=msg)
    update["conditions"] = conds
    return status.model_copy(update=update)


def resumed(
    status: GPUJobStatus, *, cluster: str, gpus: int, now: str, attempt: int | None = None
) -> GPUJobStatus:
    """A job placed on ``cluster`` (its ``jobs/<uid>`` record in etcd) by a hub that stopped
    before the status saying so was written: the record is the truth, so the status shows the
    placement again (phase at least ``Placed``). The decision's explanation is not stored in
    etcd; ``status.placement`` stays as it was."""
    if is_terminal(status) or status.cluster == cluster:
        return status
    msg = f"placed on {cluster}"
    conds = set_condition(status.conditions, "Valid", "True", reason="Valid", message="", now=now)
    conds = set_condition(conds, "Placed", "True", reason="Placed", message=msg, now=now)
    phase = status.phase if status.phase in ("Placed", "Running") else "Placed"
    return status.model_copy(
        update={
            "phase": phase,
            "cluster": cluster,
            "gpus": gpus,
            "message": msg,
            "conditions": conds,
            "attempt": attempt,
        }
    )


def dispatched(status: GPUJobStatus, *, dispatch_ms: float | None, now: str) -> GPUJobStatus:
    """The agent acknowledged the objects exist in the member."""
    if is_terminal(status):
        return status
    conds = set_condition(
        status.conditions,
        "Dispatched",
        "True",
        reason="Applied",
        message=f"objects created in {status.cluster}",
        now=now,
    )
    timings = status.timings or Timings()
    if dispatch_ms is not None and timings.dispatch_ms is None:
        timings = timings.model_copy(update={"dispatch_ms": dispatch_ms})
    return status.model_copy(update={"conditions": conds, "timings": timings})


def apply_retrying(
    status: GPUJobStatus,
    *,
    cluster: str,
    message: str,
    attempt: int,
    limit: int,
    retry_in_s: float,
    now: str,
) -> GPUJobStatus:
    """The member refused the objects for now (a retryable error): condition
    ``Dispatched=False`` with reason ``Retrying`` and the member's message; the phase stays."""
    if is_terminal(status):
        return status
    msg = f"retrying in {cluster} in {retry_in_s:.0f} s (attempt {attempt} of {limit}): {message}"
    conds = set_condition(
        status.conditions, "Dispatched", "False", reason="Retrying", message=msg, now=now
    )
    return status.model_copy(update={"message": msg, "conditions": conds})


def member_refused(status: GPUJobStatus, *, message: str, now: str) -> GPUJobStatus:
    """The member API refused the objects for good: phase Failed, ``Dispatched=False``."""
    if is_terminal(status):
        return status
    conds = set_condition(
        status.conditions, "Dispatched", "False", reason="MemberRejected", message=message, now=now
    )
    return status.model_copy(
        update={
            "phase": "Failed",
            "message": f"the member refused the objects: {message}",
            "conditions": conds,
        }
    )


def workload(status: GPUJobStatus, ws: WorkloadStatus, *, now: str) -> GPUJobStatus:
    """A workload status report from the member (see the module doc for the phase map)."""
    if is_terminal(status):
        return status
    phase = _MEMBER_PHASES[ws.phase]
    hub = [c for c in status.conditions if c.type in HUB_CONDITIONS]
    conds = hub + _member_conditions(ws, now)
    if phase == "Failed" and ws.phase == "Missing":
        message = (
            f"the job's objects disappeared from {status.cluster} after they were created; "
            "gpufed does not re-create a job that already ran"
        )
        conds = set_condition(
            conds, "Dispatched", "False", reason="MemberObjectsMissing", message=message, now=now
        )
    else:
        message = _workload_message(phase, ws, status.cluster)
    if phase in ("Running", "Succeeded") and any(
        c.type == "Restarting" and c.status == "True" for c in conds
    ):
        conds = set_condition(
            conds, "Restarting", "False", reason="Restarted", message=message, now=now
        )
    issues = [PodIssueStatus(pod=i.pod, reason=i.reason, message=i.message) for i in ws.pod_issues]
    return status.model_copy(
        update={
            "phase": phase,
            "message": message,
            "conditions": conds,
            "workload": WorkloadRef(kind=ws.kind, name=ws.name, namespace=""),
            "active": ws.active,
            "succeeded": ws.succeeded,
            "failed": ws.failed,
            "ready": ws.ready,
            "pod_issues": issues[:MAX_POD_ISSUES],
            "start_time": ws.start_time or status.start_time,
            "completion_time": ws.completion_time or status.completion_time,
            # Checkpoints only move forward (canonical UTC strings of one format sort as times).
            "last_checkpoint_time": max(ws.last_checkpoint_time, status.last_checkpoint_time or "")
            or None,
        }
    )


def _workload_message(phase: JobPhase, ws: WorkloadStatus, cluster: str | None) -> str:
    if phase == "Failed":
        for c in ws.conditions:
            if c.type == "Failed" and c.status == "True":
                return f"failed in {cluster}: {c.reason}: {c.message}".rstrip(": ")
        return f"failed in {cluster}"
    if phase == "Succeeded":
        return f"succeeded in {cluster}"
    if ws.pod_issues:
        first = ws.pod_issues[0]
        return f"{phase.lower()} in {cluster}; pod {first.pod}: {first.reason} {first.message}"
    return f"{phase.lower()} in {cluster}"


def cluster_lost(
    status: GPUJobStatus,
    *,
    cluster: str,
    rescheduled: bool,
    lost_for_s: float,
    now: str,
    deleted: bool = False,
) -> GPUJobStatus:
    """The member running the job was declared lost (``deleted``: its MemberCluster was
    deleted on the hub; otherwise its agent was silent for ``lost_for_s`` seconds).

    ``rescheduled`` (``reschedule: OnClusterLoss``): back to Pending to be placed again.
    Otherwise phase Lost (terminal).
    """
    if is_terminal(status):
        return status
    what = (
        f"member {cluster} was deleted on the hub (MemberCluster removed)"
        if deleted
        else f"member {cluster} stopped reporting {lost_for_s:.0f} s ago"
    )
    if rescheduled:
        msg = (
            f"{what}; placing the job again (reschedule: OnClusterLoss); the old copy is "
            "deleted when the member returns"
        )
    else:
        msg = f"{what}; the job is Lost (reschedule: Never)"
    conds = set_condition(
        status.conditions, "ClusterLost", "True", reason="ClusterLost", message=msg, now=now
    )
    if rescheduled:
        conds = set_condition(conds, "Placed", "False", reason="ClusterLost", message=msg, now=now)
        conds = [c for c in conds if c.type in HUB_CONDITIONS and c.type != "Dispatched"]
        return status.model_copy(
            update={
                "phase": "Pending",
                "cluster": None,
                "message": msg,
                "conditions": conds,
                "active": None,
                "ready": None,
                "pod_issues": [],
            }
        )
    return status.model_copy(update={"phase": "Lost", "message": msg, "conditions": conds})


# --- placement status <-> Decision ---------------------------------------------------------------


def placement_status(decision: Decision) -> PlacementStatus:
    """``status.placement`` for a decision (same fields, camelCase)."""
    return PlacementStatus(
        outcome=decision.outcome.value,
        cluster=decision.cluster,
        gpu_product=decision.gpu_product,
        nvlink_domains=list(decision.nvlink_domains),
        pod_sets=[
            PodSetPlacement(name=p.name, requests=dict(p.requests), nodes=dict(p.nodes))
            for p in decision.pod_sets
        ],
        score=decision.score,
        scores=[
            ClusterScoreStatus(
                cluster=s.cluster, score=s.score, gpu_product=s.gpu_product, parts=dict(s.parts)
            )
            for s in decision.scores
        ],
        rejections=[
            ClusterRejectionStatus(cluster=r.cluster, plugin=r.plugin, code=r.code, reason=r.reason)
            for r in decision.rejections
        ],
        message=decision.message,
        compute_domain=decision.job.rpartition("/")[2] if decision.compute_domain else None,
        explained=decision.explained,
        policy=decision.policy,
        decided_time=rfc3339(decision.decided_at) if decision.decided_at else None,
    )


def decision_from_status(job: str, uid: str, placement: PlacementStatus) -> Decision:
    """The ``Decision`` a ``status.placement`` was written from (for ``gpufed explain``)."""
    return Decision(
        job=job,
        uid=uid,
        outcome=Outcome(placement.outcome),
        cluster=placement.cluster,
        gpu_product=placement.gpu_product,
        nvlink_domains=tuple(placement.nvlink_domains),
        pod_sets=tuple(
            PodSetAssignment(name=p.name, requests=p.requests, nodes=p.nodes)
            for p in placement.pod_sets
        ),
        score=placement.score,
        scores=tuple(
            ClusterScore(cluster=s.cluster, score=s.score, gpu_product=s.gpu_product, parts=s.parts)
            for s in placement.scores
        ),
        rejections=tuple(
            ClusterRejection(cluster=r.cluster, plugin=r.plugin, code=r.code, reason=r.reason)
            for r in placement.rejections
        ),
        message=placement.message,
        explained=placement.explained,
        policy=placement.policy or "default",
        decided_at=parse_rfc3339(placement.decided_time) if placement.decided_time else 0.0,
        compute_domain=placement.compute_domain is not None,
    )
