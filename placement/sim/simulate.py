"""Trace-driven simulator behind ``gpufed simulate``: the same ``place()`` in simulated time.

Replays a job trace (docs/design.md §6) against a fleet spec (docs/design.md §5) until every job has
finished, or until the horizon (default: 30 simulated days after the last arrival). Policies:

* ``gpufed``: the hub's loop: one queue in :func:`~gpufed.placement.queue.pass_key` order,
  :func:`~gpufed.placement.queue.schedule_pass` with the backfill rule after every event,
  ``place()`` choosing member and nodes, a reservation per placed job (released when it ends).
  A job is only ever sent where it starts at once.
* ``cluster-sum`` and ``round-robin``: what federation layers that see only per-cluster GPU sums
  do, blind to topology and fragmentation (:mod:`.simbaselines`). A job is dispatched on
  arrival to one member among those with at least one node shaped to hold one of its pods:
  the one with the most free GPUs summed (``cluster-sum``) or the next in turn
  (``round-robin``). Inside the member it waits in a FIFO queue; after every event each member
  starts, in order, every queued job whose pods all find nodes with room at once (gang; no
  head-of-line blocking), pods taking nodes the way kube-scheduler's default
  ``LeastAllocated`` scoring does: most free GPUs first (``member_fit="spread"``; ``"pack"``
  takes the fullest first).
* ``first-admit`` (MultiKueue with topology-aware workers): one global queue in arrival order,
  best effort, each job to the first member in fleet-file order whose own ``place()`` fits it
  now (:mod:`.simfirstadmit`), placement without TopologyCost and the clique tier
  (``Policy.without_topology_cost``: the baseline as it was before issue 29).

Trace defaults when a column is absent (docs/placement.md, "Simulator"): ``gpus_per_pod =
min(gpus, 8)``; ``topology`` ``required`` for a one-pod job, ``preferred`` otherwise; any GPU
product; priority 0. Pods request GPUs only (traces carry no CPU or memory).

Metrics (:class:`SimResult`): waits over started jobs; ``unstarted``: jobs never started by the
horizon (including any no member could ever hold); ``stranded``: jobs sent to a member that could
not start them at that moment; ``gpu_utilization``: GPU-seconds run between the first and the
last arrival / (fleet GPUs x that window); ``nvlink_required_single_domain``: fraction
of NVLink-Required jobs of several pods whose pods all ran in one NVLink domain.

The state every policy reads and changes (jobs' runs, events, the result) is :mod:`.simstate`.

Pure apart from reading files (:func:`read_trace`, :func:`fleet_members`); the CLI measures
``runtime_s``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from gpufed.api.decision import Decision, Outcome
from gpufed.api.fleet import FleetSpec, NodeSpec, node_specs
from gpufed.api.fleetnodes import dra_group
from gpufed.api.inventory import (
    ClusterInventory,
    MemberClusterState,
    NodeInventory,
    node_from_labels,
)
from gpufed.api.labels import GPU_RESOURCE
from gpufed.api.queue import GPUQueue
from gpufed.api.request import PlacementRequest
from gpufed.api.resources import resource_list
from gpufed.placement.backfill import expected_start
from gpufed.placement.engine import place
from gpufed.placement.fairshare import DEFAULT_HALF_LIFE_S
from gpufed.placement.holds import hold_for, whole_free_nodes
from gpufed.placement.policy import Policy
from gpufed.placement.queue import BackfillRule, Hold, gpu_pods_of, pass_key, schedule_pass
from gpufed.placement.shape import JobShape
from gpufed.placement.sim.simbaselines import run_baseline
from gpufed.placement.sim.simdrain import spare_draining
from gpufed.placement.sim.simfail import SimFailures
from gpufed.placement.sim.simfirstadmit import run_first_admit
from gpufed.placement.sim.simidle import IdleMeter
from gpufed.placement.sim.simpreempt import SimPreemption, preempt_after_pass
from gpufed.placement.sim.simquota import QueueSim
from gpufed.placement.sim.simstate import SimResult, _drain, _Run, _Sim, request_of
from gpufed.placement.sim.timelimits import SCATTER_SLOWDOWN
from gpufed.placement.sim.trace import TraceError, TraceJob, read_trace
from gpufed.placement.snapshot import FleetSnapshot

__all__ = [
    "HORIZON_AFTER_LAST_ARRIVAL_S",
    "POLICIES",
    "SimResult",
    "TraceError",
    "TraceJob",
    "fleet_members",
    "load_fleet",
    "node_inventory",
    "read_trace",
    "request_of",
    "simulate",
]  # SimResult, request_of: .simstate; the trace format's home is .trace


POLICIES = ("gpufed", "cluster-sum", "round-robin", "first-admit")
PolicyName = Literal["gpufed", "cluster-sum", "round-robin", "first-admit"]
HORIZON_AFTER_LAST_ARRIVAL_S = 30 * 86400.0


def node_inventory(spec: NodeSpec) -> NodeInventory:
    """An idle node of a fleet spec as the agent would report it (nothing requested; the GPUs
    of a ``dra: true`` pool as the agent reads the sandbox's simulated driver's slices)."""
    allocatable = resource_list(spec.allocatable, field=f"node {spec.name} allocatable")
    group = dra_group(spec)
    if group is not None:
        allocatable[GPU_RESOURCE] = group.count
    return node_from_labels(
        spec.name,
        spec.labels,
        taints=spec.taints,
        allocatable=allocatable,
        dra_gpus=(group,) if group is not None else (),
    )


def fleet_members(fleet: FleetSpec) -> list[MemberClusterState]:
    """Every member of a fleet spec, idle and Ready, as placement's input."""
    return [
        MemberClusterState(
            name=c.name,
            labels=dict(c.labels),
            inventory=ClusterInventory(
                cluster=c.name, nodes=tuple(node_inventory(n) for n in node_specs(c))
            ),
        )
        for c in fleet.clusters
    ]


