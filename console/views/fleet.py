"""The fleet page's data: one :class:`MemberView` per MemberCluster (pure; part of
:mod:`gpufed.console.views`).

* :func:`fleet`: each member's state (``Ready``, ``NotReady`` with the reason, ``Lost``), and per
  GPU product the GPUs used / reserved / free and the largest free NVLink block.
* :func:`with_blocks`: the same, with each member's NVLink blocks from the hub
  (:class:`BlockView`: one cell per GPU, or one per block when a member has too many GPUs to
  draw each), suspect nodes' blocks marked, and the fragmentation they show (blocks wholly
  free, free GPUs stranded in partly used blocks).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from gpufed.api.membercluster import READY_CONDITION, MemberCluster

__all__ = ["MAX_CELLS", "BlockView", "MemberView", "ProductBar", "fleet", "with_blocks"]


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
    ``reserved``, ``held`` (for a waiting preemptor), ``free`` and ``unavailable`` (nodes not
    Ready, cordoned or degraded), and ``suspect`` when one of its nodes is on the member's
    suspect list."""

    domain: str
    product: str
    used: int
    reserved: int
    free: int
    unavailable: int
    suspect: bool
    nodes: tuple[str, ...]
    held: int = 0

    @property
    def gpus(self) -> int:
        return self.used + self.reserved + self.held + self.free + self.unavailable

    def cells(self) -> list[str]:
        """One CSS class per GPU, in the order used, reserved, held, unavailable, free."""
        bad = "suspect" if self.suspect else "unavailable"
        return (
            ["used"] * self.used
            + ["reserved"] * self.reserved
            + ["held"] * self.held
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
                held=int(b.get("held", 0)),
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
