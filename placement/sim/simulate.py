"""Trace-driven simulator behind ``gpufed simulate``: the same ``place()`` in simulated time.

Replays a job trace (docs/design.md §6) against a fleet spec (docs/design.md §5) until every job has
finished, or until the horizon (default: 30 simulated days after the last arrival). Policies:

* ``gpufed``: the hub's loop: one queue in :func:`~gpufed.placement.queue.pass_key` order,
  :func:`~gpufed.placement.queue.schedule_pass` with the backfill rule after every event,
  ``place()`` choosing member and nodes, a reservation per placed job (released when it ends).
  A job is only ever sent where it starts at once.
* ``cluster-sum`` and ``round-robin``: what federation layers that see only per-cluster GPU sums
  do, blind to topology and fragmentation. A job is dispatched on arrival to one member among
  those with at least one node shaped to hold one of its pods: the one with the most free GPUs
  summed (``cluster-sum``) or the next in turn (``round-robin``). Inside the member it waits in
  a FIFO queue; after every event each member starts, in order, every queued job whose pods all
  find nodes with room at once (gang; no head-of-line blocking), pods taking nodes the way
  kube-scheduler's default ``LeastAllocated`` scoring does: most free GPUs first
  (``member_fit="spread"``; ``"pack"`` takes the fullest first).
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

Pure apart from reading files (:func:`read_trace`, :func:`fleet_members`); the CLI measures
``runtime_s``.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from gpufed.api.decision import Decision, Outcome, PodSetAssignment
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
from gpufed.api.request import PlacementRequest, PodSet, TopologyRequest
from gpufed.api.resources import resource_list
from gpufed.placement.backfill import expected_start
from gpufed.placement.engine import place
from gpufed.placement.fairshare import DEFAULT_HALF_LIFE_S
from gpufed.placement.fit import fill
from gpufed.placement.holds import hold_for
from gpufed.placement.index import NodeState, PoolState
from gpufed.placement.policy import Policy
from gpufed.placement.preemption import PreemptionEvent
from gpufed.placement.queue import BackfillRule, Hold, fit_key, gpus_of, pass_key, schedule_pass
from gpufed.placement.quota import demand_of
from gpufed.placement.shape import JobShape
from gpufed.placement.sim.simfail import SimFailures
from gpufed.placement.sim.simfirstadmit import run_first_admit
from gpufed.placement.sim.simpreempt import SimPreemption, preempt_after_pass
from gpufed.placement.sim.simquota import QueueSim
from gpufed.placement.sim.simreport import JobRecord, RunInterval, topology_class
from gpufed.placement.sim.timelimits import SCATTER_SLOWDOWN
from gpufed.placement.sim.trace import TraceError, TraceJob, read_trace
from gpufed.placement.snapshot import FleetSnapshot

__all__ = ["TraceError", "TraceJob", "read_trace"]  # re-exported: the trace format's home is .trace

POLICIES = ("gpufed", "cluster-sum", "round-robin", "first-admit")
PolicyName = Literal["gpufed", "cluster-sum", "round-robin", "first-admit"]
HORIZON_AFTER_LAST_ARRIVAL_S = 30 * 86400.0
_NEVER = math.inf


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


@dataclass
class SimResult:
    """The simulator's answer (``--json`` prints :meth:`as_json` on one line)."""

    policy: str
    jobs: int
    placed: int
    unstarted: int
    wait_mean_s: float
    wait_p50_s: float
    wait_p95_s: float
    gpu_utilization: float
    nvlink_required_single_domain: float
    stranded: int
    runtime_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)
    #: the keys ``--queues`` adds (:meth:`.simquota.QueueSim.metrics`), after the others
    queue_metrics: dict[str, Any] | None = None
    #: the keys ``--preemption`` adds (:meth:`.simpreempt.SimPreemption.metrics`)
    preemption_metrics: dict[str, Any] | None = None
    #: the keys ``--node-failure-interval-s`` adds (:meth:`.simfail.SimFailures.metrics`), last
    failure_metrics: dict[str, Any] | None = None
    #: the key ``--check-invariants`` adds (``invariant_violations``; :mod:`.siminvariants`)
    check_metrics: dict[str, Any] | None = None
    #: one per trace job, in trace order (not in the JSON line; :mod:`.simreport`)
    records: list[JobRecord] = field(default_factory=list)
    #: every run of every job, per quota key, in trace order (``--intervals-out``)
    intervals: list[RunInterval] = field(default_factory=list)
    #: (member, GPU product) -> whole GPUs of the fleet at the start (the member check of
    #: :mod:`.siminvariants`)
    capacity: dict[tuple[str, str], int] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        """The JSON object of docs/placement.md ("Simulator"): fixed keys in a fixed order."""
        return {
            "policy": self.policy,
            "jobs": self.jobs,
            "placed": self.placed,
            "unstarted": self.unstarted,
            "wait_mean_s": round(self.wait_mean_s, 1),
            "wait_p50_s": round(self.wait_p50_s, 1),
            "wait_p95_s": round(self.wait_p95_s, 1),
            "gpu_utilization": round(self.gpu_utilization, 4),
            "nvlink_required_single_domain": round(self.nvlink_required_single_domain, 4),
            "stranded": self.stranded,
            "runtime_s": round(self.runtime_s, 2),
            **(self.queue_metrics or {}),
            **(self.preemption_metrics or {}),
            **(self.failure_metrics or {}),
            **(self.check_metrics or {}),
        }


