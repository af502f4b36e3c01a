"""Node trouble under one tracked job: its suspicions and its sticky failure cause.

Owns, for :class:`gpufed.agent.status.StatusReporter`, what the agent remembers of the nodes
under one member copy (:class:`NodeTrouble`) and the verdict over it (:func:`failure_of`, the
pure rules of :mod:`gpufed.sync.failure` fed with the inventory's view of the nodes and the
times this job first saw each trouble). A not-Ready node or a GPU drop under a running job is
first a suspicion, for the job's grace period (``spec.placement.retry.nodeNotReadySeconds``;
default 300 s, as Kubernetes' own not-ready tolerations), timed with the wall clock: since the
Ready condition's ``lastTransitionTime`` (else since the agent first saw it), since the agent
first saw the GPU drop. While it lasts, the status carries it as a pod issue
(:func:`suspicion_issues`, reason ``NodeNotReady`` or ``GPUUnavailable``) and a job condition;
the reporter re-summarises the job when the grace period ends (``recheck_at``), and only then,
if the trouble persists, does it get a failure cause, which sticks (pods of a broken gang are
deleted and replaced afterwards; the cause must not vanish with them). A node that recovers
in time leaves nothing behind.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import structlog

from gpufed.api.work import FailureCause, PodIssue, WorkloadStatus
from gpufed.sync.failure import (
    DEFAULT_NODE_GRACE_S,
    NodeHealth,
    Suspicion,
    classify_failure,
    suspicions,
)
from gpufed.sync.pins import Pins, pinned_nodes

log = structlog.get_logger("gpufed.agent.status")


@dataclass
class NodeTrouble:
    """What one tracked copy suffered. ``grace_s``: the job's ``nodeNotReadySeconds``;
    ``failure``: the first cause observed (sticky); ``gpus_seen``: node -> most whole GPUs it
    offered while an unfinished pod of the job was bound there; ``not_ready_seen`` /
    ``gpus_dropped_since``: node -> wall time this job first saw it not Ready (used when its
    Ready condition has no ``lastTransitionTime``) / offering fewer GPUs than ``gpus_seen``,
    dropped when it recovers; ``suspected``: the suspicions as last classified;
    ``recheck_at``: wall time the earliest suspicion's grace period ends."""

    grace_s: float = DEFAULT_NODE_GRACE_S
    failure: FailureCause | None = None
    gpus_seen: dict[str, int] = field(default_factory=dict)
    not_ready_seen: dict[str, float] = field(default_factory=dict)
    gpus_dropped_since: dict[str, float] = field(default_factory=dict)
    suspected: tuple[Suspicion, ...] = ()
    recheck_at: float | None = None

    def carried(self, grace_s: float) -> NodeTrouble:
        """The same copy tracked again (a new revision, or found gone after it finished): what
        it suffered still holds; the suspicions are classified afresh."""
        return NodeTrouble(
            grace_s=grace_s,
            failure=self.failure,
            gpus_seen=self.gpus_seen,
            not_ready_seen=self.not_ready_seen,
            gpus_dropped_since=self.gpus_dropped_since,
        )


