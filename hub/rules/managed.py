"""Plain workloads applied to the hub with ``managedBy: gpufed.io/hub``: which kinds, the GPUJob
that federates each one, and the workload status written back from that GPUJob's status.

Pure functions used by :mod:`gpufed.hub.components.managed` (the component that watches the
workloads, creates and deletes their GPUJobs and writes their status); no I/O, no clock (the
caller passes ``now``).

- :data:`KINDS`: the kinds the hub can accept (``batch/v1`` Job, ``jobset.x-k8s.io/v1alpha2``
  JobSet), each with its API coordinates;
- :func:`gpujob_for`: the GPUJob of a workload (JSON form), as ``gpufed submit`` would wrap it
  (placement hints: :func:`gpufed.api.hints.placement_hints`), named
  :func:`gpujob_name`, owned by the workload (a controller ``ownerReference``), its template
  the workload without what the hub's API server added (uid, selector, controller labels) and
  without ``managedBy`` (the member's own controller must run the copy);
- :func:`owner_of`: which workload a GPUJob was made for (None: not one of these GPUJobs);
- :func:`has_started`: whether a workload's status says its GPUJob ran once (a Job's
  ``startTime``, a JobSet's condition :data:`STARTED_CONDITION`), so it is never run twice;
- :func:`job_status` / :func:`jobset_status`: the workload's status from its GPUJob's status,
  valid for the API server (a Job's rules: :func:`job_status`); a finished workload's status is
  final.
"""

from __future__ import annotations

import copy
import hashlib
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from gpufed.api.errors import FieldError
from gpufed.api.gpujob import GPUJobStatus
from gpufed.api.hints import placement_hints
from gpufed.api.labels import API_VERSION, MANAGED_BY, MANAGED_KIND_LABEL
from gpufed.hub.rules.status import HUB_CONDITIONS, condition_reason, parse_rfc3339

__all__ = [
    "KINDS",
    "ManagedKind",
    "gpujob_for",
    "gpujob_name",
    "has_started",
    "is_managed",
    "job_status",
    "jobset_status",
    "owner_of",
    "workload_status",
]

#: On a managed workload's GPUJob: the workload's ``metadata.generation`` it was made from.
GENERATION_ANNOTATION = "gpufed.io/workload-generation"
#: The condition a JobSet's status gets once its GPUJob started (JobSet has no startTime).
STARTED_CONDITION = "gpufed.io/Started"
#: Longest GPUJob name (a DNS subdomain).
_MAX_NAME = 253
#: What the Job API server adds to a Job's labels and pod template labels (its selector's).
_JOB_CONTROLLER_LABELS = (
    "controller-uid",
    "batch.kubernetes.io/controller-uid",
    "job-name",
    "batch.kubernetes.io/job-name",
)
_LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"


@dataclass(frozen=True)
class ManagedKind:
    """A workload kind the hub accepts with ``spec.managedBy: gpufed.io/hub``.

    ``short``: the prefix of its GPUJobs' names (``job-<name>``); ``plural``: the resource.
    """

    kind: str
    group: str
    version: str
    plural: str
    short: str

    @property
    def api_version(self) -> str:
        """``group/version`` (``batch/v1``)."""
        return f"{self.group}/{self.version}"


#: Kinds by name (``--managed-kinds`` values).
KINDS: dict[str, ManagedKind] = {
    "Job": ManagedKind("Job", "batch", "v1", "jobs", "job"),
    "JobSet": ManagedKind("JobSet", "jobset.x-k8s.io", "v1alpha2", "jobsets", "jobset"),
}

#: Kinds ``gpufed submit`` wraps but the hub cannot accept with ``managedBy``, and why: their
#: operators' own CRDs (the versions the sandbox builds) leave no room for ``gpufed.io/hub``.
UNMANAGEABLE: dict[str, str] = {
    "PyTorchJob": (
        "training-operator v1.8.1's PyTorchJob has no spec.runPolicy.managedBy (the API server "
        "refuses or drops the field; v1.9 adds it, limited to its own name and MultiKueue's)"
    ),
    "RayJob": (
        "KubeRay v1.5.0's RayJob CRD allows spec.managedBy only 'ray.io/kuberay-operator' or "
        "'kueue.x-k8s.io/multikueue' (the API server refuses 'gpufed.io/hub')"
    ),
}


