"""Summarising a job's member objects and pods into a :class:`gpufed.api.work.WorkloadStatus`.

Owns the mapping from the status of a member workload object (``batch/v1`` Job, JobSet,
Kubeflow PyTorchJob or MPIJob, KubeRay RayJob, or any object with Kubernetes-style conditions) and its pods to the one
summary the hub mirrors into ``GPUJob.status``: phase, the member's conditions in their order,
active/succeeded/failed/ready counts, start and completion times, pod-level problems and the
nodes the pods are bound to; and the rule for the job's reported checkpoint time
(:func:`last_checkpoint`, :func:`parse_checkpoint`: the agent reads it, the hub checks it
again). Pure: takes plain dicts as the API server returns them (or the
agent's trimmed copies, which keep the same paths), so the agent calls it on every change and
tests call it on fixtures.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from gpufed.api.labels import LAST_CHECKPOINT_ANNOTATION
from gpufed.api.work import Condition, PodIssue, WorkloadPhase, WorkloadStatus

#: Waiting reasons that are part of a normal start and are not reported as issues.
_BENIGN_WAITING = frozenset({"ContainerCreating", "PodInitializing", ""})
#: At most this many pod issues per status (bounded message size; sorted by pod name).
MAX_POD_ISSUES = 20

#: A checkpoint time may be this far ahead of the reader's clock (seconds: clock skew between
#: the trainer's node and the agent or hub); further ahead it is refused as in the future.
CHECKPOINT_CLOCK_SKEW_S: Final = 60.0
#: Longest annotation value parsed as a time (RFC 3339 with nanoseconds and an offset is 35).
_MAX_TIME_CHARS: Final = 64

# Terminal conditions per kind: condition type (status "True") -> phase. Order matters: the
# first match wins, so Failed is checked before success for kinds that could show both.
_TERMINAL: dict[str, tuple[tuple[str, WorkloadPhase], ...]] = {
    "Job.batch": (("Failed", "Failed"), ("Complete", "Succeeded")),
    "JobSet.jobset.x-k8s.io": (("Failed", "Failed"), ("Completed", "Succeeded")),
    "PyTorchJob.kubeflow.org": (("Failed", "Failed"), ("Succeeded", "Succeeded")),
    "MPIJob.kubeflow.org": (("Failed", "Failed"), ("Succeeded", "Succeeded")),
    # from the conditions :func:`ray_conditions` derives (a RayJob reports states, not conditions)
    "RayJob.ray.io": (("Failed", "Failed"), ("Succeeded", "Succeeded")),
}
#: Kinds whose ``status.replicaStatuses`` map replica type -> {active, succeeded, failed}.
_REPLICA_STATUS_KINDS = frozenset({"PyTorchJob.kubeflow.org", "MPIJob.kubeflow.org"})
#: RayJob ``jobStatus`` values (the Ray job inside) that end it without success.
_RAY_UNSUCCESSFUL = frozenset({"FAILED", "STOPPED"})
_GENERIC_TERMINAL: tuple[tuple[str, WorkloadPhase], ...] = (
    ("Failed", "Failed"),
    ("Complete", "Succeeded"),
    ("Completed", "Succeeded"),
    ("Succeeded", "Succeeded"),
)


def summarize_workload(
    *,
    job_uid: str,
    revision: int,
    kind: str,
    name: str,
    obj: Mapping[str, Any] | None,
    pods: Iterable[Mapping[str, Any]] = (),
    missing: bool = False,
) -> WorkloadStatus:
    """Summarise one job's main member object ``obj`` (of ``kind`` = ``Kind.group``) and its
    pods into a :class:`WorkloadStatus`.

    Phases: ``Missing`` when ``missing`` (the objects are gone and will not be re-created);
    ``Succeeded``/``Failed`` from the kind's terminal condition with status ``True`` (Job:
    ``Complete``/``Failed``; JobSet: ``Completed``/``Failed``; PyTorchJob and MPIJob:
    ``Succeeded``/``Failed``; RayJob: those :func:`ray_conditions` derives from its
    ``jobDeploymentStatus``/``jobStatus``, after its own conditions if any; other kinds: any of
    these); ``Running`` when a pod runs or
    already finished, the object reports ready, succeeded or failed pods or a ``Running``
    condition is True; ``Pending`` otherwise,
    including while ``obj`` is None (applied, not yet observed). A pod that is Pending because it is unschedulable
    keeps the job Pending (a Job counts such pods as active).

    Counts come from the object's status (Job ``status.active/succeeded/failed/ready``,
    JobSet ``status.replicatedJobsStatus[]`` summed, PyTorchJob and MPIJob
    ``status.replicaStatuses`` summed); kinds without counts (RayJob) are counted from pods. ``start_time``: ``status.startTime``,
    else the earliest pod ``status.startTime``; ``completion_time``: ``status.completionTime``
    (RayJob: ``status.endTime``), else the ``lastTransitionTime`` of the terminal condition (a failed Job has no
    completionTime).
    """
    pod_list = sorted(pods, key=lambda p: str(_meta(p).get("name", "")))
    nodes = tuple(sorted({n for p in pod_list if (n := _spec(p).get("nodeName"))}))
    issues = _pod_issues(pod_list)
    if missing:
        return WorkloadStatus(
            job_uid=job_uid, revision=revision, kind=kind, name=name, phase="Missing"
        )
    status: Mapping[str, Any] = (obj or {}).get("status") or {}
    conditions = _conditions(kind, status)
    active, succeeded, failed, ready = _counts(kind, status, pod_list)

    phase: WorkloadPhase = "Pending"
    terminal_at = ""
    if (terminal := _terminal(kind, conditions)) is not None:
        phase, terminal_at = terminal
    else:
        running_pod = any(_status(p).get("phase") == "Running" for p in pod_list)
        running_cond = any(c.type == "Running" and c.status == "True" for c in conditions)
        # Pods that already ran keep the job Running until its terminal condition arrives
        # (a Job's pod finishes a moment before the Job controller marks it Complete); without
        # this the phase would fall back to Pending in between.
        ran = (
            succeeded > 0
            or failed > 0
            or any(_status(p).get("phase") in ("Succeeded", "Failed") for p in pod_list)
        )
        if obj is not None and (running_pod or running_cond or ready > 0 or ran):
            phase = "Running"

    start = str(status.get("startTime") or "") or _earliest_pod_start(pod_list)
    done_at = status.get("endTime") if kind == "RayJob.ray.io" else status.get("completionTime")
    completion = str(done_at or "") if phase == "Succeeded" else ""
    if phase in ("Succeeded", "Failed") and not completion:
        completion = terminal_at
    return WorkloadStatus(
        job_uid=job_uid,
        revision=revision,
        kind=kind,
        name=name,
        phase=phase,
        conditions=conditions,
        active=active,
        succeeded=succeeded,
        failed=failed,
        ready=ready,
        start_time=start,
        completion_time=completion,
        pod_issues=() if phase == "Succeeded" else issues,
        nodes=nodes,
    )


def terminal_phase(kind: str, obj: Mapping[str, Any] | None) -> WorkloadPhase | None:
    """``Succeeded`` or ``Failed`` when the member object ``obj`` (of ``kind`` =
    ``Kind.group``) shows its kind's terminal condition, by the rule of
    :func:`summarize_workload`; None while it has not finished (or is None).

    The agent asks it about the last state of a deleted object: a copy that finished before it
    was deleted keeps its outcome instead of turning ``Missing``."""
    status: Mapping[str, Any] = (obj or {}).get("status") or {}
    terminal = _terminal(kind, _conditions(kind, status))
    return terminal[0] if terminal is not None else None


def _conditions(kind: str, status: Mapping[str, Any]) -> tuple[Condition, ...]:
    """The object's conditions in its order (a RayJob's then those derived from its states)."""
    conditions = tuple(_condition(c) for c in status.get("conditions") or [] if isinstance(c, dict))
    if kind == "RayJob.ray.io":
        own = {c.type for c in conditions}
        conditions += tuple(c for c in ray_conditions(status) if c.type not in own)
    return conditions


def _terminal(kind: str, conditions: tuple[Condition, ...]) -> tuple[WorkloadPhase, str] | None:
    """(phase, lastTransitionTime) of the kind's first terminal condition that is True."""
    for ctype, cphase in _TERMINAL.get(kind, _GENERIC_TERMINAL):
        cond = next((c for c in conditions if c.type == ctype and c.status == "True"), None)
        if cond is not None:
            return cphase, cond.last_transition_time
    return None


