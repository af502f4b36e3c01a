"""The status side's view of the member: informer handlers that cache the watched workload
objects and pods of gpufed jobs for :class:`gpufed.agent.status.StatusReporter`.

Owns what one watch event does to the reporter's caches: a workload object (one handler per
served kind, :class:`ObjectEvents`) is kept as its metadata and status, and the node names its
pod templates pin it to (:data:`PINNED`); a pod
(:class:`PodEvents`) as the few fields summaries and failure classification read
(:func:`trim_pod`: phase, conditions, container states, node, an unbound pod's required
node affinity, the checkpoint and attempt annotations). A deleted workload object goes to the reporter with its
final state (the ``DELETED`` event's object, else the cached one), which keeps it as the job's
last word when it had finished (:class:`FinalState`). A re-list drops what it no longer lists.
Every change marks the job for a new summary.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpufed.api.labels import (
    ATTEMPT_ANNOTATION,
    COMPUTE_DOMAIN_KIND,
    JOB_UID_LABEL,
    LAST_CHECKPOINT_ANNOTATION,
)
from gpufed.sync.apply import ObjectRef
from gpufed.sync.pins import template_pins

if TYPE_CHECKING:
    from gpufed.agent.status import StatusReporter

ObjKey = tuple[str, str, str]  # (Kind.group, namespace, name)
#: Key of a cached workload object's pinned node names (its pod templates' by-name node
#: affinity, :func:`gpufed.sync.pins.template_pins`): what the hub placed it on, which a
#: failed copy whose pods were collected is judged by (rule 4a of :mod:`gpufed.sync.failure`).
PINNED = "pinnedNodes"


@dataclass(frozen=True)
class FinalState:
    """The last state of a tracked job's deleted main object, when it had finished."""

    key: ObjKey
    obj: dict[str, Any]
    pods: tuple[dict[str, Any], ...]  # the job's pods (of its attempt) cached at the deletion


def ref_key(ref: ObjectRef) -> ObjKey:
    """``(Kind.group, namespace, name)`` of ``ref``, the caches' key."""
    return (ref.kind_group, ref.namespace, ref.name)


def job_uid_of(obj: dict[str, Any]) -> str:
    """The ``gpufed.io/job-uid`` label of an API object ("" without)."""
    return str(((obj.get("metadata") or {}).get("labels") or {}).get(JOB_UID_LABEL, ""))


def attempt_of(pod: dict[str, Any]) -> str:
    """The ``gpufed.io/attempt`` annotation of a pod ("" without)."""
    return str(((pod.get("metadata") or {}).get("annotations") or {}).get(ATTEMPT_ANNOTATION, ""))


def trim_pod(raw: dict[str, Any]) -> dict[str, Any]:
    """The fields of an API server pod dict the reporter keeps (module docstring)."""
    meta = raw.get("metadata") or {}
    status = raw.get("status") or {}
    keep_status = {
        k: status[k]
        for k in (
            "phase",
            "reason",
            "message",
            "startTime",
            "conditions",
            "containerStatuses",
            "initContainerStatuses",
        )
        if k in status
    }
    raw_annotations = meta.get("annotations") or {}
    checkpoint = raw_annotations.get(LAST_CHECKPOINT_ANNOTATION)
    kept = {} if checkpoint is None else {LAST_CHECKPOINT_ANNOTATION: checkpoint}
    if ATTEMPT_ANNOTATION in raw_annotations:
        kept[ATTEMPT_ANNOTATION] = raw_annotations[ATTEMPT_ANNOTATION]
    return {
        "metadata": {
            "name": meta.get("name"),
            "namespace": meta.get("namespace"),
            "deletionTimestamp": meta.get("deletionTimestamp"),
            "annotations": kept,
        },
        "spec": _trim_spec(raw.get("spec") or {}),
        "status": keep_status,
    }


