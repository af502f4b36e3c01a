"""The simulator's queue bookkeeping (``gpufed simulate --queues``): quota, fair order, metrics.

Called by :mod:`.simulate` only. It drives the same pure rules as the hub (:mod:`.quota`,
:mod:`.fairshare`): with ``enforce`` a job is placed only where its queue admits it and queues
are ordered by fair share; with ``none`` the queues are only accounted and the order is
the pass's own (:func:`~gpufed.placement.queue.pass_key`).

Metrics (docs/placement.md, "Simulator"):

- ``quota_exceeded``: scheduling moments (event times, after the pass) at which any queue used
  more than nominal + borrowing limit (:func:`~gpufed.placement.quota.over_limit`);
- ``share_attainment``: sampled each simulated minute; for each queue whose demand (running
  plus waiting GPUs, its own and its descendants') is at least its nominal, ``min(1, used /
  nominal)``; the mean over all samples; ``share_attainment_min``: the worst queue's mean;
- ``queues``: per queue ``{jobs, wait_mean_s, gpu_hours, nominal_gpus}`` (``nominal_gpus``: the
  sum of its whole-GPU entries' nominal; ``gpu_hours`` of the jobs it started, up to the end).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpufed.api.labels import is_mig_resource
from gpufed.api.queue import GPUQueue
from gpufed.api.request import PlacementRequest
from gpufed.placement.fairshare import DEFAULT_HALF_LIFE_S, DecayedUsage, fair_sorted
from gpufed.placement.queue import order_key
from gpufed.placement.quota import QuotaGate, build_tree, over_limit

SAMPLE_S = 60.0


@dataclass
class QueueSim:
    """Queue state of one simulation run (GPUs per queue's own jobs)."""

    gate: QuotaGate
    fair: DecayedUsage
    nominal: dict[str, int]
    waiting: dict[str, int] = field(default_factory=dict)
    running: dict[str, int] = field(default_factory=dict)
    exceeded: int = 0
    _last: float | None = None
    _sum: dict[str, float] = field(default_factory=dict)
    _count: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(
        cls, queues: Sequence[GPUQueue], enforce: bool, half_life_s: float = DEFAULT_HALF_LIFE_S
    ) -> QueueSim:
        """Build from the queues file; raises ``ValueError`` naming each broken queue."""
        tree = build_tree(queues)
        if tree.broken:
            raise ValueError("; ".join(f"queue {n}: {m}" for n, m in sorted(tree.broken.items())))
        nominal = {
            n: sum(q.nominal for k, q in node.quotas.items() if not is_mig_resource(k))
            for n, node in tree.nodes.items()
        }
        return cls(QuotaGate(tree, enforce=enforce), DecayedUsage(half_life_s), nominal)

    def queue(self, req: PlacementRequest) -> str:
        """The queue of a request (unknown names go to the default queue)."""
        q = self.gate.queue(req)
        return q if q in self.gate.tree.nodes else self.gate.tree.default_queue

    def arrive(self, req: PlacementRequest) -> None:
        """A job arrived and waits."""
        q = self.queue(req)
        self.waiting[q] = self.waiting.get(q, 0) + req.gpus

    def start(self, req: PlacementRequest, product: str | None) -> None:
        """A job was placed on ``product``: charge it, move its GPUs to running."""
        q = self.queue(req)
        self.gate.charge(req.model_copy(update={"queue": q}), product)
        self.waiting[q] -= req.gpus
        self.running[q] = self.running.get(q, 0) + req.gpus

    def drop(self, req: PlacementRequest) -> None:
        """A job that will never start (rejected) stops waiting."""
        q = self.queue(req)
        self.waiting[q] -= req.gpus

    def finish(self, req: PlacementRequest) -> None:
        """A job ended: release its quota."""
        q = self.queue(req)
        self.gate.release(req.uid)
        self.running[q] -= req.gpus

    def order(
        self,
        now: float,
        requests: Iterable[PlacementRequest],
        within: Callable[[PlacementRequest], Any] = order_key,
    ) -> list[PlacementRequest]:
        """Fair-share order with ``enforce`` (``within`` each queue), else ``within`` alone
        (the pass's :func:`~gpufed.placement.queue.pass_key`)."""
        self.fair.observe(now, self.running)
        if not self.gate.enforce:
            return sorted(requests, key=within)
        tree = self.gate.tree
        return fair_sorted(
            (
                r if r.queue in tree.nodes else r.model_copy(update={"queue": tree.default_queue})
                for r in requests
            ),
            tree,
            self.fair.shares(tree),
            within,
        )

    def after_pass(self) -> None:
        """Count a moment at which a queue is over its limit."""
        if over_limit(self.gate.tree, self.gate.usage):
            self.exceeded += 1

    def sample_until(self, now: float) -> None:
        """Account the minute samples in ``[last, now)``; the state was constant since last."""
        last, self._last = self._last, now
        if last is None:
            return
        ticks = math.ceil(now / SAMPLE_S) - math.ceil(last / SAMPLE_S)
        if ticks <= 0:
            return
        tree = self.gate.tree
        for name, nominal in self.nominal.items():
            if nominal <= 0:
                continue
            used = demand = 0
            stack = [name]
            while stack:
                n = stack.pop()
                used += self.running.get(n, 0)
                demand += self.running.get(n, 0) + self.waiting.get(n, 0)
                stack.extend(tree.nodes[n].children)
            if demand >= nominal:
                self._sum[name] = self._sum.get(name, 0.0) + ticks * min(1.0, used / nominal)
                self._count[name] = self._count.get(name, 0) + ticks

    def metrics(self, per_queue: dict[str, dict[str, Any]]) -> dict[str, Any]:
        """The JSON keys this module adds (module docstring)."""
        total = sum(self._count.values())
        means = [self._sum[q] / self._count[q] for q in self._count if self._count[q]]
        for name, row in per_queue.items():
            row["nominal_gpus"] = self.nominal.get(name, 0)
        return {
            "quota_mode": "enforce" if self.gate.enforce else "none",
            "quota_exceeded": self.exceeded,
            "share_attainment": round(sum(self._sum.values()) / total, 4) if total else 1.0,
            "share_attainment_min": round(min(means), 4) if means else 1.0,
            "queues": dict(sorted(per_queue.items())),
        }
