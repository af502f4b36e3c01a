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
"""

from __future__ import annotations

import gc
import resource
import statistics
import sys
import time
from collections import deque
from typing import Any

from gpufed.api.decision import Outcome
from gpufed.api.gpujob import ObjectMeta
from gpufed.api.queue import GPUQueue, GPUQueueSpec, QueueQuota
from gpufed.placement.engine import place
from gpufed.placement.policy import Policy
from gpufed.placement.quota import QuotaGate, build_tree
from gpufed.placement.snapshot import FleetSnapshot
from gpufed.placement.synthetic import synthetic_fleet, synthetic_jobs


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


def run_placement_bench(
    clusters: int,
    nodes_per_cluster: int,
    decisions: int,
    seed: int,
    *,
    window: int | None = None,
    policy: Policy | None = None,
    queues: int = 0,
) -> dict[str, Any]:
    """Run the benchmark; returns the JSON-ready result (see the module docstring).

    ``queues``: 0 for none, else the size of the queue tree (module docstring)."""
    policy = policy or Policy()
    t0 = time.perf_counter()
    members, shape = synthetic_fleet(clusters, nodes_per_cluster, seed)
    t1 = time.perf_counter()
    snapshot = FleetSnapshot(members)
    t2 = time.perf_counter()
    del members
    jobs = synthetic_jobs(decisions, seed, shape.products)
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
        "placed": outcomes[Outcome.PLACED.value],
        "unschedulable": outcomes[Outcome.UNSCHEDULABLE.value],
        "rejected": outcomes[Outcome.REJECTED.value],
        "fleet_build_s": round(t1 - t0, 3),
        "snapshot_build_s": round(t2 - t1, 3),
        "seed": seed,
        "queues": queues,
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