def request_of(job: TraceJob) -> PlacementRequest:
    """The placement request of a trace job (GPUs only; one pod set)."""
    return PlacementRequest(
        job=f"trace/{job.job_id}",
        uid=f"trace-{job.job_id}",
        pod_sets=(
            PodSet(name="worker", count=job.pods, requests={GPU_RESOURCE: job.gpus_per_pod}),
        ),
        gpu_products=(job.gpu_product,) if job.gpu_product else (),
        topology=TopologyRequest(nvlink=job.topology),
        priority=job.priority,
        queue=job.queue,
        submitted_at=job.submit_s,
        time_limit_s=job.time_limit_s,
    )


@dataclass(slots=True)
class _Run:
    job: TraceJob
    request: PlacementRequest
    key: Any
    start: float = _NEVER  # the first start (waits are to it)
    end: float = _NEVER
    cluster: str | None = None
    single_domain: bool = True
    domains: tuple[str, ...] = ()
    # preemption: seconds of work left, when the current run began, events
    remaining: float = 0.0
    seg_start: float = _NEVER
    preempted: list[PreemptionEvent] = field(default_factory=list)
    product: str | None = None  # the GPU product of the current (or last) run
    slowdown: float = 1.0  # the current run's: SCATTER_SLOWDOWN when scattered, else 1
    limit_hit: bool = False  # the current run ends at the job's time limit, work undone
    backfill: str | None = None  # the hold its (first) run borrowed, if it ran as backfill
    # earlier runs: (start, end, member, GPU product, why it ended: .simreport.ENDINGS)
    past: list[tuple[float, float, str | None, str | None, str]] = field(default_factory=list)

    def stop(self, now: float, why: str) -> None:
        """The current run ends at ``now`` before its work is done (``preempted``,
        ``node-failure``): kept in ``past``; the caller says what happens next."""
        self.past.append((self.seg_start, now, self.cluster, self.product, why))

    def segments(self) -> list[tuple[float, float]]:
        """Every run's ``(start, end)``, the current one last (``(inf, inf)`` when waiting)."""
        return [*((s, e) for s, e, *_ in self.past), (self.seg_start, self.end)]

    def ran(self, until: float) -> float:
        """Seconds run before ``until``, every run counted (lost work included)."""
        return sum(max(0.0, min(e, until) - s) for s, e in self.segments() if s < until)


