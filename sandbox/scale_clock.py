"""What ``gpufed bench scale`` records and prints: the first-seen times of every member and
job (:class:`Clock`), the result line (:func:`summarize`), the per-job stage trace
(:func:`trace_lines`), run-queue waits from Linux schedstat and etcd's db size.

Pure bookkeeping and parsing, apart from :func:`runqueue_wait_s` (reads ``/proc``); the run
itself is :mod:`gpufed.sandbox.scale_bench`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpufed.sandbox.e2e_harness import percentile_ms

if TYPE_CHECKING:
    from gpufed.sandbox.scale_bench import ScaleOptions


def etcd_db_bytes(metrics_text: str) -> int | None:
    """``etcd_mvcc_db_total_size_in_bytes`` from etcd's Prometheus text, or None."""
    for line in metrics_text.splitlines():
        if line.startswith("etcd_mvcc_db_total_size_in_bytes"):
            return int(float(line.split()[-1]))
    return None


def metric_sum(metrics_text: str, name: str) -> float | None:
    """The sum of every sample of metric ``name`` (all label sets) in Prometheus text, or None
    when it has none (a hub that does not export it)."""
    total, seen = 0.0, False
    for line in metrics_text.splitlines():
        if line.startswith(name) and line[len(name) : len(name) + 1] in (" ", "{"):
            total += float(line.rsplit(" ", 1)[-1])
            seen = True
    return total if seen else None


def hub_figures(
    metrics_text: str | None,
    *,
    ingest_cpu_s: float,
    nodes: int,
    jobs_cpu_s: float,
    jobs: int,
) -> dict[str, Any]:
    """The hub's own cost figures of a run: CPU seconds per 1,000 nodes ingested (the join
    phase: snapshots, and the churn's deltas meanwhile), CPU milliseconds per job (the job
    phase), and from its ``/metrics`` at the end the event loop's worst stall (wall, and the
    part its thread was on the CPU), missed lease renewals and incremental-vs-recount drift (None where the hub does not export them)."""
    text = metrics_text or ""
    stall = metric_sum(text, "gpufed_hub_event_loop_stall_max_seconds")
    held = metric_sum(text, "gpufed_hub_event_loop_stall_cpu_max_seconds")
    return {
        "hub_cpu_s_per_1000_nodes": round(ingest_cpu_s / nodes * 1000, 3) if nodes else None,
        "hub_cpu_ms_per_job": round(jobs_cpu_s / jobs * 1000, 1) if jobs else None,
        "loop_stall_max_ms": round(stall * 1000, 1) if stall is not None else None,
        "loop_stall_cpu_max_ms": round(held * 1000, 1) if held is not None else None,
        "lease_renewals_missed": metric_sum(text, "gpufed_hub_lease_renewals_missed_total"),
        "incremental_drift": metric_sum(text, "gpufed_hub_incremental_drift_total"),
    }


def ready_with_nodes(obj: dict[str, Any], nodes: int) -> bool:
    """The MemberCluster ``obj`` is Ready and reports ``nodes`` nodes."""
    st = obj.get("status") or {}
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in st.get("conditions") or []
    )
    return ready and st.get("nodes") == nodes


@dataclass
class Clock:
    """First-seen times (``time.monotonic``) by member name or ``namespace/name``."""

    first: dict[str, float] = field(default_factory=dict)
    registered: dict[str, float] = field(default_factory=dict)
    created: dict[str, float] = field(default_factory=dict)
    acked: dict[str, float] = field(default_factory=dict)
    reported: dict[str, float] = field(default_factory=dict)
    succeeded: dict[str, float] = field(default_factory=dict)
    placement_ms: dict[str, float] = field(default_factory=dict)
    #: when the GPUJob watch first showed a placement (``status.timings.placementMs``)
    placed: dict[str, float] = field(default_factory=dict)
    closed: list[dict[str, Any]] = field(default_factory=list)
    churn: int = 0
    all_registered: asyncio.Event = field(default_factory=asyncio.Event)
    all_done: asyncio.Event = field(default_factory=asyncio.Event)


def summarize(clock: Clock, opts: ScaleOptions, extra: dict[str, Any]) -> dict[str, Any]:
    """The result line (module docstring) from the clock."""
    reg = [clock.registered[m] - clock.first[m] for m in clock.registered if m in clock.first]
    disp = [clock.acked[k] - clock.created[k] for k in clock.acked if k in clock.created]
    stat = [clock.succeeded[k] - clock.reported[k] for k in clock.succeeded if k in clock.reported]
    place = [ms / 1000 for ms in clock.placement_ms.values()]
    return {
        "members": opts.members,
        "nodes_per_member": opts.nodes_per_member,
        "jobs": opts.jobs,
        "registration_p50_ms": percentile_ms(reg, 0.50),
        "registration_p99_ms": percentile_ms(reg, 0.99),
        "dispatch_p50_ms": percentile_ms(disp, 0.50),
        "dispatch_p99_ms": percentile_ms(disp, 0.99),
        "status_p50_ms": percentile_ms(stat, 0.50),
        "status_p99_ms": percentile_ms(stat, 0.99),
        "placement_p99_ms": percentile_ms(place, 0.99),
        "registered": len(clock.registered),
        "dispatched": len(clock.acked),
        "completed": len(clock.succeeded),
        "churn_pods": clock.churn,
        "streams_closed": len(clock.closed),
        **extra,
    }


def schedstat_wait_s(texts: list[str]) -> float:
    """Run-queue wait in seconds summed over threads, from the text of each thread's
    ``/proc/<pid>/task/<tid>/schedstat`` (``<on-cpu ns> <waiting ns> <timeslices>``);
    unreadable lines count 0."""
    total = 0
    for text in texts:
        parts = text.split()
        if len(parts) >= 2 and parts[1].isdigit():
            total += int(parts[1])
    return total / 1e9


def runqueue_wait_s(pid: int) -> float | None:
    """Seconds the live threads of process ``pid`` spent runnable, waiting for a CPU (Linux
    schedstat; None where it cannot be read). With CPU time, it says whether a latency is
    work or waiting for the machine: a process that waits as long as it runs is starved."""
    base = Path(f"/proc/{pid}/task")
    texts = []
    try:
        for task in base.iterdir():
            with contextlib.suppress(OSError):
                texts.append((task / "schedstat").read_text())
    except OSError:
        return None
    return schedstat_wait_s(texts) if texts else None


def trace_lines(clock: Clock, wall_offset: float) -> list[str]:
    """One JSON line per job, its stages as wall-clock seconds (``time.monotonic()`` +
    ``wall_offset``, so they compare with the hub log's timestamps): ``created`` (the create
    call started), ``placed`` (the GPUJob watch first showed a placement), ``acked`` (the
    agent wrote APPLIED), ``reported`` (the agent wrote Succeeded), ``succeeded`` (the watch
    showed it); a stage not reached is absent."""
    stages = ("created", "placed", "acked", "reported", "succeeded")
    out = []
    for key in sorted(clock.created):
        row: dict[str, Any] = {"job": key}
        for stage in stages:
            got: dict[str, float] = getattr(clock, stage)
            t = got.get(key)
            if t is not None:
                row[stage] = round(t + wall_offset, 4)
        out.append(json.dumps(row))
    return out
