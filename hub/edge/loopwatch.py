"""The hub process's event-loop stall watch: how long the one event loop was held at a time.

Started by :mod:`gpufed.hub.edge.app` for the life of the process. A task asks to wake every
``interval_s``; how much later than asked it wakes is how long something held the loop (a
snapshot decoded in one turn, a planning pass, a large list). Exported as
``gpufed_hub_event_loop_stall_seconds`` (histogram of wake-up delays above 5 ms) and
``gpufed_hub_event_loop_stall_max_seconds`` (the longest since the process started), which
``gpufed bench scale`` reports as ``loop_stall_max_ms``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from gpufed.hub.components.metrics import HubMetrics

#: Wake-up delays below this are the loop's own jitter, not a stall (seconds).
STALL_FLOOR_S = 0.005


async def watch_loop(
    metrics: HubMetrics,
    *,
    interval_s: float = 0.05,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Observe the loop's stalls until cancelled (the module docstring)."""
    worst = 0.0
    while True:
        asked = clock() + interval_s
        await asyncio.sleep(interval_s)
        late = clock() - asked
        if late >= STALL_FLOOR_S:
            metrics.event_loop_stall.observe(late)
            if late > worst:
                worst = late
                metrics.event_loop_stall_max.set(late)
