"""Victim sets of the blocks the search tries (pure): the second phase of the victim search of
:mod:`.victims`, after :mod:`.victimblocks` chose the blocks (docs/placement.md, "Preemption").

Called by :func:`~gpufed.placement.victims.plan_preemption` only, through :func:`search`. The
order of sets is :func:`~gpufed.placement.victimblocks.set_key`: the highest victim priority
lowest first, then the least work lost, then the fewest victims, then member and UIDs. A set
*fits* when the what-if ``place()`` places the job in its member (:meth:`Search.fits`); every
set is first checked by :meth:`Search.allowed` (the set-level quota rule) and, when all its
victims sit wholly inside the block, by arithmetic (:func:`could_fit`: GPUs and pods per node,
in one GPU product), and skipped without a what-if when either says no.

* **Exact** (:func:`exact`), for the blocks with at most :data:`EXACT_MAX` candidates: one
  best-first enumeration of the subsets of every such block, in ``set_key`` order, from a heap
  (each set's successors are "add the next candidate" and "swap the last for the next", in
  victim order, which never lowers the key, so the sets come out sorted); the first set that
  fits is the cheapest of those blocks, and it is minimal (a subset of it would have a lower key
  and would have been tried first). It stops there, when every set was tried, after half the
  what-ifs left to the decision or after :data:`EXACT_SETS` sets; then the bounded search runs
  over every block with the rest.
* **Bounded** (:func:`bounded`), for a block with more candidates (or every block when the
  exact search stopped early): the shortest prefix of the victim order that
  fits (doubling, then bisection), pruned most expensive first, then improved by swaps: for each
  other candidate, cheapest first, the set with that one victim in place of the most expensive
  victims its GPUs make up for, tried when its key is lower, then pruned again (at most
  :data:`SWAPS` what-ifs a block).

Both keep within ``max_whatifs`` what-ifs per decision (the bounded search of a block may stop
with a fitting set not yet pruned when the budget runs out). :attr:`Found.exact` says whether
the answer is the cheapest set of the blocks tried.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gpufed.api.decision import Decision
from gpufed.placement.preemption import Victim
from gpufed.placement.victimblocks import Block, SetKey, set_key, victim_key

if TYPE_CHECKING:
    from gpufed.placement.victims import Search

#: blocks with at most this many candidate victims are searched exactly (2**12 subsets)
EXACT_MAX = 12
#: sets the exact search takes from its heap per decision before it gives up for the bounded one
EXACT_SETS = 1 << 13
#: what-ifs the bounded search's swaps may run per block
SWAPS = 8

Split = tuple[list[Victim], list[Victim]]


@dataclass
class Found:
    """The search's answer: the cheapest fitting set found (key, victims, decision, member), a
    line per member searched, whether the answer is exact and ``how`` it was found."""

    best: tuple[SetKey, list[Victim], Decision, str] | None = None
    members: dict[str, str] = field(default_factory=dict)
    exact: bool = True
    how: str = "exact search"
    #: the cheapest set found per member
    per: dict[str, SetKey] = field(default_factory=dict)

    def offer(self, cluster: str, victims: list[Victim], d: Decision) -> None:
        """A fitting set: kept when it is the cheapest so far (of its member, of all)."""
        k = set_key(cluster, victims)
        if cluster not in self.per or k < self.per[cluster]:
            self.per[cluster] = k
            self.members[cluster] = f"{len(victims)} victims, {k[1]:.0f} GPU-s lost"
        if self.best is None or k < self.best[0]:
            self.best = (k, victims, d, cluster)


def could_fit(s: Search, b: Block, victims: Sequence[Victim]) -> bool:
    """False when arithmetic shows the job cannot fit with ``victims`` gone, while every victim
    sits wholly inside the block (nothing else changes); True otherwise (the what-if decides).
    Necessary conditions, in one GPU product the set frees GPUs of (a whole-member block counts
    each product apart; a smaller block counts all its GPUs as one; unless ``place()`` placed
    the job before preemption, a product where nothing is freed cannot hold it): the free GPUs
    plus those freed reach the job's
    demand; for each pod size ``t`` of the job, its pods of ``t`` GPUs or more fit
    ``floor(free / t)`` to a node, counting the nodes the victims run on one by one and the
    rest of the free GPUs as if on one node (an upper bound)."""
    avail: dict[str, int] = {}
    for v in victims:
        r = v.running
        if b.freed[r.uid] != r.gpu_count:
            return True  # a victim also frees GPUs elsewhere: arithmetic on one block says nothing
        for n, x in r.gpus.items():
            avail[n] = avail.get(n, b.node_free[n][0]) + x
    if not b.product_free:
        return _room(s, b.free, b, avail, None)
    return any(_room(s, free, b, avail, p) for p, free in b.product_free.items())


def _room(s: Search, free: int, b: Block, avail: dict[str, int], product: str | None) -> bool:
    """:func:`could_fit`'s conditions over the nodes of ``product`` (None: all)."""
    mine = {n: a for n, a in avail.items() if product is None or b.node_free[n][1] == product}
    if not mine:  # nothing freed in this product: the job did not fit there before
        return s.fit_before  # unless it did, and waits on quota only
    freed = sum(a - b.node_free[n][0] for n, a in mine.items())
    if free + freed < s.job.demand:
        return False
    rest = max(0, free - sum(b.node_free[n][0] for n in mine))
    need = 0
    for ps in s.job.gpu_sets:  # largest pods first
        need += ps.count
        t = ps.gpus
        if rest // t + sum(a // t for a in mine.values()) < need:
            return False
    return True


