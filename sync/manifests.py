"""Manifest preparation: turn a GPUJob's template into the objects a member applies.

Called by the hub when it writes a work item (:func:`prepare_manifests`); the workload kinds'
pod templates, which pod-set derivation reads too (so both agree on pod set names), are
:mod:`gpufed.sync.workloads` (re-exported here). Pure functions over plain dicts (the JSON
form of Kubernetes objects); no client, no I/O. The target namespace is not part of the
manifests: the agent creates it when absent, labelled ``gpufed.io/managed``
(several jobs share it, so deleting one job never deletes it).

What preparation does, object by object (docs/design.md §4, STYLE.md habit 10):

1. **Tenant confinement.** Only kinds on the allow-list pass (``Kind.group``, default
   :data:`DEFAULT_ALLOWED_KINDS`); every object goes to the GPUJob's own namespace (a different
   ``metadata.namespace`` is refused, an absent one is set). Anything else raises
   :class:`~gpufed.api.errors.FieldError` naming the field, so a hub user cannot reach beyond their namespace
   in any member.
2. **Strip server-filled fields**: ``status`` and ``metadata.{resourceVersion, uid,
   managedFields, creationTimestamp, generation, selfLink, deletionTimestamp,
   deletionGracePeriodSeconds}``, and every ``ownerReference``: an owner UID from the hub never
   resolves in a member, and the member's garbage collector deletes objects whose owners do
   not exist.
3. **Ownership labels** ``gpufed.io/origin`` (the hub's id) and ``gpufed.io/job-uid`` (the
   GPUJob UID) on every object and on every pod template inside it; the annotation
   ``gpufed.io/job`` carries ``namespace/name``. Label values are kept valid (<= 63
   characters, alphanumeric ends): a longer value is shortened with a hash suffix and the full
   value kept in an annotation under the same key.
4. **Pinning**: the pods of each pod set get a required node affinity to the nodes (or NVLink
   cliques) that placement chose, ANDed into every existing node selector term.
5. **Attempt** (when given): every pod template gets the annotation ``gpufed.io/attempt`` and
   every container and init container the environment variable ``GPUFED_ATTEMPT`` (replacing
   one the template set), so a job re-run after an infrastructure failure knows to resume
   from its checkpoint.
6. **Node grace** (when given and not the default 300 s): every object gets the annotation
   ``gpufed.io/node-not-ready-seconds``, the job's ``spec.placement.retry.nodeNotReadySeconds``,
   which the agent reads from the work item (:func:`node_not_ready_of`) to time its failure
   classification (:mod:`gpufed.sync.failure`). Object metadata, not the pod templates: a
   batch/v1 Job's template is immutable, its annotations are not.
7. **Priority stays at the hub**: ``spec.priorityClassName`` and ``spec.priority`` are removed
   from every pod template. The hub placed and may preempt the job by its PriorityClass on the
   hub cluster (docs/hub.md "Priorities"); the member need not have that class (a pod naming a
   class the member lacks is refused by its Priority admission, and the job would hang), and a
   member-side priority would let the member's kube-scheduler preempt other tenants' gpufed
   pods behind the hub's back.
8. **ComputeDomain** (when placement gave the job one): the ``ComputeDomain`` object, owned
   like the rest, and every GPU pod's channel claim (:mod:`gpufed.sync.computedomain`).
9. **Time limit** (when given: ``spec.placement.timeLimitSeconds``): every batch/v1 Job gets it
   as ``spec.activeDeadlineSeconds`` unless it declares a smaller one, so the member's Job
   controller stops the copy at the limit too (the hub stops every kind at it:
   :mod:`gpufed.hub.rules.lifecycle` rule 6b). Other kinds are left as they are.
"""

from __future__ import annotations

import copy
import hashlib
import re
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from gpufed.api.bounds import measure
from gpufed.api.errors import FieldError
from gpufed.api.gpujob import DEFAULT_NODE_NOT_READY_S, MAX_NODE_NOT_READY_S
from gpufed.api.labels import (
    ATTEMPT_ANNOTATION,
    ATTEMPT_ENV,
    GPU_CLIQUE_LABEL,
    HOSTNAME_LABEL,
    JOB_ANNOTATION,
    JOB_UID_LABEL,
    NODE_NOT_READY_ANNOTATION,
    ORIGIN_LABEL,
)

# The workload kinds and their pod templates live in sync/workloads.py; their names are
# re-exported here, so `from gpufed.sync.manifests import WORKLOAD_KINDS,
# workload_pod_templates` keeps working.
from gpufed.sync.computedomain import (
    ComputeDomainSpec,
    add_channel_claim,
    compute_domain_object,
)
from gpufed.sync.workloads import (
    WORKLOAD_KINDS,
    PodTemplateRef,
    object_kind,
    template_objects,
    workload_pod_templates,
)