def failure_of(
    uid: str,
    trouble: NodeTrouble,
    status: WorkloadStatus,
    pods: Iterable[dict[str, Any]],
    node_health: Callable[[str], NodeHealth | None] | None,
    wall: Callable[[], float],
    pins: Pins | None = None,
    node_of_hostname: Callable[[str], str | None] | None = None,
) -> FailureCause | None:
    """The job's failure cause (sticky once observed), classified over its ``pods`` and the
    inventory's view of their nodes (``node_health``: None when unknown, rules 2, 3 and 4a of
    :mod:`gpufed.sync.failure` are then skipped), timed by the wall clock ``wall`` (seconds
    since the epoch). ``pins``: where the copy's main object pins its pods
    (:func:`gpufed.sync.pins.template_pins`); a failed copy with no pod left and a pinned
    node gone is ``NodeLost`` (rule 4a). Its hostnames are nodes through ``node_of_hostname``
    (the inventory's node carrying that ``kubernetes.io/hostname``; None: no such node, gone);
    without it only the pinned names count. Updates ``trouble``: the cause, the GPUs seen, the
    suspicions and ``recheck_at``."""
    before, trouble.suspected, trouble.recheck_at = trouble.suspected, (), None
    if trouble.failure is not None or status.phase == "Succeeded":
        return trouble.failure
    now = wall()
    pod_list = list(pods)
    nodes: dict[str, NodeHealth] | None = None
    pinned: frozenset[str] = frozenset()
    unfinished: set[str] = set()
    if node_health is not None:
        nodes = {}
        for p in pod_list:
            node = str((p.get("spec") or {}).get("nodeName") or "")
            if not node:
                continue
            if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
                unfinished.add(node)
            health = node_health(node)
            if health is not None:
                nodes[node] = _timed(trouble, node, health, now)
        pinned = _template_nodes(status, pod_list, pins, node_of_hostname)
        # the nodes a replacement pod, or the failed copy's own template, is pinned to (gone
        # ones make it NodeLost)
        for node in sorted({*pinned, *(n for p in pod_list for n in pinned_nodes(p))}):
            health = node_health(node)
            if health is not None and node not in nodes:
                nodes[node] = _timed(trouble, node, health, now)
    cause = classify_failure(
        phase=status.phase,
        conditions=status.conditions,
        pods=pod_list,
        nodes=nodes,
        gpus_seen=trouble.gpus_seen,
        now=now,
        grace_s=trouble.grace_s,
        gpus_dropped_since=trouble.gpus_dropped_since,
        pinned=pinned,
    )
    if nodes is not None:  # after classifying: a drop is measured against the past
        for node in unfinished & set(nodes):
            trouble.gpus_seen[node] = max(trouble.gpus_seen.get(node, 0), nodes[node].gpus)
        if cause is None:
            trouble.suspected = suspicions(
                pods=pod_list,
                nodes=nodes,
                gpus_seen=trouble.gpus_seen,
                now=now,
                grace_s=trouble.grace_s,
                gpus_dropped_since=trouble.gpus_dropped_since,
            )
            if trouble.suspected:
                trouble.recheck_at = min(s.deadline for s in trouble.suspected)
                _log_suspicions(uid, trouble.suspected, before)
    if cause is not None:
        trouble.failure = cause
        log.warning(
            "status.failure_classified",
            job_uid=uid,
            kind=cause.kind,
            reason=cause.reason,
            nodes=list(cause.nodes),
        )
    return cause


def _template_nodes(
    status: WorkloadStatus,
    pod_list: list[dict[str, Any]],
    pins: Pins | None,
    node_of_hostname: Callable[[str], str | None] | None,
) -> frozenset[str]:
    """The node names the copy's template pins it to, read only when rule 4a can apply (the
    copy Failed, no pod left): a pinned hostname no node carries counts as a gone node of
    that name."""
    if pins is None or status.phase != "Failed" or pod_list:
        return frozenset()
    names = set(pins.names)
    if node_of_hostname is not None:
        names |= {node_of_hostname(h) or h for h in pins.hostnames}
    return frozenset(names)


def _timed(trouble: NodeTrouble, node: str, health: NodeHealth, now: float) -> NodeHealth:
    """``health`` with the "since" times classification needs: a not-Ready node without
    a Ready ``lastTransitionTime`` counts from when this job first saw it so; a GPU drop
    (fewer GPUs than while the job ran there) from when this job first saw it. Both are
    forgotten when the node recovers."""
    if health.ready:
        trouble.not_ready_seen.pop(node, None)
    else:
        first = trouble.not_ready_seen.setdefault(node, now)
        if health.not_ready_since is None:
            health = replace(health, not_ready_since=first)
    if health.ready and health.gpus < trouble.gpus_seen.get(node, 0):
        trouble.gpus_dropped_since.setdefault(node, now)
    else:
        trouble.gpus_dropped_since.pop(node, None)
    return health


def _log_suspicions(
    uid: str, suspected: tuple[Suspicion, ...], before: tuple[Suspicion, ...]
) -> None:
    """One ``status.node_suspected`` line per new suspicion (not per re-summary)."""
    known = {(s.node, s.reason, s.since) for s in before}
    for s in suspected:
        if (s.node, s.reason, s.since) in known:
            continue
        log.info(
            "status.node_suspected",
            job_uid=uid,
            node=s.node,
            reason=s.reason,
            since=s.since,
            deadline=s.deadline,
        )


def suspicion_issues(
    suspected: tuple[Suspicion, ...], pods: Iterable[dict[str, Any]]
) -> list[PodIssue]:
    """One pod issue per suspicion, on the first pod (by name) bound to its node."""
    on: dict[str, str] = {}
    for p in sorted(pods, key=lambda p: str((p.get("metadata") or {}).get("name") or "")):
        node = str((p.get("spec") or {}).get("nodeName") or "")
        on.setdefault(node, str((p.get("metadata") or {}).get("name") or ""))
    return [PodIssue(pod=on.get(s.node, ""), reason=s.reason, message=s.message) for s in suspected]