def load_fleet(path: str | Path) -> list[MemberClusterState]:
    """:func:`fleet_members` of the fleet file at ``path`` (``FleetSpec.load``)."""
    return fleet_members(FleetSpec.load(path))


def simulate(
    members: list[MemberClusterState],
    jobs: list[TraceJob],
    policy: PolicyName = "gpufed",
    *,
    horizon_s: float = HORIZON_AFTER_LAST_ARRIVAL_S,
    member_fit: Literal["spread", "pack"] = "spread",
    placement_policy: Policy | None = None,
    backfill: BackfillRule | None = None,
    queues: Sequence[GPUQueue] | None = None,
    quota_mode: Literal["enforce", "none"] = "enforce",
    half_life_s: float = DEFAULT_HALF_LIFE_S,
    preemption: SimPreemption | None = None,
    failures: SimFailures | None = None,
    scatter_slowdown: float = SCATTER_SLOWDOWN,
    progress: Callable[[int, int, float], None] | None = None,
    idle: bool = False,
) -> SimResult:
    """Replay ``jobs`` on ``members`` under ``policy``; see the module docstring.

    ``horizon_s``: the run stops this many simulated seconds after the last arrival (default 30
    days). ``queues``: GPUQueues (policy ``gpufed`` only): with ``quota_mode`` ``enforce`` jobs
    are admitted by quota and ordered by fair share (decayed usage, ``half_life_s``), with
    ``none`` only accounted (:mod:`.simquota`). Raises ``ValueError`` for an unknown policy or
    quota mode, queues with a baseline policy, and broken queues (naming each).
    ``preemption``: None (the JSON keys stay as before), or on/off with its victim rule
    (:class:`~gpufed.placement.sim.simpreempt.SimPreemption`; policy ``gpufed`` only): waiting jobs
    preempt after each pass, victims return to the queue and redo their lost work; the JSON
    adds ``preemptions``, ``gpu_hours_lost``, ``wait_p95_s_by_priority``. ``failures``: node
    failures and re-runs (:class:`~gpufed.placement.sim.simfail.SimFailures`; policy ``gpufed``
    only); the JSON adds ``node_failures``, ``retry``, ``goodput``, ``restarts``,
    ``failed_infra``, ``gpu_hours_lost_failures``. ``progress(arrived, total, now_s)``, when
    given, is called after each batch of simultaneous events (jobs arrived so far, jobs in the
    trace, simulated seconds); it decides itself how often to report. ``idle``: also measure
    why GPUs stood idle (``SimResult.idle``, :mod:`.simidle`; one pass over the fleet's nodes
    after every batch of events, so off by default).
    """
    if policy not in POLICIES:
        raise ValueError(f"policy: {policy!r} is not one of {', '.join(POLICIES)}")
    if quota_mode not in ("enforce", "none"):
        raise ValueError(f"quota_mode: {quota_mode!r} is not enforce or none")
    if queues and policy != "gpufed":
        raise ValueError(f"queues: only the gpufed policy admits by queue, not {policy}")
    if preemption is not None and preemption.on and policy != "gpufed":
        raise ValueError(f"preemption: only the gpufed policy preempts, not {policy}")
    if failures is not None and policy != "gpufed":
        raise ValueError(f"node failures: only the gpufed policy re-runs jobs, not {policy}")
    if not (math.isfinite(scatter_slowdown) and scatter_slowdown >= 1):
        raise ValueError(f"scatter_slowdown: {scatter_slowdown!r} must be a number >= 1")
    sim = _Sim(members, jobs)
    sim.scatter_slowdown = scatter_slowdown
    sim.progress = progress
    capacity = sim.capacity()
    if failures is not None and jobs:
        failures.first(sim, min(j.submit_s for j in jobs))
    last_arrival = max((j.submit_s for j in jobs), default=0.0)
    horizon = last_arrival + horizon_s
    if idle:
        first = min((j.submit_s for j in jobs), default=0.0)
        sim.idle = IdleMeter(first, last_arrival if last_arrival > first else None)
    qs = QueueSim.of(queues, quota_mode == "enforce", half_life_s) if queues else None
    if policy == "gpufed":
        pre = preemption if preemption is not None and preemption.on else None
        rule = backfill or BackfillRule()
        _run_gpufed(sim, horizon, placement_policy or Policy(), rule, qs, pre, failures)
    elif policy == "first-admit":
        order = [m.name for m in members]
        base = (placement_policy or Policy()).without_topology_cost()
        run_first_admit(sim, _drain(sim, horizon), base, order)
    else:
        run_baseline(sim, horizon, policy, member_fit)
    result = sim.result(policy, horizon)
    result.capacity = capacity
    result.intervals = sim.intervals(
        horizon,
        (lambda r: qs.queue(r.request)) if qs is not None else (lambda r: r.request.queue or ""),
    )
    if preemption is not None:
        result.preemption_metrics = {
            **preemption.metrics(),
            "wait_p95_s_by_priority": sim.by_priority(),
        }
    if qs is not None:
        result.queue_metrics = qs.metrics(sim.per_queue(qs, result.extra["end_s"]))
    if failures is not None:
        result.failure_metrics = failures.metrics(sim, horizon)
    return result


