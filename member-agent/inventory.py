"""The member's GPU inventory, kept up to date from Node and Pod events.

Owns the agent's in-memory picture of its cluster: per node the few facts placement needs
(labels, taints, cordon, Ready, allocatable) and per bound, unfinished pod its effective
request, summed incrementally into ``requested`` per node (and per ``gpufed.io/job-uid``).
Raw API objects are reduced to these facts on arrival and dropped, so memory grows with the
number of nodes and pods, not with the size of their manifests.

A node whose GPUs NVIDIA's DRA driver publishes (ResourceSlices, :mod:`gpufed.agent.dra`,
kept in :attr:`InventoryState.dra`) reports them as ``nvidia.com/gpu``: the devices offered as
allocatable, the devices ResourceClaims hold as requested (and per job, through the pods the
claims are reserved for), and the device groups in ``dra_gpus``; its pods' own
``nvidia.com/gpu`` requests are not counted again.

Fed by the informers of :mod:`gpufed.agent.informer` (list + watch), read by the hub stream
(:mod:`gpufed.agent.hub_stream`: snapshot, then coalesced deltas) and by
``gpufed agent inventory --once``. Pure and synchronous: no I/O, no clock.

Bad input degrades only its node: an unparsable or fractional quantity, a missing
``status.allocatable``, an unknown taint effect or MIG strategy, or a bound pod whose
requests cannot be read sets :attr:`NodeInventory.degraded` with the reason (and the node then
offers nothing); every other node is reported as usual.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, get_args

from gpufed.agent.dra import DraState, count_once
from gpufed.api.inventory import (
    MIG_STRATEGIES,
    NodeInventory,
    Taint,
    TaintEffect,
    TopologyLabels,
    node_from_labels,
)
from gpufed.api.labels import GPU_RESOURCE, HOSTNAME_LABEL, JOB_UID_LABEL, MIG_STRATEGY_LABEL
from gpufed.api.resources import QuantityError, pod_requests, to_canonical
from gpufed.sync.failure import NodeHealth

_EFFECTS: frozenset[str] = frozenset(get_args(TaintEffect))
_FINISHED = frozenset({"Succeeded", "Failed"})
#: Node degradation reasons name at most this many bad pods (the count says how many more).
_MAX_POD_REASONS = 3
#: True node conditions kept per node.
_MAX_CONDITIONS = 32


@dataclass(frozen=True, slots=True)
class NodeFacts:
    """What the agent keeps of one Node (``metadata.labels``, ``spec.taints``,
    ``spec.unschedulable``, ``status.conditions[Ready]``, ``status.allocatable``), plus the
    problems found reading it."""

    name: str
    labels: Mapping[str, str]
    taints: tuple[Taint, ...]
    unschedulable: bool
    ready: bool
    allocatable: Mapping[str, int]
    problems: tuple[str, ...] = ()
    #: condition types other than Ready whose status is True (at most 32), with their reason
    true_conditions: Mapping[str, str] = field(default_factory=dict)
    #: when the Ready condition last changed (its ``lastTransitionTime``, seconds since the
    #: epoch; None when absent or unreadable): since when a not-Ready node has been so
    ready_changed: float | None = None


@dataclass(frozen=True, slots=True)
class PodFacts:
    """What the agent keeps of one pod: the node it holds resources on (``spec.nodeName``),
    its effective request (:func:`gpufed.api.resources.pod_requests` plus ``pods: 1``), its
    job UID label, and why its request could not be read (then it counts as nothing and its
    node is degraded)."""

    node: str
    requests: Mapping[str, int]
    job_uid: str | None = None
    problem: str | None = None


def _intern(s: str) -> str:
    return sys.intern(s)


def _epoch(value: Any) -> float | None:
    """An RFC 3339 time (``2026-12-03T06:40:00Z``) as seconds since the epoch; None when it
    is not one."""
    if not isinstance(value, str) or not value:
        return None
    try:
        when = datetime.fromisoformat(value.strip().replace("z", "Z").replace("Z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.timestamp()


def node_facts(raw: Mapping[str, Any]) -> NodeFacts:
    """Reduce a Node object to :class:`NodeFacts`; never raises on odd content."""
    meta = raw.get("metadata") or {}
    spec = raw.get("spec") or {}
    status = raw.get("status") or {}
    name = str(meta.get("name", ""))
    problems: list[str] = []

    labels: dict[str, str] = {}
    for k, v in (meta.get("labels") or {}).items():
        labels[_intern(str(k))] = _intern(str(v))

    taints: list[Taint] = []
    for i, t in enumerate(spec.get("taints") or []):
        effect = str((t or {}).get("effect", ""))
        if effect not in _EFFECTS:
            problems.append(
                f"spec.taints[{i}].effect: {effect!r} is not one of {', '.join(sorted(_EFFECTS))}"
            )
            continue
        taints.append(
            Taint(key=str(t.get("key", "")), value=str(t.get("value") or ""), effect=effect)
        )

    allocatable: dict[str, int] = {}
    raw_alloc = status.get("allocatable")
    if not raw_alloc:
        problems.append(
            "status.allocatable: missing (the kubelet has not reported the node's resources)"
        )
    elif not isinstance(raw_alloc, Mapping):
        problems.append("status.allocatable: expected a map of resource name to quantity")
    else:
        for res, q in raw_alloc.items():
            try:
                allocatable[_intern(str(res))] = to_canonical(
                    str(res), q, field=f"status.allocatable[{res}]"
                )
            except QuantityError as exc:
                problems.append(str(exc))

    ready_cond = next(
        (
            c
            for c in status.get("conditions") or []
            if isinstance(c, Mapping) and c.get("type") == "Ready"
        ),
        None,
    )
    ready = ready_cond is not None and ready_cond.get("status") == "True"
    ready_changed = _epoch(ready_cond.get("lastTransitionTime")) if ready_cond else None
    true_conditions: dict[str, str] = {}
    for c in status.get("conditions") or []:
        if (
            isinstance(c, Mapping)
            and c.get("status") == "True"
            and c.get("type") != "Ready"
            and len(true_conditions) < _MAX_CONDITIONS
        ):
            true_conditions[_intern(str(c.get("type", "")))[:316]] = str(c.get("reason") or "")[
                :128
            ]
    mig = labels.get(MIG_STRATEGY_LABEL, "none")
    if mig not in MIG_STRATEGIES:
        problems.append(
            f"label {MIG_STRATEGY_LABEL}: {mig!r} is not one of {', '.join(sorted(MIG_STRATEGIES))}"
        )
    return NodeFacts(
        name=name,
        labels=labels,
        taints=tuple(taints),
        unschedulable=bool(spec.get("unschedulable", False)),
        ready=ready,
        ready_changed=ready_changed,
        allocatable=allocatable,
        problems=tuple(problems),
        true_conditions=true_conditions,
    )


def pod_key(raw: Mapping[str, Any]) -> str:
    """``namespace/name`` of a pod object."""
    meta = raw.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def pod_facts(raw: Mapping[str, Any]) -> PodFacts | None:
    """Reduce a Pod to :class:`PodFacts`, or None when it holds nothing on any node: not
    bound yet (no ``spec.nodeName``) or finished (``status.phase`` Succeeded or Failed).
    A Terminating pod (``metadata.deletionTimestamp`` set) still holds its resources."""
    spec = raw.get("spec") or {}
    node = spec.get("nodeName")
    if not node:
        return None
    if (raw.get("status") or {}).get("phase") in _FINISHED:
        return None
    labels = (raw.get("metadata") or {}).get("labels") or {}
    job_uid = labels.get(JOB_UID_LABEL)
    try:
        req = pod_requests(spec)
    except QuantityError as exc:
        return PodFacts(
            node=_intern(str(node)),
            requests={},
            job_uid=job_uid,
            problem=f"pod {pod_key(raw)}: {exc}",
        )
    req["pods"] = req.get("pods", 0) + 1
    return PodFacts(
        node=_intern(str(node)),
        requests={_intern(k): v for k, v in req.items()},
        job_uid=_intern(str(job_uid)) if job_uid else None,
    )


def _add(target: dict[str, int], amounts: Mapping[str, int], sign: int) -> None:
    for k, v in amounts.items():
        n = target.get(k, 0) + sign * v
        if n:
            target[k] = n
        else:
            target.pop(k, None)


@dataclass
class _Relist:
    seen: set[str] = field(default_factory=set)


class InventoryState:
    """Nodes and bound pods of one member, with ``requested`` kept incrementally.

    Changes mark nodes dirty; :meth:`take_changes` returns and clears them (the hub stream
    sends them as one delta). ``on_change`` is called (no arguments) whenever something
    became dirty, so the sender can wake up; ``on_node`` with a node's name whenever that Node
    changed or was deleted (the status reporter re-classifies the jobs on it).
    """

    def __init__(
        self,
        topology: TopologyLabels | None = None,
        *,
        on_change: Callable[[], None] | None = None,
        log_degraded: Callable[[str, str], None] | None = None,
        on_node: Callable[[str], None] | None = None,
    ) -> None:
        self.topology = topology or TopologyLabels()
        self._on_change = on_change
        self._on_node = on_node
        self._log_degraded = log_degraded
        self._nodes: dict[str, NodeFacts] = {}
        self._pods: dict[str, PodFacts] = {}
        self._requested: dict[str, dict[str, int]] = {}
        self._job_requests: dict[str, dict[str, dict[str, int]]] = {}
        self._pod_problems: dict[str, dict[str, str]] = {}
        self._dirty: set[str] = set()
        self._removed: set[str] = set()
        self._node_relist: _Relist | None = None
        self._pod_relist: _Relist | None = None
        self._degraded_seen: dict[str, str] = {}
        self._degraded_conditions: frozenset[str] = frozenset()
        #: GPUs published through DRA (ResourceSlices, ResourceClaims); see :meth:`node_inventory`
        self.dra = DraState(on_node=self._touch)

    def set_degraded_conditions(self, types: Iterable[str]) -> None:
        """Node condition types that make a node degraded while True (from the hub's
        ``Welcome``); a change marks every node changed."""
        new = frozenset(types)
        if new == self._degraded_conditions:
            return
        self._degraded_conditions = new
        for name in self._nodes:
            self._touch(name)

    # --- counts ------------------------------------------------------------------------------

    @property
    def node_count(self) -> int:
        return len(self._nodes)

    @property
    def pod_count(self) -> int:
        """Bound, unfinished pods currently counted."""
        return len(self._pods)

    @property
    def degraded_count(self) -> int:
        """Nodes whose last built inventory was degraded."""
        return len(self._degraded_seen)

    def node_names(self) -> list[str]:
        return sorted(self._nodes)

    # --- nodes -------------------------------------------------------------------------------

    def upsert_node(self, raw: Mapping[str, Any]) -> None:
        """A Node was added or modified (or listed)."""
        facts = node_facts(raw)
        if self._node_relist is not None:
            self._node_relist.seen.add(facts.name)
        if self._nodes.get(facts.name) == facts:
            return
        self._nodes[facts.name] = facts
        self._removed.discard(facts.name)
        self._touch(facts.name)
        if self._on_node is not None:
            self._on_node(facts.name)

    def delete_node(self, name: str) -> None:
        """A Node was deleted. Pods bound to it keep counting until they are deleted too."""
        if self._nodes.pop(name, None) is None:
            return
        self._dirty.discard(name)
        self._removed.add(name)
        self._degraded_seen.pop(name, None)
        self._notify()
        if self._on_node is not None:
            self._on_node(name)

    def begin_node_relist(self) -> None:
        """A full node list starts: nodes not upserted before :meth:`end_node_relist` are
        deleted then (they vanished while the watch was broken)."""
        self._node_relist = _Relist()

    def end_node_relist(self) -> None:
        relist, self._node_relist = self._node_relist, None
        if relist is None:
            return
        for name in [n for n in self._nodes if n not in relist.seen]:
            self.delete_node(name)

    # --- pods --------------------------------------------------------------------------------

    def upsert_pod(self, raw: Mapping[str, Any]) -> None:
        """A Pod was added or modified (or listed)."""
        key = pod_key(raw)
        if self._pod_relist is not None:
            self._pod_relist.seen.add(key)
        self._set_pod(key, pod_facts(raw))

    def delete_pod(self, key: str) -> None:
        """A Pod (``namespace/name``) was deleted, or left the watch's field selector."""
        self._set_pod(key, None)

    def begin_pod_relist(self) -> None:
        """A full pod list starts (see :meth:`begin_node_relist`)."""
        self._pod_relist = _Relist()

    def end_pod_relist(self) -> None:
        relist, self._pod_relist = self._pod_relist, None
        if relist is None:
            return
        for key in [k for k in self._pods if k not in relist.seen]:
            self._set_pod(key, None)

    def _set_pod(self, key: str, new: PodFacts | None) -> None:
        old = self._pods.get(key)
        if old == new:
            return
        if old is not None:
            self._account(key, old, -1)
            del self._pods[key]
        if new is not None:
            self._pods[key] = new
            self._account(key, new, +1)

    def _account(self, key: str, pod: PodFacts, sign: int) -> None:
        node = pod.node
        if pod.problem is not None:
            problems = self._pod_problems.setdefault(node, {})
            if sign > 0:
                problems[key] = pod.problem
            else:
                problems.pop(key, None)
                if not problems:
                    del self._pod_problems[node]
        else:
            _add(self._requested.setdefault(node, {}), pod.requests, sign)
            if not self._requested[node]:
                del self._requested[node]
            if pod.job_uid:
                per_job = self._job_requests.setdefault(node, {})
                _add(per_job.setdefault(pod.job_uid, {}), pod.requests, sign)
                if not per_job[pod.job_uid]:
                    del per_job[pod.job_uid]
                if not per_job:
                    del self._job_requests[node]
        self._touch(node)

    # --- reading -----------------------------------------------------------------------------

    def _touch(self, node: str) -> None:
        self._dirty.add(node)
        self._notify()

    def _notify(self) -> None:
        if self._on_change is not None:
            self._on_change()

    def node_health(self, name: str) -> NodeHealth | None:
        """Ready and whole GPUs allocatable of one node, None when the node is unknown (for
        :func:`gpufed.sync.failure.classify_failure`)."""
        facts = self._nodes.get(name)
        if facts is None:
            return None
        dra = self.dra.node_gpus(name)
        return NodeHealth(
            ready=facts.ready,
            gpus=dra.offered if dra is not None else facts.allocatable.get(GPU_RESOURCE, 0),
            not_ready_since=None if facts.ready else facts.ready_changed,
        )

    def node_of_hostname(self, hostname: str) -> str | None:
        """The name of a known node whose ``kubernetes.io/hostname`` label is ``hostname``
        (a node without the label: its name), None when there is none. A scan over the nodes:
        called only for a failed copy whose pods are gone."""
        if hostname in self._nodes and HOSTNAME_LABEL not in self._nodes[hostname].labels:
            return hostname
        return next(
            (
                n
                for n, facts in sorted(self._nodes.items())
                if facts.labels.get(HOSTNAME_LABEL) == hostname
            ),
            None,
        )

    def node_inventory(self, name: str) -> NodeInventory:
        """The :class:`NodeInventory` of one known node (KeyError when unknown)."""
        facts = self._nodes[name]
        labels = facts.labels
        problems = list(facts.problems)
        for ctype in sorted(self._degraded_conditions & facts.true_conditions.keys()):
            reason = facts.true_conditions[ctype]
            problems.append(f"condition {ctype}=True{f' ({reason})' if reason else ''}")
        bad_pods = self._pod_problems.get(name, {})
        for key in sorted(bad_pods)[:_MAX_POD_REASONS]:
            problems.append(bad_pods[key])
        if len(bad_pods) > _MAX_POD_REASONS:
            problems.append(f"and {len(bad_pods) - _MAX_POD_REASONS} more pods with bad requests")
        allocatable = dict(facts.allocatable)
        requested = dict(self._requested.get(name, {}))
        job_requests = {uid: dict(r) for uid, r in self._job_requests.get(name, {}).items()}
        dra = self.dra.node_gpus(name)
        if dra is not None:
            problems.extend(dra.problems)
            job_of = {pod: f.job_uid for pod in dra.held_by_pod if (f := self._pods.get(pod))}
            count_once(dra, job_of, allocatable, requested, job_requests)
        degraded = "; ".join(problems) or None
        if degraded != self._degraded_seen.get(name):  # log each new reason once
            if degraded is None:
                self._degraded_seen.pop(name, None)
            else:
                self._degraded_seen[name] = degraded
                if self._log_degraded is not None:
                    self._log_degraded(name, degraded)
        return node_from_labels(
            name,
            labels,
            topology=self.topology,
            ready=facts.ready,
            unschedulable=facts.unschedulable,
            taints=facts.taints,
            allocatable=allocatable,
            requested=requested,
            job_requests=job_requests,
            degraded=degraded,
            gpu_product=dra.product if dra is not None else None,
            dra_gpus=dra.groups if dra is not None else (),
        )

    def snapshot(self) -> list[NodeInventory]:
        """Every known node, sorted by name; clears the pending changes (a snapshot carries
        them all)."""
        self._dirty.clear()
        self._removed.clear()
        return [self.node_inventory(n) for n in sorted(self._nodes)]

    def has_changes(self) -> bool:
        return bool(self._removed) or any(n in self._nodes for n in self._dirty)

    def take_changes(self) -> tuple[list[NodeInventory], list[str]]:
        """Nodes changed since the last call (or snapshot) and nodes removed; clears both.

        Dirty names of nodes that are not (or no longer) known are dropped: a pod bound to a
        node the agent has not seen yet is accounted, and shows once the node arrives.
        """
        dirty, self._dirty = self._dirty, set()
        removed, self._removed = self._removed, set()
        upserts = [self.node_inventory(n) for n in sorted(dirty) if n in self._nodes]
        return upserts, sorted(removed)


class NodeHandler:
    """Informer handler feeding Node objects into an :class:`InventoryState`."""

    def __init__(self, state: InventoryState) -> None:
        self.state = state

    def begin_relist(self) -> None:
        self.state.begin_node_relist()

    def upsert(self, obj: dict[str, Any]) -> None:
        self.state.upsert_node(obj)

    def delete(self, obj: dict[str, Any]) -> None:
        self.state.delete_node(str((obj.get("metadata") or {}).get("name", "")))

    def end_relist(self) -> None:
        self.state.end_node_relist()


class PodHandler:
    """Informer handler feeding Pod objects into an :class:`InventoryState`."""

    def __init__(self, state: InventoryState) -> None:
        self.state = state

    def begin_relist(self) -> None:
        self.state.begin_pod_relist()

    def upsert(self, obj: dict[str, Any]) -> None:
        self.state.upsert_pod(obj)

    def delete(self, obj: dict[str, Any]) -> None:
        self.state.delete_pod(pod_key(obj))

    def end_relist(self) -> None:
        self.state.end_pod_relist()