def is_managed(obj: dict[str, Any]) -> bool:
    """True when ``obj`` (a Job or JobSet, JSON form) has ``spec.managedBy: gpufed.io/hub``."""
    spec = obj.get("spec")
    return isinstance(spec, dict) and spec.get("managedBy") == MANAGED_BY


def gpujob_name(kind: ManagedKind, name: str) -> str:
    """The GPUJob name of workload ``name``: ``<short>-<name>`` (``job-train``), the same on
    every hub and every restart; past 253 characters cut and suffixed with a hash of the whole."""
    full = f"{kind.short}-{name}"
    if len(full) <= _MAX_NAME:
        return full
    digest = hashlib.sha256(full.encode()).hexdigest()[:10]
    return f"{full[: _MAX_NAME - 11].rstrip('-.')}-{digest}"


def _template(obj: dict[str, Any], kind: ManagedKind) -> dict[str, Any]:
    """The workload as a member should get it (see the module doc)."""
    meta = obj.get("metadata") or {}
    spec = copy.deepcopy(obj.get("spec") or {})
    spec.pop("managedBy", None)
    labels = dict(meta.get("labels") or {})
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k != _LAST_APPLIED}
    if kind.kind == "Job":
        # The hub's API server generated the selector and these labels from the hub object's
        # uid; the member's API server generates its own (a copied selector is refused there).
        spec.pop("selector", None)
        spec.pop("manualSelector", None)
        for key in _JOB_CONTROLLER_LABELS:
            labels.pop(key, None)
        pod_meta = (spec.get("template") or {}).get("metadata")
        if isinstance(pod_meta, dict) and isinstance(pod_meta.get("labels"), dict):
            for key in _JOB_CONTROLLER_LABELS:
                pod_meta["labels"].pop(key, None)
    out_meta: dict[str, Any] = {"name": meta.get("name")}
    if labels:
        out_meta["labels"] = labels
    if annotations:
        out_meta["annotations"] = annotations
    return {"apiVersion": kind.api_version, "kind": kind.kind, "metadata": out_meta, "spec": spec}


def gpujob_for(obj: dict[str, Any], kind: ManagedKind) -> dict[str, Any]:
    """The GPUJob (JSON form, for a create) that federates workload ``obj`` of ``kind``.

    Same namespace; name :func:`gpujob_name`; labels and annotations the workload's (minus
    kubectl's last-applied copy) plus ``gpufed.io/managed-kind`` and
    ``gpufed.io/workload-generation``; one controller ``ownerReference`` to the workload
    (``blockOwnerDeletion`` false: the hub removes the GPUJob itself). Raises
    :class:`~gpufed.api.errors.FieldError` naming the workload's field (no name, namespace or
    uid; a malformed placement hint).
    """
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        raise FieldError("metadata", "must be a mapping (name, namespace, labels ...)")
    for field in ("name", "namespace", "uid"):
        if not isinstance(meta.get(field), str) or not meta.get(field):
            raise FieldError(f"metadata.{field}", "required (as the hub's API server sets it)")
    placement = placement_hints(meta)
    labels = {**(meta.get("labels") or {}), MANAGED_KIND_LABEL: kind.kind}
    # The workload's annotations travel once, in the template (to the member copy); the
    # GPUJob's own metadata keeps only gpufed's (a copy of all of them could push the GPUJob
    # past etcd's object limit while the workload fits).
    annotations = {
        **{k: v for k, v in (meta.get("annotations") or {}).items() if k.startswith("gpufed.io/")},
        GENERATION_ANNOTATION: str(meta.get("generation") or 1),
    }
    return {
        "apiVersion": API_VERSION,
        "kind": "GPUJob",
        "metadata": {
            "name": gpujob_name(kind, meta["name"]),
            "namespace": meta["namespace"],
            "labels": labels,
            "annotations": annotations,
            "ownerReferences": [
                {
                    "apiVersion": kind.api_version,
                    "kind": kind.kind,
                    "name": meta["name"],
                    "uid": meta["uid"],
                    "controller": True,
                    "blockOwnerDeletion": False,
                }
            ],
        },
        "spec": {"template": _template(obj, kind), "placement": placement},
    }


