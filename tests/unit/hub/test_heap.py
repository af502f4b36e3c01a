"""The hub's GC policy (gpufed.hub.edge.heap): what survives a full collection is frozen, each
full collection is observed, and uninstall stops it."""

from __future__ import annotations

import gc

from gpufed.hub.components.metrics import HubMetrics
from gpufed.hub.edge.heap import HeapPolicy


def full_count(m: HubMetrics) -> float:
    samples = m.gc_full_seconds.collect()[0].samples
    return next(s.value for s in samples if s.name.endswith("_count"))


def test_survivors_of_a_full_collection_are_frozen_and_observed() -> None:
    m = HubMetrics()
    heap = HeapPolicy(m)
    try:
        heap.install()
        assert m.gc_frozen_objects._value.get() == gc.get_freeze_count() > 0
        survivors = [[i] for i in range(5000)]  # new, tracked, long-lived
        garbage = [[]]
        garbage[0].append(garbage)  # a cycle: collected, never frozen
        del garbage
        before = gc.get_freeze_count()
        gc.collect()
        assert heap.full_collections == 1
        assert full_count(m) == 1
        assert gc.get_freeze_count() >= before + len(survivors)
        assert m.gc_frozen_objects._value.get() == gc.get_freeze_count()
        heap.uninstall()
        heap.uninstall()  # idempotent
        gc.collect()
        assert heap.full_collections == 1, "not watched once uninstalled"
    finally:
        heap.uninstall()
        gc.unfreeze()


def test_a_young_collection_freezes_nothing() -> None:
    heap = HeapPolicy()
    try:
        heap.install()
        frozen = gc.get_freeze_count()
        gc.collect(0)
        assert heap.full_collections == 0
        assert gc.get_freeze_count() == frozen
    finally:
        heap.uninstall()
        gc.unfreeze()


def test_frozen_cyclic_garbage_is_freed_within_unfreeze_every_full_collections() -> None:
    import weakref

    from gpufed.hub.edge import heap as heap_module

    class Node:
        def __init__(self) -> None:
            self.me = self  # a reference cycle

    heap = HeapPolicy()
    try:
        heap.install()
        cyclic = Node()
        gone = weakref.ref(cyclic)
        gc.collect()  # it survives (still referenced) and is frozen
        del cyclic  # garbage now, but a frozen cycle: reference counting cannot free it
        gc.collect()
        assert gone() is not None, "frozen: the cycle outlives a full collection"
        for _ in range(heap_module.UNFREEZE_EVERY + 1):
            gc.collect()
        assert gone() is None, "freed after an unfreeze"
    finally:
        heap.uninstall()
        gc.unfreeze()
