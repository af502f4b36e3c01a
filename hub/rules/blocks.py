"""One member's NVLink blocks as the hub sees them now: the body of the hub's
``GET /fleet/members/<name>/blocks`` (``hub/edge/http.py``), drawn by ``gpufed console``.

Pure over the placement snapshot's public readers (:meth:`FleetSnapshot.member`, ``free``,
``outstanding``): per NVLink domain (an HGX node ``node:<name>``, an NVL72 clique
``clique:<id>``), whole GPUs ``used`` (requested by bound pods), ``reserved`` (promised to
placed jobs whose pods are not bound yet), ``free`` (what placement may use) and
``unavailable`` (on nodes not Ready, cordoned or degraded). Nodes without whole GPUs (MIG-only,
CPU) are left out.

Bounded: at most ``max_blocks`` blocks (sorted by domain; ``truncated`` counts the rest) and
:data:`MAX_NODES_PER_BLOCK` node names per block, so one answer stays under about 1 MB even
for a 5,000-node member.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpufed.api.labels import GPU_RESOURCE
from gpufed.placement import FleetSnapshot

__all__ = ["MAX_BLOCKS", "MAX_NODES_PER_BLOCK", "member_blocks"]

#: Most blocks one answer carries (a 5,000-node HGX member has 5,000).
MAX_BLOCKS = 10_000
#: Most node names listed per block (an NVL72 clique has 18 trays).
MAX_NODES_PER_BLOCK = 72


def member_blocks(
    snapshot: FleetSnapshot,
    member: str,
    *,
    held: Mapping[str, int] | None = None,
    max_blocks: int = MAX_BLOCKS,
) -> dict[str, Any]:
    """``{"member", "ready", "nodes", "blocks": [{"domain", "product", "gpus", "used",
    "reserved", "held", "free", "unavailable", "nodes"}], "truncated"}`` for one member,
    blocks by domain. GPU counts are whole GPUs; ``gpus`` = used + reserved + held + free +
    unavailable. ``held``: per node, the GPUs a waiting preemptor's hold keeps there (part of
    what the snapshot shows reserved; shown apart). Raises ``KeyError`` naming the member when
    the snapshot has no such member."""
    held = held or {}
    state = snapshot.member(member)
    blocks: dict[str, dict[str, Any]] = {}
    for inv in state.inventory.nodes:
        alloc = inv.allocatable.get(GPU_RESOURCE, 0)
        if alloc <= 0:
            continue
        offers = inv.ready and not inv.unschedulable and inv.degraded is None
        b = blocks.setdefault(
            inv.nvlink_domain,
            {
                "domain": inv.nvlink_domain,
                "product": inv.gpu_product or "unknown",
                "gpus": 0,
                "used": 0,
                "reserved": 0,
                "held": 0,
                "free": 0,
                "unavailable": 0,
                "nodes": [],
            },
        )
        b["gpus"] += alloc
        if len(b["nodes"]) < MAX_NODES_PER_BLOCK:
            b["nodes"].append(inv.name)
        if not offers:
            b["unavailable"] += alloc
            continue
        free = snapshot.free(member, inv.name)
        reserved = min(
            snapshot.outstanding(member, inv.name).get(GPU_RESOURCE, 0), max(0, alloc - free)
        )
        kept = min(held.get(inv.name, 0), reserved)
        b["free"] += free
        b["reserved"] += reserved - kept
        b["held"] += kept
        b["used"] += max(0, alloc - free - reserved)
    ordered = [blocks[k] for k in sorted(blocks)]
    return {
        "member": member,
        "ready": state.health.ready,
        "nodes": len(state.inventory.nodes),
        "blocks": ordered[:max_blocks],
        "truncated": max(0, len(ordered) - max_blocks),
    }