class _Sim:
    """Simulated time, events and bookkeeping shared by every policy."""

    def __init__(self, members: list[MemberClusterState], jobs: list[TraceJob]) -> None:
        self.snapshot = FleetSnapshot(members)
        self.runs = [_Run(j, r := request_of(j), fit_key(r), remaining=j.duration_s) for j in jobs]
        self.by_uid = {run.request.uid: run for run in self.runs}
        # (time, kind, seq, uid); kind 0=finish, 1=arrival, 2/3=node failure/repair (.simfail)
        self.events: list[tuple[float, int, int, str]] = []
        self.seq = 0
        self.stranded = 0
        self.live: dict[str, _Run] = {}
        self.arrived = 0
        #: run-time factor of a scattered NVLink-Required job (:data:`.timelimits.SCATTER_SLOWDOWN`)
        self.scatter_slowdown = SCATTER_SLOWDOWN
        #: (member, node) -> uid -> (run start, GPUs there) of the runs started there (stale
        #: entries, of runs ended or restarted since, are skipped and pruned by hold_start)
        self.node_runs: dict[tuple[str, str], dict[str, tuple[float, int]]] = {}
        self.progress: Callable[[int, int, float], None] | None = None
        for run in self.runs:
            self._push(run.job.submit_s, 1, run.request.uid)
        self.fleet_gpus = sum(
            pool.cap
            for c in self.snapshot.clusters()
            for pool in c.pools.values()
            if not pool.slices
        )

    def _push(self, t: float, kind: int, uid: str) -> None:
        heapq.heappush(self.events, (t, kind, self.seq, uid))
        self.seq += 1

    def start(self, run: _Run, decision: Decision, now: float) -> None:
        """Run ``run`` from ``now`` as ``decision`` places it: reserve, then schedule its end
        (its remaining work, times :attr:`scatter_slowdown` for an NVLink-Required job of
        several pods spread over several NVLink domains, cut at its time limit)."""
        self.snapshot.reserve(decision, now, ttl_s=1e18)
        run.start = min(run.start, now)
        run.seg_start = now
        run.cluster = decision.cluster
        run.product = decision.gpu_product
        run.slowdown = 1.0
        self.live[run.request.uid] = run
        if decision.cluster:
            cluster = decision.cluster
            if run.product is None:  # the baselines' decisions name no product: their pool's
                nodes = self.snapshot.cluster(cluster).nodes
                first = next((n for ps in decision.pod_sets for n in ps.nodes), "")
                state = nodes.get(first)
                run.product = state.pool.product if state and state.pool else None
            domains = {
                self.snapshot.node(cluster, n).nvlink_domain
                for ps in decision.pod_sets
                for n in ps.nodes
            }
            run.domains = tuple(sorted(domains))
            for ps in decision.pod_sets:
                g = ps.requests.get(GPU_RESOURCE, 0)
                for n, pods in ps.nodes.items():
                    self.node_runs.setdefault((cluster, n), {})[run.request.uid] = (now, g * pods)
            if run.job.topology == "Required" and run.job.pods > 1:
                run.single_domain = len(domains) == 1
                if len(domains) > 1:
                    run.slowdown = self.scatter_slowdown
        took = run.remaining * run.slowdown
        limit = run.job.time_limit_s
        run.limit_hit = limit is not None and took > limit
        run.end = now + (limit if run.limit_hit and limit is not None else took)
        self._push(run.end, 0, run.request.uid)

    def result(self, policy: str, horizon: float) -> SimResult:
        started = [r for r in self.runs if r.start < _NEVER]
        waits = sorted(r.start - r.job.submit_s for r in started)
        t0 = min((r.job.submit_s for r in self.runs), default=0.0)
        finished_all = all(r.end <= horizon for r in self.runs)
        t_end = max((r.end for r in started), default=t0) if finished_all else horizon
        # utilization while jobs keep arriving: the drain after the last arrival runs the same
        # GPU-hours under every policy and would only dilute the difference
        t_last = max((r.job.submit_s for r in self.runs), default=t0)
        window_end = t_last if t_last > t0 else t_end
        busy = sum(r.job.gpus * r.ran(window_end) for r in started)
        span = max(window_end - t0, 1e-9)
        nvl = [r for r in started if r.job.topology == "Required" and r.job.pods > 1]
        return SimResult(
            policy=policy,
            jobs=len(self.runs),
            placed=len(started),
            unstarted=len(self.runs) - len(started),
            wait_mean_s=sum(waits) / len(waits) if waits else 0.0,
            wait_p50_s=_pct(waits, 0.50),
            wait_p95_s=_pct(waits, 0.95),
            gpu_utilization=busy / (self.fleet_gpus * span) if self.fleet_gpus else 0.0,
            nvlink_required_single_domain=(
                sum(1 for r in nvl if r.single_domain) / len(nvl) if nvl else 1.0
            ),
            stranded=self.stranded,
            extra={"end_s": t_end, "fleet_gpus": self.fleet_gpus},
            records=[self._record(r, horizon) for r in self.runs],
        )

    @staticmethod
    def _record(r: _Run, horizon: float) -> JobRecord:
        started = r.start < _NEVER
        runs = r.segments() if started else []
        pools: dict[str, float] = {}
        if started:
            for s, e, member, product, _ in (
                *r.past,
                (r.seg_start, r.end, r.cluster, r.product, ""),
            ):
                if s < min(e, horizon):
                    key = f"{member or ''}/{product or ''}"
                    pools[key] = pools.get(key, 0.0) + min(e, horizon) - s
        return JobRecord(
            job_id=r.job.job_id,
            gpus=r.job.gpus,
            submit_s=r.job.submit_s,
            start_s=r.start if started else None,
            end_s=r.end if started and r.end <= horizon else None,
            member=r.cluster,
            nvlink_domains=r.domains,
            runs=tuple((s, min(e, horizon)) for s, e in runs if s < _NEVER),
            topology=topology_class(r.job.pods, r.job.topology),
            pool_s=tuple(sorted(pools.items())),
            limit_hit=r.limit_hit and r.end <= horizon,
            backfill=r.backfill,
            time_limit_s=r.job.time_limit_s,
        )

    def intervals(self, horizon: float, queue: Callable[[_Run], str]) -> list[RunInterval]:
        """Every run of every started job (``queue``: the queue it is charged to), one row
        per quota key; a run still going at ``horizon`` ends there, ``still-running``.
        Zero-length runs hold nothing and are left out."""
        out: list[RunInterval] = []
        for r in self.runs:
            if r.start == _NEVER:
                continue
            runs = list(r.past)
            if r.seg_start < r.end:
                why = (
                    "still-running"
                    if r.end > horizon
                    else ("time-limit" if r.limit_hit else "succeeded")
                )
                runs.append((r.seg_start, min(r.end, horizon), r.cluster, r.product, why))
            q = queue(r)
            for n, (s, e, member, product, why) in enumerate(runs, start=1):
                if not s < e:
                    continue
                keys = demand_of(r.request, product) or {product or "": r.job.gpus}
                out += [
                    RunInterval(r.job.job_id, n, q, member or "", k, a, s, e, why)
                    for k, a in sorted(keys.items())
                ]
        return out

    def hold_start(self, req: PlacementRequest, hold: Hold, now: float) -> float | None:
        """When ``req`` is expected to start on ``hold``'s nodes (:func:`.backfill.expected_start`
        over the runs there and their time limits); None for a whole-member hold."""
        if not hold.nodes:
            return None
        free = 0
        releases: dict[str, tuple[float | None, int]] = {}
        for n in hold.nodes:
            free += self.snapshot.free(hold.cluster, n)
            runs = self.node_runs.get((hold.cluster, n))
            if not runs:
                continue
            for uid, (began, gpus) in list(runs.items()):
                run = self.live.get(uid)
                if run is None or run.seg_start != began or run.end <= now:
                    del runs[uid]  # ended or restarted since
                    continue
                limit = run.job.time_limit_s
                end, total = releases.get(uid, (None if limit is None else began + limit, 0))
                releases[uid] = (end, total + gpus)
        return expected_start(now, gpus_of(req), free, releases.values())

    def capacity(self) -> dict[tuple[str, str], int]:
        """(member, GPU product) -> whole GPUs of its pools now ('' for pools with no
        product)."""
        out: dict[tuple[str, str], int] = {}
        for c in self.snapshot.clusters():
            for pool in c.pools.values():
                if not pool.slices:
                    k = (c.name, pool.product or "")
                    out[k] = out.get(k, 0) + pool.cap
        return out

    def by_priority(self) -> dict[str, float]:
        """Priority (as a string) -> p95 wait of its started jobs, seconds; high first."""
        waits: dict[int, list[float]] = {}
        for r in self.runs:
            if r.start < _NEVER:
                waits.setdefault(r.request.priority, []).append(r.start - r.job.submit_s)
        return {
            str(p): round(_pct(sorted(w), 0.95), 1) for p, w in sorted(waits.items(), reverse=True)
        }

    def per_queue(self, qs: QueueSim, end: float) -> dict[str, dict[str, Any]]:
        """Per queue: jobs, mean wait of those started, GPU-hours run up to ``end``."""
        rows: dict[str, dict[str, Any]] = {}
        waits: dict[str, list[float]] = {}
        for r in self.runs:
            q = qs.queue(r.request)
            row = rows.setdefault(q, {"jobs": 0, "wait_mean_s": 0.0, "gpu_hours": 0.0})
            row["jobs"] += 1
            if r.start < _NEVER:
                waits.setdefault(q, []).append(r.start - r.job.submit_s)
                row["gpu_hours"] += r.job.gpus * r.ran(end) / 3600.0
        for q, row in rows.items():
            w = waits.get(q, [])
            row["wait_mean_s"] = round(sum(w) / len(w), 1) if w else 0.0
            row["gpu_hours"] = round(row["gpu_hours"], 1)
        return rows


