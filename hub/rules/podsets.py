"""Pod sets and the placement request of a GPUJob, derived from its template (docs/design.md §4).

Called by the hub's intake for every new GPUJob. Which pods a workload runs at once:

- ``batch/v1`` Job: one pod set ``main`` of ``min(parallelism, completions)`` pods
  (``parallelism`` defaults to 1; ``completions`` unset means no cap), as Kueue counts it;
- JobSet (``jobset.x-k8s.io``): one pod set per replicated job, ``replicas`` (default 1) times
  its Job's pod count;
- Kubeflow PyTorchJob (``kubeflow.org/v1``) and MPIJob (``kubeflow.org/v2beta1``): one pod
  set per replica type (``master``, ``worker``; ``launcher``, ``worker``), ``replicas``
  (default 1) pods each; an MPIJob shape mpi-operator refuses or ignores (no ``Launcher``, a
  launcher of other than 1 replica, a ``Worker`` of fewer than 1, another replica type, a pod
  template without containers, another version than v2beta1, ``slotsPerWorker`` below 1, an
  ``mpiImplementation`` other than OpenMPI/Intel/MPICH) is invalid (:mod:`gpufed.sync.workloads`);
- RayJob (``ray.io/v1``): the RayCluster of ``spec.rayClusterSpec``: pod set ``head`` (one
  pod) and one per worker group, named by ``groupName``, of the pods KubeRay starts:
  ``replicas`` (default 0) clamped into [``minReplicas``, ``maxReplicas``], times
  ``numOfHosts`` (default 1). The submitter pod KubeRay adds asks for no GPU and is not
  sized; a RayJob on an existing cluster (``spec.clusterSelector``) is invalid.

Every pod set of a job is placed at once or not at all (gang), whatever the kind. A workload its
member controller would never start is invalid, whatever the kind: ``suspend: true``
(``spec.suspend``, or ``spec.runPolicy.suspend`` of the Kubeflow kinds) or ``managedBy`` naming
another controller (:mod:`gpufed.sync.workloads`).
- ``kind: List``: the pod sets of every workload in it (ConfigMaps, Secrets, Services carry
  none), names prefixed with the object's name when there are several workloads.
- Pods that claim GPUs through DRA (``spec.resourceClaims`` naming ResourceClaimTemplates of
  the List) count the templates' GPUs as ``nvidia.com/gpu`` and carry their CEL selectors
  (below, "DRA claims", which lists what is refused).

Per-pod requests are the effective requests kube-scheduler computes
(:func:`gpufed.api.resources.pod_requests`: limits fill missing requests, init containers count
as their maximum, pod overhead is added). Errors name the GPUJob field.

Bounded input (docs/design.md §4): the template's depth, value count and size are checked
first (:func:`gpufed.api.bounds.measure`), every quantity before it is parsed
(:mod:`gpufed.api.resources`), and pod counts (``parallelism``, ``completions``, ``replicas``)
are int32 as in Kubernetes; a job past a limit is invalid, naming the field.

**DRA claims** (docs/placement.md, "DRA and ComputeDomains"): the GPUs a pod template claims
through DRA, sized from the ResourceClaimTemplates carried in the GPUJob's ``kind: List``
template, for every pod template. A pod lists claims in ``spec.resourceClaims[] {name, resourceClaimTemplateName}``; each named template
(``resource.k8s.io/v1`` ResourceClaimTemplate, in the same List) holds
``spec.spec.devices.requests[]``. What gpufed sizes, exactly as kube-scheduler would allocate it:

- a request ``exactly: {deviceClassName: gpu.nvidia.com, allocationMode: ExactCount (the
  default), count (default 1), selectors[].cel.expression}``: ``count`` whole GPUs per pod,
  counted into ``requests[nvidia.com/gpu]``, every device satisfying every selector
  (:func:`gpufed.placement.devicecel.check_selector` says which CEL gpufed evaluates);
- ``config[]`` (opaque driver configuration) is carried, it does not change the size.

Refused, with ``Valid=False`` naming the field and what is supported, never guessed:
``resourceClaimName`` (a claim shared by pods: its size and place belong to no one pod),
a template not in the List, ``firstAvailable`` (which alternative is taken is the member's
choice), ``allocationMode: All`` (as many devices as a node has), device classes other than
``gpu.nvidia.com`` (MIG through DRA, ``mig.nvidia.com``, is not read yet), ``constraints``,
CEL outside the subset, and a pod that asks for ``nvidia.com/gpu`` as well as claiming GPUs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from gpufed.api.bounds import measure
from gpufed.api.errors import FieldError
from gpufed.api.gpujob import GPUJob
from gpufed.api.gpus import UnknownGPUError, resolve_gpu_products
from gpufed.api.inventory import Toleration
from gpufed.api.labels import DRA_GPU_DRIVER, GPU_RESOURCE
from gpufed.api.request import (
    LabelSelector,
    LabelSelectorRequirement,
    PlacementRequest,
    PodSet,
    TopologyRequest,
)
from gpufed.api.resources import QuantityError, pod_requests
from gpufed.placement.devicecel import check_selector
from gpufed.sync.manifests import (
    WORKLOAD_KINDS,
    PodTemplateRef,
    object_kind,
    template_objects,
    workload_pod_templates,
)


def derive_pod_sets(template: Mapping[str, Any]) -> tuple[PodSet, ...]:
    """The pod sets of a GPUJob template (see the module doc for the rules).

    Raises :class:`~gpufed.api.errors.FieldError` naming the field: a template past the structural limits
    (:mod:`gpufed.api.bounds`), no workload in the template, a negative, non-integer or
    larger than int32 count, a bad quantity, a malformed toleration.
    """
    measure(template, field="spec.template")
    templates = workload_pod_templates(template)
    if not templates:
        raise FieldError(
            "spec.template.kind",
            "the template holds no workload; use a batch/v1 Job, a JobSet, a PyTorchJob, a "
            "RayJob, an MPIJob, or a List that contains one",
        )
    claim_tpls = claim_templates(template)
    pod_sets: list[PodSet] = []
    for ref in templates:
        count = _pod_count(ref)
        if count == 0:
            continue
        path = ref.path
        spec = ref.template.get("spec")
        if not isinstance(spec, Mapping):
            raise FieldError(f"{path}.spec", "the pod template needs a spec with containers")
        if not spec.get("containers"):
            raise FieldError(f"{path}.spec.containers", "the pod template has no containers")
        _check_containers(spec, f"{path}.spec")
        try:
            requests = pod_requests(spec, field=f"{path}.spec")
        except QuantityError as exc:
            raise FieldError(f"{path}.spec", str(exc)) from exc
        claimed = claimed_gpus(spec, claim_tpls, f"{path}.spec", requests)
        if claimed is not None and claimed.gpus:
            requests[GPU_RESOURCE] = claimed.gpus
        _check_int64(requests, count, ref)
        try:
            pod_sets.append(
                PodSet(
                    name=ref.pod_set,
                    count=count,
                    requests=requests,
                    node_selector=_str_map(spec.get("nodeSelector"), f"{path}.spec.nodeSelector"),
                    tolerations=tuple(
                        Toleration.model_validate(t) for t in spec.get("tolerations") or []
                    ),
                    claim_selectors=(
                        claimed.selectors if claimed is not None and claimed.gpus else None
                    ),
                )
            )
        except ValidationError as exc:
            err = exc.errors()[0]
            loc = ".".join(str(p) for p in err["loc"])
            raise FieldError(f"{path}.spec.tolerations", f"{loc}: {err['msg']}") from exc
    if not pod_sets:
        raise FieldError("spec.template", "the workload runs no pods (every count is 0)")
    if sum(ps.gpus for ps in pod_sets) > INT64_MAX:
        raise FieldError("spec.template", f"asks for more than {INT64_MAX} GPUs in all")
    return tuple(pod_sets)


#: Largest amount Kubernetes (and ``GPUJob.status.gpus``, an int64) can hold.
INT64_MAX = 2**63 - 1
#: Largest pod count field (``parallelism``, ``completions``, ``replicas`` are int32).
INT32_MAX = 2**31 - 1


def _check_int64(requests: Mapping[str, int], count: int, ref: PodTemplateRef) -> None:
    """Refuse amounts no API server can hold (a status naming them could never be written)."""
    for resource, amount in requests.items():
        if amount > INT64_MAX:
            raise FieldError(
                f"{ref.path}.spec",
                f"{resource}: {amount} per pod is larger than Kubernetes can hold ({INT64_MAX})",
            )
        if amount * count > INT64_MAX:
            field = "parallelism" if ref.kind == "Job.batch" else "replicas"
            raise FieldError(
                f"{ref.replica_path}.{field}",
                f"{count} pods x {amount} {resource} is larger than Kubernetes can hold "
                f"({INT64_MAX})",
            )


def _int(value: Any, field: str, default: int) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise FieldError(field, f"{value!r} is not an integer")
    if value < 0:
        raise FieldError(field, f"{value} is negative" if value > -INT32_MAX else "is negative")
    if value > INT32_MAX:
        raise FieldError(field, f"is larger than {INT32_MAX} (Kubernetes counts are int32)")
    return value


def _job_pods(job_spec: Mapping[str, Any], path: str) -> int:
    parallelism = _int(job_spec.get("parallelism"), f"{path}.parallelism", 1)
    completions = job_spec.get("completions")
    if completions is None:
        return parallelism
    return min(parallelism, _int(completions, f"{path}.completions", 1))


def _pod_count(ref: PodTemplateRef) -> int:
    if ref.kind == "Job.batch":
        return _job_pods(ref.replica, ref.replica_path)
    if ref.kind == "JobSet.jobset.x-k8s.io":
        replicas = _int(ref.replica.get("replicas"), f"{ref.replica_path}.replicas", 1)
        job_spec = (ref.replica.get("template") or {}).get("spec") or {}
        return replicas * _job_pods(job_spec, f"{ref.replica_path}.template.spec")
    if ref.kind == "RayJob.ray.io":
        return _ray_group_pods(ref)
    return _int(ref.replica.get("replicas"), f"{ref.replica_path}.replicas", 1)


def _ray_group_pods(ref: PodTemplateRef) -> int:
    """Pods KubeRay starts for a RayJob group: 1 for the head; for a worker group ``replicas``
    (default 0) clamped into [``minReplicas`` (default 0), ``maxReplicas``], times
    ``numOfHosts`` (default 1)."""
    if not ref.replica:  # the head group
        return 1
    path = ref.replica_path
    low = _int(ref.replica.get("minReplicas"), f"{path}.minReplicas", 0)
    high = _int(ref.replica.get("maxReplicas"), f"{path}.maxReplicas", INT32_MAX)
    if low > high:
        raise FieldError(f"{path}.minReplicas", f"{low} is more than maxReplicas {high}")
    replicas = _int(ref.replica.get("replicas"), f"{path}.replicas", 0)
    hosts = _int(ref.replica.get("numOfHosts"), f"{path}.numOfHosts", 1)
    count = min(max(replicas, low), high) * hosts
    if count > INT32_MAX:
        raise FieldError(f"{path}.numOfHosts", f"{count} pods is more than {INT32_MAX}")
    return count


def _check_containers(spec: Mapping[str, Any], path: str) -> None:
    """Refuse container lists that are not lists of objects (``containers: [null]``), naming
    the entry, before their requests are read."""
    for key in ("containers", "initContainers"):
        items = spec.get(key) or []
        if not isinstance(items, list):
            raise FieldError(f"{path}.{key}", "must be a list of containers")
        for i, c in enumerate(items):
            if not isinstance(c, Mapping):
                got = "null" if c is None else type(c).__name__
                raise FieldError(
                    f"{path}.{key}[{i}]",
                    f"must be an object (a container with name, image, resources), not {got}",
                )


def _str_map(value: Any, field: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise FieldError(field, "must be a map of strings")
    return dict(value)


def main_workload_kind(template: Mapping[str, Any]) -> str:
    """``Kind.group`` of the first workload object in the template (``Job.batch`` ...)."""
    for path, obj in template_objects(template):
        kind = object_kind(obj, path)
        if kind in WORKLOAD_KINDS:
            return kind
    raise FieldError("spec.template.kind", "the template holds no workload")


def placement_request(job: GPUJob, *, submitted_at: float) -> PlacementRequest:
    """The :class:`PlacementRequest` of a GPUJob: its pod sets plus ``spec.placement`` and
    ``spec.checkpoint``. ``priority`` is the spec's integer here; the hub's scheduling replaces
    it with the job's PriorityClass value (:mod:`gpufed.hub.rules.admission`).

    ``gpuProducts`` may hold short names (``H100``): the request carries the GFD products they
    stand for (:func:`gpufed.api.gpus.resolve_gpu_products`); the GPUJob spec is not rewritten.

    ``submitted_at``: seconds since the epoch (queue order after priority). Raises
    :class:`~gpufed.api.errors.FieldError` naming the field.
    """
    if not job.metadata.uid:
        raise FieldError("metadata.uid", "the GPUJob has no uid (read it from the API server)")
    template = job.spec.template
    pod_sets = derive_pod_sets(template)
    placement = job.spec.placement
    selector = None
    if placement.cluster_selector is not None:
        expressions = []
        for i, e in enumerate(placement.cluster_selector.match_expressions):
            try:
                expressions.append(
                    LabelSelectorRequirement(key=e.key, operator=e.operator, values=tuple(e.values))
                )
            except ValidationError as exc:
                raise FieldError(
                    f"spec.placement.clusterSelector.matchExpressions[{i}]",
                    exc.errors()[0]["msg"].removeprefix("Value error, "),
                ) from exc
        selector = LabelSelector(
            match_labels=placement.cluster_selector.match_labels,
            match_expressions=tuple(expressions),
        )
    try:
        return _request(job, pod_sets, selector, submitted_at)
    except ValidationError as exc:
        # Every rule above should have named its field; this keeps a missed one from ever
        # escaping as anything but an invalid job.
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        raise FieldError("spec", f"{loc}: {err['msg']}") from exc


def _request(
    job: GPUJob,
    pod_sets: tuple[PodSet, ...],
    selector: LabelSelector | None,
    submitted_at: float,
) -> PlacementRequest:
    assert job.metadata.uid is not None
    placement = job.spec.placement
    template = job.spec.template
    try:
        # The spec keeps the names the user wrote; placement and status use the products.
        products = resolve_gpu_products(placement.gpu_products)
    except UnknownGPUError as exc:
        raise FieldError(f"spec.placement.gpuProducts[{exc.index}]", str(exc)) from exc
    return PlacementRequest(
        job=job.key,
        uid=job.metadata.uid,
        pod_sets=pod_sets,
        gpu_products=products,
        allocation=placement.allocation,
        cluster_selector=selector,
        topology=TopologyRequest(
            nvlink=placement.topology.nvlink,
            rack=placement.topology.rack,
            block=placement.topology.block,
            compute_domain=placement.topology.compute_domain,
        ),
        priority=placement.priority,
        checkpoint_interval_s=(
            job.spec.checkpoint.interval_seconds if job.spec.checkpoint is not None else None
        ),
        queue=placement.queue,
        workload_kind=main_workload_kind(template),
        submitted_at=submitted_at,
        time_limit_s=time_limit_of(job),
    )


def time_limit_of(job: GPUJob) -> int | None:
    """The job's declared run-time limit, seconds: ``spec.placement.timeLimitSeconds``, else the
    ``spec.activeDeadlineSeconds`` of its batch/v1 Job when that Job is the template's only
    workload (the member's Job controller then stops the whole job at it), else None.

    A List that holds another workload beside the Job (a JobSet, a PyTorchJob, a second Job)
    gets no limit from ``activeDeadlineSeconds``: the member would stop only that Job, so such a
    limit must not buy backfill on held nodes; declare ``timeLimitSeconds`` (the hub stops every
    kind at it). Raises :class:`FieldError` for an ``activeDeadlineSeconds`` that is not a
    positive integer."""
    if job.spec.placement.time_limit_seconds is not None:
        return job.spec.placement.time_limit_seconds
    found: int | None = None
    objects = list(template_objects(job.spec.template))
    workloads = [(p, o) for p, o in objects if object_kind(o, p) in WORKLOAD_KINDS]
    if len(workloads) != 1:
        return None
    for path, obj in workloads:
        if object_kind(obj, path) != "Job.batch":
            continue
        spec = obj.get("spec")
        raw = spec.get("activeDeadlineSeconds") if isinstance(spec, Mapping) else None
        if raw is None:
            continue
        field = f"{path}.spec.activeDeadlineSeconds"
        if isinstance(raw, bool) or not isinstance(raw, int) or raw < 1:
            raise FieldError(field, f"{raw!r} is not a positive integer (seconds)")
        found = raw if found is None else min(found, raw)
    return found


# --- DRA claims ----------------------------------------------------------------------------------

CLAIM_TEMPLATE_KIND = "ResourceClaimTemplate.resource.k8s.io"
#: Most GPUs one request may ask for (the API's limit on ``count``).
MAX_REQUEST_COUNT = 128


@dataclass(frozen=True, slots=True)
class ClaimedGPUs:
    """What one pod claims through DRA: ``gpus`` whole GPUs per pod and the CEL ``selectors``
    every device must satisfy (sorted, de-duplicated)."""

    gpus: int
    selectors: tuple[str, ...]


def claim_templates(template: Mapping[str, Any]) -> dict[str, tuple[str, Mapping[str, Any]]]:
    """The ResourceClaimTemplates of a GPUJob template by name: name -> (field path, object)."""
    out: dict[str, tuple[str, Mapping[str, Any]]] = {}
    for path, obj in template_objects(template):
        if object_kind(obj, path) == CLAIM_TEMPLATE_KIND:
            name = str((obj.get("metadata") or {}).get("name") or "")
            if not name:
                raise FieldError(f"{path}.metadata.name", "a ResourceClaimTemplate needs a name")
            out[name] = (path, obj)
    return out


def claimed_gpus(
    spec: Mapping[str, Any],
    templates: Mapping[str, tuple[str, Mapping[str, Any]]],
    path: str,
    requests: Mapping[str, int],
) -> ClaimedGPUs | None:
    """The GPUs one pod template (``spec`` at field path ``path``) claims, None when it lists
    no ``spec.resourceClaims``. ``requests``: its extended-resource requests (a pod may not ask
    for ``nvidia.com/gpu`` and claim GPUs too). Raises :class:`FieldError` naming the field."""
    claims = spec.get("resourceClaims")
    if not claims:
        return None
    if not isinstance(claims, list):
        raise FieldError(
            f"{path}.resourceClaims", "must be a list of {name, resourceClaimTemplateName}"
        )
    gpus = 0
    selectors: set[str] = set()
    for i, claim in enumerate(claims):
        field = f"{path}.resourceClaims[{i}]"
        if not isinstance(claim, Mapping):
            raise FieldError(field, "must be an object {name, resourceClaimTemplateName}")
        if claim.get("resourceClaimName"):
            raise FieldError(
                f"{field}.resourceClaimName",
                "a claim shared by pods is not supported (its devices belong to no one pod); "
                "use resourceClaimTemplateName with a ResourceClaimTemplate in the template's "
                "List, so each pod gets its own claim",
            )
        name = claim.get("resourceClaimTemplateName")
        if not isinstance(name, str) or not name:
            raise FieldError(f"{field}.resourceClaimTemplateName", "is required")
        if name not in templates:
            raise FieldError(
                f"{field}.resourceClaimTemplateName",
                f"no ResourceClaimTemplate {name!r} in the template; add it to the GPUJob's "
                "kind: List template (gpufed creates it in the member with the workload)",
            )
        n, sel = _template_gpus(*templates[name])
        gpus += n
        selectors.update(sel)
    if gpus and requests.get(GPU_RESOURCE, 0):
        raise FieldError(
            f"{path}.containers",
            "the pod asks for nvidia.com/gpu and claims GPUs through DRA; use one or the other",
        )
    return ClaimedGPUs(gpus=gpus, selectors=tuple(sorted(selectors)))


def _template_gpus(path: str, obj: Mapping[str, Any]) -> tuple[int, set[str]]:
    devices = ((obj.get("spec") or {}).get("spec") or {}).get("devices") or {}
    base = f"{path}.spec.spec.devices"
    if not isinstance(devices, Mapping):
        raise FieldError(base, "must be an object with requests")
    if devices.get("constraints"):
        raise FieldError(
            f"{base}.constraints",
            "constraints (matchAttribute) are not supported; gpufed sizes requests of "
            "exactly: {deviceClassName: gpu.nvidia.com, allocationMode: ExactCount, count, "
            "selectors}",
        )
    requests = devices.get("requests") or []
    if not isinstance(requests, list) or not requests:
        raise FieldError(f"{base}.requests", "needs at least one request")
    gpus = 0
    selectors: set[str] = set()
    for i, req in enumerate(requests):
        field = f"{base}.requests[{i}]"
        if not isinstance(req, Mapping):
            raise FieldError(field, "must be an object {name, exactly}")
        if req.get("firstAvailable"):
            raise FieldError(
                f"{field}.firstAvailable",
                "is not supported (which alternative the member picks decides the size); "
                "use exactly: {deviceClassName: gpu.nvidia.com, count}",
            )
        exactly = req.get("exactly")
        if not isinstance(exactly, Mapping):
            raise FieldError(f"{field}.exactly", "is required (exactly: {deviceClassName, count})")
        ef = f"{field}.exactly"
        cls = exactly.get("deviceClassName")
        if cls != DRA_GPU_DRIVER:
            raise FieldError(
                f"{ef}.deviceClassName",
                f"{cls!r} is not supported; gpufed sizes whole GPUs of device class "
                f"{DRA_GPU_DRIVER} (MIG through DRA, mig.nvidia.com, is not read yet)",
            )
        mode = exactly.get("allocationMode", "ExactCount")
        if mode != "ExactCount":
            raise FieldError(
                f"{ef}.allocationMode",
                f"{mode!r} is not supported (All takes as many GPUs as a node has); use "
                "ExactCount with a count",
            )
        count = exactly.get("count", 1)
        if (
            isinstance(count, bool)
            or not isinstance(count, int)
            or not 1 <= count <= MAX_REQUEST_COUNT
        ):
            raise FieldError(f"{ef}.count", f"must be an integer from 1 to {MAX_REQUEST_COUNT}")
        for j, sel in enumerate(exactly.get("selectors") or []):
            expr = (
                ((sel or {}).get("cel") or {}).get("expression")
                if isinstance(sel, Mapping)
                else None
            )
            if not isinstance(expr, str) or not expr:
                raise FieldError(f"{ef}.selectors[{j}].cel.expression", "is required")
            why = check_selector(expr)
            if why is not None:
                raise FieldError(f"{ef}.selectors[{j}].cel.expression", why)
            selectors.add(expr)
        gpus += count
    return gpus, selectors
