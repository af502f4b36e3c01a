"""The jobs pages' data: the filtered job list and one job's timeline (pure; part of
:mod:`gpufed.console.views`).

* :func:`job_rows`: GPUJobs filtered by namespace, queue and phase, newest first.
* :func:`timeline`: what happened to one job, oldest first, from its status and its Events.
* :func:`age`: ``3m``, ``2h`` since a time.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from gpufed.api.gpujob import GPUJob

__all__ = ["PHASES", "JobRow", "TimelineEntry", "age", "job_rows", "queue_of", "timeline"]

PHASES = ("Pending", "Placed", "Running", "Succeeded", "Failed", "Lost")


def _time(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        t = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return t if t.tzinfo else t.replace(tzinfo=UTC)


def age(value: str | None, now: datetime) -> str:
    """``3m``, ``2h``, ``5d`` since the RFC 3339 ``value`` (``-`` when absent)."""
    t = _time(value)
    if t is None:
        return "-"
    secs = max(0, int((now - t).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if secs >= size:
            return f"{secs // size}{unit}"
    return f"{secs}s"


def queue_of(job: Mapping[str, Any], namespace_queue: Mapping[str, str]) -> str:
    """The queue a GPUJob is charged to: ``spec.placement.queue``, else the queue listing its
    namespace (``namespace_queue``), else ``""`` (the hub's default queue)."""
    named = ((job.get("spec") or {}).get("placement") or {}).get("queue")
    if named:
        return str(named)
    return namespace_queue.get((job.get("metadata") or {}).get("namespace", ""), "")


@dataclass(frozen=True)
class JobRow:
    """One GPUJob in the list."""

    namespace: str
    name: str
    queue: str
    phase: str
    cluster: str
    gpus: int | None
    created: str | None
    message: str


def job_rows(
    items: Iterable[Mapping[str, Any]],
    namespace_queue: Mapping[str, str],
    *,
    namespace: str = "",
    queue: str = "",
    phase: str = "",
) -> list[JobRow]:
    """GPUJobs matching every filter given (empty: any), newest first (creation time, then
    namespace and name)."""
    rows = []
    for raw in items:
        meta = raw.get("metadata") or {}
        status = raw.get("status") or {}
        row = JobRow(
            namespace=meta.get("namespace", ""),
            name=meta.get("name", ""),
            queue=queue_of(raw, namespace_queue),
            phase=status.get("phase") or "Pending",
            cluster=status.get("cluster") or "",
            gpus=status.get("gpus"),
            created=meta.get("creationTimestamp"),
            message=status.get("message") or "",
        )
        if namespace and row.namespace != namespace:
            continue
        if queue and row.queue != queue:
            continue
        if phase and row.phase != phase:
            continue
        rows.append(row)
    rows.sort(key=lambda r: (r.namespace, r.name))
    rows.sort(key=lambda r: _time(r.created) or datetime.min.replace(tzinfo=UTC), reverse=True)
    return rows


@dataclass(frozen=True)
class TimelineEntry:
    """One thing that happened to a job: ``time`` (RFC 3339 or ``""``), ``kind`` (a CSS
    class: ``submitted``, ``placed``, ``preempted``, ``failure``, ``end``, ``event``, …),
    ``title`` and ``detail``."""

    time: str
    kind: str
    title: str
    detail: str = ""


_EVENT_KIND = {
    "Placed": "placed",
    "Preempting": "preempted",
    "Preempted": "preempted",
    "Restarting": "failure",
    "InfrastructureFailure": "failure",
    "ClusterLost": "failure",
    "Running": "running",
    "Succeeded": "end",
    "Failed": "end",
}


def timeline(raw: Mapping[str, Any], events: Iterable[Mapping[str, Any]]) -> list[TimelineEntry]:
    """What happened to one GPUJob, oldest first: submitted, each placement (from Events, and
    the latest decision with its member, nodes and NVLink blocks from the status), dispatch,
    running, preemptions (with the preemptor when known), infrastructure failures with cause
    and nodes, re-runs, the end. Entries without a time go last."""
    job = GPUJob.model_validate(raw)
    s = job.status
    out = [TimelineEntry(job.metadata.creation_timestamp or "", "submitted", "submitted")]
    for e in events:
        when = e.get("lastTimestamp") or e.get("eventTime") or e.get("firstTimestamp") or ""
        reason = str(e.get("reason") or "")
        count = int(e.get("count") or 1)
        title = reason + (f" (x{count})" if count > 1 else "")
        out.append(
            TimelineEntry(str(when), _EVENT_KIND.get(reason, "event"), title, e.get("message", ""))
        )
    if s is not None:
        p = s.placement
        if p is not None and p.outcome == "Placed" and p.cluster:
            nodes = sorted({n for ps in p.pod_sets for n in ps.nodes})
            detail = f"nodes {', '.join(nodes[:16])}" + (" …" if len(nodes) > 16 else "")
            if p.nvlink_domains:
                detail += f"; NVLink blocks {', '.join(p.nvlink_domains[:8])}"
            out.append(
                TimelineEntry(
                    p.decided_time or "",
                    "placed",
                    f"placement decided: {p.cluster}"
                    + (f" ({p.gpu_product})" if p.gpu_product else ""),
                    detail,
                )
            )
        if s.preemption is not None:
            pre = s.preemption
            victims = ", ".join(v.job for v in pre.victims[:8])
            out.append(
                TimelineEntry(
                    pre.time or "",
                    "preempted",
                    f"preempted {len(pre.victims)} job(s) in {pre.cluster} to be placed",
                    f"victims {victims}; {pre.cost_gpu_seconds:.0f} GPU-seconds lost",
                )
            )
        for r in s.restart_history:
            out.append(
                TimelineEntry(
                    r.time or "",
                    "failure",
                    f"attempt {r.attempt} failed in {r.cluster}: {r.reason}",
                    f"nodes {', '.join(r.nodes[:8]) or '-'}; {r.message}".rstrip("; "),
                )
            )
        for c in s.conditions:
            if c.type in ("Dispatched", "Preempted", "Finished", "ClusterLost") and (
                c.status == "True"
            ):
                kind = {"Preempted": "preempted", "Finished": "end", "ClusterLost": "failure"}
                out.append(
                    TimelineEntry(
                        c.last_transition_time or "",
                        kind.get(c.type, "placed"),
                        f"{c.type}: {c.reason}",
                        c.message,
                    )
                )
        if s.start_time:
            out.append(TimelineEntry(s.start_time, "running", "workload started in the member"))
        if s.completion_time:
            out.append(TimelineEntry(s.completion_time, "end", f"ended: {s.phase}"))
    never = datetime.max.replace(tzinfo=UTC)
    out.sort(key=lambda e: _time(e.time) or never)
    return [TimelineEntry(_rfc3339(e.time), e.kind, e.title, e.detail) for e in out]


def _rfc3339(value: str) -> str:
    """One spelling for every time shown (Events say ``+00:00``, statuses ``Z``)."""
    t = _time(value)
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ") if t else value