__all__ = [
    "DEFAULT_ALLOWED_KINDS",
    "WORKLOAD_KINDS",
    "PodSetPinning",
    "PodTemplateRef",
    "attempt_of",
    "is_valid_label_value",
    "label_value",
    "node_not_ready_of",
    "object_kind",
    "pin_pod_template",
    "prepare_manifests",
    "template_objects",
    "workload_pod_templates",
]

#: Kinds a GPUJob may create in a member, as ``Kind.group`` (core kinds have no group).
DEFAULT_ALLOWED_KINDS: frozenset[str] = frozenset(
    {
        "Job.batch",
        "JobSet.jobset.x-k8s.io",
        "PyTorchJob.kubeflow.org",
        "RayJob.ray.io",
        "MPIJob.kubeflow.org",
        "ConfigMap",
        "Secret",
        "Service",
        "ResourceClaimTemplate.resource.k8s.io",
    }
)
_SERVER_METADATA = (
    "resourceVersion",
    "uid",
    "managedFields",
    "creationTimestamp",
    "generation",
    "selfLink",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "ownerReferences",
)
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_MAX_LABEL_VALUE = 63


class PodSetPinning(BaseModel):
    """Where placement put one pod set: node names and/or NVLink domain ids.

    ``nodes``: member Node names (``metadata.name``); when given, pods are pinned to exactly
    these nodes. ``hostnames``: node name -> its ``kubernetes.io/hostname`` label value, for
    pinning to several nodes (the label equals the name unless the member says otherwise).
    ``nvlink_domains``: domain ids (``clique:<value>`` or ``node:<name>``); used when
    ``nodes`` is empty.
    """

    model_config = ConfigDict(frozen=True)

    nodes: tuple[str, ...] = ()
    hostnames: dict[str, str] = Field(default_factory=dict)
    nvlink_domains: tuple[str, ...] = ()


# --- label values --------------------------------------------------------------------------------


def is_valid_label_value(value: str) -> bool:
    """Kubernetes label value rules: <= 63 chars, ``[A-Za-z0-9._-]``, alphanumeric at both ends."""
    return len(value) <= _MAX_LABEL_VALUE and bool(_LABEL_VALUE.match(value))


def label_value(value: str) -> str:
    """``value`` itself when it is a valid label value, else a valid stand-in.

    The stand-in keeps a readable prefix of the value's allowed characters and ends in 10 hex
    characters of its SHA-256, so different values stay different: ``"hub.example.com/…"`` (80
    chars) -> ``"hub.example.com-…-3f2a9c01de"`` (63 chars). Store the full value in an
    annotation under the same key when it matters.
    """
    if is_valid_label_value(value):
        return value
    digest = hashlib.sha256(value.encode()).hexdigest()[:10]
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "-", value).strip("-_.")
    prefix = cleaned[: _MAX_LABEL_VALUE - len(digest) - 1].rstrip("-_.")
    return f"{prefix}-{digest}" if prefix else f"h{digest}"


# --- preparation ---------------------------------------------------------------------------------


