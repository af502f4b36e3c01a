"""Manifest preparation: turn a GPUJob's template into the objects a member applies.

Called by the hub when it writes a work item (:func:`prepare_manifests`) and by pod-set
derivation (:func:`workload_pod_templates`, so both agree on pod set names). Pure functions over
plain dicts (the JSON form of Kubernetes objects); no client, no I/O. The target namespace is
not part of the manifests: the agent creates it when absent, labelled ``gpufed.io/managed``
(several jobs share it, so deleting one job never deletes it).

What preparation does, object by object (docs/design.md §4, STYLE.md habit 10):

1. **Tenant confinement.** Only kinds on the allow-list pass (``Kind.group``, default
   :data:`DEFAULT_ALLOWED_KINDS`); every object goes to the GPUJob's own namespace (a different
   ``metadata.namespace`` is refused, an absent one is set). Anything else raises
   :class:`ManifestError` naming the field, so a hub user cannot reach beyond their namespace
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
6. **Priority stays at the hub**: ``spec.priorityClassName`` and ``spec.priority`` are removed
   from every pod template. The hub placed and may preempt the job by its PriorityClass on the
   hub cluster (docs/hub.md "Priorities"); the member need not have that class (a pod naming a
   class the member lacks is refused by its Priority admission, and the job would hang), and a
   member-side priority would let the member's kube-scheduler preempt other tenants' gpufed
   pods behind the hub's back.
"""

from __future__ import annotations

import copy
import hashlib
import re
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from pydantic import BaseModel, ConfigDict, Field

from gpufed.api.bounds import BoundsError, clip, measure
from gpufed.api.inventory import workload_kind
from gpufed.api.labels import (
    ATTEMPT_ANNOTATION,
    ATTEMPT_ENV,
    GPU_CLIQUE_LABEL,
    HOSTNAME_LABEL,
    JOB_ANNOTATION,
    JOB_UID_LABEL,
    ORIGIN_LABEL,
)

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
    }
)
#: Kinds whose pods placement sizes (the workload kinds); other allowed kinds carry no pods.
WORKLOAD_KINDS: frozenset[str] = frozenset(
    {
        "Job.batch",
        "JobSet.jobset.x-k8s.io",
        "PyTorchJob.kubeflow.org",
        "RayJob.ray.io",
        "MPIJob.kubeflow.org",
    }
)
#: Replica-spec maps of the Kubeflow kinds (replica type -> {replicas, template}).
_REPLICA_SPECS: dict[str, str] = {
    "PyTorchJob.kubeflow.org": "pytorchReplicaSpecs",
    "MPIJob.kubeflow.org": "mpiReplicaSpecs",
}

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


class ManifestError(ValueError):
    """A template object that may not be sent to a member.

    ``field`` is the path inside the GPUJob (``spec.template.items[1].kind``); the message says
    what is wrong and what would be accepted.
    """

    def __init__(self, field: str, message: str) -> None:
        # Messages may quote tenant input: clipped, so the status that carries them fits.
        field, message = clip(field, 256), clip(message)
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


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


# --- template structure --------------------------------------------------------------------------


