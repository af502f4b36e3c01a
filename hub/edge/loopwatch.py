"""The hub process's event-loop stall watch: how long the one event loop was held at a time.

Started by :mod:`gpufed.hub.edge.app` for the life of the process. A task asks to wake every
``interval_s``; how much later than asked it wakes is how long something held the loop (a
snapshot decoded in one turn, a planning pass, a large list). Exported as
``gpufed_hub_event_loop_stall_seconds`` (histogram of wake-up delays above 5 ms) and
``gpufed_hub_event_loop_stall_max_seconds`` (the longest since the process started), which
``gpufed bench scale`` reports as ``loop_stall_max_ms``.

On a loaded machine a late wake-up is also time the process waited for a CPU. The part the loop
itself was busy is bounded by the loop thread's CPU time over the same interval
(:func:`time.thread_time`): ``gpufed_hub_event_loop_stall_cpu_max_seconds`` is the longest
``min(delay, thread CPU)`` since start (``loop_stall_cpu_max_ms``), the hub's own share.
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
    cpu: Callable[[], float] = time.thread_time,
) -> None:
    """Observe the loop's stalls until cancelled (the module docstring)."""
    worst = worst_cpu = 0.0
    while True:
        asked, cpu0 = clock() + interval_s, cpu()
        await asyncio.sleep(interval_s)
        late = clock() - asked
        if late >= STALL_FLOOR_S:
            metrics.event_loop_stall.observe(late)
            if late > worst:
                worst = late
                metrics.event_loop_stall_max.set(late)
            held = min(late, cpu() - cpu0)
            if held > worst_cpu:
                worst_cpu = held
                metrics.event_loop_stall_cpu_max.set(held)
