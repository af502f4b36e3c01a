"""The event-loop watch records how long the loop was held: a synchronous hold of 80 ms shows
as a stall of at least that in gpufed_hub_event_loop_stall_max_seconds; the lease holder counts
a renewal whose turn came and went as missed."""

from __future__ import annotations

import asyncio
import time

from gpufed.hub.components.metrics import HubMetrics
from gpufed.hub.edge.loopwatch import watch_loop


async def test_a_held_loop_shows_as_a_stall() -> None:
    metrics = HubMetrics()
    task = asyncio.create_task(watch_loop(metrics, interval_s=0.01))
    await asyncio.sleep(0.03)
    held = time.monotonic()
    while time.monotonic() - held < 0.08:  # the loop held, as a long synchronous step would
        pass
    await asyncio.sleep(0.03)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    worst = metrics.event_loop_stall_max._value.get()
    assert 0.06 <= worst < 1.0, worst
    held = metrics.event_loop_stall_cpu_max._value.get()
    assert 0 < held <= worst, "the loop's own share, from its thread's CPU time"
