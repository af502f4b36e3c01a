"""Score plugins of placement (0-100 each; ``place()`` takes their weighted mean):
NVLinkBestFit, ResourceAllocation, TopologyLocality (TopologyCost is :mod:`.topocost`), and a
plan's scores under them (:class:`Scored`, what ``place()`` remembers with a plan)."""

from __future__ import annotations

from typing import ClassVar

from gpufed.placement.fit import Plan
from gpufed.placement.index import PoolState
from gpufed.placement.memo import PoolMemo
from gpufed.placement.pluginapi import Scorer
from gpufed.placement.shape import JobShape
from gpufed.placement.topocost import Destroyed, TopologyCost, destroyed


# --- scorers ----------------------------------------------------------------------------------------
class NVLinkBestFit:
    """Fewest stranded GPUs: ``100 * GPUs placed / free GPUs of the NVLink domains used``.

    1 GPU on a node with 1 free scores 100, on an idle 8-GPU node 12.5; 4 trays of an NVL72
    clique with 16 free score 100, with 72 free 22. Fully-free domains are therefore broken
    only when no tighter fit exists.
    """

    name: ClassVar[str] = "NVLinkBestFit"

    def __init__(self, weight: float) -> None:
        self.weight = weight

    def bound(self, job: JobShape, pool: PoolState | None, memo: PoolMemo | None) -> float:
        if pool is None or pool.slices or len(job.gpu_sets) != 1 or not job.grouped_only:
            return 100.0
        s = job.gpu_sets[0]
        tight = (
            memo.tightest_domain(s.gpus, s.count)
            if memo is not None
            else pool.tightest_domain(s.gpus, s.count)
        )
        return 100.0 * job.demand / tight if tight else 0.0

    def score(self, job: JobShape, plan: Plan) -> float:
        return plan.fit


class ResourceAllocation:
    """``binpack``: GPUs of the product used in the member after placement (percent);
    ``spread``: the free part left. Jobs without whole GPUs score 50. The mode is the job's
    own (``PlacementRequest.allocation``, from ``spec.placement.allocation``) when it sets one,
    else the policy's (``mode``)."""

    name: ClassVar[str] = "ResourceAllocation"

    def __init__(self, weight: float, mode: str) -> None:
        self.weight = weight
        self.mode = mode

    def bound(self, job: JobShape, pool: PoolState | None, memo: PoolMemo | None) -> float:
        return self._share(job, pool)

    def score(self, job: JobShape, plan: Plan) -> float:
        return self._share(job, plan.pool)

    def _share(self, job: JobShape, pool: PoolState | None) -> float:
        if pool is None or pool.cap <= 0:
            return 50.0
        if (job.request.allocation or self.mode) == "spread":
            return 100.0 * (pool.free - job.demand) / pool.cap
        return 100.0 * (pool.cap - pool.free + job.demand) / pool.cap


class TopologyLocality:
    """NVLink / rack / block wishes met: 100 when all GPU pods share the finest wished level,
    ``100*(k-i)/k`` when they share the i-th of k wished levels, 0 when none (100 without
    wishes)."""

    name: ClassVar[str] = "TopologyLocality"

    def __init__(self, weight: float) -> None:
        self.weight = weight

    def bound(self, job: JobShape, pool: PoolState | None, memo: PoolMemo | None) -> float:
        return 100.0

    def score(self, job: JobShape, plan: Plan) -> float:
        return plan.topo


# --- a plan's scores ---------------------------------------------------------------------------
class Scored:
    """A plan and its scores under one policy's scorers: ``parts`` (each scorer's 0-100 score,
    in the scorers' order), ``total`` (their weighted mean) and ``cost`` (what the plan
    destroys, when TopologyCost is a scorer: the ``Placed`` message says it). Remembered in
    the pool memo with the plan, so a remembered plan is scored once per pool version, not
    once per decision."""

    __slots__ = ("cost", "parts", "plan", "total")

    def __init__(
        self, plan: Plan, parts: tuple[float, ...], total: float, cost: Destroyed | None
    ) -> None:
        self.plan = plan
        self.parts = parts
        self.total = total
        self.cost = cost


def scored_plan(job: JobShape, plan: Plan, scorers: tuple[Scorer, ...], total_w: float) -> Scored:
    """``plan``'s :class:`Scored` under ``scorers`` (``total_w``: the sum of their weights)."""
    cost: Destroyed | None = None
    parts: list[float] = []
    for sc in scorers:
        if isinstance(sc, TopologyCost):
            cost = destroyed(job, plan)
            parts.append(sc.score_of(cost))
        else:
            parts.append(sc.score(job, plan))
    total = sum(sc.weight * p for sc, p in zip(scorers, parts, strict=True)) / total_w
    return Scored(plan, tuple(parts), total, cost)
