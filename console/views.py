"""What each console page shows, as plain data: pure functions from hub objects (dicts as the
API server returns them) to view models the templates render.

No I/O and no clock (``now`` is passed in): :mod:`gpufed.console.server` reads with
:mod:`gpufed.console.reader` and renders these with its templates; the unit tests check them
against hand-built objects.

* :func:`fleet`: one :class:`MemberView` per MemberCluster: its state (``Ready``, ``NotReady``
  with the reason, ``Lost``), and per GPU product the GPUs used / reserved / free and the
  largest free NVLink block.
* :func:`with_blocks`: the same, with each member's NVLink blocks from the hub
  (:class:`BlockView`: one cell per GPU, or one per block when a member has too many GPUs to
  draw each), suspect nodes' blocks marked, and the fragmentation they show (blocks wholly
  free, free GPUs stranded in partly used blocks).
* :func:`queue_tree`: the GPUQueue tree depth first (roots and siblings by name), with each
  quota key's nominal, used, borrowed and idle (nominal not used, what others may borrow).
* :func:`sparkline`: an SVG polyline of a queue's fair share over time.
* :func:`job_rows`: GPUJobs filtered by namespace, queue and phase, newest first.
* :func:`timeline`: what happened to one job, oldest first, from its status and its Events.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from gpufed.api.gpujob import GPUJob
from gpufed.api.membercluster import READY_CONDITION, MemberCluster
from gpufed.api.queue import ACTIVE_CONDITION, GPUQueue

__all__ = [
    "MAX_CELLS",
    "PHASES",
    "BlockView",
    "JobRow",
    "MemberView",
    "ProductBar",
    "QueueView",
    "TimelineEntry",
    "age",
    "fleet",
    "job_rows",
    "queue_of",
    "queue_tree",
    "sparkline",
    "timeline",
    "with_blocks",
]

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


# --- fleet -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProductBar:
    """One GPU product of a member: whole GPUs ``total`` = ``used`` + ``reserved`` + ``free``
    (on Ready, schedulable nodes) and ``largest_block`` free GPUs in one NVLink domain."""

    product: str
    total: int
    used: int
    reserved: int
    free: int
    largest_block: int

    def percent(self, part: int) -> float:
        """``part`` as a percentage of ``total`` (bar widths)."""
        return 100.0 * part / self.total if self.total else 0.0


@dataclass(frozen=True)
class MemberView:
    """One MemberCluster: ``state`` is ``Ready``, ``NotReady`` or ``Lost`` (``Unknown`` before
    the hub judged it), ``reason`` the Ready condition's reason."""

    name: str
    state: str
    reason: str
    message: str
    nodes: int
    heartbeat: str | None
    agent_version: str
    labels: Mapping[str, str]
    products: list[ProductBar]
    largest_block: int
    suspects: list[tuple[str, str, str]]
    #: the hub's NVLink blocks (None: not had, see the page's notes)
    blocks: list[BlockView] | None = None
    #: blocks the hub left out of its answer (its bound)
    blocks_truncated: int = 0
    #: True when the member has more than :data:`MAX_CELLS` GPUs: one cell per block
    compact: bool = False

    @property
    def whole_free_blocks(self) -> int:
        """Blocks with every GPU free (what a job that needs a whole domain can have)."""
        return sum(1 for b in self.blocks or [] if b.gpus and b.free == b.gpus)

    @property
    def stranded(self) -> int:
        """Free GPUs in partly used blocks: the fragmentation a whole-domain job cannot use."""
        return sum(b.free for b in self.blocks or [] if 0 < b.free < b.gpus)


#: Most GPU cells drawn for one member; above it each block is one cell coloured by its state.
MAX_CELLS = 4096


