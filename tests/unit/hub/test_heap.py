"""The hub's GC policy (gpufed.hub.edge.heap): what survives a full collection is frozen, each
full collection is observed, and uninstall stops it."""

from __future__ import annotations

import gc
import sys
import weakref

import pytest

from gpufed.hub.components.metrics import HubMetrics
from gpufed.hub.edge import heap as heap_module
from gpufed.hub.edge.heap import HeapPolicy


def full_count(m: HubMetrics, walk: str) -> float:
    """Full collections observed with ``walk`` ("whole" / "new"); 0 when none was."""
    samples = m.gc_full_seconds.collect()[0].samples
    return next(
        (s.value for s in samples if s.name.endswith("_count") and s.labels["walk"] == walk), 0
    )


@pytest.fixture
def freeze_counts(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts calls of gc.get_freeze_count (it walks every frozen object: 0.17 s at
    100 x 5,000 nodes, inside the collection that holds the hub's loop)."""
    calls: list[int] = []
    real = gc.get_freeze_count

    def counted() -> int:
        calls.append(1)
        return real()

    monkeypatch.setattr(gc, "get_freeze_count", counted)
    return calls


def test_survivors_of_a_full_collection_are_frozen_and_observed(freeze_counts: list[int]) -> None:
    m = HubMetrics()
    heap = HeapPolicy(m)
    try:
        heap.install()
        assert freeze_counts == [], "the policy never walks the frozen list to count it"
        assert m.gc_walked_heap_blocks._value.get() == heap.walked_base > 0
        survivors = [[i] for i in range(5000)]  # new, tracked, long-lived
        garbage = [[]]
        garbage[0].append(garbage)  # a cycle: collected, never frozen
        del garbage
        before = gc.get_freeze_count()
        gc.collect()
        assert heap.full_collections == 1
        assert (full_count(m, "new"), full_count(m, "whole")) == (1, 0)
        assert gc.get_freeze_count() >= before + len(survivors)
        assert m.gc_walked_heap_blocks._value.get() == heap.walked_base, "set at a whole walk"
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


class _Cycle:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only a collection that walks it can free it


def _frozen_garbage() -> weakref.ref[_Cycle]:
    """A reference cycle that survives a full collection (so is frozen), then dropped."""
    cyclic = _Cycle()
    gone = weakref.ref(cyclic)
    gc.collect()  # survives (still referenced) and is frozen
    del cyclic
    return gone


def test_a_heap_that_does_not_grow_is_never_walked_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """Many full collections with short-lived garbage (what a preemption cycle makes) leave
    frozen cyclic garbage alone: no whole walk without growth. Before, every 16th did one."""
    monkeypatch.setattr(heap_module, "UNFREEZE_GROWTH", 1.5)
    heap = HeapPolicy()
    try:
        heap.install()
        gone = _frozen_garbage()
        for _ in range(40):
            transient = [[i] for i in range(2000)]
            gc.collect()
            del transient
        assert gone() is not None, "the frozen cycle was walked: a whole-heap collection ran"
    finally:
        heap.uninstall()
        gc.unfreeze()


def test_frozen_cyclic_garbage_is_freed_once_the_frozen_heap_has_grown(
    monkeypatch: pytest.MonkeyPatch, freeze_counts: list[int]
) -> None:
    monkeypatch.setattr(heap_module, "UNFREEZE_GROWTH", 1.05)
    now = [0.0]
    m = HubMetrics()
    heap = HeapPolicy(m, clock=lambda: now[0])
    try:
        heap.install()
        now[0] = heap_module.WALK_INTERVAL_S  # the interval after install has passed
        gone = _frozen_garbage()
        gc.collect()
        assert gone() is not None, "frozen: the cycle outlives a full collection"
        grown = [[i] for i in range(int(0.06 * sys.getallocatedblocks()) + 1)]  # long-lived
        gc.collect()  # frozen with them, past the growth: the heap is unfrozen
        assert gone() is not None
        gc.collect()  # walks the whole heap
        assert gone() is None, "freed by the whole walk"
        assert (heap.whole_walks, full_count(m, "whole"), full_count(m, "new")) == (1, 1, 3)
        walked = sys.getallocatedblocks()
        assert m.gc_walked_heap_blocks._value.get() == heap.walked_base
        assert abs(heap.walked_base - walked) < 0.01 * walked, "the base: the heap after the walk"
        assert freeze_counts == [], "the frozen list is never walked to count it"
        assert heap.walked_at == now[0]
        now[0] += heap_module.WALK_INTERVAL_S
        # the base is the heap after that walk: the survivors do not trigger another
        survivor = _frozen_garbage()
        for _ in range(5):
            gc.collect()
        assert survivor() is not None
        del grown
    finally:
        heap.uninstall()
        gc.unfreeze()


def test_a_heap_that_doubles_soon_after_a_walk_waits_for_the_interval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Within WALK_INTERVAL_S of the last whole walk a growth past UNFREEZE_GROWTH (but not
    UNFREEZE_GROWTH_SOON) walks nothing: a hub ingesting its fleet is not walked at each
    doubling. Once the interval has passed, the next full collections walk the whole heap."""
    monkeypatch.setattr(heap_module, "UNFREEZE_GROWTH", 1.05)
    monkeypatch.setattr(heap_module, "UNFREEZE_GROWTH_SOON", 1e6)
    now = [1000.0]
    heap = HeapPolicy(clock=lambda: now[0])
    try:
        heap.install()
        gone = _frozen_garbage()
        grown = [[i] for i in range(int(0.06 * sys.getallocatedblocks()) + 1)]  # long-lived
        now[0] += heap_module.WALK_INTERVAL_S - 1
        for _ in range(3):
            gc.collect()
        assert gone() is not None, "walked within the interval"
        assert heap.whole_walks == 0
        now[0] += 1
        gc.collect()  # past the interval, and grown: unfrozen
        gc.collect()  # the whole walk
        assert gone() is None, "freed once the interval had passed"
        assert (heap.whole_walks, heap.walked_at) == (1, now[0])
        del grown
    finally:
        heap.uninstall()
        gc.unfreeze()


def test_a_heap_that_grows_past_the_soon_bound_is_walked_within_the_interval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The interval never holds back a walk once the heap grew UNFREEZE_GROWTH_SOON times:
    frozen cyclic garbage stays bounded while the clock stands still."""
    monkeypatch.setattr(heap_module, "UNFREEZE_GROWTH", 1e6)
    monkeypatch.setattr(heap_module, "UNFREEZE_GROWTH_SOON", 1.05)
    heap = HeapPolicy(clock=lambda: 0.0)
    try:
        heap.install()
        gone = _frozen_garbage()
        grown = [[i] for i in range(int(0.06 * sys.getallocatedblocks()) + 1)]
        gc.collect()
        gc.collect()
        assert gone() is None, "walked at the soon bound without waiting"
        assert heap.whole_walks == 1
        del grown
    finally:
        heap.uninstall()
        gc.unfreeze()