def _spare(
    sim: _Sim, snapshot: FleetSnapshot, now: float, rule: BackfillRule
) -> Callable[[PlacementRequest], Mapping[str, Hold]] | None:
    """``schedule_pass``'s ``spare`` for one pass: the whole free nodes
    (``spare_whole_nodes_s``), with ``spare_draining_s`` also the nodes about to drain
    (:func:`~gpufed.placement.sim.simdrain.spare_draining`); None when off."""
    if rule.spare_whole_nodes_s <= 0:
        return None
    whole = whole_free_nodes(snapshot)
    if rule.spare_draining_s <= 0:
        return whole
    return spare_draining(sim, snapshot, now, rule.spare_draining_s, whole)


def _run_gpufed(
    sim: _Sim,
    horizon: float,
    policy: Policy,
    rule: BackfillRule,
    qs: QueueSim | None = None,
    pre: SimPreemption | None = None,
    fails: SimFailures | None = None,
) -> None:
    pending: dict[str, _Run] = {}
    snapshot = sim.snapshot
    now = 0.0
    gate = qs.gate if qs is not None else None

    def attempt(req: PlacementRequest, hold: Mapping[str, Hold]) -> Decision:
        quota = gate.for_request(req) if gate is not None else None
        d = place(req, snapshot, policy, now, hold=hold, quota=quota)
        if d.outcome == Outcome.PLACED:
            starts.clear()
            sim.start(pending.pop(req.uid), d, now)
            if qs is not None:
                qs.start(req, d.gpu_product)
        elif d.outcome == Outcome.REJECTED:
            pending.pop(req.uid, None)  # no member could ever hold it: never started
            if qs is not None:
                qs.drop(req)
        return d

    starts: dict[tuple[str, str, int], float | None] = {}  # this pass's, until a placement

    def node_start(cluster: str, node: str, gpus: int) -> float | None:
        key = (cluster, node, gpus)
        if key not in starts:
            one = Hold(cluster, frozenset({node}), "")
            starts[key] = expected_start(now, gpus, *sim.releases(one, now, rule.start_accuracy))
        return starts[key]

    start_on = node_start if rule.hold_nodes != "most-free" else None
    multi_only = rule.hold_nodes in ("earliest-drain-multi", "earliest-drain-multi-free")
    free_first = rule.hold_nodes == "earliest-drain-multi-free"

    def holds(req: PlacementRequest) -> Hold | None:
        return avoiding(req, None)

    def avoiding(req: PlacementRequest, held: Mapping[str, Hold] | None) -> Hold | None:
        # a job its quota blocks holds no nodes it cannot use: others drain them meanwhile
        quota = gate.for_request(req) if gate is not None else None
        by_drain = start_on if not multi_only or JobShape.of(req).gpu_pods > 1 else None
        return hold_for(
            req,
            snapshot,
            policy,
            quota,
            avoid=held,
            start_on=by_drain,
            free_first=free_first,
            now=now,
            busy=rule.hold_busy_nodes,
            busy_start_on=node_start if rule.hold_busy_by_drain else None,
            keep=kept.get(req.uid),
        )

    def hold_start(req: PlacementRequest, hold: Hold) -> float | None:
        return sim.hold_start(req, hold, now, rule.start_accuracy)

    def hold_idle(req: PlacementRequest, hold: Hold) -> float | None:
        return sim.hold_idle(req, hold, now, rule.start_accuracy)

    def key_of(req: PlacementRequest) -> Any:
        key = sim.by_uid[req.uid].key
        return (req.queue, key) if gate is not None and gate.enforce else key

    carried: list[tuple[PlacementRequest, Hold]] = []  # the last pass's holds (carry_holds)
    kept: dict[str, Hold] = {}  # one-pod holder UID -> its last pass's hold (hold_keep_one_node)
    for now, finished, arrived, node_events in _drain(sim, horizon):
        if qs is not None:
            qs.sample_until(now)
        for uid in finished:
            if sim.by_uid[uid].end != now:
                continue  # the run was preempted: its finish is void
            sim.live.pop(uid, None)
            snapshot.release(uid)
            if qs is not None:
                qs.finish(sim.by_uid[uid].request)
        for uid in arrived:
            pending[uid] = sim.by_uid[uid]
            if qs is not None:
                qs.arrive(sim.by_uid[uid].request)
        if fails is not None:
            for kind, uid in node_events:
                fails.handle(sim, kind, uid, now, pending, qs)
        if not pending:
            sim.observe_idle(now, ())
            continue
        starts.clear()
        requests = (r.request for r in pending.values())
        within = pass_key(now, rule)
        queue = qs.order(now, requests, within) if qs is not None else sorted(requests, key=within)
        result = schedule_pass(
            queue,
            now,
            attempt,
            holds,
            rule,
            presorted=True,
            record_skipped=False,
            key_of=key_of,
            hold_start=hold_start if rule.backfill_by_limit else None,
            hold_avoiding=avoiding if rule.holds_per_shape > 1 else None,
            carry=carried,
            spare=_spare(sim, snapshot, now, rule),
            hold_rank=hold_idle if rule.hold_choice == "least-idle" else None,
        )
        carried = result.taken
        if rule.hold_keep_one_node:
            kept = {r.uid: h for r, h in result.taken if gpu_pods_of(r) == 1}
        for uid, borrowed in result.backfilled.items():
            run = sim.by_uid[uid]
            if run.backfill is None:
                run.backfill = borrowed.reason
        if pre is not None and pending:
            preempt_after_pass(sim, pending, now, policy, qs, pre)
        sim.observe_idle(now, pending.values(), result.holds)
        if qs is not None:
            qs.after_pass()