@dataclass(frozen=True)
class BlockView:
    """One NVLink domain of a member (an HGX node, an NVL72 clique): whole GPUs ``used``,
    ``reserved``, ``free`` and ``unavailable`` (nodes not Ready, cordoned or degraded), and
    ``suspect`` when one of its nodes is on the member's suspect list."""

    domain: str
    product: str
    used: int
    reserved: int
    free: int
    unavailable: int
    suspect: bool
    nodes: tuple[str, ...]

    @property
    def gpus(self) -> int:
        return self.used + self.reserved + self.free + self.unavailable

    def cells(self) -> list[str]:
        """One CSS class per GPU, in the order used, reserved, unavailable, free."""
        bad = "suspect" if self.suspect else "unavailable"
        return (
            ["used"] * self.used
            + ["reserved"] * self.reserved
            + [bad] * self.unavailable
            + ["free"] * self.free
        )

    @property
    def state(self) -> str:
        """One word for the whole block (compact drawing): ``free`` (all free), ``partial``
        (some free), ``full`` (none free), ``suspect`` or ``unavailable``."""
        if self.suspect:
            return "suspect"
        if self.unavailable == self.gpus:
            return "unavailable"
        if self.free == self.gpus:
            return "free"
        return "partial" if self.free else "full"


def with_blocks(
    members: list[MemberView], answers: Mapping[str, Mapping[str, Any]]
) -> list[MemberView]:
    """``members`` with the hub's blocks of each member that has an answer in ``answers``
    (member -> the JSON of ``GET /fleet/members/<name>/blocks``)."""
    out = []
    for m in members:
        answer = answers.get(m.name)
        if answer is None:
            out.append(m)
            continue
        suspects = {node for node, _, _ in m.suspects}
        blocks = [
            BlockView(
                domain=str(b.get("domain", "")),
                product=str(b.get("product", "")),
                used=int(b.get("used", 0)),
                reserved=int(b.get("reserved", 0)),
                free=int(b.get("free", 0)),
                unavailable=int(b.get("unavailable", 0)),
                suspect=bool(suspects.intersection(b.get("nodes") or [])),
                nodes=tuple(str(n) for n in b.get("nodes") or []),
            )
            for b in answer.get("blocks") or []
        ]
        out.append(
            replace(
                m,
                blocks=blocks,
                blocks_truncated=int(answer.get("truncated") or 0),
                compact=sum(b.gpus for b in blocks) > MAX_CELLS,
            )
        )
    return out


def fleet(items: Iterable[Mapping[str, Any]]) -> list[MemberView]:
    """One :class:`MemberView` per MemberCluster object, by name."""
    out = []
    for raw in items:
        mc = MemberCluster.model_validate(raw)
        s = mc.status
        ready = next((c for c in (s.conditions if s else []) if c.type == READY_CONDITION), None)
        if s is not None and (s.lost_time or (ready and ready.reason == "ClusterLost")):
            state = "Lost"
        elif ready is None:
            state = "Unknown"
        else:
            state = "Ready" if ready.status == "True" else "NotReady"
        products = []
        for product, total in sorted((s.gpus_total if s else {}).items()):
            free = (s.gpus_free if s else {}).get(product, 0)
            reserved = min((s.gpus_reserved if s else {}).get(product, 0), max(0, total - free))
            products.append(
                ProductBar(
                    product=product,
                    total=total,
                    used=max(0, total - free - reserved),
                    reserved=reserved,
                    free=free,
                    largest_block=(s.largest_free_nvlink_block_by_product if s else {}).get(
                        product, 0
                    ),
                )
            )
        out.append(
            MemberView(
                name=mc.metadata.name or "",
                state=state,
                reason=ready.reason if ready else "",
                message=ready.message if ready else "",
                nodes=(s.nodes or 0) if s else 0,
                heartbeat=s.last_heartbeat_time if s else None,
                agent_version=(s.agent_version or "") if s else "",
                labels=dict(mc.spec.labels),
                products=products,
                largest_block=(s.largest_free_nvlink_block or 0) if s else 0,
                suspects=[
                    (x.node, x.reason, x.until or "") for x in (s.suspect_nodes if s else [])
                ],
            )
        )
    return sorted(out, key=lambda m: m.name)