def _pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    return values[min(len(values) - 1, max(0, math.ceil(q * len(values)) - 1))]


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
    trace, simulated seconds); it decides itself how often to report.
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
        _run_baseline(sim, horizon, policy, member_fit)
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


def _drain(
    sim: _Sim, horizon: float
) -> Iterable[tuple[float, list[str], list[str], list[tuple[int, str]]]]:
    """Events grouped by time: (now, finished uids, arrived uids, node events (kind, uid)),
    up to the horizon."""
    events = sim.events
    while events and events[0][0] <= horizon:
        now = events[0][0]
        finished: list[str] = []
        arrived: list[str] = []
        nodes: list[tuple[int, str]] = []
        while events and events[0][0] == now:
            _, kind, _, uid = heapq.heappop(events)
            if kind > 1:
                nodes.append((kind, uid))
            else:
                (arrived if kind else finished).append(uid)
        sim.arrived += len(arrived)
        if sim.progress is not None:
            sim.progress(sim.arrived, len(sim.runs), now)
        yield now, finished, arrived, nodes


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
            sim.start(pending.pop(req.uid), d, now)
            if qs is not None:
                qs.start(req, d.gpu_product)
        elif d.outcome == Outcome.REJECTED:
            pending.pop(req.uid, None)  # no member could ever hold it: never started
            if qs is not None:
                qs.drop(req)
        return d

    def holds(req: PlacementRequest) -> Hold | None:
        # a job its quota blocks holds no nodes it cannot use: others drain them meanwhile
        return hold_for(req, snapshot, policy, gate.for_request(req) if gate is not None else None)

    def avoiding(req: PlacementRequest, held: Mapping[str, Hold]) -> Hold | None:
        quota = gate.for_request(req) if gate is not None else None
        return hold_for(req, snapshot, policy, quota, avoid=held)

    def hold_start(req: PlacementRequest, hold: Hold) -> float | None:
        return sim.hold_start(req, hold, now)

    def key_of(req: PlacementRequest) -> Any:
        key = sim.by_uid[req.uid].key
        return (req.queue, key) if gate is not None and gate.enforce else key

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
            continue
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
        )
        for uid, borrowed in result.backfilled.items():
            run = sim.by_uid[uid]
            if run.backfill is None:
                run.backfill = borrowed.reason
        if pre is not None and pending:
            preempt_after_pass(sim, pending, now, policy, qs, pre)
        if qs is not None:
            qs.after_pass()


