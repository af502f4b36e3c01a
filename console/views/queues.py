"""The queues page's data: the GPUQueue tree and the fair-share line (pure; part of
:mod:`gpufed.console.views`).

* :func:`queue_tree`: the GPUQueue tree depth first (roots and siblings by name), with each
  quota key's nominal, used, borrowed and idle (nominal not used, what others may borrow).
* :func:`sparkline`: an SVG polyline of a queue's fair share over time.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpufed.api.queue import ACTIVE_CONDITION, GPUQueue

__all__ = ["QueueView", "QuotaLine", "queue_tree", "sparkline"]


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
