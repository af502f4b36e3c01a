"""The rows of ``gpufed get queues``: the GPUQueue tree as the hub reports it (``GPUQueue.status``).

The command and its printing are :mod:`gpufed.cli.get` and :mod:`gpufed.cli.output`. Rows come in tree order (each root, then its
children by name, indented); a queue whose parent is missing or that sits in a cycle of
parents is shown as a root (its ``Active=False`` message says why). ``-o json`` prints one
object per queue.
"""

from __future__ import annotations

from typing import Any

from gpufed.api.queue import ACTIVE_CONDITION, GPUQueue


def queue_rows(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``get queues --json``: one object per GPUQueue in tree order, with its ``depth``."""
    queues: dict[str, GPUQueue] = {}
    for raw in items:
        q = GPUQueue.model_validate(raw)
        queues[q.metadata.name] = q
    children: dict[str, list[str]] = {}
    roots = []
    for name, q in sorted(queues.items()):
        parent = q.spec.parent
        if parent is None or parent not in queues:
            roots.append(name)
        else:
            children.setdefault(parent, []).append(name)
    order: list[tuple[str, int]] = []
    seen: set[str] = set()

    def walk(start: str) -> None:
        stack = [(start, 0)]
        while stack:
            name, depth = stack.pop()
            if name in seen:
                continue
            seen.add(name)
            order.append((name, depth))
            stack.extend((c, depth + 1) for c in reversed(children.get(name, [])))

    for name in roots:
        walk(name)
    for name in sorted(queues):  # left over: a cycle of parents
        walk(name)
    out = []
    for name, depth in order:
        q = queues[name]
        s = q.status
        active = next((c for c in (s.conditions if s else []) if c.type == ACTIVE_CONDITION), None)
        out.append(
            {
                "name": name,
                "depth": depth,
                "parent": q.spec.parent,
                "namespaces": list(q.spec.namespaces),
                "weight": q.spec.fair_share.weight,
                "active": active.status if active else "Unknown",
                "message": active.message if active else "the hub has not looked at it yet",
                "usage": [u.model_dump(by_alias=True) for u in (s.usage if s else [])],
                "pending_jobs": s.pending_jobs if s else None,
                "admitted_jobs": s.admitted_jobs if s else None,
                "fair_share": s.fair_share if s else None,
            }
        )
    return out


def usage_text(usage: list[dict[str, Any]]) -> str:
    """``gpuProduct=used/nominal (+borrowed)`` per usage entry, comma-separated ("-": none)."""
    parts = []
    for u in usage:
        text = f"{u['gpuProduct']}={u['used']}/{u['nominal']}"
        if u.get("borrowed"):
            text += f" (+{u['borrowed']} borrowed)"
        parts.append(text)
    return ", ".join(parts) or "-"