def prepare_manifests(
    template: Mapping[str, Any],
    *,
    job_uid: str,
    job_name: str,
    namespace: str,
    origin: str,
    pinning: Mapping[str, PodSetPinning] | None = None,
    allowed_kinds: Iterable[str] = DEFAULT_ALLOWED_KINDS,
    clique_label: str = GPU_CLIQUE_LABEL,
    attempt: int | None = None,
    node_not_ready_s: int | None = None,
    compute_domain: ComputeDomainSpec | None = None,
    time_limit_s: int | None = None,
) -> list[dict[str, Any]]:
    """The objects of ``template`` ready to apply in a member (steps 1-9 of the module doc).

        ``job_uid``: the GPUJob ``metadata.uid``; ``job_name``: its name (the default name of a
        single-object template without one); ``namespace``: the GPUJob's namespace; ``origin``:
        the hub's id; ``pinning``: pod set name -> where placement put it (names as
        :func:`workload_pod_templates` gives them); ``attempt``: the placement attempt (None: not
    stamped, as when intake only validates); ``node_not_ready_s``: the job's
    ``spec.placement.retry.nodeNotReadySeconds`` (None or 300: not stamped);
    ``compute_domain``: the ComputeDomain placement gave the job (step 8; None: none);
    ``time_limit_s``: the job's ``spec.placement.timeLimitSeconds``, seconds (step 9; None:
    none). The input is not modified.

        Raises :class:`~gpufed.api.errors.FieldError` naming the field for a refused kind, a foreign namespace, a
        cluster-scoped attempt or a List item without a name, and for a template past the
        structural limits of :mod:`gpufed.api.bounds` (checked first: the copies below recurse).
    """
    measure(template, field="spec.template")
    allowed = frozenset(allowed_kinds)
    objects = template_objects(template)
    prepared: list[dict[str, Any]] = []
    for path, obj in objects:
        kind = object_kind(obj, path)
        if kind not in allowed:
            raise FieldError(
                f"{path}.kind",
                f"{kind} may not be created in a member; allowed kinds: {', '.join(sorted(allowed))}",
            )
        out = copy.deepcopy(dict(obj))
        out.pop("status", None)
        meta = out.get("metadata")
        if meta is None:
            meta = {}
        if not isinstance(meta, dict):
            raise FieldError(f"{path}.metadata", "must be an object")
        out["metadata"] = meta
        for key in _SERVER_METADATA:
            meta.pop(key, None)
        ns = meta.get("namespace")
        if ns not in (None, "", namespace):
            raise FieldError(
                f"{path}.metadata.namespace",
                f"{ns!r} is not allowed: a GPUJob's objects go to its own namespace "
                f"{namespace!r} (leave metadata.namespace out)",
            )
        meta["namespace"] = namespace
        if not meta.get("name"):
            if len(objects) > 1 or meta.get("generateName"):
                raise FieldError(
                    f"{path}.metadata.name",
                    "is required (generateName is not supported: names make re-applying "
                    "idempotent)",
                )
            meta["name"] = job_name
        meta.pop("generateName", None)
        _own(meta, job_uid=job_uid, job_key=f"{namespace}/{job_name}", origin=origin)
        if node_not_ready_s is not None and node_not_ready_s != DEFAULT_NODE_NOT_READY_S:
            meta["annotations"][NODE_NOT_READY_ANNOTATION] = str(node_not_ready_s)
        if time_limit_s is not None and kind == "Job.batch":
            _limit_job(out, time_limit_s)
        prepared.append(out)

    # Pod templates: labels and pinning. Walk the prepared copies with the same rules.
    pinning = pinning or {}
    prepared_template: Mapping[str, Any] = (
        {"apiVersion": "v1", "kind": "List", "items": prepared}
        if template.get("kind") == "List"
        else prepared[0]
    )
    for ref in workload_pod_templates(prepared_template):
        pod_template = ref.template
        assert isinstance(pod_template, dict)  # our own deep copy
        pod_meta = pod_template.get("metadata") or {}
        labels = pod_meta.get("labels") or {} if isinstance(pod_meta, dict) else None
        if not isinstance(labels, dict):
            raise FieldError(f"{ref.path}.metadata", "must be an object with a labels map")
        pod_template["metadata"], pod_meta["labels"] = pod_meta, labels
        labels[ORIGIN_LABEL] = label_value(origin)
        labels[JOB_UID_LABEL] = label_value(job_uid)
        where = pinning.get(ref.pod_set)
        if where is not None:
            pin_pod_template(pod_template, where, clique_label=clique_label)
        if attempt is not None:
            _stamp_attempt(pod_template, pod_meta, attempt)
        pod_spec = pod_template.get("spec")
        if isinstance(pod_spec, dict):
            pod_spec.pop("priorityClassName", None)
            pod_spec.pop("priority", None)
        if compute_domain is not None and ref.pod_set in compute_domain.pod_sets:
            add_channel_claim(pod_template, compute_domain.name)
    if compute_domain is not None:
        domain = compute_domain_object(compute_domain, namespace)
        _own(domain["metadata"], job_uid=job_uid, job_key=f"{namespace}/{job_name}", origin=origin)
        prepared.append(domain)
    return prepared


def attempt_of(manifests: Iterable[Mapping[str, Any]]) -> str:
    """The ``gpufed.io/attempt`` of the first pod template of prepared ``manifests`` ("" when
    none carries one, or they cannot be read). The agent uses it to tell the pods of the
    current copy from those a previous attempt left terminating."""
    items = list(manifests)
    try:
        refs = workload_pod_templates({"apiVersion": "v1", "kind": "List", "items": items})
    except FieldError:
        return ""
    for ref in refs:
        meta = ref.template.get("metadata") if isinstance(ref.template, Mapping) else None
        annotations = meta.get("annotations") if isinstance(meta, Mapping) else None
        if isinstance(annotations, Mapping) and ATTEMPT_ANNOTATION in annotations:
            return str(annotations[ATTEMPT_ANNOTATION])
    return ""


