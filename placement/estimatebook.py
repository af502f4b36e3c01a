"""The block estimates of one preemption cycle, kept across its preemptors (pure): a later
preemptor re-estimates only the blocks the cycle's earlier plans changed.

Built by :class:`~gpufed.placement.preemptcycle.PreemptionCycle`, read by
:func:`~gpufed.placement.victims.plan_preemption` in place of
:func:`~gpufed.placement.victimblocks.estimates` (docs/placement.md, "Preemption").

A block's greedy estimate (:func:`~gpufed.placement.victimblocks.block_estimate`) depends on the
preemptor only through what :func:`signature` names (priority, queue, pod sets, the block level
it needs, its GPU products, and its submit time where its queue's ``withinQueue`` reads it), on
the quota ledger only through the answers :class:`~gpufed.placement.victims.Search` caches per
(queue, product), and on the fleet only through the block's running jobs, the skipped UIDs and
the block's free GPUs. Within one cycle (one ``now``, one running-jobs index) the fleet changes
between two preemptors only by the earlier plans: their victims leave (skipped, their GPUs
freed) and their what-if placements are reserved. So per signature the book keeps every
block's estimate (or that it has none) and, for the next preemptor of that signature,
re-estimates only the blocks that hold a node of a new victim or of a new reservation; the
rest are read back as they are. Blocks the bounds (:class:`~.victimblocks.Bound`: the priority
and the :func:`~.victimblocks.block_floor` of the ``k``-th cheapest) passed over stay unread
until the bounds, rebuilt from the kept estimates, reach them; they are read cheapest floor
first (a heap per member, made once per signature), and a member whose pools' floors are all
beyond the bound is passed over without listing its blocks.

The estimates kept are those a full scan would give now, so the blocks tried, and the plan,
are the same (``tests/unit/placement/test_estimatebook.py`` checks it against a full scan after
random plans). The book is dropped and rebuilt when anything else it cannot follow moves: the
index (:attr:`~.runindex.RunningIndex.version`), ``now``, a quota answer, the earlier plans not
being a prefix of the ones it saw. Preemptors with past preemptions (the cycle-back rule reads
each one's own history) and jobs that need a whole member (filed per member at once) are
estimated in full, as before.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING

from gpufed.api.decision import Decision
from gpufed.placement.member import ClusterState
from gpufed.placement.preemption import Running
from gpufed.placement.runindex import BlockRuns, RunningIndex
from gpufed.placement.victimblocks import (
    Bound,
    Estimate,
    block_estimate,
    block_floor,
    cost_floor,
    level_of,
)

if TYPE_CHECKING:
    from gpufed.placement.victims import Search


#: tie-breaks of the floor heaps (blocks are never compared)
_TICK = itertools.count()


def signature(s: Search, level: str) -> Hashable:
    """Everything about the preemptor that a block's estimate reads (module docstring)."""
    req = s.p.request
    submitted: float | None = None
    if s.quota is not None and s.preemption.within_queue == "LowerOrNewerEqualPriority":
        submitted = req.submitted_at
    return (
        req.priority,
        req.queue,
        level,
        s.job.products,
        s.job.demand,
        tuple((ps.count, tuple(sorted(ps.requests.items()))) for ps in req.pod_sets),
        submitted,
        s.quota is None,
    )


#: A heap entry: a block's :func:`~.victimblocks.block_floor` flattened (low, cost floor, least
#: UID, block key: the same order within one member, whose name and the constant 1 the floor
#: key also holds), a tie-break count, the block. One tuple a block, not four: a member's first
#: fill makes one for each of its blocks (at 100 x 5,000, 5,000 blocks in a 20 GB process: the
#: fill was ~2/3 of the first preemptor's planning).
_HeapEntry = tuple[int, float, str, str, int, BlockRuns]


def _heap_entry(b: BlockRuns, now: float) -> _HeapEntry:
    """Block ``b``'s heap entry at ``now`` (wall seconds); its cost floor is
    :func:`~.victimblocks.block_floor`'s."""
    return (b.low, cost_floor(b.gmin, b.amax, now), b.umin, b.key, next(_TICK), b)


