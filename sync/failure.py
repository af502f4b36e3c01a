"""Failure classification: was a job's member copy broken by infrastructure or by its own code?

Owns the rules that tell an **infrastructure** failure (the node, its GPUs or the cluster failed
under the job: it may be re-run from its checkpoint) from an **application** failure (the job's
own code exited non-zero: final). The agent (:mod:`gpufed.agent.status`) classifies every
tracked job on each change of its objects, pods or nodes; the hub applies the job's declared
infrastructure exit codes (:func:`with_declared_exit_codes`); the simulator shares the
vocabulary. Pure: plain dicts as the API server returns them, no I/O, no clock.

Rules, first match wins (a job is a gang: one broken pod breaks the whole job, whatever its
phase, so an infrastructure cause may be reported while the member Job still says Running):

1. a pod with condition ``DisruptionTarget`` True (Kubernetes ≥ 1.26 sets it before it kills
   a pod for an infrastructure reason): reason = the condition's reason (``DeletionByPodGC``
   after its node was deleted, ``TerminationByKubelet`` on node shutdown or pressure,
   ``DeletionByTaintManager`` for a NoExecute taint such as ``node.kubernetes.io/unreachable``,
   ``EvictionByEvictionAPI`` for a drain, ``PreemptionByScheduler``);
2. a node the job's unfinished pods were bound to is gone (``NodeLost``) or not Ready
   (``NodeNotReady``);
3. a node under an unfinished pod of the job now offers fewer whole GPUs (``nvidia.com/gpu``
   allocatable) than it did while the job ran there (``GPUUnavailable``: the device plugin
   withdrew a failed GPU);
4a. the workload failed, **no pod of the copy is left** to show an exit code or a
   ``DisruptionTarget``, a node its pod templates pin it to (``pinned``: what the hub's
   placement wrote into the copy, :func:`gpufed.sync.pins.template_pins`, hostnames mapped to node names by the
   caller) no longer exists, and the ``Failed`` condition's own words
   allow a lost pod (:data:`LOST_POD_REASONS`: the Job counted a failed pod against its
   backoff limit, or its pod failure policy matched ``DisruptionTarget``): ``NodeLost``. This is
   a ``backoffLimit: 0`` Job whose node was deleted while the agent was down: the Job
   controller failed it for the lost pod and the pod garbage collector removed the pod
   (:func:`lost_with_its_pods`, which says why this is the rule);
4. the workload failed: ``Application``, reason the member object's ``Failed`` condition reason
   (``BackoffLimitExceeded`` …) else ``Failed``, with the non-zero exit codes of its
   terminated containers (the hub turns it into ``InfrastructureExitCode`` when every such code
   is one the job declared, :func:`with_declared_exit_codes`).

A job that succeeded, or runs with none of the above, has no cause.

**Kubernetes' timing, not ours** (rules 2 and 3): a node that is not Ready, or offers fewer
GPUs, is first only a *suspicion* (:func:`suspicions`). A kubelet hiccup or a device-plugin
restart lasts seconds; Kubernetes itself tolerates a not-ready or unreachable node for 300 s
(the default ``node.kubernetes.io/not-ready`` / ``unreachable`` NoExecute tolerations) before
it evicts the pods, marking them ``DisruptionTarget`` (rule 1). So a suspicion becomes a
cause only when ``grace_s`` (the job's ``spec.placement.retry.nodeNotReadySeconds``, default
300) has passed since it began (the Ready condition's ``lastTransitionTime``; for GPUs, when
the caller first saw the drop) while it persists, or at once when the member gives up on a
pod there (``DisruptionTarget``, or an unfinished pod on that node being deleted). A node that
recovers within the grace period leaves no cause. ``grace_s`` 0 (or no ``now``): at once. The
caller passes ``now`` and the "since" times; nothing here reads a clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from gpufed.api.gpujob import DEFAULT_NODE_NOT_READY_S
from gpufed.api.work import (
    MAX_FAILURE_ITEMS,
    MAX_FAILURE_MESSAGE,
    Condition,
    FailureCause,
    WorkloadPhase,
)
from gpufed.sync.pins import pinned_nodes

#: The pod condition Kubernetes sets before killing a pod for an infrastructure reason.
DISRUPTION_TARGET: Final = "DisruptionTarget"
#: Reasons of causes this module produces (besides the DisruptionTarget reasons it copies).
NODE_LOST: Final = "NodeLost"
NODE_NOT_READY: Final = "NodeNotReady"
GPU_UNAVAILABLE: Final = "GPUUnavailable"
INFRASTRUCTURE_EXIT_CODE: Final = "InfrastructureExitCode"
#: The ``DisruptionTarget`` reasons Kubernetes sets (rule 1), which this module copies as the
#: cause's reason: the pod garbage collector after the node's deletion, a NoExecute taint
#: (``node.kubernetes.io/unreachable``, a GPU health taint), the kubelet on node shutdown or
#: pressure, a drain (the Eviction API), the member's scheduler preempting the pod.
DELETION_BY_POD_GC: Final = "DeletionByPodGC"
DELETION_BY_TAINT_MANAGER: Final = "DeletionByTaintManager"
TERMINATION_BY_KUBELET: Final = "TerminationByKubelet"
EVICTION_BY_EVICTION_API: Final = "EvictionByEvictionAPI"
PREEMPTION_BY_SCHEDULER: Final = "PreemptionByScheduler"
#: Infrastructure reasons that are evidence about the node itself, which alone mark nodes
#: suspect (the hub's ``hub/components/reservations.py``, via ``hub/components/lifecycle.py``): the node gone or NotReady,
#: GPUs withdrawn by the device plugin, the pod garbage collector after the node's deletion, a
#: NoExecute taint. Not: ``InfrastructureExitCode`` (the tenant declares it),
#: ``TerminationByKubelet`` (a pressure eviction the tenant's own pod can provoke),
#: ``EvictionByEvictionAPI`` (a drain), ``PreemptionByScheduler`` (the member's scheduler):
#: those re-run the job, marking nothing; else one tenant could mark nodes at will.
NODE_EVIDENCE: frozenset[str] = frozenset(
    {NODE_LOST, NODE_NOT_READY, GPU_UNAVAILABLE, DELETION_BY_POD_GC, DELETION_BY_TAINT_MANAGER}
)
#: Seconds a not-Ready node or a GPU drop under a running job is only a suspicion, unless the
#: job says otherwise (Kubernetes' default NoExecute ``tolerationSeconds`` for not-ready and
#: unreachable nodes).
DEFAULT_NODE_GRACE_S: Final = DEFAULT_NODE_NOT_READY_S
_FINISHED = frozenset({"Succeeded", "Failed"})
#: ``Failed`` condition reasons under which a workload may have failed for a pod it lost (rule
#: 4a): the batch/v1 Job controller counted a failed pod against ``backoffLimit`` (a pod removed
#: with its node counts as failed), per index (``backoffLimitPerIndex``: ``FailedIndexes``,
#: ``MaxFailedIndexesExceeded``), or a ``podFailurePolicy`` ``FailJob`` rule matched (only when
#: its message names ``DisruptionTarget``, :data:`DISRUPTION_TARGET`: a rule matching an exit
#: code is the job's own failure). Never ``DeadlineExceeded`` (the time limit) nor a reason
#: this list does not know.
LOST_POD_REASONS: frozenset[str] = frozenset(
    {"BackoffLimitExceeded", "FailedIndexes", "MaxFailedIndexesExceeded", "PodFailurePolicy"}
)


@dataclass(frozen=True, slots=True)
class NodeHealth:
    """What classification needs of one member node: its ``Ready`` condition, the whole
    GPUs it offers (``status.allocatable[nvidia.com/gpu]``) and since when (seconds since the
    epoch) it has not been Ready (the Ready condition's ``lastTransitionTime``; None: Ready,
    or unknown)."""

    ready: bool
    gpus: int
    not_ready_since: float | None = None


@dataclass(frozen=True, slots=True)
class Suspicion:
    """A node under a running job that is not Ready or withdrew GPUs, within the grace period
    (module docstring): ``reason`` ``NodeNotReady`` or ``GPUUnavailable``; ``since`` seconds
    since the epoch; ``deadline``: when it becomes a failure if it persists."""

    node: str
    reason: str
    since: float
    deadline: float
    message: str


def classify_failure(
    *,
    phase: WorkloadPhase,
    conditions: Iterable[Condition] = (),
    pods: Iterable[Mapping[str, Any]] = (),
    nodes: Mapping[str, NodeHealth] | None = None,
    gpus_seen: Mapping[str, int] | None = None,
    now: float | None = None,
    grace_s: float = 0,
    gpus_dropped_since: Mapping[str, float] | None = None,
    pinned: Iterable[str] = (),
) -> FailureCause | None:
    """The cause of a job's failure, or None (module docstring, rules 1-4).

    ``phase``: the summarised workload phase; ``conditions``: the main object's conditions;
    ``pods``: the job's pods (API server dicts); ``nodes``: every node of the member by name
    (None: unknown, rules 2 and 3 are skipped); ``gpus_seen``: per node, the most whole GPUs
    it offered while an unfinished pod of the job was bound there. ``now`` (seconds since the
    epoch), ``grace_s`` (seconds; 0: at once) and ``gpus_dropped_since`` (per node, when the
    caller first saw it offer fewer GPUs than ``gpus_seen``) time rules 2 and 3: a not-Ready
    node or a GPU drop is a cause only once ``grace_s`` has passed since it began, or when an
    unfinished pod on that node is being deleted; a missing "since" counts as elapsed.
    ``pinned``: the node names the copy's own pod templates pin it to (:func:`gpufed.sync.pins.template_pins`),
    for rule 4a (needs ``nodes``). Never raises on odd input.
    """
    if phase in ("Succeeded", "Missing"):
        return None
    pod_list = sorted(pods, key=lambda p: str(_meta(p).get("name", "")))
    # 1. DisruptionTarget
    disrupted: dict[str, list[str]] = {}
    messages: list[str] = []
    for pod in pod_list:
        cond = _pod_condition(pod, DISRUPTION_TARGET)
        if cond is not None and cond.get("status") == "True":
            reason = str(cond.get("reason") or DISRUPTION_TARGET)
            disrupted.setdefault(reason, []).append(_node(pod))
            messages.append(f"pod {_meta(pod).get('name', '')}: {cond.get('message') or reason}")
    if disrupted:
        reason = sorted(disrupted)[0]
        return _cause(
            "Infrastructure", reason, messages, [n for ns in disrupted.values() for n in ns]
        )
    if nodes is not None:
        lost, not_ready, dropped = _node_trouble(pod_list, nodes, gpus_seen or {})
        # 2. node gone or not Ready
        if lost:
            return _cause(
                "Infrastructure", NODE_LOST, [f"node {n} was deleted" for n in lost], lost
            )
        timing = _Timing(now, grace_s, _deleting_on(pod_list))
        not_ready = [n for n in not_ready if timing.due(n, nodes[n].not_ready_since)]
        if not_ready:
            msgs = [
                f"node {n} is not Ready{timing.how_long(nodes[n].not_ready_since)}"
                for n in not_ready
            ]
            return _cause("Infrastructure", NODE_NOT_READY, msgs, not_ready)
        # 3. a GPU withdrawn under the job
        seen = gpus_seen or {}
        since = gpus_dropped_since or {}
        dropped = [n for n in dropped if timing.due(n, since.get(n))]
        if dropped:
            msgs = [
                f"node {n} offers {nodes[n].gpus} GPUs, {seen[n]} while the job ran there"
                f"{timing.how_long(since.get(n))}"
                for n in dropped
            ]
            return _cause("Infrastructure", GPU_UNAVAILABLE, msgs, dropped)
    if phase != "Failed":
        return None
    failed = next((c for c in conditions if c.type == "Failed" and c.status == "True"), None)
    # 4a. failed for a pod it lost with its node, the pod collected since
    if nodes is not None and not pod_list:
        gone = lost_with_its_pods(failed, pinned, nodes)
        if gone:
            return _cause(
                "Infrastructure",
                NODE_LOST,
                [
                    f"node {', '.join(gone)} the copy was pinned to was deleted; the workload "
                    f"failed ({failed.reason if failed else 'Failed'}) and no pod is left to show "
                    "an exit code"
                ],
                gone,
            )
    # 4. the workload failed by itself
    codes = sorted(set(exit_codes(pod_list)))[:MAX_FAILURE_ITEMS]
    reason = (failed.reason if failed else "") or "Failed"
    message = (failed.message if failed else "") or (
        f"exit codes {', '.join(map(str, codes))}" if codes else "the workload failed"
    )
    return FailureCause(
        kind="Application",
        reason=reason[:128],
        message=message[:MAX_FAILURE_MESSAGE],
        nodes=tuple(sorted({n for p in pod_list if (n := _node(p))}))[:MAX_FAILURE_ITEMS],
        exit_codes=tuple(codes),
    )


def suspicions(
    *,
    pods: Iterable[Mapping[str, Any]],
    nodes: Mapping[str, NodeHealth],
    gpus_seen: Mapping[str, int],
    now: float,
    grace_s: float,
    gpus_dropped_since: Mapping[str, float] | None = None,
) -> tuple[Suspicion, ...]:
    """The not-Ready nodes and GPU drops under the job's unfinished pods that are not (yet)
    causes for :func:`classify_failure` with the same arguments: within ``grace_s`` of their
    "since" time. Sorted by node; empty when ``grace_s`` is 0. A "since" in the future counts
    from ``now``."""
    if grace_s <= 0:
        return ()
    pod_list = list(pods)
    _lost, not_ready, dropped = _node_trouble(pod_list, nodes, gpus_seen)
    timing = _Timing(now, grace_s, _deleting_on(pod_list))
    since_gpus = gpus_dropped_since or {}
    out: list[Suspicion] = []
    for node, reason, since, what in [
        *((n, NODE_NOT_READY, nodes[n].not_ready_since, "is not Ready") for n in not_ready),
        *(
            (
                n,
                GPU_UNAVAILABLE,
                since_gpus.get(n),
                f"offers {nodes[n].gpus} of {gpus_seen[n]} GPUs",
            )
            for n in dropped
        ),
    ]:
        if since is None or timing.due(node, since):
            continue
        start = min(since, now)
        out.append(
            Suspicion(
                node=node,
                reason=reason,
                since=start,
                deadline=start + grace_s,
                message=(
                    f"node {node} {what} since {_rfc3339(start)}; an infrastructure failure "
                    f"at {_rfc3339(start + grace_s)} unless it recovers"
                ),
            )
        )
    return tuple(sorted(out, key=lambda s: (s.node, s.reason)))


def suspicion_conditions(suspected: Iterable[Suspicion]) -> list[Condition]:
    """The job's conditions for its suspicions: one per reason (``NodeNotReady``,
    ``GPUUnavailable``), True since the earliest, its message naming each node (at most 8),
    since when and the deadline. Shown at once, while the grace period runs; gone when the
    nodes recover."""
    by_reason: dict[str, list[Suspicion]] = {}
    for s in suspected:
        by_reason.setdefault(s.reason, []).append(s)
    out = []
    for reason, items in sorted(by_reason.items()):
        items.sort(key=lambda s: (s.since, s.node))
        shown = "; ".join(s.message for s in items[:8])
        more = f"; and {len(items) - 8} more nodes" if len(items) > 8 else ""
        out.append(
            Condition(
                type=reason,
                status="True",
                reason=reason,
                message=(shown + more)[:1024],
                last_transition_time=_rfc3339(items[0].since),
            )
        )
    return out


def with_declared_exit_codes(cause: FailureCause, declared: Iterable[int]) -> FailureCause:
    """``cause`` as an infrastructure failure (reason ``InfrastructureExitCode``) when it is an
    application failure whose non-zero exit codes are all in ``declared`` (the job's
    ``spec.placement.retry.infrastructureExitCodes``, e.g. an NCCL or XID crash wrapper's
    code); otherwise ``cause`` unchanged. A failure with no exit code is never promoted."""
    codes = set(declared)
    if cause.kind != "Application" or not cause.exit_codes or not codes:
        return cause
    if not set(cause.exit_codes) <= codes:
        return cause
    return cause.model_copy(
        update={
            "kind": "Infrastructure",
            "reason": INFRASTRUCTURE_EXIT_CODE,
            "message": (
                f"exit codes {', '.join(map(str, cause.exit_codes))} are declared as "
                f"infrastructure failures (spec.placement.retry.infrastructureExitCodes)"
            ),
        }
    )


def exit_codes(pods: Iterable[Mapping[str, Any]]) -> list[int]:
    """Non-zero exit codes of the pods' terminated containers (``state.terminated``, else
    ``lastState.terminated``), init containers included, in pod order."""
    codes: list[int] = []
    for pod in pods:
        status = _status(pod)
        for cs in [
            *(status.get("initContainerStatuses") or []),
            *(status.get("containerStatuses") or []),
        ]:
            if not isinstance(cs, Mapping):
                continue
            for where in ("state", "lastState"):
                term = (cs.get(where) or {}).get("terminated")
                if not isinstance(term, Mapping):
                    continue
                code = term.get("exitCode")
                if isinstance(code, int) and not isinstance(code, bool) and code != 0:
                    codes.append(code)
                break  # the latest termination decides
    return codes


def _node_trouble(
    pod_list: list[Mapping[str, Any]], nodes: Mapping[str, NodeHealth], seen: Mapping[str, int]
) -> tuple[list[str], list[str], list[str]]:
    """The nodes under the job's unfinished pods that are gone, not Ready, or offer fewer
    GPUs than while the job ran there (each sorted; a node in at most one, in that order)."""
    bound = sorted(
        {n for p in pod_list if (n := _node(p)) and _status(p).get("phase") not in _FINISHED}
    )
    lost = sorted({n for n in bound if n not in nodes} | _pinned_to_gone(pod_list, nodes))
    not_ready = [n for n in bound if n in nodes and not nodes[n].ready]
    dropped = [n for n in bound if n in nodes and nodes[n].ready and nodes[n].gpus < seen.get(n, 0)]
    return lost, not_ready, dropped


def lost_with_its_pods(
    failed: Condition | None, pinned: Iterable[str], nodes: Mapping[str, NodeHealth]
) -> list[str]:
    """Rule 4a: the pinned nodes (sorted) that no longer exist in ``nodes`` when the
    workload's ``Failed`` condition ``failed`` allows a lost pod (:data:`LOST_POD_REASONS`);
    empty otherwise. The caller has checked that no pod of the copy is left.

    Why this rule: once the pods are gone, the member keeps no evidence of *why* the pod
    failed (no exit code, no ``DisruptionTarget``), nor when the node left (a deleted Node
    leaves no record; its pods, finished ones too, are collected by the pod garbage
    collector). The two stories it cannot tell apart -- the node deleted under the running
    pod, or the pod failing on its own and its node deleted later -- both happened while no
    agent watched: an agent that watched saw the pod's exit code or ``DisruptionTarget`` and
    its cause sticks (:mod:`gpufed.agent.status_trouble`), and a hub that got an
    ``Application`` failure keeps the job Failed (terminal is final). In that window the
    infrastructure reading is chosen because its error is bounded: one more run from the
    checkpoint, charged to the job's re-run budget (``spec.placement.retry``
    .onInfrastructureFailure) with the hub's backoff, on another node, where a failure of its
    own is seen with its exit code; the other error loses a job for good to a node deletion.
    A reason that names the job's own doing (``DeadlineExceeded``, a pod failure policy
    matching an exit code, a reason not in the list) is never read as a lost pod.
    """
    if failed is None or failed.reason not in LOST_POD_REASONS:
        return []
    if failed.reason == "PodFailurePolicy" and DISRUPTION_TARGET not in (failed.message or ""):
        return []
    return sorted({n for n in pinned if n and n not in nodes})


def _pinned_to_gone(pod_list: list[Mapping[str, Any]], nodes: Mapping[str, NodeHealth]) -> set[str]:
    """Nodes that unbound pods of the job are pinned to (:func:`pinned_nodes`) and that no
    longer exist: after a node is deleted, the pod garbage collector removes the pods bound to
    it and the workload's controller creates new ones, pinned to the gone node, so they wait
    forever. An agent that restarted after the old pods were gone sees only these. A pod counts
    when none of the nodes it may go to exists."""
    out: set[str] = set()
    for pod in pod_list:
        pinned = pinned_nodes(pod)
        if pinned and not (pinned & set(nodes)):
            out |= pinned
    return out


def _deleting_on(pod_list: list[Mapping[str, Any]]) -> frozenset[str]:
    """Nodes where an unfinished pod of the job is being deleted: the member gave up on it."""
    return frozenset(
        n
        for p in pod_list
        if (n := _node(p))
        and _meta(p).get("deletionTimestamp")
        and _status(p).get("phase") not in _FINISHED
    )


@dataclass(frozen=True, slots=True)
class _Timing:
    now: float | None
    grace_s: float
    deleting: frozenset[str]

    def due(self, node: str, since: float | None) -> bool:
        """Whether trouble on ``node`` that began at ``since`` is a cause now."""
        if self.grace_s <= 0 or self.now is None or since is None or node in self.deleting:
            return True
        return self.now - since >= self.grace_s

    def how_long(self, since: float | None) -> str:
        if self.grace_s <= 0 or self.now is None or since is None:
            return ""
        return f" for {self.now - since:.0f} s (grace {self.grace_s:.0f} s)"


def _rfc3339(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _cause(kind: str, reason: str, messages: list[str], nodes: Iterable[str]) -> FailureCause:
    return FailureCause(
        kind="Infrastructure" if kind == "Infrastructure" else "Application",
        reason=reason[:128],
        message="; ".join(messages)[:MAX_FAILURE_MESSAGE],
        nodes=tuple(sorted({n for n in nodes if n}))[:MAX_FAILURE_ITEMS],
    )


def _pod_condition(pod: Mapping[str, Any], ctype: str) -> Mapping[str, Any] | None:
    for c in _status(pod).get("conditions") or []:
        if isinstance(c, Mapping) and c.get("type") == ctype:
            return c
    return None


def _node(pod: Mapping[str, Any]) -> str:
    return str((pod.get("spec") or {}).get("nodeName") or "")


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def _status(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("status") or {}