# --- baselines -------------------------------------------------------------------------------------


def _eligible_pools(sim: _Sim, run: _Run, cluster: str) -> list[PoolState]:
    """Pools of ``cluster`` with a node shaped to hold one pod of the job (allocatable).

    Pools whose nodes carry a scheduling taint are never eligible: trace pods carry no
    tolerations, so the member's kube-scheduler would not bind them there.
    """
    c = sim.snapshot.cluster(cluster)
    g = run.job.gpus_per_pod
    want = run.job.gpu_product
    out = []
    for pool in c.pools_sorted():
        if pool.slices or pool.taints or (want is not None and pool.product != want):
            continue
        if any(dict(shape).get(GPU_RESOURCE, 0) >= g for shape in pool.alloc_shapes):
            out.append(pool)
    return out


def _try_start_in_member(sim: _Sim, run: _Run, cluster: str, member_fit: str, now: float) -> bool:
    """Start ``run`` in ``cluster`` if every pod finds a node with room now (gang)."""
    ps = JobShape.of(run.request).gpu_sets[0]
    pools = _eligible_pools(sim, run, cluster)
    nodes: list[NodeState] = [
        n
        for pool in pools
        for n in (
            pool.iter_nodes_descending(ps.gpus)
            if member_fit == "spread"
            else pool.iter_nodes_ascending(ps.gpus)
        )
    ]
    if len(pools) > 1:
        nodes.sort(key=lambda n: (-n.gpu_free if member_fit == "spread" else n.gpu_free, n.name))
    out: dict[str, int] = {}
    if fill(ps, nodes, ps.count, {}, {}, out) < ps.count:
        return False
    decision = Decision.model_construct(
        job=run.request.job,
        uid=run.request.uid,
        outcome=Outcome.PLACED,
        cluster=cluster,
        pod_sets=(PodSetAssignment.model_construct(name=ps.name, requests=ps.requests, nodes=out),),
    )
    sim.start(run, decision, now)
    return True


