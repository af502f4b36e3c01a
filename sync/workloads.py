"""A GPUJob template's objects and workloads: which objects are workloads, and their pod templates.

Owns the shapes of the workload kinds (:data:`WORKLOAD_KINDS`): where each keeps its pod
templates and pod counts (:func:`workload_pod_templates`, one :class:`PodTemplateRef` per pod
set, in template order), the objects of a ``kind: List`` template (:func:`template_objects`),
and the shapes refused because no operator would run them as sized (a RayJob on an existing
cluster or with autoscaling, an MPIJob without a launcher, a suspended job or one managed by
another controller ...). Called by pod-set derivation
(``hub/rules/podsets.py``), by manifest preparation (:mod:`gpufed.sync.manifests`, so both agree on
pod set names), by admission and by the agent. A template that may not be sent raises
:class:`~gpufed.api.errors.FieldError` naming the field, here and in preparation. Pure functions over plain dicts;
split out of :mod:`gpufed.sync.manifests`, which re-exports every public name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from gpufed.api.errors import FieldError
from gpufed.api.inventory import workload_kind

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


# --- template structure --------------------------------------------------------------------------


def template_objects(template: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """The objects of a GPUJob template with their field paths.

    A template of ``kind: List`` yields its ``items`` (``spec.template.items[i]``); any other
    template is one object (``spec.template``). Raises :class:`~gpufed.api.errors.FieldError` when an item is
    not an object.
    """
    if template.get("kind") == "List":
        items = template.get("items")
        if not isinstance(items, list) or not items:
            raise FieldError("spec.template.items", "a List template needs a non-empty list")
        out: list[tuple[str, Mapping[str, Any]]] = []
        seen: dict[tuple[str, str, str], str] = {}
        for i, item in enumerate(items):
            path = f"spec.template.items[{i}]"
            if not isinstance(item, Mapping):
                raise FieldError(path, "every item must be a Kubernetes object (a mapping)")
            name = _name_of(item, default="")
            if name:
                # Same group, kind and name: one object in the member (the second would
                # overwrite the first, and their pod sets would share a name).
                group = str(item.get("apiVersion", "")).rpartition("/")[0]
                key = (group, str(item.get("kind", "")), name)
                if key in seen:
                    raise FieldError(
                        f"{path}.metadata.name",
                        f"{name!r} is also the name of {seen[key]} of the same kind; "
                        "give each object of a List its own name",
                    )
                seen[key] = path
            out.append((path, item))
        return out
    return [("spec.template", template)]


def object_kind(obj: Mapping[str, Any], path: str) -> str:
    """``Kind.group`` of an object; raises :class:`~gpufed.api.errors.FieldError` when apiVersion/kind are absent."""
    api_version = obj.get("apiVersion")
    kind = obj.get("kind")
    if not isinstance(api_version, str) or not api_version:
        raise FieldError(f"{path}.apiVersion", "is required (for example batch/v1)")
    if not isinstance(kind, str) or not kind:
        raise FieldError(f"{path}.kind", "is required (for example Job)")
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
        raise FieldError(f"{path}.spec", "is required for a workload")
    _check_started_by_its_operator(spec, kind, path)
    if kind == "MPIJob.kubeflow.org":
        _check_mpi_job(obj, spec, path)
    if kind == "Job.batch":
        tpl = _mapping(spec, "template", f"{path}.spec")
        return [PodTemplateRef("main", f"{path}.spec.template", tpl, kind, spec, f"{path}.spec")]
    if kind == "JobSet.jobset.x-k8s.io":
        rjobs = spec.get("replicatedJobs")
        if not isinstance(rjobs, list) or not rjobs:
            raise FieldError(f"{path}.spec.replicatedJobs", "a JobSet needs replicatedJobs")
        out = []
        names: set[str] = set()
        for i, rj in enumerate(rjobs):
            rpath = f"{path}.spec.replicatedJobs[{i}]"
            if not isinstance(rj, Mapping) or not isinstance(rj.get("name"), str) or not rj["name"]:
                raise FieldError(f"{rpath}.name", "every replicated job needs a name")
            if rj["name"] in names:
                raise FieldError(
                    f"{rpath}.name",
                    f"{rj['name']!r} names an earlier replicated job too; names must be unique",
                )
            names.add(rj["name"])
            job = _mapping(rj, "template", rpath)
            job_spec = _mapping(job, "spec", f"{rpath}.template")
            # each child Job is run by the member's Job controller: another managedBy there
            # would leave the JobSet's pods uncreated (suspend is the JobSet's own to set)
            own = _OWN_CONTROLLER["Job.batch"]
            managed_by = job_spec.get("managedBy")
            if managed_by is not None and managed_by != own:
                raise FieldError(
                    f"{rpath}.template.spec.managedBy",
                    f"{managed_by!r}: the member's {own} leaves a Job managed by another "
                    f"controller alone, so its pods never start; remove it (or set it to {own})",
                )
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
            raise FieldError(f"{path}.spec.{field}", f"a {short} needs {field}")
        if kind == "MPIJob.kubeflow.org":
            _check_mpi_replica_specs(specs, f"{path}.spec.{field}")
        out = []
        roles: dict[str, str] = {}
        for role in sorted(specs):
            rpath = f"{path}.spec.{field}.{role}"
            rs = specs[role]
            if not isinstance(rs, Mapping):
                raise FieldError(rpath, "must be a replica spec (replicas, template)")
            if str(role).lower() in roles:
                raise FieldError(
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


#: Where each workload kind keeps its run policy (``suspend``, ``managedBy``): the spec itself,
#: or ``spec.runPolicy`` for the Kubeflow kinds.
_RUN_POLICY: dict[str, str | None] = {
    "Job.batch": None,
    "JobSet.jobset.x-k8s.io": None,
    "RayJob.ray.io": None,
    "PyTorchJob.kubeflow.org": "runPolicy",
    "MPIJob.kubeflow.org": "runPolicy",
}
#: The ``managedBy`` value of the controller each kind is started by in a member (its default:
#: writing it is the same as leaving it unset).
_OWN_CONTROLLER: dict[str, str] = {
    "Job.batch": "kubernetes.io/job-controller",
    "JobSet.jobset.x-k8s.io": "jobset.sigs.k8s.io/jobset-controller",
    "RayJob.ray.io": "ray.io/kuberay-operator",
    "PyTorchJob.kubeflow.org": "kubeflow.org/training-operator",
    "MPIJob.kubeflow.org": "kubeflow.org/mpi-operator",
}


def _check_started_by_its_operator(spec: Mapping[str, Any], kind: str, path: str) -> None:
    """Refuse a workload its member controller would not start: ``suspend: true`` (the job
    would wait to be resumed, and gpufed never resumes it) or ``managedBy`` naming another
    controller (the member's operator leaves it alone). Either way its placed gang would hold
    GPUs for no pod until the reservation's TTL, keeping them from other tenants. gpufed never
    suspends the member copy itself: it starts a job by sending it once it is placed."""
    sub = _RUN_POLICY[kind]
    where, policy = path + ".spec", spec
    if sub is not None:
        where = f"{where}.{sub}"
        raw = spec.get(sub)
        if raw is None:
            return
        if not isinstance(raw, Mapping):
            raise FieldError(where, "must be an object (suspend, managedBy, backoffLimit ...)")
        policy = raw
    suspend = policy.get("suspend")
    if suspend is not None and suspend is not False:
        raise FieldError(
            f"{where}.suspend",
            f"{suspend!r}: a suspended job is never started in the member; remove "
            f"{where.removeprefix(path + '.')}.suspend: gpufed starts the job when it is placed",
        )
    managed_by = policy.get("managedBy")
    own = _OWN_CONTROLLER[kind]
    if managed_by is not None and managed_by != own:
        raise FieldError(
            f"{where}.managedBy",
            f"{managed_by!r}: the member's {own} leaves a job managed by another controller "
            f"alone, so it never starts; remove {where.removeprefix(path + '.')}.managedBy "
            f"(or set it to {own}): gpufed runs the job with the member's own controller",
        )


#: The MPIJob version mpi-operator serves (its CRD holds no other).
_MPI_API_VERSION = "kubeflow.org/v2beta1"
#: ``spec.mpiImplementation`` values mpi-operator accepts.
_MPI_IMPLEMENTATIONS = ("OpenMPI", "Intel", "MPICH")
_INT32_MAX = 2**31 - 1


def _check_mpi_job(obj: Mapping[str, Any], spec: Mapping[str, Any], path: str) -> None:
    """Refuse MPIJob fields mpi-operator refuses: another ``apiVersion`` than
    ``kubeflow.org/v2beta1`` (no other is served, so the member cannot create it),
    ``slotsPerWorker`` below 1 or not an int32, an ``mpiImplementation`` outside
    OpenMPI/Intel/MPICH."""
    version = obj.get("apiVersion")
    if version != _MPI_API_VERSION:
        raise FieldError(
            f"{path}.apiVersion",
            f"{version!r}: mpi-operator serves MPIJobs only as {_MPI_API_VERSION}; "
            f"write apiVersion: {_MPI_API_VERSION}",
        )
    slots = spec.get("slotsPerWorker")
    if slots is not None and (type(slots) is not int or not 1 <= slots <= _INT32_MAX):
        raise FieldError(
            f"{path}.spec.slotsPerWorker",
            f"{slots!r}: must be a whole number from 1 to {_INT32_MAX} (mpi-operator refuses "
            "others); set the MPI slots of each worker (usually its GPUs), or leave it unset for 1",
        )
    impl = spec.get("mpiImplementation")
    if impl is not None and impl not in _MPI_IMPLEMENTATIONS:
        raise FieldError(
            f"{path}.spec.mpiImplementation",
            f"{impl!r}: mpi-operator knows only {', '.join(_MPI_IMPLEMENTATIONS)} "
            "(case-sensitive); write one of them, or leave it unset for OpenMPI",
        )


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
        raise FieldError(
            f"{path}.{role}",
            f"{role!r} is not an MPIJob replica type: mpi-operator starts only Launcher and "
            f"Worker (case-sensitive); {fix}",
        )
    if "Launcher" not in specs:
        raise FieldError(
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
                raise FieldError(
                    f"{path}.Launcher.replicas",
                    f"{replicas}: must be 1 (mpirun runs in one launcher pod); set replicas: 1",
                )
            if role == "Worker" and replicas < 1:
                raise FieldError(
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
                raise FieldError(
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
        raise FieldError(f"{path}.spec.rayClusterSpec", why)
    cpath = f"{path}.spec.rayClusterSpec"
    cluster = spec["rayClusterSpec"]
    if cluster.get("enableInTreeAutoscaling"):
        # the gang is sized and pinned once, at placement: an autoscaler growing a group past
        # it would take GPUs on the pinned nodes that were promised to other jobs
        raise FieldError(
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
        raise FieldError(f"{cpath}.workerGroupSpecs", "must be a list of worker groups")
    names = {"head"}
    for i, group in enumerate(groups):
        gpath = f"{cpath}.workerGroupSpecs[{i}]"
        if not isinstance(group, Mapping):
            raise FieldError(gpath, "must be a worker group (groupName, replicas, template)")
        name = group.get("groupName")
        if not isinstance(name, str) or not name:
            raise FieldError(f"{gpath}.groupName", "every worker group needs a groupName")
        if name in names:
            raise FieldError(
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
        raise FieldError(f"{path}.{key}", "is required and must be an object")
    return value


def workload_pod_templates(template: Mapping[str, Any]) -> list[PodTemplateRef]:
    """Every pod template of the workloads in a GPUJob template, in template order.

    Pod set names: ``main`` for a batch/v1 Job, the replicated job's name for a JobSet, the
    lowercased replica type for a PyTorchJob (``master``, ``worker``) or an MPIJob
    (``launcher``, ``worker``), ``head`` and each worker group's ``groupName`` for a RayJob. When a List holds
    several workloads, names are prefixed with the object's name (``<name>.<pod set>``).
    Raises :class:`~gpufed.api.errors.FieldError` naming the field of a malformed workload.
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