def _try(s: Search, cluster: str, b: Block, victims: list[Victim]) -> Decision | None:
    """The what-if for ``victims`` unless arithmetic rules it out (:meth:`Search.fits` applies
    the set-level rule itself, before any what-if)."""
    if not could_fit(s, b, victims):
        return None
    return s.fits(cluster, victims)


def exact(s: Search, blocks: Sequence[tuple[str, Block]], found: Found) -> bool:
    """Best-first over every subset of ``blocks``' candidates (module docstring); the first set
    that fits goes to ``found``. True when the search finished (a set fit, or none can); False
    when half the what-ifs left or :data:`EXACT_SETS` sets stopped it first (the bounded
    search then has the other half)."""
    cands = [sorted(b.victims.values(), key=victim_key) for _, b in blocks]
    heap: list[tuple[SetKey, int, tuple[int, ...]]] = []
    for i, (cluster, _) in enumerate(blocks):
        if cands[i]:
            heap.append((set_key(cluster, cands[i][:1]), i, (0,)))
    heapq.heapify(heap)
    taken = 0
    stop = s.whatifs + max(1, (s.rules.max_whatifs - s.whatifs) // 2)
    while heap:
        if s.whatifs >= stop or taken >= EXACT_SETS:
            return False
        _, i, idx = heapq.heappop(heap)
        taken += 1
        cluster, b = blocks[i]
        vs = cands[i]
        nxt = idx[-1] + 1
        if nxt < len(vs):
            for succ in ((*idx, nxt), (*idx[:-1], nxt)):
                heapq.heappush(heap, (set_key(cluster, [vs[j] for j in succ]), i, succ))
        victims = [vs[j] for j in idx]
        d = _try(s, cluster, b, victims)
        if d is not None:
            found.offer(cluster, victims, d)
            return True
    return True


def _grow(s: Search, cluster: str, b: Block, split: Split) -> tuple[list[Victim], Decision] | None:
    """The shortest prefix of the victim order (``split``: the greedy head, the rest) that
    fits: doubling the victims added until the job fits, then bisecting back (freeing more never
    makes a job not fit), so O(log victims) what-ifs."""
    order = split[0] + split[1]
    lo = len(split[0])  # shorter prefixes cannot reach the demand's GPU count
    d = _try(s, cluster, b, order[:lo])
    if d is None:
        fail, step, hit = lo, 1, None
        while hit is None and fail < len(order) and not s.spent:
            n = min(len(order), fail + step)
            d = _try(s, cluster, b, order[:n])
            if d is None:
                fail, step = n, step * 2
            else:
                hit = n
        if hit is None:
            return None
        while hit - fail > 1 and not s.spent:
            mid = (fail + hit) // 2
            d2 = _try(s, cluster, b, order[:mid])
            if d2 is None:
                fail = mid
            else:
                hit, d = mid, d2
        lo = hit
    assert d is not None
    return order[:lo], d


def _prune(
    s: Search, cluster: str, b: Block, chosen: list[Victim], d: Decision
) -> tuple[list[Victim], Decision]:
    """Drop every victim without which the job still fits, most expensive first: by
    monotonicity one pass leaves every victim necessary (unless the budget runs out)."""
    for v in sorted(chosen, key=victim_key, reverse=True):
        if s.spent or len(chosen) == 1:
            break
        d2 = _try(s, cluster, b, [x for x in chosen if x is not v])
        if d2 is not None:
            chosen, d = [x for x in chosen if x is not v], d2
    return chosen, d


def _improve(
    s: Search, cluster: str, b: Block, chosen: list[Victim], d: Decision
) -> tuple[list[Victim], Decision]:
    """Swaps to one victim (module docstring): for each candidate not chosen, cheapest first,
    the set with it in place of the most expensive chosen victims whose GPUs it makes up for
    (by the block's arithmetic) is tried when its key is lower, and pruned when it fits; at
    most :data:`SWAPS` what-ifs."""
    key = set_key(cluster, chosen)
    tries = 0
    for v in sorted(b.victims.values(), key=victim_key):
        if s.spent or tries >= SWAPS:
            break
        prio, cost = v.running.priority, v.cost_gpu_s
        if prio > key[0] or (prio == key[0] and cost > key[1]):
            break  # every later candidate makes a set of a higher key on its own
        if any(x.running.uid == v.running.uid for x in chosen):
            continue
        keep = sorted(chosen, key=victim_key)
        have = b.free + b.freed[v.running.uid] + sum(b.freed[x.running.uid] for x in keep)
        for x in reversed(list(keep)):
            if have - b.freed[x.running.uid] >= s.job.demand:
                have -= b.freed[x.running.uid]
                keep.remove(x)
        trial = [*keep, v]
        if set_key(cluster, trial) >= key or not could_fit(s, b, trial):
            continue
        if not s.allowed(trial):
            continue
        tries += 1
        d2 = s.fits(cluster, trial)
        if d2 is not None:
            chosen, d = _prune(s, cluster, b, trial, d2)
            key = set_key(cluster, chosen)
    return chosen, d


def bounded(s: Search, cluster: str, b: Block, split: Split, found: Found) -> None:
    """Greedy prefix, prune, swaps (module docstring) in one block; the set to ``found``."""
    r = _grow(s, cluster, b, split)
    if r is None:
        if cluster not in found.per:
            found.members[cluster] = "the job does not fit even with the candidate victims gone"
        return
    chosen, d = _improve(s, cluster, b, *_prune(s, cluster, b, *r))
    found.offer(cluster, chosen, d)


def search(s: Search, tried: Sequence[tuple[str, Block, Split]]) -> Found:
    """The cheapest fitting set over the blocks ``tried`` (member, block, its greedy split):
    exact over the small blocks, then bounded over the large ones (over every block when the
    exact search stopped at :data:`EXACT_SETS`)."""
    found = Found()
    small = [(c, b) for c, b, _ in tried if len(b.victims) <= EXACT_MAX]
    done = exact(s, small, found)
    for c, _ in small:
        found.members.setdefault(
            c,
            "the job does not fit even with the candidate victims gone"
            if done and found.best is None
            else "no victim set here is cheaper than the plan's"
            if done
            else "not searched to the end (the exact search stopped)",
        )
    large = [t for t in tried if not done or len(t[1].victims) > EXACT_MAX]
    for cluster, b, split in large:
        if s.spent:
            break
        bounded(s, cluster, b, split, found)
    if not done:
        found.how = "bounded search (the exact one stopped at its share of the what-ifs or sets)"
    elif large:
        found.how = f"bounded search (a block has more than {EXACT_MAX} candidates)"
    found.exact = done and not large
    return found