def ray_conditions(status: Mapping[str, Any]) -> tuple[Condition, ...]:
    """Conditions for a RayJob's ``status`` (KubeRay reports ``jobDeploymentStatus``, the
    RayJob's own state, and ``jobStatus``, the Ray job's; no conditions).

    ``jobDeploymentStatus`` ``Complete`` with ``jobStatus`` ``SUCCEEDED``: ``Succeeded=True``;
    ``Failed``, or ``Complete`` with ``FAILED``/``STOPPED``: ``Failed=True`` (reason: the
    RayJob's ``status.reason`` or the job status); ``Running``: ``Running=True``; any other
    state (``New``, ``Initializing``, ``Waiting``, ``Suspended``, ``Retrying`` ...):
    ``Running=False`` with the state as reason. ``lastTransitionTime``: ``endTime`` for the
    terminal ones, else ``startTime``. Nothing before KubeRay wrote a state.
    """
    deployment = str(status.get("jobDeploymentStatus") or "")
    job = str(status.get("jobStatus") or "")
    if not deployment:
        return ()
    message = str(status.get("message") or "")
    end, begin = str(status.get("endTime") or ""), str(status.get("startTime") or "")
    if deployment == "Complete" and job == "SUCCEEDED":
        return (_cond("Succeeded", "True", job, message, end),)
    if deployment == "Failed" or (deployment == "Complete" and job in _RAY_UNSUCCESSFUL):
        reason = str(status.get("reason") or job or deployment)
        return (_cond("Failed", "True", reason, message, end),)
    running = deployment == "Running"
    return (_cond("Running", "True" if running else "False", job or deployment, message, begin),)


