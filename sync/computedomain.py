"""Rendering a job's ComputeDomain: the ``ComputeDomain`` object and every GPU pod's channel claim.

When placement decides that a job gets a ComputeDomain (``Decision.compute_domain``, rules in
:mod:`gpufed.placement.computedomain`), the hub's manifest preparation
(:func:`gpufed.sync.manifests.prepare_manifests`) adds to the job's objects, with this module:

* one ``ComputeDomain`` (``resource.nvidia.com/v1beta1``, NVIDIA's DRA driver) named after the
  job, in the job's namespace: ``spec.numNodes`` = the nodes placement chose for the GPU pods,
  ``spec.channel.resourceClaimTemplate.name`` = :func:`channel_template_name`,
  ``spec.channel.allocationMode: Single``. It carries gpufed's ownership labels like every other
  object of the job, so the agent creates it alongside the workload and deletes it with the job;
  the driver's controller then creates that ResourceClaimTemplate (owned by the domain, so the
  member's garbage collector deletes it with the domain);
* in every pod template of a pod set with GPUs: ``spec.resourceClaims`` entry
  ``{name: gpufed-imex-channel, resourceClaimTemplateName: <that template>}`` and, in every
  container, ``resources.claims`` entry ``{name: gpufed-imex-channel}``. Pod sets without GPUs
  (launchers) get none: their node is not part of the IMEX domain.

The agent reports the domain's readiness as the workload condition ``ComputeDomainReady``
(:func:`domain_condition`), which the hub mirrors into ``GPUJob.status.conditions``.

Pure functions over plain dicts; no I/O.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any, Final

from pydantic import BaseModel, ConfigDict

from gpufed.api.decision import Decision
from gpufed.api.labels import COMPUTE_DOMAIN_API_VERSION
from gpufed.api.work import Condition

#: The claim name every GPU pod of a ComputeDomain job lists (``spec.resourceClaims[].name``).
CHANNEL_CLAIM: Final = "gpufed-imex-channel"
_SUFFIX: Final = "-imex-channel"
_MAX_NAME: Final = 253


class ComputeDomainSpec(BaseModel):
    """What to render: the domain's ``name`` (the job's), the ``nodes`` its GPU pods use, and
    the ``pod_sets`` (names) whose pods get the channel claim."""

    model_config = ConfigDict(frozen=True)

    name: str
    nodes: int
    pod_sets: tuple[str, ...]


def compute_domain_of(decision: Decision) -> ComputeDomainSpec | None:
    """The domain a ``Placed`` decision asks for, None when it asks for none."""
    if not decision.compute_domain or not decision.placed:
        return None
    gpu_sets = [p for p in decision.pod_sets if p.requests.get("nvidia.com/gpu", 0) > 0]
    return ComputeDomainSpec(
        name=decision.job.rpartition("/")[2],
        nodes=len({n for p in gpu_sets for n in p.nodes}),
        pod_sets=tuple(p.name for p in gpu_sets),
    )


def channel_template_name(domain: str) -> str:
    """The ResourceClaimTemplate the domain's controller creates: ``<domain>-imex-channel``
    (a too long name keeps its start and gets a hash, within 253 characters)."""
    name = domain + _SUFFIX
    if len(name) <= _MAX_NAME:
        return name
    digest = hashlib.sha256(domain.encode()).hexdigest()[:10]
    return f"{domain[: _MAX_NAME - len(_SUFFIX) - 11]}-{digest}{_SUFFIX}"


def compute_domain_object(spec: ComputeDomainSpec, namespace: str) -> dict[str, Any]:
    """The ``ComputeDomain`` manifest (no ownership labels yet: the caller stamps them)."""
    return {
        "apiVersion": COMPUTE_DOMAIN_API_VERSION,
        "kind": "ComputeDomain",
        "metadata": {"name": spec.name, "namespace": namespace},
        "spec": {
            "numNodes": spec.nodes,
            "channel": {
                "resourceClaimTemplate": {"name": channel_template_name(spec.name)},
                "allocationMode": "Single",
            },
        },
    }


def add_channel_claim(pod_template: dict[str, Any], domain: str) -> None:
    """Give one pod template the domain's channel claim (in place; idempotent): the pod's
    ``spec.resourceClaims`` entry and every container's ``resources.claims`` entry."""
    spec = pod_template.setdefault("spec", {})
    claims = [
        c
        for c in spec.get("resourceClaims") or []
        if not (isinstance(c, Mapping) and c.get("name") == CHANNEL_CLAIM)
    ]
    claims.append(
        {"name": CHANNEL_CLAIM, "resourceClaimTemplateName": channel_template_name(domain)}
    )
    spec["resourceClaims"] = claims
    for container in spec.get("containers") or []:
        if not isinstance(container, dict):
            continue
        resources = container.setdefault("resources", {})
        own = [
            c
            for c in resources.get("claims") or []
            if not (isinstance(c, Mapping) and c.get("name") == CHANNEL_CLAIM)
        ]
        own.append({"name": CHANNEL_CLAIM})
        resources["claims"] = own


#: The workload condition the agent adds for a job's ComputeDomain (``status.conditions``).
READY_CONDITION: Final = "ComputeDomainReady"


def domain_condition(obj: Mapping[str, Any]) -> Condition:
    """The ``ComputeDomainReady`` condition of a ComputeDomain object as the member shows it:
    ``True`` with reason ``Ready`` when its controller says ``status.status: Ready``, else
    ``False`` with reason ``NotReady``; the message names the domain and the nodes that
    joined (``status.nodes``)."""
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    name = str(meta.get("name", "")) if isinstance(meta, Mapping) else ""
    state = str(status.get("status") or "NotReady") if isinstance(status, Mapping) else "NotReady"
    nodes = status.get("nodes") if isinstance(status, Mapping) else None
    joined = len(nodes) if isinstance(nodes, list) else 0
    ready = state == "Ready"
    return Condition(
        type=READY_CONDITION,
        status="True" if ready else "False",
        reason="Ready" if ready else "NotReady",
        message=f"ComputeDomain {name}: {state}, {joined} node{'' if joined == 1 else 's'} joined",
    )