def template_objects(template: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """The objects of a GPUJob template with their field paths.

    A template of ``kind: List`` yields its ``items`` (``spec.template.items[i]``); any other
    template is one object (``spec.template``). Raises :class:`ManifestError` when an item is
    not an object.
    """
    if template.get("kind") == "List":
        items = template.get("items")
        if not isinstance(items, list) or not items:
            raise ManifestError("spec.template.items", "a List template needs a non-empty list")
        out: list[tuple[str, Mapping[str, Any]]] = []
        seen: dict[tuple[str, str, str], str] = {}
        for i, item in enumerate(items):
            path = f"spec.template.items[{i}]"
            if not isinstance(item, Mapping):
                raise ManifestError(path, "every item must be a Kubernetes object (a mapping)")
            name = _name_of(item, default="")
            if name:
                # Same group, kind and name: one object in the member (the second would
                # overwrite the first, and their pod sets would share a name).
                group = str(item.get("apiVersion", "")).rpartition("/")[0]
                key = (group, str(item.get("kind", "")), name)
                if key in seen:
                    raise ManifestError(
                        f"{path}.metadata.name",
                        f"{name!r} is also the name of {seen[key]} of the same kind; "
                        "give each object of a List its own name",
                    )
                seen[key] = path
            out.append((path, item))
        return out
    return [("spec.template", template)]


def object_kind(obj: Mapping[str, Any], path: str) -> str:
    """``Kind.group`` of an object; raises :class:`ManifestError` when apiVersion/kind are absent."""
    api_version = obj.get("apiVersion")
    kind = obj.get("kind")
    if not isinstance(api_version, str) or not api_version:
        raise ManifestError(f"{path}.apiVersion", "is required (for example batch/v1)")
    if not isinstance(kind, str) or not kind:
        raise ManifestError(f"{path}.kind", "is required (for example Job)")
    return workload_kind(api_version, kind)


class PodTemplateRef(NamedTuple):
    """One pod template inside a workload object.

    ``pod_set``: the pod set name; ``path``: field path of the pod template in the GPUJob;
    ``template``: the pod template (``metadata`` + ``spec``); ``kind``: the owner's
    ``Kind.group``; ``replica``: the mapping that holds the pod count fields (a Job's
    ``spec``, a JobSet ``replicatedJobs[i]`` entry, a PyTorchJob or MPIJob replica spec, a
    RayJob worker group; empty for a RayJob's head, which is one pod) and ``replica_path`` its
    field path.
    """

    pod_set: str
    path: str
    template: Mapping[str, Any]
    kind: str
    replica: Mapping[str, Any]
    replica_path: str


def _pod_templates_of(obj: Mapping[str, Any], kind: str, path: str) -> list[PodTemplateRef]:
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        raise ManifestError(f"{path}.spec", "is required for a workload")
    if kind == "Job.batch":
        tpl = _mapping(spec, "template", f"{path}.spec")
        return [PodTemplateRef("main", f"{path}.spec.template", tpl, kind, spec, f"{path}.spec")]
    if kind == "JobSet.jobset.x-k8s.io":
        rjobs = spec.get("replicatedJobs")
        if not isinstance(rjobs, list) or not rjobs:
            raise ManifestError(f"{path}.spec.replicatedJobs", "a JobSet needs replicatedJobs")
        out = []
        names: set[str] = set()
        for i, rj in enumerate(rjobs):
            rpath = f"{path}.spec.replicatedJobs[{i}]"
            if not isinstance(rj, Mapping) or not isinstance(rj.get("name"), str) or not rj["name"]:
                raise ManifestError(f"{rpath}.name", "every replicated job needs a name")
            if rj["name"] in names:
                raise ManifestError(
                    f"{rpath}.name",
                    f"{rj['name']!r} names an earlier replicated job too; names must be unique",
                )
            names.add(rj["name"])
            job = _mapping(rj, "template", rpath)
            job_spec = _mapping(job, "spec", f"{rpath}.template")
            tpl = _mapping(job_spec, "template", f"{rpath}.template.spec")
            out.append(
                PodTemplateRef(
                    str(rj["name"]), f"{rpath}.template.spec.template", tpl, kind, rj, rpath
                )
            )
        return out
    if kind in _REPLICA_SPECS:
        field = _REPLICA_SPECS[kind]
        specs = spec.get(field)
        short = kind.split(".")[0]
        if not isinstance(specs, Mapping) or not specs:
            raise ManifestError(f"{path}.spec.{field}", f"a {short} needs {field}")
        if kind == "MPIJob.kubeflow.org":
            _check_mpi_replica_specs(specs, f"{path}.spec.{field}")
        out = []
        roles: dict[str, str] = {}
        for role in sorted(specs):
            rpath = f"{path}.spec.{field}.{role}"
            rs = specs[role]
            if not isinstance(rs, Mapping):
                raise ManifestError(rpath, "must be a replica spec (replicas, template)")
            if str(role).lower() in roles:
                raise ManifestError(
                    rpath,
                    f"replica type {role!r} is the same as {roles[str(role).lower()]!r} "
                    "(replica types are case-insensitive); write each type once",
                )
            roles[str(role).lower()] = str(role)
            tpl = _mapping(rs, "template", rpath)
            out.append(PodTemplateRef(str(role).lower(), f"{rpath}.template", tpl, kind, rs, rpath))
        return out
    if kind == "RayJob.ray.io":
        return _ray_pod_templates(spec, kind, path)
    return []


#: The replica types mpi-operator (kubeflow.org/v2beta1) starts, by their exact names.
_MPI_ROLES = ("Launcher", "Worker")


def _check_mpi_replica_specs(specs: Mapping[str, Any], path: str) -> None:
    """Refuse the MPIJob shapes mpi-operator refuses or ignores, which a placed gang would
    otherwise hold GPUs for: no ``Launcher``, a launcher of other than one replica, a ``Worker``
    of fewer than one, a replica type other than ``Launcher``/``Worker`` (the operator looks
    them up by their exact names) and a pod template without containers. Replica counts that
    are not integers are left to the pod-set sizing, which names them."""
    for role in sorted(specs):
        if role in _MPI_ROLES:
            continue
        exact = next((r for r in _MPI_ROLES if r.lower() == str(role).lower()), None)
        fix = f"write {exact}" if exact else "remove it or rename it"
        raise ManifestError(
            f"{path}.{role}",
            f"{role!r} is not an MPIJob replica type: mpi-operator starts only Launcher and "
            f"Worker (case-sensitive); {fix}",
        )
    if "Launcher" not in specs:
        raise ManifestError(
            f"{path}.Launcher",
            "an MPIJob needs a launcher (mpi-operator refuses one without): add a Launcher "
            "replica spec with replicas: 1 and the pod template that runs mpirun",
        )
    for role in _MPI_ROLES:
        rs = specs.get(role)
        if not isinstance(rs, Mapping):
            continue  # absent (Worker is optional), or refused as a non-mapping below
        replicas = rs.get("replicas")
        if type(replicas) is int:
            if role == "Launcher" and replicas != 1:
                raise ManifestError(
                    f"{path}.Launcher.replicas",
                    f"{replicas}: must be 1 (mpirun runs in one launcher pod); set replicas: 1",
                )
            if role == "Worker" and replicas < 1:
                raise ManifestError(
                    f"{path}.Worker.replicas",
                    f"{replicas}: an MPIJob's Worker needs at least 1 replica (mpi-operator "
                    "refuses fewer); set the number of worker pods, or drop the Worker spec "
                    "to run mpirun on the launcher alone",
                )
        tpl = rs.get("template")
        pod_spec = tpl.get("spec") if isinstance(tpl, Mapping) else None
        if isinstance(pod_spec, Mapping):
            containers = pod_spec.get("containers")
            if not isinstance(containers, list) or not containers:
                raise ManifestError(
                    f"{path}.{role}.template.spec.containers",
                    f"the {role} pod template has no containers (mpi-operator refuses it); "
                    "add at least one container",
                )


def _ray_pod_templates(spec: Mapping[str, Any], kind: str, path: str) -> list[PodTemplateRef]:
    """A RayJob's pod sets: ``head`` (one pod) and one per worker group (``groupName``)."""
    if not isinstance(spec.get("rayClusterSpec"), Mapping):
        why = (
            "a RayJob on an existing RayCluster (spec.clusterSelector) cannot be placed: "
            "gpufed sizes and places the cluster the RayJob creates"
            if spec.get("clusterSelector")
            else "is required: the RayCluster the RayJob creates (headGroupSpec, workerGroupSpecs)"
        )
        raise ManifestError(f"{path}.spec.rayClusterSpec", why)
    cpath = f"{path}.spec.rayClusterSpec"
    cluster = spec["rayClusterSpec"]
    if cluster.get("enableInTreeAutoscaling"):
        # the gang is sized and pinned once, at placement: an autoscaler growing a group past
        # it would take GPUs on the pinned nodes that were promised to other jobs
        raise ManifestError(
            f"{cpath}.enableInTreeAutoscaling",
            "autoscaling RayClusters cannot be placed as one gang: set each worker group's "
            "replicas and turn autoscaling off",
        )
    head = _mapping(cluster, "headGroupSpec", cpath)
    hpath = f"{cpath}.headGroupSpec"
    out = [
        PodTemplateRef(
            "head", f"{hpath}.template", _mapping(head, "template", hpath), kind, {}, hpath
        )
    ]
    groups = cluster.get("workerGroupSpecs") or []
    if not isinstance(groups, list):
        raise ManifestError(f"{cpath}.workerGroupSpecs", "must be a list of worker groups")
    names = {"head"}
    for i, group in enumerate(groups):
        gpath = f"{cpath}.workerGroupSpecs[{i}]"
        if not isinstance(group, Mapping):
            raise ManifestError(gpath, "must be a worker group (groupName, replicas, template)")
        name = group.get("groupName")
        if not isinstance(name, str) or not name:
            raise ManifestError(f"{gpath}.groupName", "every worker group needs a groupName")
        if name in names:
            raise ManifestError(
                f"{gpath}.groupName",
                f"{name!r} names the head or an earlier worker group; names must be unique",
            )
        names.add(name)
        tpl = _mapping(group, "template", gpath)
        out.append(PodTemplateRef(name, f"{gpath}.template", tpl, kind, group, gpath))
    return out


def _mapping(parent: Mapping[str, Any], key: str, path: str) -> Mapping[str, Any]:
    value = parent.get(key)
    if not isinstance(value, Mapping):
        raise ManifestError(f"{path}.{key}", "is required and must be an object")
    return value


def workload_pod_templates(template: Mapping[str, Any]) -> list[PodTemplateRef]:
    """Every pod template of the workloads in a GPUJob template, in template order.

    Pod set names: ``main`` for a batch/v1 Job, the replicated job's name for a JobSet, the
    lowercased replica type for a PyTorchJob (``master``, ``worker``) or an MPIJob
    (``launcher``, ``worker``), ``head`` and each worker group's ``groupName`` for a RayJob. When a List holds
    several workloads, names are prefixed with the object's name (``<name>.<pod set>``).
    Raises :class:`ManifestError` naming the field of a malformed workload.
    """
    per_object: list[tuple[Mapping[str, Any], list[PodTemplateRef]]] = []
    for path, obj in template_objects(template):
        kind = object_kind(obj, path)
        if kind in WORKLOAD_KINDS:
            per_object.append((obj, _pod_templates_of(obj, kind, path)))
    if len(per_object) <= 1:
        return [ref for _, refs in per_object for ref in refs]
    return [
        ref._replace(pod_set=f"{_name_of(obj)}.{ref.pod_set}")
        for obj, refs in per_object
        for ref in refs
    ]


def _name_of(obj: Mapping[str, Any], default: str = "unnamed") -> str:
    meta = obj.get("metadata")
    name = meta.get("name") if isinstance(meta, Mapping) else None
    return str(name) if name else default


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
) -> list[dict[str, Any]]:
    """The objects of ``template`` ready to apply in a member (steps 1-5 of the module doc).

        ``job_uid``: the GPUJob ``metadata.uid``; ``job_name``: its name (the default name of a
        single-object template without one); ``namespace``: the GPUJob's namespace; ``origin``:
        the hub's id; ``pinning``: pod set name -> where placement put it (names as
        :func:`workload_pod_templates` gives them); ``attempt``: the placement attempt (None: not
    stamped, as when intake only validates). The input is not modified.

        Raises :class:`ManifestError` naming the field for a refused kind, a foreign namespace, a
        cluster-scoped attempt or a List item without a name, and for a template past the
        structural limits of :mod:`gpufed.api.bounds` (checked first: the copies below recurse).
    """
    try:
        measure(template, field="spec.template")
    except BoundsError as exc:
        raise ManifestError(exc.field, exc.message) from exc
    allowed = frozenset(allowed_kinds)
    objects = template_objects(template)
    prepared: list[dict[str, Any]] = []
    for path, obj in objects:
        kind = object_kind(obj, path)
        if kind not in allowed:
            raise ManifestError(
                f"{path}.kind",
                f"{kind} may not be created in a member; allowed kinds: {', '.join(sorted(allowed))}",
            )
        out = copy.deepcopy(dict(obj))
        out.pop("status", None)
        meta = out.get("metadata")
        if meta is None:
            meta = {}
        if not isinstance(meta, dict):
            raise ManifestError(f"{path}.metadata", "must be an object")
        out["metadata"] = meta
        for key in _SERVER_METADATA:
            meta.pop(key, None)
        ns = meta.get("namespace")
        if ns not in (None, "", namespace):
            raise ManifestError(
                f"{path}.metadata.namespace",
                f"{ns!r} is not allowed: a GPUJob's objects go to its own namespace "
                f"{namespace!r} (leave metadata.namespace out)",
            )
        meta["namespace"] = namespace
        if not meta.get("name"):
            if len(objects) > 1 or meta.get("generateName"):
                raise ManifestError(
                    f"{path}.metadata.name",
                    "is required (generateName is not supported: names make re-applying "
                    "idempotent)",
                )
            meta["name"] = job_name
        meta.pop("generateName", None)
        _own(meta, job_uid=job_uid, job_key=f"{namespace}/{job_name}", origin=origin)
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
            raise ManifestError(f"{ref.path}.metadata", "must be an object with a labels map")
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
    return prepared


def attempt_of(manifests: Iterable[Mapping[str, Any]]) -> str:
    """The ``gpufed.io/attempt`` of the first pod template of prepared ``manifests`` ("" when
    none carries one, or they cannot be read). The agent uses it to tell the pods of the
    current copy from those a previous attempt left terminating."""
    items = list(manifests)
    try:
        refs = workload_pod_templates({"apiVersion": "v1", "kind": "List", "items": items})
    except ManifestError:
        return ""
    for ref in refs:
        meta = ref.template.get("metadata") if isinstance(ref.template, Mapping) else None
        annotations = meta.get("annotations") if isinstance(meta, Mapping) else None
        if isinstance(annotations, Mapping) and ATTEMPT_ANNOTATION in annotations:
            return str(annotations[ATTEMPT_ANNOTATION])
    return ""


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