def node_not_ready_of(manifests: Iterable[Mapping[str, Any]]) -> int:
    """The ``gpufed.io/node-not-ready-seconds`` of prepared ``manifests`` (the first object
    carrying one), in seconds: how long the agent waits out a not-Ready node or a GPU drop
    under the job. 300 (Kubernetes' default not-ready toleration) when none carries one, and
    for a value that is not a whole number within 0-3,600."""
    for obj in manifests:
        meta = obj.get("metadata") if isinstance(obj, Mapping) else None
        annotations = meta.get("annotations") if isinstance(meta, Mapping) else None
        if not isinstance(annotations, Mapping) or NODE_NOT_READY_ANNOTATION not in annotations:
            continue
        value = str(annotations[NODE_NOT_READY_ANNOTATION])
        if value.isdigit() and int(value) <= MAX_NODE_NOT_READY_S:
            return int(value)
        return DEFAULT_NODE_NOT_READY_S
    return DEFAULT_NODE_NOT_READY_S


def _limit_job(job: dict[str, Any], limit_s: int) -> None:
    """Step 9: ``spec.activeDeadlineSeconds`` of a batch/v1 Job copy becomes ``limit_s`` unless
    it is already a smaller positive integer (intake refused any other value)."""
    spec = job.get("spec")
    if not isinstance(spec, dict):
        return
    own = spec.get("activeDeadlineSeconds")
    if isinstance(own, int) and not isinstance(own, bool) and 0 < own <= limit_s:
        return
    spec["activeDeadlineSeconds"] = limit_s


def _stamp_attempt(pod_template: dict[str, Any], pod_meta: dict[str, Any], attempt: int) -> None:
    annotations = pod_meta.get("annotations")
    if not isinstance(annotations, dict):
        annotations = {}
    annotations[ATTEMPT_ANNOTATION] = str(attempt)
    pod_meta["annotations"] = annotations
    spec = pod_template.get("spec")
    if not isinstance(spec, dict):
        return
    for key in ("initContainers", "containers"):
        for container in spec.get(key) or []:
            if not isinstance(container, dict):
                continue
            env = [
                e
                for e in container.get("env") or []
                if not (isinstance(e, dict) and e.get("name") == ATTEMPT_ENV)
            ]
            env.append({"name": ATTEMPT_ENV, "value": str(attempt)})
            container["env"] = env


def _own(meta: dict[str, Any], *, job_uid: str, job_key: str, origin: str) -> None:
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    labels[ORIGIN_LABEL] = label_value(origin)
    labels[JOB_UID_LABEL] = label_value(job_uid)
    if labels[ORIGIN_LABEL] != origin:
        annotations[ORIGIN_LABEL] = origin
    if labels[JOB_UID_LABEL] != job_uid:
        annotations[JOB_UID_LABEL] = job_uid
    annotations[JOB_ANNOTATION] = job_key
    meta["labels"] = labels
    meta["annotations"] = annotations


def pin_pod_template(
    pod_template: dict[str, Any], where: PodSetPinning, *, clique_label: str = GPU_CLIQUE_LABEL
) -> None:
    """Add a required node affinity to ``where`` (in place), ANDed with the existing one.

    One node: ``matchFields`` on ``metadata.name`` (exact; the API server allows exactly one
    value there). Several nodes: ``matchExpressions`` ``kubernetes.io/hostname In [...]`` (the
    nodes' hostname label values). Without nodes: clique domains (``clique:<v>``) by ``In`` on
    ``clique_label``, node domains (``node:<name>``) by hostname. Each existing
    ``nodeSelectorTerms`` entry (they are ORed) gets the constraint added (a term's parts are
    ANDed); with none, one term is created.
    """
    fields: list[dict[str, Any]] = []
    exprs: list[dict[str, Any]] = []
    nodes = sorted(set(where.nodes))
    if not nodes:
        nodes = sorted(d.split(":", 1)[1] for d in where.nvlink_domains if d.startswith("node:"))
        cliques = sorted(
            d.split(":", 1)[1] for d in where.nvlink_domains if d.startswith("clique:")
        )
        if cliques:
            exprs.append({"key": clique_label, "operator": "In", "values": cliques})
    if len(nodes) == 1:
        fields.append({"key": "metadata.name", "operator": "In", "values": nodes})
    elif nodes:
        values = sorted({where.hostnames.get(n, n) for n in nodes})
        exprs.append({"key": HOSTNAME_LABEL, "operator": "In", "values": values})
    if not fields and not exprs:
        return
    spec = pod_template.setdefault("spec", {})
    affinity = spec.setdefault("affinity", {})
    node_affinity = affinity.setdefault("nodeAffinity", {})
    required = node_affinity.setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
    terms = required.get("nodeSelectorTerms") or [{}]
    for term in terms:
        term.setdefault("matchFields", []).extend(copy.deepcopy(fields))
        term.setdefault("matchExpressions", []).extend(copy.deepcopy(exprs))
        if not term["matchFields"]:
            del term["matchFields"]
        if not term["matchExpressions"]:
            del term["matchExpressions"]
    required["nodeSelectorTerms"] = terms