# --- queues ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class QuotaLine:
    """One quota key of a queue: ``idle`` = nominal not used (what the tree may borrow)."""

    key: str
    nominal: int
    used: int
    borrowed: int
    borrowing_limit: int | None
    lending_limit: int | None

    @property
    def idle(self) -> int:
        return max(0, self.nominal - self.used)


@dataclass
class QueueView:
    """One GPUQueue at ``depth`` in the tree (0: a root)."""

    name: str
    depth: int
    parent: str | None
    namespaces: list[str]
    active: str
    active_message: str
    weight: int
    fair_share: str
    pending: int | None
    admitted: int | None
    quotas: list[QuotaLine] = field(default_factory=list)


def queue_tree(items: Iterable[Mapping[str, Any]]) -> list[QueueView]:
    """Every GPUQueue depth first (roots, then each queue's children by name). A queue whose
    parent is not among ``items`` (not readable, or absent) is shown as a root; a cycle is
    broken where it is met (the hub marks such a queue ``Active=False``)."""
    queues = {q.metadata.name or "": q for q in (GPUQueue.model_validate(r) for r in items)}
    children: dict[str | None, list[str]] = {}
    for name, q in queues.items():
        parent = q.spec.parent if q.spec.parent in queues else None
        children.setdefault(parent, []).append(name)
    out: list[QueueView] = []
    seen: set[str] = set()

    def visit(name: str, depth: int) -> None:
        if name in seen:
            return
        seen.add(name)
        q = queues[name]
        s = q.status
        active = next((c for c in (s.conditions if s else []) if c.type == ACTIVE_CONDITION), None)
        usage = {u.gpu_product: u for u in (s.usage if s else [])}
        keys = [x.gpu_product for x in q.spec.quotas] + sorted(
            k for k in usage if k not in {x.gpu_product for x in q.spec.quotas}
        )
        spec = {x.gpu_product: x for x in q.spec.quotas}
        lines = []
        for key in keys:
            u = usage.get(key)
            sq = spec.get(key)
            lines.append(
                QuotaLine(
                    key=key,
                    nominal=sq.nominal if sq else (u.nominal if u else 0),
                    used=u.used if u else 0,
                    borrowed=u.borrowed if u else 0,
                    borrowing_limit=sq.borrowing_limit if sq else None,
                    lending_limit=sq.lending_limit if sq else None,
                )
            )
        out.append(
            QueueView(
                name=name,
                depth=depth,
                parent=q.spec.parent,
                namespaces=list(q.spec.namespaces),
                active=active.status if active else "Unknown",
                active_message=active.message if active else "",
                weight=q.spec.fair_share.weight,
                fair_share=(s.fair_share or "-") if s else "-",
                pending=s.pending_jobs if s else None,
                admitted=s.admitted_jobs if s else None,
                quotas=lines,
            )
        )
        for child in sorted(children.get(name, [])):
            visit(child, depth + 1)

    for root in sorted(children.get(None, [])):
        visit(root, 0)
    for name in sorted(queues):  # members of a cycle: no root leads to them
        visit(name, 0)
    return out


def sparkline(points: Iterable[tuple[float, float]], *, width: int = 160, height: int = 28) -> str:
    """The ``points`` attribute of an SVG ``<polyline>`` drawing ``(time, value)`` samples in a
    ``width`` x ``height`` box: time left to right over the samples' span, value bottom (0) to
    top (the largest value); ``""`` with fewer than 2 samples. Times in seconds, any origin."""
    pts = sorted(points)
    if len(pts) < 2:
        return ""
    t0, t1 = pts[0][0], pts[-1][0]
    top = max(v for _, v in pts) or 1.0
    span = (t1 - t0) or 1.0
    return " ".join(
        f"{(t - t0) / span * width:.1f},{height - v / top * height:.1f}" for t, v in pts
    )


# --- jobs --------------------------------------------------------------------------------------


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
