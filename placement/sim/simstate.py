"""The simulator's state: each job's runs, simulated time and events, and the result.

:class:`_Sim` (the snapshot, the event heap, the live runs and their nodes, what every policy
reads and changes), :class:`_Run` (one trace job's runs), :func:`_drain` (the events grouped by
time), :class:`SimResult` (what :func:`gpufed.placement.sim.simulate.simulate` returns), and
:func:`request_of` (a trace job's placement request). The policies that drive them:
:mod:`.simulate` (``gpufed``), :mod:`.simbaselines` (``cluster-sum``, ``round-robin``),
:mod:`.simfirstadmit` (``first-admit``). Pure.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpufed.api.decision import Decision
from gpufed.api.inventory import MemberClusterState
from gpufed.api.labels import GPU_RESOURCE
from gpufed.api.request import PlacementRequest, PodSet, TopologyRequest
from gpufed.placement.backfill import expected_start, idle_until_start
from gpufed.placement.preemption import PreemptionEvent
from gpufed.placement.queue import Hold, fit_key, gpus_of
from gpufed.placement.quota import demand_of
from gpufed.placement.sim.simidle import IdleMeter
from gpufed.placement.sim.simquota import QueueSim
from gpufed.placement.sim.simreport import JobRecord, RunInterval, topology_class
from gpufed.placement.sim.timelimits import SCATTER_SLOWDOWN
from gpufed.placement.sim.trace import TraceJob
from gpufed.placement.snapshot import FleetSnapshot

_NEVER = math.inf


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
    #: idle GPU-hours by reason and pool (``simulate(idle=True)``, :mod:`.simidle`; in the JSON
    #: only under ``--per-class``)
    idle: dict[str, Any] | None = None

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
        #: idle GPU time by reason (``simulate(idle=True)``; :mod:`.simidle`), else None
        self.idle: IdleMeter | None = None
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

    def observe_idle(
        self, now: float, waiting: Iterable[_Run], holds: Mapping[str, Hold] | None = None
    ) -> None:
        """After a batch: the jobs still ``waiting`` and the pass's ``holds``, for the idle
        meter when one is on (:meth:`.simidle.IdleMeter.observe`)."""
        if self.idle is not None:
            self.idle.observe(now, self.snapshot, waiting, holds)

    def result(self, policy: str, horizon: float) -> SimResult:
        started = [r for r in self.runs if r.start < _NEVER]
        waits = sorted(r.start - r.job.submit_s for r in started)
        t0 = min((r.job.submit_s for r in self.runs), default=0.0)
        finished_all = all(r.end <= horizon for r in self.runs)
        t_end = max((r.end for r in started), default=t0) if finished_all else horizon
        # utilization while jobs keep arriving: after the last arrival a policy only works off
        # its backlog (whose size differs by policy), which says nothing of how it kept up
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
            idle=self.idle.report(self.fleet_gpus, window_end) if self.idle is not None else None,
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

    def hold_start(
        self, req: PlacementRequest, hold: Hold, now: float, accuracy: float = 1.0
    ) -> float | None:
        """When ``req`` is expected to start on ``hold``'s nodes (:func:`.backfill.expected_start`
        over the runs there, each ending at its start plus ``accuracy`` times its time limit,
        not before ``now``: ``BackfillRule.start_accuracy``); None for a whole-member hold."""
        if not hold.nodes:
            return None
        return expected_start(now, gpus_of(req), *self.releases(hold, now, accuracy))

    def hold_idle(
        self, req: PlacementRequest, hold: Hold, now: float, accuracy: float = 1.0
    ) -> float | None:
        """GPU-seconds ``hold``'s GPUs stand idle until :meth:`hold_start`
        (:func:`.backfill.idle_until_start`); None when that start is."""
        if not hold.nodes:
            return None
        return idle_until_start(now, gpus_of(req), *self.releases(hold, now, accuracy))

    def releases(
        self, hold: Hold, now: float, accuracy: float
    ) -> tuple[int, list[tuple[float | None, int]]]:
        """(free GPUs now, (end, GPUs) per run) of ``hold``'s nodes."""
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
                end = None if limit is None else began + limit * accuracy
                if end is not None and accuracy < 1.0:
                    end = max(end, now)
                end, total = releases.get(uid, (end, 0))
                releases[uid] = (end, total + gpus)
        return free, list(releases.values())

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
