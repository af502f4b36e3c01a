"""What a placement destroys: the TopologyCost scorer and the clique tier of ``place()``.

Called by :mod:`.plugins` (the scorer, in every policy's tuple) and :mod:`.engine` (the tier).
Pure: reads a plan and the pool's indexes before the plan is applied.

* **TopologyCost** (0-100): ``100 x GPUs placed / (GPUs placed + GPUs destroyed)``, where a
  plan destroys (a) the free GPUs of every *whole* node it breaks (an idle HGX node, an idle
  GB200 tray) that the job itself does not use: they are stranded for any job that needs a
  whole node or tray; and (b) what it takes off the pool's **largest free NVLink block** (the
  most free GPUs of one NVLink domain: an HGX node, or an NVL72 clique) beyond the GPUs the job
  puts there: 1 GPU in the only idle clique's last free tray costs the clique jobs a block
  of 72. A plan that uses only partly used nodes and leaves the largest block whole scores 100.
  Among members and nodes where a job fits equally well (NVLinkBestFit, ResourceAllocation),
  the cheaper plan wins.
* **The clique tier**: a job that has no use for a multi-node NVLink domain (one GPU pod, or
  several with ``nvlink: None``) is planned in pools of NVL72 cliques only when no other pool
  can take it now: candidates are ordered by tier before score.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from gpufed.placement.fit import Plan
from gpufed.placement.index import PoolState
from gpufed.placement.memo import PoolMemo
from gpufed.placement.shape import JobShape


def clique_tier(job: JobShape, pool: PoolState | None) -> int:
    """1 when ``pool`` has multi-node NVLink domains (NVL72 cliques) and ``job`` has no use for
    one: a single GPU pod (it sits in one node wherever it goes), or several with ``nvlink:
    None``; else 0. ``place()`` plans tier 0 candidates first and uses tier 1 only when none of
    them fits."""
    if pool is None or pool.slices or pool.single_count == len(pool.nodes):
        return 0
    wants_clique = job.gpu_pods > 1 and job.request.topology.nvlink != "None"
    return 0 if wants_clique else 1


@dataclass(frozen=True, slots=True)
class Destroyed:
    """What one plan destroys in its pool: ``whole_nodes`` broken, the free GPUs of those nodes
    the job leaves stranded (``stranded``), the pool's largest free NVLink block before and
    after (GPUs), and the GPUs the job places (``placed``)."""

    whole_nodes: int
    stranded: int
    block_before: int
    block_after: int
    placed: int

    @property
    def lost(self) -> int:
        """GPUs destroyed: stranded plus the block lost beyond the job's own GPUs."""
        return self.stranded + max(0, self.block_before - self.block_after)

    def text(self) -> str:
        """``breaks 1 whole node (7 GPUs stranded), largest free NVLink block 8 -> 7 GPUs``;
        empty when nothing is destroyed."""
        parts = []
        if self.whole_nodes:
            s = "" if self.whole_nodes == 1 else "s"
            parts.append(f"breaks {self.whole_nodes} whole node{s} ({self.stranded} GPUs stranded)")
        if self.block_after < self.block_before:
            parts.append(
                f"largest free NVLink block {self.block_before} -> {self.block_after} GPUs"
            )
        return ", ".join(parts)


def destroyed(job: JobShape, plan: Plan) -> Destroyed:
    """What ``plan`` destroys (:class:`Destroyed`), judged on the pool's state before it."""
    pool = plan.pool
    used: dict[str, int] = {}
    for s in job.gpu_sets:
        for node, pods in plan.assign[s.index].items():
            used[node] = used.get(node, 0) + pods * s.gpus
    placed = sum(used.values())
    if pool is None or pool.slices or not used:
        return Destroyed(0, 0, 0, 0, placed)
    whole = stranded = 0
    by_domain: dict[str, int] = {}
    single_used: dict[int, int] = {}  # free GPUs before -> HGX nodes of that free used
    for name, g in used.items():
        n = pool.nodes.get(name)
        if n is None:
            continue
        if n.gpu_free == n.gpu_alloc and n.gpu_alloc > 0:
            whole += 1
            stranded += n.gpu_free - g
        if n.domain is None:
            single_used[n.gpu_free] = single_used.get(n.gpu_free, 0) + 1
        by_domain[n.domain_id] = by_domain.get(n.domain_id, 0) + g
    before = max(_largest_single(pool, {}), _largest_clique(pool, {}))
    cliques_used: dict[int, int] = {}
    for dom, free in plan.domains.items():
        if dom.startswith("clique:"):
            cliques_used[free] = cliques_used.get(free, 0) + 1
    after = max(_largest_single(pool, single_used), _largest_clique(pool, cliques_used))
    for dom, free in plan.domains.items():
        after = max(after, free - by_domain.get(dom, 0))
    return Destroyed(whole, stranded, before, after, placed)


def _largest_single(pool: PoolState, used: dict[int, int]) -> int:
    """Most free GPUs of an HGX node (its own NVLink domain) of ``pool`` not in ``used``
    (free GPUs -> nodes used at that value). Clique trays are counted by :func:`_largest_clique`."""
    if not pool.single_count:
        return 0
    all_single = pool.single_count == len(pool.nodes)
    for f in range(len(pool.counts) - 1, 0, -1):
        if not pool.counts[f]:
            continue
        have = (
            pool.counts[f] if all_single else sum(1 for e in pool.buckets[f] if e[2].domain is None)
        )
        if have > used.get(f, 0):
            return f
    return 0


def _largest_clique(pool: PoolState, used: dict[int, int]) -> int:
    """Most free GPUs of a multi-node NVLink domain of ``pool`` not in ``used`` (free GPUs ->
    cliques used at that value)."""
    gb = pool.index("nvlink")
    for free in reversed(gb.keys()):
        if len(gb[free]) > used.get(int(free), 0):
            return int(free)
    return 0


class TopologyCost:
    """Scorer: ``100 x placed / (placed + destroyed)`` (module docstring)."""

    name: ClassVar[str] = "TopologyCost"

    def __init__(self, weight: float) -> None:
        self.weight = weight

    def bound(self, job: JobShape, pool: PoolState | None, memo: PoolMemo | None) -> float:
        return 100.0

    def score(self, job: JobShape, plan: Plan) -> float:
        return self.score_of(destroyed(job, plan))

    @staticmethod
    def score_of(d: Destroyed) -> float:
        """The score of a plan that destroys ``d`` (``place()`` keeps ``d`` for the message)."""
        if d.placed <= 0:
            return 100.0
        return 100.0 * d.placed / (d.placed + d.lost)


def cost_note(
    job: JobShape, plan: Plan, keep_cliques: bool = True, cost: Destroyed | None = None
) -> str:
    """The part of a ``Placed`` message (``gpufed explain``) that says what the plan destroys
    and why an NVL72 pool took a job that needs no clique: ``"; breaks 1 whole node (7 GPUs
    stranded)"``, ``"; NVL72 clique pool: no other pool fits it now"``; empty when neither.
    ``cost``: :func:`destroyed` of this plan if already computed (on the pool's same state)."""
    out = ""
    text = (cost if cost is not None else destroyed(job, plan)).text()
    if text:
        out += f"; {text}"
    if keep_cliques and clique_tier(job, plan.pool):
        out += "; NVL72 clique pool: no other pool fits it now"
    return out