def _cond(ctype: str, status: str, reason: str, message: str, at: str) -> Condition:
    return Condition(
        type=ctype, status=status, reason=reason, message=message, last_transition_time=at
    )


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def _spec(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("spec") or {}


def _status(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("status") or {}


def _condition(raw: Mapping[str, Any]) -> Condition:
    return Condition(
        type=str(raw.get("type", "")),
        status=str(raw.get("status", "")),
        reason=str(raw.get("reason") or ""),
        message=str(raw.get("message") or ""),
        last_transition_time=str(raw.get("lastTransitionTime") or ""),
    )


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _counts(
    kind: str, status: Mapping[str, Any], pods: list[Mapping[str, Any]]
) -> tuple[int, int, int, int]:
    """(active, succeeded, failed, ready) from the object status, else from pods."""
    if kind == "Job.batch":
        return (
            _int(status.get("active")),
            _int(status.get("succeeded")),
            _int(status.get("failed")),
            _int(status.get("ready")),
        )
    if kind == "JobSet.jobset.x-k8s.io" and status.get("replicatedJobsStatus"):
        rjs = [r for r in status.get("replicatedJobsStatus") or [] if isinstance(r, dict)]
        return (
            sum(_int(r.get("active")) for r in rjs),
            sum(_int(r.get("succeeded")) for r in rjs),
            sum(_int(r.get("failed")) for r in rjs),
            sum(_int(r.get("ready")) for r in rjs),
        )
    if kind in _REPLICA_STATUS_KINDS and status.get("replicaStatuses"):
        reps = [r for r in (status.get("replicaStatuses") or {}).values() if isinstance(r, dict)]
        active = sum(_int(r.get("active")) for r in reps)
        return (
            active,
            sum(_int(r.get("succeeded")) for r in reps),
            sum(_int(r.get("failed")) for r in reps),
            _pods_ready(pods),
        )
    phases = [_status(p).get("phase") for p in pods if not _meta(p).get("deletionTimestamp")]
    return (
        sum(1 for ph in phases if ph in ("Pending", "Running")),
        sum(1 for ph in phases if ph == "Succeeded"),
        sum(1 for ph in phases if ph == "Failed"),
        _pods_ready(pods),
    )


def _pods_ready(pods: list[Mapping[str, Any]]) -> int:
    return sum(
        1
        for p in pods
        if any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in _status(p).get("conditions") or []
            if isinstance(c, dict)
        )
    )


def _earliest_pod_start(pods: list[Mapping[str, Any]]) -> str:
    # RFC 3339 UTC timestamps as the API server writes them compare correctly as strings.
    starts = [str(s) for p in pods if (s := _status(p).get("startTime"))]
    return min(starts, default="")


def _pod_issues(pods: list[Mapping[str, Any]]) -> tuple[PodIssue, ...]:
    """Why pods are not running: the scheduler's Unschedulable, container waiting reasons
    (ImagePullBackOff, CrashLoopBackOff, CreateContainerConfigError ...), and the reason of a
    failed pod (Evicted, OOMKilled ...)."""
    issues: list[PodIssue] = []
    for pod in pods:
        name = str(_meta(pod).get("name", ""))
        status = _status(pod)
        phase = status.get("phase")
        issue: PodIssue | None = None
        if phase == "Pending":
            sched = next(
                (
                    c
                    for c in status.get("conditions") or []
                    if isinstance(c, dict) and c.get("type") == "PodScheduled"
                ),
                None,
            )
            if sched is not None and sched.get("status") == "False" and sched.get("reason"):
                issue = PodIssue(
                    pod=name, reason=str(sched["reason"]), message=str(sched.get("message") or "")
                )
        if issue is None and phase in ("Pending", "Running"):
            for cs in [
                *(status.get("initContainerStatuses") or []),
                *(status.get("containerStatuses") or []),
            ]:
                waiting = ((cs or {}).get("state") or {}).get("waiting") or {}
                reason = str(waiting.get("reason") or "")
                if reason not in _BENIGN_WAITING:
                    issue = PodIssue(
                        pod=name, reason=reason, message=str(waiting.get("message") or "")
                    )
                    break
        if issue is None and phase == "Failed":
            reason = str(status.get("reason") or "")
            message = str(status.get("message") or "")
            if not reason:
                for cs in status.get("containerStatuses") or []:
                    term = ((cs or {}).get("state") or {}).get("terminated") or {}
                    if term.get("exitCode", 0) != 0:
                        reason = str(term.get("reason") or "Error")
                        message = str(term.get("message") or f"exit code {term.get('exitCode')}")
                        break
            if reason:
                issue = PodIssue(pod=name, reason=reason, message=message)
        if issue is not None:
            issues.append(issue)
        if len(issues) >= MAX_POD_ISSUES:
            break
    return tuple(issues)


# --- the reported checkpoint ---------------------------------------------------------------------


def parse_checkpoint(value: str, *, now: float) -> tuple[str, str]:
    """A ``gpufed.io/last-checkpoint`` value -> (the time in canonical RFC 3339 UTC,
    ``2026-01-02T03:04:05Z``, "" when refused; why it was refused, "" when accepted).

    Refused: longer than 64 characters, not RFC 3339 with a time zone (``Z`` or an offset), or
    more than :data:`CHECKPOINT_CLOCK_SKEW_S` after ``now`` (wall seconds). Never raises.
    """
    if len(value) > _MAX_TIME_CHARS:
        return "", f"longer than {_MAX_TIME_CHARS} characters"
    try:
        when = datetime.fromisoformat(value.strip().replace("z", "Z").replace("Z", "+00:00"))
    except ValueError:
        return "", "not an RFC 3339 time (e.g. 2026-01-02T03:04:05Z)"
    if "T" not in value.upper() or when.tzinfo is None:
        return "", "not an RFC 3339 time with a time zone (e.g. 2026-01-02T03:04:05Z)"
    ts = when.timestamp()
    if ts > now + CHECKPOINT_CLOCK_SKEW_S:
        return "", f"{ts - now:.0f} s in the future"
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), ""


