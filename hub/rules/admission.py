"""Admission of a GPUJob at intake: the hub's policy over a job's prepared manifests before it
may be placed.

Called by :mod:`gpufed.hub.components.intake` for every new job that was never placed, after
:func:`gpufed.sync.manifests.prepare_manifests` (kinds, own namespace) succeeded. Pure: the
caller passes the namespace's Pod Security level (:class:`gpufed.hub.components.intake.NamespaceLevels`) and the
policy from :class:`gpufed.hub.components.config.HubConfig`. In order (the first refusal wins, naming the
field):

1. **Reserved namespaces** (``kube-system``, ``kube-public``, ``kube-node-lease``, the gpufed
   namespace, plus the configured ones): a GPUJob there is refused (``metadata.namespace``).
2. **Names, labels, annotations** a member's API server would certainly refuse
   (:mod:`gpufed.sync.apivalidation`), on every object and pod template.
3. **Exposed Services**: ``type: NodePort`` / ``LoadBalancer`` or ``externalIPs`` reach beyond
   the member's cluster network; refused unless the hub allows them.
4. **Pod Security Standards** (:mod:`gpufed.sync.podsecurity`): every pod template of every
   workload, at the namespace's level.
5. **Stoppable pods**: a pod template may not carry ``metadata.finalizers`` nor a
   ``spec.terminationGracePeriodSeconds`` above :data:`MAX_TERMINATION_GRACE_S`: the hub stops a
   preempted or re-run job's copy and waits for its pods to go before another job (the
   preemptor) may use the GPUs, so a pod that never goes would hold another tenant's GPUs.

Already placed jobs are never admitted again (a running job is not failed by a later policy
change): intake calls this only for jobs without a job record.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from gpufed.api.errors import FieldError
from gpufed.api.inventory import workload_kind
from gpufed.sync.apivalidation import metadata_errors, name_error
from gpufed.sync.manifests import template_objects, workload_pod_templates
from gpufed.sync.podsecurity import Level, check_pod_template

#: Service types that open ports outside the member's cluster network.
EXPOSED_SERVICE_TYPES: Final = frozenset({"NodePort", "LoadBalancer"})
#: Violations named in one condition message (the rest are counted).
_SHOWN: Final = 3
#: Most seconds a pod of a GPUJob may take to stop (SIGTERM to SIGKILL): time to write a
#: checkpoint, and no longer than a reservation lives (the preemptor's hold, 600 s by default).
MAX_TERMINATION_GRACE_S: Final = 600


@dataclass(frozen=True)
class AdmissionPolicy:
    """``reserved_namespaces``: hub namespaces whose GPUJobs are refused;
    ``allow_exposed_services``: NodePort/LoadBalancer Services and ``externalIPs`` pass."""

    reserved_namespaces: frozenset[str]
    allow_exposed_services: bool = False


def admit(
    template: Mapping[str, Any],
    prepared: Sequence[Mapping[str, Any]],
    *,
    namespace: str,
    level: Level,
    policy: AdmissionPolicy,
) -> None:
    """Refuse what the hub's policy refuses (steps 1-4 of the module docstring).

    ``template``: the GPUJob's ``spec.template``; ``prepared``: what
    :func:`~gpufed.sync.manifests.prepare_manifests` made of it (same objects, same order;
    names defaulted), so names are checked as the member will see them. Raises
    :class:`~gpufed.api.errors.FieldError` with the field path and the rule.
    """
    # 1. reserved namespaces
    if namespace in policy.reserved_namespaces:
        raise FieldError(
            "metadata.namespace",
            f"{namespace!r} is reserved (the control plane's or gpufed's own); submit GPUJobs "
            "in a team's namespace",
        )
    paths = [path for path, _ in template_objects(template)]
    for path, obj in zip(paths, prepared, strict=True):
        kind = workload_kind(str(obj.get("apiVersion", "")), str(obj.get("kind", "")))
        meta = obj.get("metadata")
        assert isinstance(meta, Mapping)  # prepare_manifests made it
        # 2. what the member's API server refuses
        why = name_error(kind, str(meta.get("name", "")))
        if why is not None:
            raise FieldError(f"{path}.metadata.name", f"{meta.get('name')!r} {why}")
        for field, why in metadata_errors(meta, f"{path}.metadata"):
            raise FieldError(field, why)
        # 3. exposed Services
        if kind == "Service" and not policy.allow_exposed_services:
            _check_service(obj, path)
    prepared_template: Mapping[str, Any] = (
        {"apiVersion": "v1", "kind": "List", "items": list(prepared)}
        if template.get("kind") == "List"
        else prepared[0]
    )
    for ref in workload_pod_templates(prepared_template):
        pod_meta = ref.template.get("metadata")
        if isinstance(pod_meta, Mapping):
            for field, why in metadata_errors(pod_meta, f"{ref.path}.metadata"):
                raise FieldError(field, why)
        # 5. pods the hub can stop (checked first: a single, cheap field each)
        _check_stoppable(ref.template, ref.path)
        # 4. Pod Security Standards
        violations = check_pod_template(ref.template, ref.path, level)
        if violations:
            first = violations[0]
            more = "; ".join(f"{v.field} {v.message}" for v in violations[1:_SHOWN])
            rest = len(violations) - _SHOWN
            tail = (f"; also {more}" if more else "") + (f" (and {rest} more)" if rest > 0 else "")
            raise FieldError(
                first.field,
                f"{first.message}: violates PodSecurity {level!r} ({first.check}) of namespace "
                f"{namespace!r}{tail}",
            )


def _check_stoppable(pod_template: Mapping[str, Any], path: str) -> None:
    meta = pod_template.get("metadata")
    if isinstance(meta, Mapping) and meta.get("finalizers"):
        raise FieldError(
            f"{path}.metadata.finalizers",
            "pods of a GPUJob may not carry finalizers: the hub must be able to stop them "
            "(preemption, re-runs, deletion); remove the field",
        )
    spec = pod_template.get("spec")
    grace = spec.get("terminationGracePeriodSeconds") if isinstance(spec, Mapping) else None
    if isinstance(grace, int) and not isinstance(grace, bool) and grace > MAX_TERMINATION_GRACE_S:
        raise FieldError(
            f"{path}.spec.terminationGracePeriodSeconds",
            f"{grace} is above the hub's limit of {MAX_TERMINATION_GRACE_S} s: a stopping job "
            "holds GPUs another job waits for; checkpoint within that time",
        )


def _check_service(obj: Mapping[str, Any], path: str) -> None:
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        return
    svc_type = spec.get("type")
    if svc_type in EXPOSED_SERVICE_TYPES:
        raise FieldError(
            f"{path}.spec.type",
            f"{svc_type} Services open ports outside the member's cluster network and are not "
            "allowed by this hub; use ClusterIP (or ask the operator for --allow-exposed-services)",
        )
    if spec.get("externalIPs"):
        raise FieldError(
            f"{path}.spec.externalIPs",
            "externalIPs are not allowed by this hub (ask the operator for "
            "--allow-exposed-services)",
        )
