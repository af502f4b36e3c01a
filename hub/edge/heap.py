"""The hub process's garbage-collector policy: what survived a full collection is frozen.

Installed by :mod:`gpufed.hub.edge.app` for the life of the process. CPython's full
(generation 2) collection walks every tracked object: at 10 members x 1,000 nodes and 10,000
jobs one costs about 1.4 s of CPU, and it runs on whichever thread allocated last, so it lands
inside a scheduling cycle or a snapshot ingest and holds the event loop (the lease renewal,
acks, status writes) that long. It comes back each time the heap grew by a quarter.

The hub's heap is mostly long-lived (node inventories, job records, the placement snapshot),
so after each full collection :func:`gc.freeze` moves every survivor to the permanent
generation: later full collections walk only what was allocated since (O(new objects), not
O(heap)). Frozen objects are still freed by reference counting when dropped; only garbage
that is a reference *cycle* among frozen objects is not collected while frozen. So once the
heap has grown to :data:`UNFREEZE_GROWTH` times its size right after the last whole walk, the
policy unfreezes everything (:func:`gc.unfreeze`): the next full collection walks the whole
heap once, frees such cycles, and freezes again (at :data:`UNFREEZE_GROWTH_SOON` times within
:data:`WALK_INTERVAL_S` of the last whole walk: below). Frozen cyclic garbage is therefore
bounded by a multiple of the heap after the last whole walk, and a hub whose heap stays the
size it is walks it again only when that much garbage has built up. The heap's size
is :func:`sys.getallocatedblocks` (CPython's small-object allocator, counted per arena: ~2 ms
at 15 million blocks). :func:`gc.get_freeze_count` walks the whole frozen list (0.17 s at
100 x 5,000 nodes, 3 million frozen objects, on top of the walk's 1.4 s; 1.6 s at 10 x 5,000
with 50,000 jobs), so the policy never calls it.

**At most one whole walk per** :data:`WALK_INTERVAL_S` **unless the heap quadruples.** A heap
that doubles soon after its last walk is a hub ingesting its fleet (a start or a failover:
node inventories, all live), not a hub making garbage, and each walk of a big heap holds the
loop: at 100 x 5,000 nodes the rule alone walked at 1.4, 3.2 and 6.7 million blocks within the
first two minutes, the last (1.4 s) in the middle of the job traffic that followed the fleet's
registration. So within :data:`WALK_INTERVAL_S` of the last whole walk (or of install) the
heap is unfrozen only once it has grown to :data:`UNFREEZE_GROWTH_SOON` times the base; after
that, at :data:`UNFREEZE_GROWTH`. Frozen cyclic garbage is so at most
(``UNFREEZE_GROWTH_SOON`` - 1) times the base for the interval after a walk, and
(``UNFREEZE_GROWTH`` - 1) times it after that; whole-heap stalls come at most once per
interval while the heap less than quadruples. (Measured at the end of a 100 x 5,000 run, a
whole walk found 17,000 cyclic objects among 3 million: the hub's long-lived objects seldom
form cycles.)

A whole walk costs about 1 s per million objects and holds the event loop that long (10 x 5,000
nodes with 50,000 running jobs: 5-7 s). The rule before, one whole walk in every 16 full
collections, put one into every second preemption cycle at that size, because planning
allocates enough for a dozen full collections a cycle (docs/benchmarks.md, "Whole-heap walks");
the growth rule ties walks to the heap, not to the allocation rate.
``gpufed_hub_gc_full_seconds{walk="whole"|"new"}`` observes each full collection's CPU
seconds (whole: it walked the whole heap), ``gpufed_hub_gc_walked_heap_blocks`` the growth
rule's base (the heap's blocks at install and after the last whole walk).
"""

from __future__ import annotations

import gc
import sys
import time
from collections.abc import Callable
from typing import Any

from gpufed.hub.components.metrics import HubMetrics

#: The heap is unfrozen (and the next full collection walks all of it) once it has grown to
#: this many times its size after the last whole walk (module docstring) ...
UNFREEZE_GROWTH = 2.0
#: ... or, within :data:`WALK_INTERVAL_S` seconds of the last whole walk (or install), to this.
UNFREEZE_GROWTH_SOON = 4.0
WALK_INTERVAL_S = 600.0


class HeapPolicy:
    """The policy of the module docstring; :meth:`install` / :meth:`uninstall` (idempotent)."""

    def __init__(
        self, metrics: HubMetrics | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._metrics = metrics
        self._clock = clock
        #: when the last whole walk (or install) was, on ``clock``
        self.walked_at = 0.0
        self._started = 0.0
        #: full collections seen since install, and their CPU seconds in all
        self.full_collections = 0
        self.full_seconds = 0.0
        #: full collections that walked the whole heap (the heap was unfrozen before them)
        self.whole_walks = 0
        #: the heap's size (allocated blocks) right after the last whole walk or install: the
        #: growth rule's base
        self.walked_base = 0
        self._whole_next = False

    def install(self) -> None:
        """Freeze what survives each full collection from now on (and what lives now)."""
        if self._callback not in gc.callbacks:
            gc.callbacks.append(self._callback)
        gc.freeze()
        self._walked()

    def uninstall(self) -> None:
        """Stop freezing (what is frozen stays frozen)."""
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if info.get("generation") != 2:
            return
        if phase == "start":
            self._started = time.process_time()
            return
        took = time.process_time() - self._started
        self.full_collections += 1
        self.full_seconds += took
        gc.freeze()
        whole = self._whole_next
        if whole:  # this collection walked the whole heap: the new base
            self._whole_next = False
            self.whole_walks += 1
            self._walked()
        elif sys.getallocatedblocks() >= self._growth() * max(self.walked_base, 1):
            gc.unfreeze()  # the next full collection walks everything and frees frozen cycles
            self._whole_next = True
        if self._metrics is not None:
            self._metrics.gc_full_seconds.labels(walk="whole" if whole else "new").observe(took)

    def _growth(self) -> float:
        """The growth that unfreezes the heap now (module docstring)."""
        soon = self._clock() - self.walked_at < WALK_INTERVAL_S
        return UNFREEZE_GROWTH_SOON if soon else UNFREEZE_GROWTH

    def _walked(self) -> None:
        """Take the growth rule's base: the heap's blocks and the clock, now (install or
        right after a whole walk); the one place both are set."""
        self.walked_base = sys.getallocatedblocks()
        self.walked_at = self._clock()
        if self._metrics is not None:
            self._metrics.gc_walked_heap_blocks.set(self.walked_base)
