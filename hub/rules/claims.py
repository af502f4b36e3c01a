"""GPUs a pod template claims through DRA: sizing from the ResourceClaimTemplates carried in the
GPUJob's ``kind: List`` template (docs/placement.md, "DRA and ComputeDomains").

Called by pod-set derivation (:mod:`gpufed.hub.rules.podsets`) for every pod template. A pod
lists claims in ``spec.resourceClaims[] {name, resourceClaimTemplateName}``; each named template
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

from gpufed.api.errors import FieldError
from gpufed.api.labels import DRA_GPU_DRIVER, GPU_RESOURCE
from gpufed.placement.devicecel import check_selector
from gpufed.sync.manifests import object_kind, template_objects

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
