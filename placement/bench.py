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
from gpufed.placement.engine import place
from gpufed.placement.policy import Policy
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
) -> dict[str, Any]:
    """Run the benchmark; returns the JSON-ready result (see the module docstring)."""
    policy = policy or Policy()
    t0 = time.perf_counter()
    members, shape = synthetic_fleet(clusters, nodes_per_cluster, seed)
    t1 = time.perf_counter()
    snapshot = FleetSnapshot(members)
    t2 = time.perf_counter()
    del members
    jobs = synthetic_jobs(decisions, seed, shape.products)
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
        d = place(req, snapshot, policy, float(i))
        latencies.append(perf() - a)
        cpu.append(thread_time() - c)
        outcomes[d.outcome.value] += 1
        if d.outcome == Outcome.PLACED:
            snapshot.reserve(d, float(i), policy.reservation_ttl_s)
            live.append(d.uid)
            if len(live) > window:
                snapshot.release(live.popleft())
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
    }