def _trim_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """The pod's node and, while it is unbound, its required node affinity: a replacement pod
    pinned by name to a node that no longer exists is how an agent restarted after the old
    pods were collected still sees the node lost (:func:`gpufed.sync.pins.pinned_nodes`)."""
    out: dict[str, Any] = {"nodeName": spec.get("nodeName")}
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    if required and not spec.get("nodeName"):
        out["affinity"] = {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}
        }
    return out


class ObjectEvents:
    """Informer handler for one workload kind."""

    def __init__(self, reporter: StatusReporter, kind_group: str) -> None:
        self.r = reporter
        self.kind = kind_group
        self._relist: set[ObjKey] | None = None

    def _key(self, obj: dict[str, Any]) -> ObjKey:
        meta = obj.get("metadata") or {}
        return (self.kind, str(meta.get("namespace", "")), str(meta.get("name", "")))

    def begin_relist(self) -> None:
        self._relist = set()

    def upsert(self, obj: dict[str, Any]) -> None:
        key = self._key(obj)
        if self._relist is not None:
            self._relist.add(key)
        self.r._revived(key, job_uid_of(obj))
        self.r._objects[key] = {
            "metadata": obj.get("metadata") or {},
            "status": obj.get("status") or {},
        }
        pins = template_pins(obj)
        if pins.names or pins.hostnames:
            self.r._objects[key][PINNED] = pins
        self.r._objects[key]["metadata"].pop("managedFields", None)
        if self.kind == COMPUTE_DOMAIN_KIND:
            self.r._domains[job_uid_of(obj)] = key
        self.r._mark(job_uid_of(obj))

    def delete(self, obj: dict[str, Any]) -> None:
        key = self._key(obj)
        cached = self.r._objects.pop(key, None)
        if self.kind == COMPUTE_DOMAIN_KIND:
            self.r._domains.pop(job_uid_of(obj), None)
        # The DELETED event carries the object's final state; the cache is older.
        final = obj if obj.get("status") or cached is None else cached
        self.r._gone(key, final)

    def end_relist(self) -> None:
        seen, self._relist = self._relist or set(), None
        for key in [k for k in self.r._objects if k[0] == self.kind and k not in seen]:
            # Deleted while unwatched: the last cached state is the last word we have.
            gone = self.r._objects.pop(key)
            if self.kind == COMPUTE_DOMAIN_KIND:
                self.r._domains.pop(job_uid_of(gone), None)
            self.r._gone(key, gone)


class PodEvents:
    """Informer handler for the pods labelled with a job UID."""

    def __init__(self, reporter: StatusReporter) -> None:
        self.r = reporter
        self._relist: set[tuple[str, str]] | None = None

    def begin_relist(self) -> None:
        self._relist = set()

    def upsert(self, obj: dict[str, Any]) -> None:
        uid = job_uid_of(obj)
        meta = obj.get("metadata") or {}
        key = f"{meta.get('namespace')}/{meta.get('name')}"
        if self._relist is not None:
            self._relist.add((uid, key))
        self.r._pods.setdefault(uid, {})[key] = trim_pod(obj)
        self.r._mark(uid)

    def delete(self, obj: dict[str, Any]) -> None:
        uid = job_uid_of(obj)
        meta = obj.get("metadata") or {}
        pods = self.r._pods.get(uid)
        if pods is not None:
            pods.pop(f"{meta.get('namespace')}/{meta.get('name')}", None)
            if not pods:
                del self.r._pods[uid]
        self.r._mark(uid)

    def end_relist(self) -> None:
        seen, self._relist = self._relist or set(), None
        # Every tracked job again: one whose pods are all gone (the first list of a restarted
        # agent) is judged only once the pods are listed (StatusReporter._summarize).
        for uid in list(self.r._tracked):
            self.r._mark(uid)
        for uid in list(self.r._pods):
            pods = self.r._pods[uid]
            for key in [k for k in pods if (uid, k) not in seen]:
                del pods[key]
                self.r._mark(uid)
            if not pods:
                del self.r._pods[uid]
