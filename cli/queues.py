"""``gpufed get queues``: the GPUQueue tree as the hub reports it (``GPUQueue.status``).

Registered on the ``get`` group of :mod:`gpufed.cli.jobs` by :mod:`gpufed.cli.main`; talks to the hub cluster's API
server only, like the other ``get`` commands. Rows come in tree order (each root, then its
children by name, indented); a queue whose parent is missing or that sits in a cycle of
parents is shown as a root (its ``Active=False`` message says why). ``--json`` prints one
object per queue.
"""

from __future__ import annotations

import json
from typing import Any

import typer

from gpufed.api.labels import GROUP, VERSION
from gpufed.api.queue import ACTIVE_CONDITION, GPUQueue
from gpufed.cli.jobs import (
    AsJSON,
    Context,
    Kubeconfig,
    _api_errors,
    _Kube,
    _reachable,
    _table,
)


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


def _usage_text(usage: list[dict[str, Any]]) -> str:
    parts = []
    for u in usage:
        text = f"{u['gpuProduct']}={u['used']}/{u['nominal']}"
        if u.get("borrowed"):
            text += f" (+{u['borrowed']} borrowed)"
        parts.append(text)
    return ", ".join(parts) or "-"


def get_queues(
    kubeconfig: Kubeconfig = None, context: Context = None, as_json: AsJSON = False
) -> None:
    """List GPUQueues as a tree: Active, GPUs used/nominal per product, pending and admitted
    jobs, fair share (docs/design.md §8)."""
    kube = _Kube(kubeconfig, context)
    with _reachable(kube), _api_errors("gpuqueues"):
        resp = kube.custom.list_cluster_custom_object(GROUP, VERSION, "gpuqueues")
    rows = queue_rows(resp.get("items", []))
    if as_json:
        typer.echo(json.dumps(rows))
        return
    if not rows:
        typer.echo("No GPUQueues (every GPUJob is in the hub's default queue, without limit).")
        return
    table = [["NAME", "ACTIVE", "USED/NOMINAL", "PENDING", "ADMITTED", "FAIR-SHARE", "MESSAGE"]]
    for r in rows:
        table.append(
            [
                "  " * r["depth"] + str(r["name"]),
                str(r["active"]),
                _usage_text(r["usage"]),
                "-" if r["pending_jobs"] is None else str(r["pending_jobs"]),
                "-" if r["admitted_jobs"] is None else str(r["admitted_jobs"]),
                str(r["fair_share"] or "-"),
                "" if r["active"] == "True" else str(r["message"]),
            ]
        )
    _table(table)
