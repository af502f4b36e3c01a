"""The job trace format of ``gpufed simulate`` (docs/design.md §6): reading and checking a CSV.

Called by the simulator (:mod:`.simulate`) and the CLI. Pure apart from reading the file.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpufed.api.errors import PermanentError
from gpufed.api.request import NVLinkPolicy

_TOPOLOGY: dict[str, NVLinkPolicy] = {
    "required": "Required",
    "preferred": "Preferred",
    "none": "None",
}


class TraceError(PermanentError, ValueError):
    """A trace row that cannot be read; the message names the file, line and column."""


@dataclass(slots=True)
class TraceJob:
    """One trace row with defaults applied (``topology`` is ``Required|Preferred|None``)."""

    job_id: str
    submit_s: float
    gpus: int
    duration_s: float
    gpus_per_pod: int
    topology: NVLinkPolicy
    gpu_product: str | None = None
    queue: str = "default"
    priority: int = 0
    #: checkpoint interval, seconds (None: the job does not checkpoint)
    checkpoint_s: float | None = None
    #: declared time limit, seconds (None: none; :mod:`.timelimits` draws one by default)
    time_limit_s: float | None = None

    @property
    def pods(self) -> int:
        """Pods of the job (``gpus / gpus_per_pod``)."""
        return self.gpus // self.gpus_per_pod


def read_trace(
    path: str | Path, *, queue_column: str = "queue", queue_prefix: str = ""
) -> list[TraceJob]:
    """Read a trace CSV (header required; docs/design.md §6), in file order.

    ``queue_column``: the column naming each job's queue (default ``queue``; the ITP trace's
    ``cluster``, a virtual cluster, i.e. a tenant), its value prefixed with ``queue_prefix``
    (``vc`` gives ``vc4``); an empty or absent value is the ``default`` queue.

    Raises :class:`TraceError` naming line and column for a missing column, a non-number (or
    a NaN / infinite one), a GPU count that is not a multiple of ``gpus_per_pod``, an unknown
    topology or a repeated ``job_id``; and naming the file when it cannot be read, is not
    UTF-8 text or holds no jobs.
    """
    where = str(path)
    jobs: list[TraceJob] = []
    seen: dict[str, int] = {}
    line = 0
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            reader = csv.DictReader(fh)
            cols = set(reader.fieldnames or ())
            missing = [c for c in ("job_id", "submit_s", "gpus", "duration_s") if c not in cols]
            if missing:
                raise TraceError(
                    f"{where}: missing column(s) {', '.join(missing)}; a trace needs "
                    "job_id,submit_s,gpus,duration_s (optional gpus_per_pod,topology,gpu_product,"
                    "queue,priority,checkpoint_s,time_limit_s)"
                )
            for row in reader:
                line = reader.line_num
                job = _row(where, line, row, queue_column, queue_prefix)
                first = seen.setdefault(job.job_id, line)
                if first != line:
                    raise TraceError(
                        f"{where} line {line}: job_id: {job.job_id!r} repeats line {first}; "
                        "every job needs its own id"
                    )
                jobs.append(job)
    except UnicodeDecodeError as exc:
        raise TraceError(
            f"{where}: not a UTF-8 CSV file ({exc.reason} at byte {exc.start})"
        ) from None
    except csv.Error as exc:
        raise TraceError(f"{where} line {line + 1}: not valid CSV ({exc})") from None
    except OSError as exc:
        raise TraceError(f"{where}: cannot read the trace file: {exc.strerror or exc}") from None
    if not jobs:
        raise TraceError(f"{where}: no jobs (the trace has a header but no rows)")
    return jobs


def _number(where: str, line: int, row: Mapping[str, str], col: str, kind: type) -> Any:
    raw = (row.get(col) or "").strip()
    try:
        value = kind(raw)
    except ValueError:
        raise TraceError(
            f"{where} line {line}: {col}: {raw!r} is not {'an integer' if kind is int else 'a number'}"
        ) from None
    if not math.isfinite(value):
        raise TraceError(f"{where} line {line}: {col}: {raw!r} is not a finite number")
    if value < 0:
        raise TraceError(f"{where} line {line}: {col}: {raw!r} is negative")
    return value


def _row(
    where: str, line: int, row: Mapping[str, str], queue_column: str, queue_prefix: str
) -> TraceJob:
    queue = (row.get(queue_column) or "").strip()
    gpus = _number(where, line, row, "gpus", int)
    if gpus < 1:
        raise TraceError(f"{where} line {line}: gpus: must be at least 1")
    explicit = bool((row.get("gpus_per_pod") or "").strip())
    per_pod = _number(where, line, row, "gpus_per_pod", int) if explicit else min(gpus, 8)
    if not explicit and gpus % per_pod:
        raise TraceError(
            f"{where} line {line}: gpus: {gpus} is not a multiple of the default gpus_per_pod "
            f"min(gpus, 8) = {per_pod}; add a gpus_per_pod column that divides it"
        )
    if per_pod < 1 or gpus % per_pod:
        raise TraceError(
            f"{where} line {line}: gpus_per_pod: {per_pod} does not divide gpus {gpus}"
        )
    raw_topo = (row.get("topology") or "").strip().lower()
    if raw_topo and raw_topo not in _TOPOLOGY:
        raise TraceError(
            f"{where} line {line}: topology: {raw_topo!r} is not required, preferred or none"
        )
    default: NVLinkPolicy = "Required" if gpus == per_pod else "Preferred"
    topology = _TOPOLOGY[raw_topo] if raw_topo else default
    return TraceJob(
        job_id=(row.get("job_id") or str(line)).strip(),
        submit_s=_number(where, line, row, "submit_s", float),
        gpus=gpus,
        duration_s=_number(where, line, row, "duration_s", float),
        gpus_per_pod=per_pod,
        topology=topology,
        gpu_product=(row.get("gpu_product") or "").strip() or None,
        queue=f"{queue_prefix}{queue}" if queue else "default",
        priority=(
            _number(where, line, row, "priority", int) if (row.get("priority") or "").strip() else 0
        ),
        checkpoint_s=_checkpoint(where, line, row),
        time_limit_s=_positive(where, line, row, "time_limit_s", "a job without a limit"),
    )


def _checkpoint(where: str, line: int, row: Mapping[str, str]) -> float | None:
    """The optional ``checkpoint_s`` column: an interval > 0, or empty for none."""
    return _positive(where, line, row, "checkpoint_s", "a job that does not checkpoint")


def _positive(
    where: str, line: int, row: Mapping[str, str], col: str, empty_means: str
) -> float | None:
    """An optional column of seconds > 0, or None when empty or absent."""
    if not (row.get(col) or "").strip():
        return None
    value: float = _number(where, line, row, col, float)
    if value <= 0:
        raise TraceError(
            f"{where} line {line}: {col}: must be > 0 (leave it empty for {empty_means})"
        )
    return value