class _Member:
    """One member's kept blocks: each read block's estimate (None: it has none) and the
    reasons its jobs are not eligible; the blocks the bound passed over, unread, and the same
    in :func:`~.victimblocks.block_floor` order (a heap, made on first need; an entry whose
    block is no longer passed over is stale). ``filled``: False while the member was passed
    over whole (by its pools' floors: its blocks not even listed yet)."""

    __slots__ = ("filled", "heap", "passed", "reasons", "rows")

    def __init__(self) -> None:
        self.rows: dict[BlockRuns, Estimate | None] = {}
        self.reasons: dict[BlockRuns, dict[str, str]] = {}
        self.passed: dict[BlockRuns, str] = {}  # block -> its pool's GPU product
        self.heap: list[_HeapEntry] | None = None
        self.filled = False


class _Entry:
    """The kept estimates for one signature, and what they were made with."""

    __slots__ = ("above", "dirty", "gone", "members", "placed", "self_uid", "within")

    def __init__(self, s: Search, self_uid: str) -> None:
        self.members: dict[str, _Member] = {}
        #: member -> blocks to read again before they are served
        self.dirty: dict[str, set[BlockRuns]] = {}
        self.gone: list[str] = [r.uid for r in s.gone]
        self.placed: list[Decision] = list(s.placed)
        self.self_uid = self_uid
        self.above: dict[tuple[str, str], str] = {}
        self.within: dict[tuple[str, str], bool] = {}