def _run_baseline(sim: _Sim, horizon: float, policy: str, member_fit: str) -> None:
    names = sim.snapshot.cluster_names
    queues: dict[str, list[_Run]] = {n: [] for n in names}
    turn = 0
    for now, finished, arrived, _ in _drain(sim, horizon):
        for uid in finished:
            sim.snapshot.release(uid)
        dispatched: list[_Run] = []
        for uid in arrived:
            run = sim.by_uid[uid]
            eligible = [n for n in names if _eligible_pools(sim, run, n)]
            if not eligible:
                continue  # no member could ever hold it: never started
            if policy == "cluster-sum":
                # max() keeps the first of equals: names are sorted, so ties go by name
                target = max(
                    eligible, key=lambda n: sum(p.free for p in _eligible_pools(sim, run, n))
                )
            else:
                target = eligible[turn % len(eligible)]
                turn += 1
            queues[target].append(run)
            dispatched.append(run)
        for name in names:
            q = queues[name]
            if not q:
                continue
            failed: set[Any] = set()
            keep: list[_Run] = []
            for run in q:
                if run.key in failed or not _try_start_in_member(sim, run, name, member_fit, now):
                    failed.add(run.key)
                    keep.append(run)
            queues[name] = keep
        sim.stranded += sum(1 for run in dispatched if run.start == _NEVER)
