"""Admission of a GPUJob: the hub's policy over a job's prepared manifests before it may be
placed, and its priority from the hub cluster's PriorityClasses (the part Kubernetes' Priority
admission plugin plays for Pods).

**Manifests** (:func:`admit`).

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

**Priority** (:func:`priority_source`, :class:`PriorityClasses`): the hub cluster's
PriorityClasses (``scheduling.k8s.io/v1``) and the rule that gives a GPUJob its priority and
preemption policy (docs/design.md §4, §8).

Fed by :mod:`gpufed.hub.components.intake` (list+watch of ``priorityclasses``, the same loop as GPUJobs;
a change asks for a scheduling cycle); asked by :mod:`gpufed.hub.components.scheduling` for every waiting
job, each cycle, with the cap of the job's GPUQueue (:meth:`gpufed.hub.components.queues.Queues.max_priority`).
The term's one :class:`PriorityClasses` is ``HubState.priorities``, where the two meet; whether
a job waits for its class or fails for its value is the lifecycle's rule 7
(:mod:`gpufed.hub.rules.lifecycle`), from what :meth:`PriorityClasses.resolve` finds.

- **Where a job's class comes from** (:func:`priority_source`, once at intake):
  ``spec.placement.priorityClassName``, else the ``priorityClassName`` of the workload's pod
  templates (they must agree), else none.
- **The free integer** ``spec.placement.priority`` (deprecated) is accepted only without a
  class and when it is 0 or negative (a job may lower itself; raising itself needs a class an
  administrator created). Jobs placed before (a job record, a claim) or finished are not
  validated again: they keep the integer they were placed with.
- **Resolution** (:meth:`PriorityClasses.resolve`): a named class that exists gives its
  ``value`` and ``preemptionPolicy`` (``PreemptLowerPriority`` when unset, as Kubernetes);
  one that does not exist (yet) makes the job **wait** (phase Pending, the message names the
  class and how to create it) and it is placed once the class appears; no class means the
  global default class (``globalDefault: true``; of several, the lowest value, as the
  Kubernetes priority admission plugin), else 0. Values above 1,000,000,000 (the system
  classes ``system-cluster-critical``, ``system-node-critical``) are for the cluster's own
  components and refused, as is a named class above the queue's cap
  (``GPUQueue.spec.maxPriority``; for the default queue without one, the hub's
  ``--default-queue-max-priority``: :class:`PriorityCap`); an implicit priority (default class or 0) above the cap is
  lowered to the cap instead, since the job did not ask for it.
- **Before the first PriorityClass list** of a term nothing is placed (:attr:`synced`): the
  default class and the named ones are not known yet.

Bounded: one small record per PriorityClass (PriorityClasses are cluster-scoped and created by
administrators). One instance per leader term.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, get_args

import structlog

from gpufed.api.errors import FieldError
from gpufed.api.gpujob import GPUJob
from gpufed.api.inventory import workload_kind
from gpufed.api.request import PreemptionPolicy
from gpufed.sync.apivalidation import metadata_errors, name_error
from gpufed.sync.manifests import template_objects, workload_pod_templates
from gpufed.sync.podsecurity import Level, check_pod_template

log = structlog.get_logger("gpufed.hub.rules.admission")

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


#: Largest value of a user-defined PriorityClass (Kubernetes' HighestUserDefinablePriority);
#: above it are the system classes.
MAX_USER_PRIORITY: Final = 1_000_000_000
CLASS_FIELD: Final = "spec.placement.priorityClassName"
PRIORITY_FIELD: Final = "spec.placement.priority"
_POLICIES: Final = frozenset(get_args(PreemptionPolicy))


@dataclass(frozen=True)
class PriorityClassInfo:
    """What the hub keeps of one PriorityClass: ``value``, ``preemption_policy``,
    ``global_default``."""

    name: str
    value: int
    preemption_policy: PreemptionPolicy = "PreemptLowerPriority"
    global_default: bool = False


@dataclass(frozen=True)
class PriorityCap:
    """The highest priority a job of a queue may use: ``value``, from a GPUQueue's
    ``spec.maxPriority`` (``flag`` None) or from the hub flag ``flag``
    (``--default-queue-max-priority``, for the default queue without a cap of its own)."""

    value: int
    flag: str | None = None

    def where(self, queue: str) -> str:
        """``GPUQueue team-a (spec.maxPriority 1000)``: the cap and who set it."""
        if self.flag is None:
            return f"GPUQueue {queue} (spec.maxPriority {self.value})"
        return f"the default queue {queue} (hub flag {self.flag} {self.value})"

    def fix(self) -> str:
        """Who can raise it."""
        if self.flag is None:
            return "ask the queue's administrator to raise spec.maxPriority"
        return (
            f"ask the hub's operator to raise {self.flag}, or an administrator to list the "
            "job's namespace in a GPUQueue"
        )


@dataclass(frozen=True)
class PrioritySource:
    """Where a job's priority comes from: ``class_name`` named at ``field`` (None: none named),
    else the free integer ``value`` (``spec.placement.priority``)."""

    class_name: str | None = None
    field: str = CLASS_FIELD
    value: int = 0


@dataclass(frozen=True)
class Resolution:
    """A job's priority now: ``priority`` and ``preemption_policy`` (``class_name``: the class
    used, the default one included); or ``waiting`` (the message: its class does not exist);
    or ``error`` at ``error_field`` (the job fails with ``Valid=False``)."""

    priority: int = 0
    preemption_policy: PreemptionPolicy = "PreemptLowerPriority"
    class_name: str | None = None
    waiting: str | None = None
    error: str | None = None
    error_field: str = CLASS_FIELD


def priority_source(job: GPUJob, *, placed: bool) -> PrioritySource:
    """Where ``job``'s priority comes from (see the module docstring).

    ``placed``: the job was placed before (or finished): the free integer is kept whatever its
    value. Raises :class:`~gpufed.api.errors.FieldError` naming the field: pod templates
    naming different classes, a class name that is not a string, a positive free integer, or a
    free integer together with a class.
    """
    placement = job.spec.placement
    name, field = placement.priority_class_name, CLASS_FIELD
    if name is None:
        name, field = _template_class(job.spec.template)
    if placed:
        return PrioritySource(class_name=name, field=field, value=placement.priority)
    if name is not None and placement.priority != 0:
        raise FieldError(
            PRIORITY_FIELD,
            f"set either a PriorityClass ({field}: {name}) or spec.placement.priority, not both; "
            "spec.placement.priority is deprecated: remove it",
        )
    if placement.priority > 0:
        raise FieldError(
            PRIORITY_FIELD,
            f"{placement.priority} is positive: a higher priority comes only from a "
            "PriorityClass on the hub cluster; set spec.placement.priorityClassName "
            "(kubectl get priorityclasses) and remove spec.placement.priority",
        )
    return PrioritySource(class_name=name, field=field, value=placement.priority)


def _template_class(template: Mapping[str, Any]) -> tuple[str | None, str]:
    """The ``priorityClassName`` the workload's pod templates name (all the same), and its
    field."""
    try:
        refs = workload_pod_templates(template)
    except FieldError:
        return None, CLASS_FIELD  # already refused by the pod sets' derivation
    found: dict[str, str] = {}
    for ref in refs:
        spec = ref.template.get("spec")
        value = spec.get("priorityClassName") if isinstance(spec, Mapping) else None
        if value is None or value == "":
            continue
        path = f"{ref.path}.spec.priorityClassName"
        if not isinstance(value, str):
            raise FieldError(path, "must be a string (a PriorityClass name)")
        found.setdefault(value, path)
    if len(found) > 1:
        names = ", ".join(sorted(found))
        raise FieldError(
            CLASS_FIELD,
            f"the workload's pod templates name different PriorityClasses ({names}); "
            "set spec.placement.priorityClassName to the one the job runs at",
        )
    if not found:
        return None, CLASS_FIELD
    ((name, path),) = found.items()
    return name, path


def _info(obj: Mapping[str, Any]) -> PriorityClassInfo | None:
    meta = obj.get("metadata") or {}
    name = meta.get("name")
    value = obj.get("value")
    policy = obj.get("preemptionPolicy") or "PreemptLowerPriority"
    if (
        not isinstance(name, str)
        or isinstance(value, bool)
        or not isinstance(value, int)
        or policy not in _POLICIES
    ):
        log.warning("hub.priorityclass.unreadable", name=str(name), value=str(value))
        return None
    return PriorityClassInfo(
        name=name,
        value=value,
        preemption_policy="Never" if policy == "Never" else "PreemptLowerPriority",
        global_default=obj.get("globalDefault") is True,
    )


class PriorityClasses:
    """The hub cluster's PriorityClasses and the resolution rule (module docstring)."""

    def __init__(self) -> None:
        self._classes: dict[str, PriorityClassInfo] = {}
        #: set once the first PriorityClass list of this term is in
        self.synced = asyncio.Event()
        #: the last error of the PriorityClass list+watch ("" after a good list)
        self.list_error = ""

    def __len__(self) -> int:
        return len(self._classes)

    def get(self, name: str) -> PriorityClassInfo | None:
        """The class ``name``, or None while the hub has not seen it."""
        return self._classes.get(name)

    def on_event(self, type_: str, obj: Mapping[str, Any]) -> bool:
        """A PriorityClass watch event; True when what the hub keeps changed."""
        name = str((obj.get("metadata") or {}).get("name", ""))
        if type_ == "DELETED":
            return self._classes.pop(name, None) is not None
        info = _info(obj)
        if info is None:
            return self._classes.pop(name, None) is not None
        if self._classes.get(name) == info:
            return False
        self._classes[name] = info
        return True

    def listed(self, items: Iterable[Mapping[str, Any]]) -> None:
        """After a (re)list: classes gone meanwhile are forgotten; the rest arrive as ADDED."""
        items = list(items)
        present = {str((o.get("metadata") or {}).get("name", "")) for o in items}
        for name in [n for n in self._classes if n not in present]:
            del self._classes[name]
        for obj in items:
            self.on_event("ADDED", obj)
        self.list_error = ""
        self.synced.set()

    def list_failed(self, exc: Exception) -> None:
        """The PriorityClass list or watch failed (missing RBAC rule: nothing is placed)."""
        self.list_error = str(exc)

    def default(self) -> PriorityClassInfo | None:
        """The global default class (of several, the lowest value, then the first name)."""
        defaults = [c for c in self._classes.values() if c.global_default]
        return min(defaults, key=lambda c: (c.value, c.name), default=None)

    def resolve(
        self, source: PrioritySource, *, queue: str, cap: PriorityCap | int | None
    ) -> Resolution:
        """The priority of a job whose class comes from ``source``, in GPUQueue ``queue`` whose
        cap is ``cap`` (an int: a ``spec.maxPriority``; None: no cap). Pure over the classes
        seen so far."""
        if isinstance(cap, int):
            cap = PriorityCap(cap)
        name = source.class_name
        if name is None:
            return self._implicit(source, queue=queue, cap=cap)
        info = self._classes.get(name)
        if info is None:
            return Resolution(
                class_name=name,
                waiting=(
                    f"PriorityClass {name} ({source.field}) does not exist on the hub cluster; "
                    f"the job waits until it does: create it (kubectl create priorityclass "
                    f"{name} --value=<priority>) or name an existing class "
                    f"(kubectl get priorityclasses)"
                ),
            )
        if info.value > MAX_USER_PRIORITY:
            return Resolution(
                error=(
                    f"PriorityClass {name} has value {info.value}, above "
                    f"{MAX_USER_PRIORITY}: classes that high are for the cluster's own "
                    "components; name a class of your workloads (kubectl get priorityclasses)"
                ),
                error_field=source.field,
            )
        if cap is not None and info.value > cap.value:
            return Resolution(
                error=(
                    f"PriorityClass {name} has value {info.value}, above the cap of "
                    f"{cap.where(queue)}; name a class of value {cap.value} or less, or "
                    f"{cap.fix()}"
                ),
                error_field=source.field,
            )
        return Resolution(
            priority=info.value, preemption_policy=info.preemption_policy, class_name=name
        )

    def _implicit(
        self, source: PrioritySource, *, queue: str, cap: PriorityCap | None
    ) -> Resolution:
        if source.value != 0:
            # The deprecated free integer (0 or negative for new jobs; any for placed ones).
            if cap is not None and source.value > cap.value:
                return Resolution(
                    error=(
                        f"{source.value} is above the cap of {cap.where(queue)}; remove "
                        "spec.placement.priority"
                    ),
                    error_field=PRIORITY_FIELD,
                )
            return Resolution(priority=source.value)
        default = self.default()
        value = default.value if default is not None else 0
        policy: PreemptionPolicy = (
            default.preemption_policy if default is not None else "PreemptLowerPriority"
        )
        if cap is not None:
            value = min(value, cap.value)
        return Resolution(
            priority=value,
            preemption_policy=policy,
            class_name=default.name if default is not None else None,
        )
