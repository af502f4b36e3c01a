"""The placement benchmark behind ``gpufed bench placement`` (a harness, not placement itself).

Builds a seeded synthetic fleet (:mod:`.synthetic`) into a :class:`FleetSnapshot`, then times
``place()`` for each job of a seeded job mix, applying every ``Placed`` decision to the snapshot
as the hub does (``reserve``) and releasing the oldest reservation once ``window`` are live (jobs
finishing; by default about 5% of the fleet's GPUs), so the fleet's occupancy stays near where
the generator put it.

Reports (one JSON object): fleet size, p50/p99 of ``place()`` in milliseconds, decisions per
second over the whole loop (placing, reserving and releasing), the same p99 and rate on the
thread's CPU clock (``cpu_p99_ms``, ``cpu_decisions_per_s``: immune to other processes on a
shared machine), outcomes, fleet and snapshot build times and peak RSS. Wall time uses
``time.perf_counter``; ``place()`` itself never reads a clock.

``queues=N`` (``gpufed bench placement --queues N``): a tree of N queues, a root over N - 1
teams (one team when N is 1), each team with a ``*`` quota of its equal part of the fleet's
GPUs and a borrowing limit of the same size; the jobs go to the teams in turn, each decision
runs the ``Quota`` filter (admission over the tree) and each placed job is charged to the
ledger and released with its reservation: the cost of quota admission on top of ``place()``.

:func:`run_preemption_bench` (``--preemption``): a full fleet and a stream of higher-priority
jobs, each decision ``place()`` then, when it does not fit, ``plan_preemption``.
"""

from __future__ import annotations

import gc
import random
import resource
import statistics
import sys
import time
from collections import deque
from typing import Any

from gpufed.api.decision import Outcome
from gpufed.api.gpujob import ObjectMeta
from gpufed.api.inventory import MemberClusterState
from gpufed.api.labels import GPU_RESOURCE
from gpufed.api.queue import GPUQueue, GPUQueueSpec, QueueQuota
from gpufed.placement.engine import place
from gpufed.placement.policy import Policy
from gpufed.placement.preemption import PreemptionPlan, PreemptionRules, Preemptor, Running
from gpufed.placement.quota import QuotaGate, build_tree
from gpufed.placement.runindex import RunningIndex
from gpufed.placement.sim.synthetic import FleetShape, synthetic_fleet, synthetic_jobs
from gpufed.placement.snapshot import FleetSnapshot
from gpufed.placement.victims import plan_preemption


