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
that is a reference *cycle* among frozen objects is not collected while frozen: so every
:data:`UNFREEZE_EVERY`-th full collection first unfreezes everything (:func:`gc.unfreeze`), and
the one after it walks the whole heap once, frees such cycles and freezes again. Frozen cyclic
garbage therefore lives at most that many full collections, and one full collection in
:data:`UNFREEZE_EVERY` costs what every one cost before. ``gpufed_hub_gc_full_seconds`` observes each full collection's
duration, ``gpufed_hub_gc_frozen_objects`` how many objects are frozen.
"""

from __future__ import annotations

import gc
import time
from typing import Any

from gpufed.hub.components.metrics import HubMetrics

#: One full collection in this many unfreezes the heap first (see the module docstring).
UNFREEZE_EVERY = 16


class HeapPolicy:
    """The policy of the module docstring; :meth:`install` / :meth:`uninstall` (idempotent)."""

    def __init__(self, metrics: HubMetrics | None = None) -> None:
        self._metrics = metrics
        self._started = 0.0
        #: full collections seen since install, and their CPU seconds in all
        self.full_collections = 0
        self.full_seconds = 0.0

    def install(self) -> None:
        """Freeze what survives each full collection from now on (and what lives now)."""
        if self._callback not in gc.callbacks:
            gc.callbacks.append(self._callback)
        gc.freeze()
        self._frozen()

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
        if self.full_collections % UNFREEZE_EVERY == 0:
            gc.unfreeze()  # the next full collection walks everything and frees frozen cycles
        else:
            gc.freeze()
        if self._metrics is not None:
            self._metrics.gc_full_seconds.observe(took)
        self._frozen()

    def _frozen(self) -> None:
        if self._metrics is not None:
            self._metrics.gc_frozen_objects.set(gc.get_freeze_count())
