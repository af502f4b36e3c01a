"""What ``gpufed simulate`` reports beyond its JSON line: per-job records, run intervals and the
figures drawn from them (mean wait by job size, the wait-time distribution, GPU utilisation over
time).

:class:`JobRecord` is filled by :mod:`gpufed.placement.sim.simulate` (``SimResult.records``, one per
trace job, in trace order); the functions here are pure and shared by the CLI's ``--per-size``
table, ``--plot`` and ``--jobs-out`` (``cli/simulate.py``, ``cli/simplot.py``).
:class:`RunInterval` is one run of a job (``SimResult.intervals``): what ``--intervals-out``
writes (:func:`interval_rows`) and :mod:`.siminvariants` reads back (:func:`read_intervals`).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from gpufed.api.errors import PermanentError

__all__ = [
    "CSV_COLUMNS",
    "ENDINGS",
    "INTERVAL_COLUMNS",
    "TOPOLOGY_CLASSES",
    "IntervalFileError",
    "JobRecord",
    "RunInterval",
    "csv_rows",
    "interval_rows",
    "read_intervals",
    "size_bucket",
    "size_buckets",
    "topology_class",
    "utilization_series",
    "wait_by_size",
    "waits",
]

#: ``--jobs-out`` columns, in order.
CSV_COLUMNS = (
    "job_id",
    "gpus",
    "submit_s",
    "start_s",
    "end_s",
    "wait_s",
    "member",
    "nvlink_domain",
)


@dataclass(frozen=True, slots=True)
class JobRecord:
    """One trace job's run: ``submit_s``, first ``start_s`` and final ``end_s`` (simulated
    seconds; None when it never started, or did not end by the horizon), the ``member`` and the
    NVLink domain ids (``clique:<v>`` or ``node:<name>``) of its last run, and every run's
    ``(start, end)`` (several after preemptions) for utilisation. ``topology``: its class
    (:func:`topology_class`); ``pool_s``: ``(member/GPU product, seconds run there)`` per run,
    up to the horizon; ``limit_hit``: its last run was stopped at its declared time limit;
    ``backfill``: the hold its first run borrowed (it ran as backfill), else None;
    ``time_limit_s``: its declared (or drawn) limit, None without one."""

    job_id: str
    gpus: int
    submit_s: float
    start_s: float | None
    end_s: float | None
    member: str | None
    nvlink_domains: tuple[str, ...]
    runs: tuple[tuple[float, float], ...]
    topology: str = "one-pod"
    pool_s: tuple[tuple[str, float], ...] = ()
    limit_hit: bool = False
    backfill: str | None = None
    time_limit_s: float | None = None

    @property
    def completion_s(self) -> float | None:
        """Seconds from submission to the end of its last run (None: not ended)."""
        return None if self.end_s is None else self.end_s - self.submit_s

    @property
    def wait_s(self) -> float | None:
        """Seconds from submission to the first start (None: never started)."""
        return None if self.start_s is None else self.start_s - self.submit_s


#: :func:`topology_class` values, in report order.
TOPOLOGY_CLASSES: Final = ("one-pod", "Required", "Preferred", "None")


def topology_class(pods: int, nvlink: str) -> str:
    """A job's topology class: ``one-pod`` (one pod: always inside one node), else its
    multi-pod NVLink wish ``Required`` (must share one NVLink domain), ``Preferred`` or
    ``None``."""
    return "one-pod" if pods <= 1 else nvlink


def waits(records: Iterable[JobRecord]) -> list[float]:
    """Waits of the started jobs, seconds, ascending (the empirical CDF's x values)."""
    return sorted(w for r in records if (w := r.wait_s) is not None)


def size_bucket(gpus: int) -> int:
    """The size class of a job of ``gpus`` GPUs: the smallest power of two >= ``gpus`` (1, 2, 4
    ... so a 3-GPU job counts with the 4s, as docs/placement.md's table groups them)."""
    return 1 if gpus <= 1 else 1 << math.ceil(math.log2(gpus))


def size_buckets(records: Iterable[JobRecord]) -> list[int]:
    """The size classes present, ascending."""
    return sorted({size_bucket(r.gpus) for r in records})


def wait_by_size(records: Iterable[JobRecord]) -> dict[int, tuple[int, float]]:
    """Size class -> (started jobs, mean wait in seconds) of the started jobs, ascending."""
    groups: dict[int, list[float]] = {}
    for r in records:
        if (w := r.wait_s) is not None:
            groups.setdefault(size_bucket(r.gpus), []).append(w)
    return {b: (len(ws), sum(ws) / len(ws)) for b, ws in sorted(groups.items())}


def utilization_series(
    records: Sequence[JobRecord], fleet_gpus: int, *, points: int = 500
) -> list[tuple[float, float]]:
    """GPU utilisation over time: ``points`` (time, busy GPUs / ``fleet_gpus``) samples from the
    first submission to the last end (or start), each the mean over its interval.

    Cost: O(runs + points) after sorting the run edges. Empty for no runs or no GPUs.
    """
    edges: list[tuple[float, int]] = []
    for r in records:
        for s, e in r.runs:
            if e > s:
                edges += [(s, r.gpus), (e, -r.gpus)]
    if not edges or fleet_gpus <= 0 or points < 1:
        return []
    edges.sort()
    t0 = min(r.submit_s for r in records)
    t1 = max(t for t, _ in edges)
    step = max((t1 - t0) / points, 1e-9)
    out: list[tuple[float, float]] = []
    busy, i, t = 0, 0, t0
    for k in range(points):
        lo, hi = t0 + k * step, t0 + (k + 1) * step
        area = 0.0
        while i < len(edges) and edges[i][0] < hi:
            at, delta = edges[i]
            at = max(at, lo)
            area += busy * (at - t)
            t, busy = at, busy + delta
            i += 1
        area += busy * (hi - t)
        t = hi
        out.append(((lo + hi) / 2, area / (step * fleet_gpus)))
    return out


def _num(value: float | None) -> str:
    return "" if value is None else f"{value:.1f}"


def csv_rows(records: Iterable[JobRecord]) -> list[list[str]]:
    """``--jobs-out`` rows (:data:`CSV_COLUMNS`); blank cells where a job never started or
    ended; several NVLink domains joined by ``;``."""
    return [
        [
            r.job_id,
            str(r.gpus),
            _num(r.submit_s),
            _num(r.start_s),
            _num(r.end_s),
            _num(r.wait_s),
            r.member or "",
            ";".join(r.nvlink_domains),
        ]
        for r in records
    ]


#: ``--intervals-out`` columns, in order (after ``policy``).
INTERVAL_COLUMNS = (
    "job_id",
    "run",
    "queue",
    "member",
    "gpu_product",
    "gpus",
    "start_s",
    "end_s",
    "ended",
)

#: Why a run ended: it finished its work; a higher-priority (or reclaiming) job took its GPUs;
#: a node it ran on failed (it re-runs, or fails when out of retries); the horizon came first;
#: it reached its declared time limit with work left and was stopped (final).
ENDINGS: Final = ("succeeded", "preempted", "node-failure", "still-running", "time-limit")


@dataclass(frozen=True, slots=True)
class RunInterval:
    """One run of a job on one quota key: ``[start_s, end_s)`` in simulated seconds.

    ``run``: 1 for the first run, 2 for the run after a preemption or node failure, ...;
    ``queue``: the queue it is charged to ('' without queues); ``gpu_product``: the quota key
    (the GPU product of its whole GPUs, or a MIG resource name; '' when unknown) and ``gpus``
    the amount of it (GPUs, or MIG slices); a job holding several keys has one row per key
    with the same ``run``. ``ended``: one of :data:`ENDINGS`.
    """

    job_id: str
    run: int
    queue: str
    member: str
    gpu_product: str
    gpus: int
    start_s: float
    end_s: float
    ended: str


def interval_rows(intervals: Iterable[RunInterval]) -> list[list[str]]:
    """``--intervals-out`` rows (:data:`INTERVAL_COLUMNS`). Times are written exactly
    (``repr``), so an end and a start at the same instant read back equal."""
    return [
        [
            i.job_id,
            str(i.run),
            i.queue,
            i.member,
            i.gpu_product,
            str(i.gpus),
            repr(float(i.start_s)),
            repr(float(i.end_s)),
            i.ended,
        ]
        for i in intervals
    ]


class IntervalFileError(PermanentError, ValueError):
    """An intervals file that cannot be read; the message names the file and line."""


def read_intervals(path: str | Path) -> dict[str, list[RunInterval]]:
    """Policy -> its run intervals, in file order, from an ``--intervals-out`` file.

    Raises :class:`IntervalFileError` naming the file and line for a missing column, a number
    that does not parse, an ``end_s`` before ``start_s`` or an unknown ``ended``.
    """
    out: dict[str, list[RunInterval]] = {}
    try:
        with Path(path).open(newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            missing = {"policy", *INTERVAL_COLUMNS} - set(reader.fieldnames or ())
            if missing:
                raise IntervalFileError(f"{path}: missing columns {', '.join(sorted(missing))}")
            for line, row in enumerate(reader, start=2):
                try:
                    i = RunInterval(
                        job_id=row["job_id"],
                        run=int(row["run"]),
                        queue=row["queue"],
                        member=row["member"],
                        gpu_product=row["gpu_product"],
                        gpus=int(row["gpus"]),
                        start_s=float(row["start_s"]),
                        end_s=float(row["end_s"]),
                        ended=row["ended"],
                    )
                except (TypeError, ValueError) as exc:
                    raise IntervalFileError(f"{path} line {line}: {exc}") from None
                if not i.start_s <= i.end_s or i.ended not in ENDINGS or i.gpus < 0:
                    raise IntervalFileError(
                        f"{path} line {line}: expected start_s <= end_s, gpus >= 0 and ended "
                        f"one of {', '.join(ENDINGS)}"
                    )
                out.setdefault(row["policy"], []).append(i)
    except (OSError, UnicodeDecodeError) as exc:
        raise IntervalFileError(f"{path}: cannot read the file: {exc}") from None
    return out
