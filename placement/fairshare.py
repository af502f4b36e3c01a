"""Fair share between queues (pure): decayed usage in GPU-seconds and the queue order it gives.

Owns the fair-share rule of docs/placement.md, "Queues and quotas"; the hub's scheduling cycle
and the simulator call it with their own clock (``now`` is always passed in, never read).

**Decayed usage** of queue ``q``: GPU-seconds of its own jobs, each second weighted by
``2^(-age / half_life)``. Between two observations ``t0 < t1`` during which ``q`` held ``r``
GPUs, ``D(t1) = D(t0)·e^(-λΔ) + r·(1 - e^(-λΔ))/λ`` with ``λ = ln 2 / half_life`` and
``Δ = t1 - t0`` (exact for a constant rate). **Share** of ``q`` = decayed usage of ``q`` and its
descendants / ``q``'s weight.

**Order** (:func:`fair_key`): from the root down, siblings with the lower share go first (ties
by queue name); within one queue, the pass order of :func:`gpufed.placement.queue.pass_key`
(higher priority first; then jobs past the starvation age, oldest first; then the others, fewer
GPUs first, then earlier arrival; then job name and UID; :func:`~gpufed.placement.queue.order_key`
when no key is given). So among jobs competing for the same capacity,
a queue that used little lately goes first: its burst credit.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from gpufed.api.request import PlacementRequest
from gpufed.placement.queue import order_key
from gpufed.placement.quota import QueueTree

#: Default half-life of decayed usage: one day (seconds).
DEFAULT_HALF_LIFE_S: Final = 86_400.0


@dataclass
class DecayedUsage:
    """Decayed GPU-seconds per queue, advanced by :meth:`observe` with the caller's clock.

    ``half_life_s`` > 0 (seconds). :meth:`observe` ``(now, gpus)``: the queues' own GPUs in use
    from ``now`` on (those since the previous call were the previous call's). Time going
    backwards is treated as no time passing.
    """

    half_life_s: float = DEFAULT_HALF_LIFE_S
    _value: dict[str, float] = field(default_factory=dict)
    _rate: dict[str, float] = field(default_factory=dict)
    _at: float | None = None

    def __post_init__(self) -> None:
        if not self.half_life_s > 0 or math.isinf(self.half_life_s):
            raise ValueError(
                f"half_life_s: {self.half_life_s} must be a positive number of seconds"
            )

    def advance(self, now: float) -> None:
        """Integrate the current rates up to ``now``."""
        if self._at is None:
            self._at = now
            return
        dt = now - self._at
        if dt <= 0:
            return
        lam = math.log(2) / self.half_life_s
        decay = math.exp(-lam * dt)
        gain = (1.0 - decay) / lam
        for q in set(self._value) | set(self._rate):
            v = self._value.get(q, 0.0) * decay + self._rate.get(q, 0.0) * gain
            if v > 1e-9:
                self._value[q] = v
            else:
                self._value.pop(q, None)
        self._at = now

    def observe(self, now: float, gpus: Mapping[str, float]) -> None:
        """Advance to ``now``, then record ``gpus`` (queue -> GPUs in use) as the new rates."""
        self.advance(now)
        self._rate = {q: float(g) for q, g in gpus.items() if g > 0}

    def value(self, queue: str) -> float:
        """Decayed GPU-seconds of ``queue``'s own jobs at the last observation."""
        return self._value.get(queue, 0.0)

    def restore(self, values: Mapping[str, float], at: float) -> None:
        """Start from stored values (a restarted hub); rates start at zero."""
        self._value = {q: float(v) for q, v in values.items() if v > 0}
        self._rate = {}
        self._at = at

    def shares(self, tree: QueueTree) -> dict[str, float]:
        """Queue -> share: decayed usage of it and its descendants / its weight."""
        sub: dict[str, float] = {}
        for name in tree.nodes:
            total = 0.0
            stack = [name]
            while stack:
                n = stack.pop()
                total += self._value.get(n, 0.0)
                node = tree.nodes.get(n)
                if node is not None:
                    stack.extend(node.children)
            sub[name] = total
        return {n: sub[n] / tree.nodes[n].weight for n in tree.nodes}


def fair_key(
    tree: QueueTree,
    shares: Mapping[str, float],
    within: Callable[[PlacementRequest], Any] = order_key,
) -> Callable[[PlacementRequest], tuple[Any, ...]]:
    """The sort key of the fair-share order (module docstring) over ``shares``; ``within``:
    the order inside one queue (:func:`~gpufed.placement.queue.pass_key` in a pass).

    A request with no queue is in the default queue; a queue not in the tree (broken) sorts
    as a root of share 0 named after it, so its jobs are still tried (and refused by quota).
    """
    paths: dict[str, tuple[tuple[float, str], ...]] = {}

    def path_of(queue: str) -> tuple[tuple[float, str], ...]:
        hit = paths.get(queue)
        if hit is None:
            nodes = tree.path(queue)
            names = [n.name for n in nodes] if nodes else [queue]
            hit = tuple((shares.get(n, 0.0), n) for n in reversed(names))
            paths[queue] = hit
        return hit

    def key(request: PlacementRequest) -> tuple[Any, ...]:
        q = request.queue if request.queue is not None else tree.default_queue
        return (path_of(q), within(request))

    return key


def fair_sorted(
    requests: Iterable[PlacementRequest],
    tree: QueueTree,
    shares: Mapping[str, float],
    within: Callable[[PlacementRequest], Any] = order_key,
) -> list[PlacementRequest]:
    """``requests`` in fair-share order, ``within`` each queue (give the result to
    ``schedule_pass(presorted=True)``)."""
    return sorted(requests, key=fair_key(tree, shares, within))