def owner_of(gpujob: dict[str, Any]) -> tuple[ManagedKind, str, str] | None:
    """(kind, name, uid) of the workload a GPUJob was made for, or None: the GPUJob lacks the
    ``gpufed.io/managed-kind`` label or a controller ``ownerReference`` of that kind."""
    meta = gpujob.get("metadata") or {}
    kind = KINDS.get(str((meta.get("labels") or {}).get(MANAGED_KIND_LABEL, "")))
    if kind is None:
        return None
    for ref in meta.get("ownerReferences") or []:
        if (
            isinstance(ref, dict)
            and ref.get("controller") is True
            and ref.get("kind") == kind.kind
            and ref.get("apiVersion") == kind.api_version
            and ref.get("name")
            and ref.get("uid")
        ):
            return kind, str(ref["name"]), str(ref["uid"])
    return None


# --- status --------------------------------------------------------------------------------------


def _seconds(value: str) -> str:
    """An RFC 3339 time at whole seconds, as the API server keeps a ``metav1.Time`` (so that
    times of two sources compare as text)."""
    return datetime.fromtimestamp(int(parse_rfc3339(value)), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _true(conditions: Any, type_: str) -> bool:
    return any(
        isinstance(c, dict) and c.get("type") == type_ and c.get("status") == "True"
        for c in conditions or []
    )


def _member_condition(gs: GPUJobStatus, type_: str) -> tuple[str, str, str] | None:
    """(reason, message, lastTransitionTime) of the member workload's condition ``type_``."""
    for c in gs.conditions:
        if c.type == type_ and c.type not in HUB_CONDITIONS and c.status == "True":
            return c.reason, c.message, c.last_transition_time or ""
    return None


def _failure(gs: GPUJobStatus, member_type: str) -> tuple[str, str]:
    """Reason and message of a failed or lost job: the member's own failure condition, else
    the hub's (``Valid``/``Placed``/``Dispatched`` False: an invalid, never placeable or refused
    job; ``Lost``)."""
    own = _member_condition(gs, member_type)
    if own is not None and own[0]:
        return condition_reason(own[0]), own[1] or gs.message
    if gs.phase == "Lost":
        return "ClusterLost", gs.message
    for c in gs.conditions:
        if c.type in ("Valid", "Placed", "Dispatched") and c.status == "False":
            return condition_reason(c.reason), gs.message
    return "Failed", gs.message


def _condition(type_: str, reason: str, message: str, when: str) -> dict[str, Any]:
    return {
        "type": type_,
        "status": "True",
        "reason": reason,
        "message": message[:4096],
        "lastProbeTime": when,
        "lastTransitionTime": when,
    }


def job_status(gs: GPUJobStatus | None, current: dict[str, Any], *, now: str) -> dict[str, Any]:
    """A hub Job's whole ``status`` from its GPUJob's status ``gs`` (None: none written yet) and
    the Job's ``current`` status (RFC 3339 ``now``).

    Kept valid for the Job API server (checked by v1.36): a finished Job (``Complete`` or
    ``Failed`` True) is final and returned as it is; ``startTime`` never changes once set
    (the first member copy's start; a re-run elsewhere keeps it); ``ready`` never exceeds
    ``active``; ``Complete`` comes with ``SuccessCriteriaMet``, ``completionTime`` (not before
    ``startTime``) and no active pods; ``Failed`` with ``FailureTarget`` and no
    ``completionTime``; a finished Job always has a ``startTime`` (``now`` when it never ran).
    While the job runs no condition is written: a member's ``FailureTarget`` may be followed
    by a re-run (``spec.placement.retry``), and the API server lets no condition be taken back.
    """
    if _true(current.get("conditions"), "Complete") or _true(current.get("conditions"), "Failed"):
        return current
    out = {k: v for k, v in current.items() if k not in ("active", "ready", "terminating")}
    if gs is None:
        return out
    for key in ("succeeded", "failed"):
        value = getattr(gs, key)
        if value is not None:
            out[key] = value
    now = _seconds(now)
    start = current.get("startTime") or (_seconds(gs.start_time) if gs.start_time else None)
    if gs.phase in ("Pending", "Placed", "Running"):
        active = gs.active or 0
        if gs.phase == "Running" and start is None:
            start = now
        if start is not None:
            out["startTime"] = start
        if active:
            out["active"] = active
            if gs.ready:
                out["ready"] = min(gs.ready, active)
        return out
    start = start or now
    out["startTime"] = start
    out["active"] = 0
    out["ready"] = 0
    conditions = [c for c in current.get("conditions") or [] if isinstance(c, dict)]
    conditions = [
        c
        for c in conditions
        if c.get("type") not in ("SuccessCriteriaMet", "Complete", "FailureTarget", "Failed")
    ]
    if gs.phase == "Succeeded":
        member = _member_condition(gs, "Complete")
        done = max(_seconds(gs.completion_time or (member[2] if member else "") or now), start)
        reason = condition_reason(member[0]) if member and member[0] else "CompletionsReached"
        message = (member[1] if member else "") or gs.message
        out["completionTime"] = done
        conditions += [
            _condition("SuccessCriteriaMet", reason, message, done),
            _condition("Complete", reason, message, done),
        ]
    else:
        reason, message = _failure(gs, "Failed")
        out.pop("completionTime", None)
        conditions += [
            _condition("FailureTarget", reason, message, now),
            _condition("Failed", reason, message, now),
        ]
    out["conditions"] = conditions
    return out


def jobset_status(gs: GPUJobStatus | None, current: dict[str, Any], *, now: str) -> dict[str, Any]:
    """A hub JobSet's ``status`` from its GPUJob's status: once the GPUJob ended, condition
    ``Completed`` (Succeeded) or ``Failed`` (Failed, Lost) True and ``terminalState`` the
    same word; before that the current status as it is (a finished JobSet's status is final).
    Conditions are ``metav1.Condition`` (reason CamelCase)."""
    if current.get("terminalState") or gs is None:
        return current
    if gs.phase not in ("Succeeded", "Failed", "Lost"):
        if gs.phase != "Running" or has_started(KINDS["JobSet"], current):
            return current
        started = {
            "type": STARTED_CONDITION,
            "status": "True",
            "reason": "Running",
            "message": "its GPUJob started in a member; it is never run a second time",
            "lastTransitionTime": _seconds(gs.start_time or now),
        }
        return {**current, "conditions": [*(current.get("conditions") or []), started]}
    out = dict(current)
    now = _seconds(now)
    if gs.phase == "Succeeded":
        member = _member_condition(gs, "Completed")
        reason = condition_reason(member[0]) if member and member[0] else "AllJobsCompleted"
        message = (member[1] if member else "") or gs.message
        type_ = "Completed"
    else:
        reason, message = _failure(gs, "Failed")
        type_ = "Failed"
    conditions = [
        c
        for c in current.get("conditions") or []
        if isinstance(c, dict) and c.get("type") not in ("Completed", "Failed")
    ]
    conditions.append(
        {
            "type": type_,
            "status": "True",
            "reason": reason,
            "message": message[:4096],
            "lastTransitionTime": now,
        }
    )
    out["conditions"] = conditions
    out["terminalState"] = type_
    return out


def has_started(kind: ManagedKind, status: dict[str, Any]) -> bool:
    """Whether a workload ``status`` shows its GPUJob started once: a Job's ``startTime``, a
    JobSet's condition :data:`STARTED_CONDITION` True."""
    if kind.kind == "Job":
        return bool(status.get("startTime"))
    return any(
        isinstance(c, dict) and c.get("type") == STARTED_CONDITION and c.get("status") == "True"
        for c in status.get("conditions") or []
    )


def workload_status(
    kind: ManagedKind, gs: GPUJobStatus | None, current: dict[str, Any], *, now: str
) -> dict[str, Any]:
    """The status of a workload of ``kind`` (:func:`job_status` or :func:`jobset_status`)."""
    if kind.kind == "Job":
        return job_status(gs, current, now=now)
    return jobset_status(gs, current, now=now)