class EstimateBook:
    """One cycle's block estimates, per :func:`signature` (module docstring).

    ``index``: the cycle's running jobs; ``now``: the cycle's clock. :meth:`estimates` answers
    like :func:`~gpufed.placement.victimblocks.estimates`. Not thread-safe.
    """

    def __init__(self, index: RunningIndex, now: float) -> None:
        self.index = index
        self.now = now
        self._version = index.version
        self._entries: dict[Hashable, _Entry] = {}
        #: blocks read, and blocks read back without reading, since the book was made
        self.read = 0
        self.kept = 0

    def begin(self, s: Search, skip: set[str]) -> _Entry | None:
        """The entry for this decision (made fresh when the one kept cannot be followed),
        with the blocks the earlier plans changed marked to read again; None when this
        preemptor is estimated in full. Call it once per decision, inside the cycle's
        :func:`~gpufed.placement.whatif.freed` block, before :meth:`estimates`."""
        level = level_of(s.job)
        if level is None or s.p.preempted or s.now != self.now:
            return None
        if self.index.version != self._version:
            self._entries.clear()
            self._version = self.index.version
        self_uid = s.p.request.uid
        sig = signature(s, level)
        entry = self._entries.get(sig)
        if entry is not None and not self._follow(entry, s, level, self_uid):
            entry = None
        if entry is None:
            entry = self._entries[sig] = _Entry(s, self_uid)
        return entry

    def _follow(self, entry: _Entry, s: Search, level: str, self_uid: str) -> bool:
        """Mark what changed since ``entry`` was served; False when it cannot be followed."""
        gone = [r.uid for r in s.gone]
        if gone[: len(entry.gone)] != entry.gone or len(s.placed) < len(entry.placed):
            return False
        if any(a is not b for a, b in zip(entry.placed, s.placed, strict=False)):
            return False
        # the quota answers the kept estimates read must be those of this decision
        mine = s.p.request.queue or (s.quota.tree.default_queue if s.quota is not None else "")
        for (theirs, product), hit in entry.above.items():
            if (s._borrowing(theirs, mine, product) or "") != hit:
                return False
        for (theirs, product), ok in entry.within.items():
            if s._within(mine, theirs, product) != ok:
                return False
        nodes: list[tuple[str, str]] = []
        new_gone: list[Running] = s.gone[len(entry.gone) :]
        for r in new_gone:
            nodes += [(r.cluster, n) for n in r.gpus]
        for d in s.placed[len(entry.placed) :]:
            if d.cluster is not None:
                nodes += [(d.cluster, n) for n in d.node_requests()]
        if self_uid != entry.self_uid:  # a preemptor that also runs skips itself
            for uid in (self_uid, entry.self_uid):
                found = self.index.find(uid)
                if found is not None:
                    nodes += [(found.cluster, n) for n in found.gpus]
        for cluster, node in nodes:
            b = self.index.block_of(cluster, level, node)
            if b is not None:
                entry.dirty.setdefault(cluster, set()).add(b)
        entry.gone = gone
        entry.placed = list(s.placed)
        entry.self_uid = self_uid
        return True

    def end(self, entry: _Entry, s: Search) -> None:
        """Keep the quota answers this decision read (call it after its last
        :meth:`estimates`)."""
        entry.above.update(s._above)
        entry.within.update(s._within_cache)

    def estimates(
        self,
        entry: _Entry,
        s: Search,
        c: ClusterState,
        skip: set[str],
        reasons: dict[str, str],
        bound: Bound,
    ) -> list[Estimate]:
        """:func:`~gpufed.placement.victimblocks.estimates` for member ``c`` and the entry
        :meth:`begin` gave: the kept estimates, the changed blocks read again, and the blocks
        the bound no longer passes over read now. The estimates returned are shared: take a
        copy before :meth:`Estimate.block` (it keeps the filed block)."""
        level = level_of(s.job)
        assert level is not None
        name, now, index = c.name, self.now, self.index
        m = entry.members.get(c.name)
        if m is None:
            m = entry.members[c.name] = _Member()
        if not m.filled:
            entry.dirty.pop(name, None)  # every block is read fresh
            products = s.job.products
            pools = [
                p
                for p in c.pools_sorted()
                if not p.slices and (products is None or p.product in products)
            ]
            listed = [(p, index.blocks(name, level, p.key)) for p in pools]
            # the member passed over whole while its pools' floors are beyond the bound
            floors = [index.floor(name, level, p.key) for p in pools]
            if all(f is None or bound.beyond(block_floor(f, now, name, "")) for f in floors):
                count = sum(len(blocks) for _, blocks in listed)
                if count:
                    bound.passed[name] = bound.passed.get(name, 0) + count
                return []
            m.filled = True
            for pool, blocks in listed:
                for b in blocks:
                    m.passed[b] = pool.product
        else:
            for b in entry.dirty.pop(name, ()):
                product = m.passed.get(b)
                if product is None and b in m.rows:
                    n = c.nodes.get(b.node)
                    product = n.pool.product if n is not None and n.pool is not None else None
                    del m.rows[b]
                    m.reasons.pop(b, None)
                    if product is not None:
                        m.passed[b] = product
                        if m.heap is not None:
                            heapq.heappush(m.heap, _heap_entry(b, now))
        # the kept estimates first (they tighten the bound), then the blocks passed over, in
        # floor order, until the next floor is beyond the bound (the bound only falls)
        out: list[Estimate] = []
        for e in m.rows.values():
            if e is not None:
                bound.found(e)
                out.append(e)
        self.kept += len(m.rows)
        if m.passed:
            if m.heap is None:
                m.heap = [_heap_entry(b, now) for b in m.passed]
                heapq.heapify(m.heap)
            heap = m.heap
            while heap:
                b = heap[0][5]
                if b not in m.passed:
                    heapq.heappop(heap)  # stale: read since
                    continue
                if b.low > bound.prio or bound.beyond(block_floor(b, now, name, b.key)):
                    break
                heapq.heappop(heap)
                why: dict[str, str] = {}
                e = block_estimate(s, c, b, level, m.passed.pop(b), skip, why)
                self.read += 1
                m.rows[b] = e
                if why:
                    m.reasons[b] = why
                if e is not None:
                    bound.found(e)
                    out.append(e)
        if m.passed:
            bound.passed[name] = bound.passed.get(name, 0) + len(m.passed)
        for why in m.reasons.values():
            reasons.update(why)
        return out


def served(rows: Sequence[Estimate]) -> list[Estimate]:
    """Copies of kept estimates that :meth:`Estimate.block` may fill."""
    return [Estimate(e.head, e.bkey, e.uids, e.filed, e.runs) for e in rows]