def peak_rss_mib() -> float:
    """Peak resident set size of this process so far, MiB (``getrusage`` ``ru_maxrss``)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux reports KiB, macOS bytes
    return peak / (2**20 if sys.platform == "darwin" else 1024)


def _percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    k = max(0, min(len(sorted_values) - 1, round(q * (len(sorted_values) - 1))))
    return sorted_values[k]


def _timings(
    shape: FleetShape,
    decisions: int,
    latencies: list[float],
    cpu: list[float],
    elapsed: float,
    cpu_elapsed: float,
) -> dict[str, Any]:
    """The keys every placement benchmark run reports, in order (seconds in, ms out)."""
    latencies.sort()
    cpu.sort()
    return {
        "clusters": shape.clusters,
        "nodes": shape.nodes,
        "gpus": shape.gpus,
        "decisions": decisions,
        "p50_ms": round(_percentile(latencies, 0.50) * 1e3, 4),
        "p99_ms": round(_percentile(latencies, 0.99) * 1e3, 4),
        "decisions_per_s": round(decisions / elapsed, 1) if elapsed > 0 else 0.0,
        "peak_rss_mib": round(peak_rss_mib(), 1),
        "mean_ms": round(statistics.fmean(latencies) * 1e3, 4) if latencies else 0.0,
        # the same on this thread's CPU clock: what a loaded, shared machine does not distort
        "cpu_p99_ms": round(_percentile(cpu, 0.99) * 1e3, 4),
        "cpu_decisions_per_s": round(decisions / cpu_elapsed, 1) if cpu_elapsed > 0 else 0.0,
        "max_ms": round(latencies[-1] * 1e3, 4) if latencies else 0.0,
    }


def run_placement_bench(
    clusters: int,
    nodes_per_cluster: int,
    decisions: int,
    seed: int,
    *,
    window: int | None = None,
    policy: Policy | None = None,
    queues: int = 0,
    dra: bool = False,
) -> dict[str, Any]:
    """Run the benchmark; returns the JSON-ready result (see the module docstring).

    ``queues``: 0 for none, else the size of the queue tree (module docstring); ``dra``: DRA
    members and claiming jobs in the mix (:mod:`gpufed.placement.sim.synthetic`)."""
    policy = policy or Policy()
    t0 = time.perf_counter()
    members, shape = synthetic_fleet(clusters, nodes_per_cluster, seed, dra=dra)
    t1 = time.perf_counter()
    snapshot = FleetSnapshot(members)
    t2 = time.perf_counter()
    del members
    jobs = synthetic_jobs(decisions, seed, shape.products, dra=dra)
    gate: QuotaGate | None = None
    if queues > 0:
        gate, teams = _queue_tree(queues, shape.gpus)
        jobs = [j.model_copy(update={"queue": teams[i % len(teams)]}) for i, j in enumerate(jobs)]
    if window is None:
        # about 5% of the fleet's GPUs held by the benchmark's own jobs (10 GPUs a job on average)
        window = max(100, shape.gpus // 200)
    # the snapshot lives as long as the hub: keep the collector from rescanning it
    gc.collect()
    gc.freeze()
    latencies: list[float] = []
    cpu: list[float] = []
    thread_time = time.thread_time
    outcomes = {o.value: 0 for o in Outcome}
    live: deque[str] = deque()
    perf = time.perf_counter
    start = perf()
    cpu_start = thread_time()
    for i, req in enumerate(jobs):
        c = thread_time()
        a = perf()
        if gate is None:
            d = place(req, snapshot, policy, float(i))
        else:
            d = place(req, snapshot, policy, float(i), quota=gate.for_request(req))
            if d.outcome == Outcome.PLACED:
                gate.charge(req, d.gpu_product)
        latencies.append(perf() - a)
        cpu.append(thread_time() - c)
        outcomes[d.outcome.value] += 1
        if d.outcome == Outcome.PLACED:
            snapshot.reserve(d, float(i), policy.reservation_ttl_s)
            live.append(d.uid)
            if len(live) > window:
                gone = live.popleft()
                snapshot.release(gone)
                if gate is not None:
                    gate.release(gone)
    elapsed = perf() - start
    cpu_elapsed = thread_time() - cpu_start
    gc.unfreeze()
    return {
        **_timings(shape, decisions, latencies, cpu, elapsed, cpu_elapsed),
        "placed": outcomes[Outcome.PLACED.value],
        "unschedulable": outcomes[Outcome.UNSCHEDULABLE.value],
        "rejected": outcomes[Outcome.REJECTED.value],
        "fleet_build_s": round(t1 - t0, 3),
        "snapshot_build_s": round(t2 - t1, 3),
        "seed": seed,
        "queues": queues,
        "dra": dra,
    }


def _queue_tree(n: int, gpus: int) -> tuple[QuotaGate, list[str]]:
    """A root over ``n - 1`` teams (or one root team), equal ``*`` quotas (module docstring)."""
    teams = [f"team-{i}" for i in range(max(1, n - 1))]
    share = max(1, gpus // len(teams))
    objs = [
        GPUQueue(
            metadata=ObjectMeta(name=t),
            spec=GPUQueueSpec(
                parent="root" if n > 1 else None,
                namespaces=[t],
                quotas=[QueueQuota(gpu_product="*", nominal=share, borrowing_limit=share)],
            ),
        )
        for t in teams
    ]
    if n > 1:
        objs.append(GPUQueue(metadata=ObjectMeta(name="root"), spec=GPUQueueSpec()))
    return QuotaGate(build_tree(objs)), teams


def _fill_with_victims(
    members: list[MemberClusterState], seed: int
) -> tuple[list[MemberClusterState], dict[str, list[Running]]]:
    """Every GPU of every node in use by low-priority jobs the member reports per job: a
    node runs one job on all its GPUs, or two on half each (one in two, seeded); priorities
    0-2, started in the last 10 h, a third checkpointing every 30 min, a third reporting a
    checkpoint. Returns the members and the running jobs by member."""
    rng = random.Random(seed + 1)
    out: list[MemberClusterState] = []
    running: dict[str, list[Running]] = {}
    for m in members:
        rows: list[Running] = running.setdefault(m.name, [])
        nodes = []
        for inv in m.inventory.nodes:
            gpus = inv.allocatable.get(GPU_RESOURCE, 0)
            full = {r: a for r, a in inv.allocatable.items() if r != "pods"}
            half = {r: a // 2 for r, a in full.items()}
            parts = [full] if gpus < 2 or rng.random() < 0.5 else [half, half]
            jobs: dict[str, dict[str, int]] = {}
            for k, req in enumerate(parts):
                uid = f"run-{inv.name}-{k}"
                jobs[uid] = req
                started = -rng.uniform(0, 36_000)
                kind = rng.randrange(3)
                rows.append(
                    Running(
                        uid=uid,
                        cluster=m.name,
                        priority=rng.randrange(3),
                        gpus={inv.name: req.get(GPU_RESOURCE, 0)},
                        started_at=started,
                        checkpoint_interval_s=1800.0 if kind == 1 else None,
                        last_checkpoint=started + rng.uniform(0, -started) if kind == 2 else None,
                    )
                )
            used = {r: sum(j.get(r, 0) for j in jobs.values()) for r in full}
            nodes.append(inv.model_copy(update={"requested": used, "job_requests": jobs}))
        inventory = m.inventory.model_copy(update={"nodes": tuple(nodes)})
        out.append(m.model_copy(update={"inventory": inventory}))
    return out, running


def run_preemption_bench(
    clusters: int,
    nodes_per_cluster: int,
    decisions: int,
    seed: int,
    *,
    policy: Policy | None = None,
    rules: PreemptionRules | None = None,
) -> dict[str, Any]:
    """``gpufed bench placement --preemption``: a full fleet (every GPU running a job of
    priority 0-2, :func:`_fill_with_victims`) and a stream of the synthetic jobs at priority
    10. Each decision is ``place()`` and, when the job does not fit, ``plan_preemption`` over
    a :class:`~gpufed.placement.runindex.RunningIndex` built once (untimed, as the hub keeps
    it) and kept as victims stop;
    a plan is carried out at once (victims gone from the snapshot and the running jobs, the
    preemptor reserved as planned). Times the whole decision (place + plan), like the
    no-preemption run times ``place()``; reports preemptions, victims and what-ifs."""
    policy = policy or Policy()
    rules = rules or PreemptionRules()
    t0 = time.perf_counter()
    members, shape = synthetic_fleet(clusters, nodes_per_cluster, seed)
    members, running = _fill_with_victims(members, seed)
    snapshot = FleetSnapshot(members)
    del members
    t1 = time.perf_counter()
    jobs = [
        j.model_copy(update={"priority": 10})
        for j in synthetic_jobs(decisions, seed, shape.products)
    ]
    # the hub keeps its running jobs indexed by block as they start and end (not timed)
    index = RunningIndex(snapshot, (r for rs in running.values() for r in rs))
    index.file_levels()
    del running
    gc.collect()
    gc.freeze()
    latencies: list[float] = []
    cpu: list[float] = []
    perf, thread_time = time.perf_counter, time.thread_time
    outcomes = {"placed": 0, "preempted": 0, "not_placed": 0}
    victims = 0
    whatifs: list[int] = []
    start, cpu_start = perf(), thread_time()
    for i, req in enumerate(jobs):
        c, a = thread_time(), perf()
        now = float(i)
        d = place(req, snapshot, policy, now)
        plan = None
        if d.outcome == Outcome.UNSCHEDULABLE:
            plan = plan_preemption(Preemptor(req), index, snapshot, policy, now, rules=rules)
            whatifs.append(plan.whatifs)
        latencies.append(perf() - a)
        cpu.append(thread_time() - c)
        if d.outcome == Outcome.PLACED:
            outcomes["placed"] += 1
            snapshot.reserve(d, now, policy.reservation_ttl_s)
        elif isinstance(plan, PreemptionPlan):
            outcomes["preempted"] += 1
            victims += len(plan.victims)
            _carry_out(snapshot, plan, index)
            snapshot.reserve(plan.decision, now, policy.reservation_ttl_s)
        else:
            outcomes["not_placed"] += 1
    elapsed, cpu_elapsed = perf() - start, thread_time() - cpu_start
    gc.unfreeze()
    whatifs.sort()
    return {
        **_timings(shape, decisions, latencies, cpu, elapsed, cpu_elapsed),
        **outcomes,
        "victims": victims,
        "whatifs_p50": _percentile([float(w) for w in whatifs], 0.5),
        "whatifs_max": whatifs[-1] if whatifs else 0,
        "build_s": round(t1 - t0, 3),
        "seed": seed,
    }


def _carry_out(
    snapshot: FleetSnapshot,
    plan: PreemptionPlan,
    index: RunningIndex,
) -> None:
    """Stop the plan's victims as the member would report it: their pods leave their nodes."""
    cluster = plan.cluster
    for v in plan.victims:
        uid = v.running.uid
        index.remove(uid, cluster)
        for name in v.running.gpus:
            inv = snapshot.node(cluster, name)
            req = inv.job_requests.get(uid, {})
            snapshot.upsert_node(
                cluster,
                inv.model_copy(
                    update={
                        "requested": {r: a - req.get(r, 0) for r, a in inv.requested.items()},
                        "job_requests": {k: x for k, x in inv.job_requests.items() if k != uid},
                    }
                ),
            )