@dataclass(frozen=True)
class CheckpointReport:
    """The job's latest valid checkpoint time (``time``, canonical RFC 3339, "" for none) and
    the values refused (``refused``: (where, value, why), at most 4)."""

    time: str = ""
    refused: tuple[tuple[str, str, str], ...] = ()


def last_checkpoint(
    obj: Mapping[str, Any] | None, pods: Iterable[Mapping[str, Any]], *, now: float
) -> CheckpointReport:
    """The latest ``gpufed.io/last-checkpoint`` (:data:`LAST_CHECKPOINT_ANNOTATION`) over the
    main object ``obj`` and its ``pods``: each value through :func:`parse_checkpoint`; refused
    values are returned for the caller to log, never raised."""
    best = ""
    refused: list[tuple[str, str, str]] = []
    sources = [("object", obj)] if obj is not None else []
    sources += [(f"pod {_meta(p).get('name', '')}", p) for p in pods]
    for where, source in sources:
        raw = (_meta(source).get("annotations") or {}).get(LAST_CHECKPOINT_ANNOTATION)
        if raw is None:
            continue
        value = str(raw)
        when, why = parse_checkpoint(value, now=now)
        if why:
            if len(refused) < 4:
                refused.append((where, value[:_MAX_TIME_CHARS], why))
        elif when > best:  # canonical UTC strings of one format sort as times
            best = when
    return CheckpointReport(time=best, refused=tuple(refused))
