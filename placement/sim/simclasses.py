"""Where the time goes: ``gpufed simulate --per-class``, per job-size class and topology class.

Pure over the simulator's :class:`~.simreport.JobRecord` list (``SimResult.records``); called
by the CLI (``cli/simulate.py``) and the tests. For each size class
(:func:`~.simreport.size_bucket`) and each topology class (:func:`~.simreport.topology_class`):
jobs, started, wait mean and p95, completion time (wait + run, scatter slowdown and time-limit
stops included) mean, GPU-hours run; per pool (``member/GPU product``): its GPU-hours and the
share of them each class ran; and the time-limit and backfill counts (docs/placement.md,
"Simulator").
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from gpufed.placement.sim.simreport import JobRecord, size_bucket


def class_report(records: Sequence[JobRecord]) -> dict[str, Any]:
    """The ``--per-class`` JSON object (keys in a fixed order):

    ``by_size`` / ``by_topology``: class -> ``{jobs, started, wait_mean_s, wait_p95_s,
    wait_max_s, completion_mean_s, gpu_hours}`` (seconds, GPU-hours; waits over started jobs, completion
    over ended ones); ``pools``: pool -> ``{gpu_hours, by_size: {class: share},
    by_topology: {class: share}}`` (shares of that pool's GPU-hours, summing to 1);
    ``time_limit_stops``: jobs stopped at their limit; ``backfilled``: jobs that ran as
    backfill inside a hold; ``backfill_limit_hits``: those of them stopped at their limit;
    ``time_limited``: jobs with a declared (or drawn) limit.
    """
    size_of: Callable[[JobRecord], str] = lambda r: str(size_bucket(r.gpus))  # noqa: E731
    topo_of: Callable[[JobRecord], str] = lambda r: r.topology  # noqa: E731
    return {
        "by_size": _table(records, size_of, key=int),
        "by_topology": _table(records, topo_of, key=str),
        "pools": _pools(records, size_of, topo_of),
        "time_limited": sum(1 for r in records if r.time_limit_s is not None),
        "time_limit_stops": sum(1 for r in records if r.limit_hit),
        "backfilled": sum(1 for r in records if r.backfill is not None),
        "backfill_limit_hits": sum(1 for r in records if r.backfill is not None and r.limit_hit),
    }


def _table(
    records: Iterable[JobRecord], class_of: Callable[[JobRecord], str], *, key: Callable[[str], Any]
) -> dict[str, dict[str, float | int]]:
    groups: dict[str, list[JobRecord]] = {}
    for r in records:
        groups.setdefault(class_of(r), []).append(r)
    out: dict[str, dict[str, float | int]] = {}
    for name in sorted(groups, key=key):
        rs = groups[name]
        waits = sorted(w for r in rs if (w := r.wait_s) is not None)
        done = [c for r in rs if (c := r.completion_s) is not None]
        out[name] = {
            "jobs": len(rs),
            "started": len(waits),
            "wait_mean_s": round(sum(waits) / len(waits), 1) if waits else 0.0,
            "wait_p95_s": round(percentile(waits, 0.95), 1),
            "wait_max_s": round(waits[-1], 1) if waits else 0.0,
            "completion_mean_s": round(sum(done) / len(done), 1) if done else 0.0,
            "gpu_hours": round(sum(r.gpus * s for r in rs for _, s in r.pool_s) / 3600.0, 1),
        }
    return out


def _pools(
    records: Iterable[JobRecord],
    size_of: Callable[[JobRecord], str],
    topo_of: Callable[[JobRecord], str],
) -> dict[str, dict[str, Any]]:
    hours: dict[str, dict[tuple[str, str], float]] = {}
    for r in records:
        for pool, s in r.pool_s:
            h = r.gpus * s / 3600.0
            row = hours.setdefault(pool, {})
            for k in (("size", size_of(r)), ("topology", topo_of(r))):
                row[k] = row.get(k, 0.0) + h
    out: dict[str, dict[str, Any]] = {}
    for pool in sorted(hours):
        row = hours[pool]
        total = sum(h for (kind, _), h in row.items() if kind == "size")
        out[pool] = {
            "gpu_hours": round(total, 1),
            "by_size": _shares(row, "size", total, key=int),
            "by_topology": _shares(row, "topology", total, key=str),
        }
    return out


def _shares(
    row: dict[tuple[str, str], float], kind: str, total: float, *, key: Callable[[str], Any]
) -> dict[str, float]:
    names = sorted((c for k, c in row if k == kind), key=key)
    return {c: round(row[(kind, c)] / total, 4) if total > 0 else 0.0 for c in names}


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank ``q`` quantile of ascending ``values`` (0.0 when empty)."""
    if not values:
        return 0.0
    return values[min(len(values) - 1, max(0, math.ceil(q * len(values)) - 1))]
