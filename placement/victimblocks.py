"""Candidate victims filed by block, and each block's greedy estimate (pure): the first phase
of the victim search of :mod:`.victims` (docs/placement.md, "Preemption").

A preemptor must sit in one block: its NVLink domain for a one-pod or ``nvlink: Required`` job,
else its rack / block when required, else the whole member (:func:`level_of`). Per block, the
cheapest eligible victims (victim order: priority, work lost, UID) are counted in until the
block's free GPUs reach the job's demand (:func:`greedy`; a whole-member block goes node by
node, :func:`by_node`); the search tries the blocks of the whole fleet with the cheapest of
these estimates (:func:`set_key` order).

:func:`estimates` computes the estimates from the :class:`~gpufed.placement.runindex.RunningIndex`:
for a job that needs a block (NVLink domain, rack, block) it reads only the blocks of the pools
its GPU products name, one tuple per eligible victim, and files the full :class:`Block` (the
:class:`~gpufed.placement.preemption.Victim` objects) only for the few blocks the search then
tries (:meth:`Estimate.block`); a whole-member block is filed at once from the member's jobs in
those pools (:func:`file_blocks`). Either way the estimates, their order and the blocks tried
are those a scan of every running job gives.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gpufed.api.errors import GpufedError
from gpufed.placement.index import GroupState, NodeState, PoolState
from gpufed.placement.member import ClusterState
from gpufed.placement.preemption import Running, Victim, work_lost_gpu_s
from gpufed.placement.runindex import BlockRuns, Floor, RunningIndex, block_group
from gpufed.placement.shape import JobShape

if TYPE_CHECKING:
    from gpufed.placement.victims import Search

#: Cost order of a victim set: highest victim priority, work lost (GPU-s, rounded), victims,
#: member, victim UIDs sorted.
SetKey = tuple[int, float, int, str, tuple[str, ...]]


def set_key(cluster: str, victims: Sequence[Victim]) -> SetKey:
    """Cost order of a plan: highest victim priority, work lost, victims, member, UIDs."""
    return (
        max(v.running.priority for v in victims),
        round(sum(v.cost_gpu_s for v in victims), 6),
        len(victims),
        cluster,
        tuple(sorted(v.running.uid for v in victims)),
    )


def victim_key(v: Victim) -> tuple[int, float, str]:
    """Victim order inside a block: priority, work lost, UID."""
    return (v.running.priority, v.cost_gpu_s, v.running.uid)


def level_of(job: JobShape) -> str | None:
    """The block the job must sit in: nvlink / rack / block, or None (the whole member)."""
    return next(
        (lv for lv in ("nvlink", "rack", "block") if lv in job.required),
        "nvlink" if job.gpu_pods == 1 else None,
    )


@dataclass
class Block:
    """Candidate victims of one block: its free and allocatable GPUs, its eligible victims and
    the GPUs each frees in it."""

    key: str
    free: int
    cap: int
    victims: dict[str, Victim] = field(default_factory=dict)
    freed: dict[str, int] = field(default_factory=dict)  # victim uid -> GPUs freed in the block
    #: node -> (its free GPUs, its victims' uids): to order a whole-member block by node
    nodes: dict[str, tuple[int, list[str]]] = field(default_factory=dict)
    #: node -> (its free GPUs, its GPU product), for every node of the block a victim runs on
    #: (any level): the pods-per-node arithmetic of :func:`~gpufed.placement.victimsets.could_fit`
    node_free: dict[str, tuple[int, str]] = field(default_factory=dict)
    #: a whole-member block's free GPUs per GPU product (a job's pods share one product);
    #: empty for a smaller block, whose free GPUs count as one
    product_free: dict[str, int] = field(default_factory=dict)


def holds_a_pod(n: NodeState, g: GroupState | None, pod_gpus: int) -> bool:
    """Whether a node of the block of ``n`` (its group ``g``; None: ``n`` alone) has
    ``pod_gpus`` allocatable GPUs: a block none of whose nodes can hold the job's largest pod
    never fits it, whatever is stopped there (a one-pod 8-GPU job and a GB200 clique of 4-GPU
    trays), so it is not searched (its sets would spend the what-ifs of the exact search)."""
    if g is None:
        return n.gpu_alloc >= pod_gpus
    return any(x.gpu_alloc >= pod_gpus for x in g.nodes.values())


def file_blocks(
    s: Search, c: ClusterState, runs: Iterable[Running], reasons: dict[str, str]
) -> list[Block]:
    """Candidate victims of member ``c`` filed by block (module docstring)."""
    level = level_of(s.job)
    products = s.job.products
    blocks: dict[str, Block] = {}
    hopeless: set[str] = set()  # blocks none of whose nodes can hold the largest pod
    pod_gpus = s.job.max_gpus
    prio = s.p.request.priority
    for run in runs:
        if run.priority >= prio and s.quota is None:
            continue  # cheap reject before any look-up: no reclaim without queues
        for name, gpus in run.gpus.items() if len(run.gpus) == 1 else sorted(run.gpus.items()):
            n = c.nodes.get(name)
            if n is None or n.pool is None or n.pool.slices or gpus <= 0:
                continue
            if products is not None and n.pool.product not in products:
                continue
            v = s.victim(run, n.pool.product)
            if isinstance(v, str):
                reasons[run.uid] = v
                break
            g = None if level is None else block_group(n, level)
            if level is None:
                key, free, cap = "", 0, 0
            elif g is not None:
                key, free, cap = g.key, g.free, g.cap
            elif level == "nvlink":
                key, free, cap = n.domain_id, n.gpu_free, n.gpu_alloc
            else:
                continue  # a node without that label can never hold a job that needs it
            b = blocks.get(key)
            if b is None:
                if key in hopeless:
                    continue
                if level is not None and not holds_a_pod(n, g, pod_gpus):
                    hopeless.add(key)
                    continue
                b = blocks[key] = Block(key, free, cap)
            b.victims[run.uid] = v
            b.freed[run.uid] = b.freed.get(run.uid, 0) + gpus
            b.node_free[name] = (n.gpu_free, n.pool.product)
            if level is None:
                b.nodes.setdefault(name, (n.gpu_free, []))[1].append(run.uid)
    if level is None and "" in blocks:
        b = blocks[""]
        pools = [p for p in c.pools.values() if not p.slices]
        if products is not None:
            pools = [p for p in pools if p.product in products]
        b.free = sum(p.free for p in pools)
        b.cap = sum(p.cap for p in pools)
        for p in pools:
            b.product_free[p.product] = b.product_free.get(p.product, 0) + p.free
    return [b for b in blocks.values() if b.cap >= s.job.demand]


def by_node(b: Block, pod_gpus: int) -> list[Victim]:
    """A whole-member block's victims in node order: per node, the cheapest victims that free
    one pod of the largest size there; nodes by the cost of that; then the rest. GPUs freed
    across many half-used nodes hold no pod, so the cost order alone would take far too many."""
    heads: list[tuple[tuple[int, float, int, str, tuple[str, ...]], list[Victim]]] = []
    tail: list[Victim] = []
    seen: set[str] = set()
    for name, (free, uids) in sorted(b.nodes.items()):
        vs = sorted((b.victims[u] for u in uids), key=victim_key)
        k = 0
        while k < len(vs) and free < pod_gpus:
            free += vs[k].running.gpus.get(name, 0)
            k += 1
        if free >= pod_gpus and k:
            heads.append((set_key(name, vs[:k]), vs[:k]))
            tail += vs[k:]
        else:
            tail += vs
    order: list[Victim] = []
    for _, vs in sorted(heads, key=lambda h: h[0]):
        for v in vs:
            if v.running.uid not in seen:
                seen.add(v.running.uid)
                order.append(v)
    for v in sorted(tail, key=victim_key):
        if v.running.uid not in seen:
            seen.add(v.running.uid)
            order.append(v)
    return order


def greedy(b: Block, demand: int, pod_gpus: int) -> tuple[list[Victim], list[Victim]] | None:
    """(the cheapest victims that bring the block's free GPUs to ``demand``, the rest in cost
    order), or None when even all of them would not. A whole-member block goes node by node
    (:func:`by_node`)."""
    order = by_node(b, pod_gpus) if b.nodes else sorted(b.victims.values(), key=victim_key)
    free = b.free
    for i, v in enumerate(order):
        free += b.freed[v.running.uid]
        if free >= demand:
            return order[: i + 1], order[i + 1 :]
    return None


@dataclass(slots=True)
class Estimate:
    """One block's greedy estimate: ``head`` (:data:`SetKey` without the UIDs), the block's
    ``bkey``, the greedy victims' ``uids``; ``filed``: the block and its greedy split when
    already filed (whole-member blocks), else the index's ``runs`` of the block to file it."""

    head: tuple[int, float, int, str]
    bkey: str
    uids: list[str]
    filed: tuple[Block, tuple[list[Victim], list[Victim]]] | None = None
    runs: BlockRuns | None = None

    @property
    def cluster(self) -> str:
        return self.head[3]

    def key(self) -> tuple[SetKey, str]:
        """The full order: :data:`SetKey`, then the block's key."""
        return ((*self.head, tuple(sorted(self.uids))), self.bkey)

    def block(
        self, s: Search, c: ClusterState, skip: set[str], reasons: dict[str, str]
    ) -> tuple[Block, tuple[list[Victim], list[Victim]]]:
        """The filed block and its greedy split (chosen, rest), as a full scan files them.
        Call it with the cycle's earlier plans applied (the block's free GPUs as they leave
        them), like :func:`estimates`. Raises :class:`FleetChangedError` when the block no longer
        frees enough: the snapshot changed since the estimate by more than the cycle's own
        plans (a caller that changes it while a worker plans)."""
        if self.filed is None:
            assert self.runs is not None
            runs = [r for r, _ in self.runs.runs.values() if r.uid not in skip]
            b = next((b for b in file_blocks(s, c, runs, reasons) if b.key == self.bkey), None)
            g = greedy(b, s.job.demand, s.job.max_gpus) if b is not None else None
            if b is None or g is None:  # the same victims reached the demand in estimates()
                raise FleetChangedError(f"block {self.bkey} of {c.name} changed since its estimate")
            self.filed = (b, g)
        return self.filed


class FleetChangedError(GpufedError, RuntimeError):
    """The snapshot changed under a decision by more than the cycle's own plans (a
    ``RuntimeError``, like a dict changing size under a reader: the hub plans again)."""


#: A lower bound of an :meth:`Estimate.key` (:func:`block_floor`), compared with keys.
FloorKey = tuple[tuple[int, float, int, str, tuple[str]], str]


def cost_floor(gmin: float, amax: float, now: float) -> float:
    """A lower bound of the work lost (GPU-seconds, rounded to 6 places as an estimate's cost
    is) of preempting any one job of a block whose jobs hold at least ``gmin`` GPUs each and
    whose cost anchors (:func:`~gpufed.placement.preemption.cost_anchor`) are at most ``amax``
    (wall seconds), at ``now``: :func:`block_floor`'s and the estimate book's heap's. O(1)."""
    return round(gmin * max(0.0, now - amax), 6)


def block_floor(f: Floor, now: float, cluster: str, bkey: str) -> FloorKey:
    """A lower bound, in :meth:`Estimate.key` order, of the estimate of any block whose jobs
    ``f`` bounds (:class:`~gpufed.placement.runindex.Floor`), in member ``cluster``, block key
    ``bkey`` (``""``: any block of a pool), at ``now``, whatever the preemptor, its rules and
    the victims skipped: ``(low, cost floor, 1, cluster, (umin,)), bkey``. The greedy victims'
    highest priority is at least ``low``; at that priority their work lost is at least one
    victim's, at least ``round(gmin x max(0, now - amax), 6)`` (float operations are monotone,
    so the floor is exact against :func:`~gpufed.placement.preemption.work_lost_gpu_s`); they
    are at least one; their sorted UIDs start at or after ``umin``. O(1)."""
    return ((f.low, cost_floor(f.gmin, f.amax, now), 1, cluster, (f.umin,)), bkey)


class Bound:
    """The ``k`` cheapest estimates found so far (across members) and the priority the
    ``k``-th reaches: a block none of whose jobs is below that priority, or whose
    :func:`block_floor` is at or above the ``k``-th key (:meth:`beyond`), cannot be among the
    ``k`` cheapest (keys are unique: the block key ends them), and is passed over unread."""

    __slots__ = ("counts", "k", "keys", "passed", "prio")

    def __init__(self, k: int) -> None:
        self.k = k
        self.prio: float = float("inf")
        self.counts: dict[int, int] = {}
        #: the keys of the (at most) k cheapest estimates found, ascending
        self.keys: list[tuple[SetKey, str]] = []
        #: blocks passed over, per member
        self.passed: dict[str, int] = {}

    def found(self, e: Estimate) -> None:
        """Count estimate ``e`` in (its priority, and its key among the k cheapest)."""
        self.add(e.head[0])
        keys = self.keys
        if len(keys) >= self.k and e.head > keys[-1][0][:4]:
            return  # not among the k cheapest: no need for its sorted UIDs
        bisect.insort(keys, e.key())
        if len(keys) > self.k:
            keys.pop()

    def beyond(self, floor: FloorKey) -> bool:
        """Whether a block of this floor cannot be among the k cheapest."""
        keys = self.keys
        return len(keys) >= self.k and floor >= keys[-1]

    def add(self, prio: int) -> None:
        self.counts[prio] = self.counts.get(prio, 0) + 1
        if prio > self.prio:
            return
        n = 0
        for p in sorted(self.counts):
            n += self.counts[p]
            if n >= self.k:
                self.prio = p
                return


def estimates(
    s: Search,
    c: ClusterState,
    index: RunningIndex,
    skip: set[str],
    reasons: dict[str, str],
    bound: Bound,
) -> list[Estimate]:
    """The blocks of member ``c`` whose eligible victims (not in ``skip``) free enough GPUs
    for the job, with their greedy estimates, less blocks ``bound`` shows cannot be among the
    cheapest (counted in ``bound.passed``); ineligible jobs' reasons go to ``reasons``. Call it
    with the cycle's earlier plans applied to the snapshot (:func:`~.whatif.freed`)."""
    level = level_of(s.job)
    products = s.job.products
    pools = [
        p for p in c.pools_sorted() if not p.slices and (products is None or p.product in products)
    ]
    if level is None:
        seen: dict[str, Running] = {}
        for pool in pools:
            for b in index.blocks(c.name, "", pool.key):
                for uid, (run, _) in b.runs.items():
                    if uid not in skip:
                        seen[uid] = run
        out = []
        for blk in file_blocks(s, c, seen.values(), reasons):
            g = greedy(blk, s.job.demand, s.job.max_gpus)
            if g is not None:
                k = set_key(c.name, g[0])
                out.append(Estimate(k[:4], blk.key, list(k[4]), filed=(blk, g)))
        return out
    return _block_estimates(s, c, index, level, pools, skip, reasons, bound)


def _block_estimates(
    s: Search,
    c: ClusterState,
    index: RunningIndex,
    level: str,
    pools: list[PoolState],
    skip: set[str],
    reasons: dict[str, str],
    bound: Bound,
) -> list[Estimate]:
    """:func:`estimates` for a job that must sit in one block: :func:`block_estimate` per
    block the bound does not pass over, in :func:`block_floor` order, until the floor of the
    next block is at or above the ``k``-th cheapest estimate found (a pool whose
    :meth:`~.runindex.RunningIndex.floor` is already there is not looked into)."""
    name = c.name
    now = s.now
    out: list[Estimate] = []
    todo: list[tuple[FloorKey, int, BlockRuns, str]] = []
    passed = 0
    for pool in pools:
        blocks = index.blocks(name, level, pool.key)
        f = index.floor(name, level, pool.key)
        if f is not None and bound.beyond(block_floor(f, now, name, "")):
            passed += len(blocks)
            continue
        for b in blocks:
            if b.low > bound.prio:
                passed += 1
                continue
            bf = block_floor(b, now, name, b.key)
            if bound.beyond(bf):
                passed += 1
                continue
            todo.append((bf, len(todo), b, pool.product))
    heapq.heapify(todo)
    while todo:
        bf, _, b, product = heapq.heappop(todo)
        if bound.beyond(bf):
            passed += 1 + len(todo)  # the rest's floors are at least this one
            break
        e = block_estimate(s, c, b, level, product, skip, reasons)
        if e is not None:
            bound.found(e)
            out.append(e)
    if passed:
        bound.passed[name] = bound.passed.get(name, 0) + passed
    return out


def block_estimate(
    s: Search,
    c: ClusterState,
    b: BlockRuns,
    level: str,
    product: str,
    skip: set[str],
    reasons: dict[str, str],
) -> Estimate | None:
    """One block's greedy estimate for a job that must sit in one block (None: its eligible
    victims not in ``skip`` cannot free enough): one tuple per victim, the :class:`Victim`
    objects only for jobs the fast rule cannot judge (past preemptions, any job when there
    are queues; :meth:`Search.victim` decides those). Ineligible jobs' reasons go to
    ``reasons``. Reads the block's free GPUs live (call it with the cycle's plans applied)."""
    demand = s.job.demand
    fc = b.free_cap(c, level)
    if fc is None or fc[1] < demand:
        return None
    if level:
        n = c.nodes[b.node]
        if not holds_a_pod(n, block_group(n, level), s.job.max_gpus):
            return None
    prio_p = s.p.request.priority
    no_quota = s.quota is None
    now = s.now
    min_rt = s.rules.min_runtime_s
    judged = bool(s.p.preempted)  # cycle-back needs the full rule for every victim
    own = s.own_queue
    default = s.quota.tree.default_queue if s.quota is not None else None
    cand: list[tuple[int, float, str, int]] = []
    for run, gpus in b.runs.values():
        uid = run.uid
        if uid in skip:
            continue
        prio = run.priority
        if prio >= prio_p and no_quota:
            continue  # no reclaim without queues
        if (
            prio < prio_p
            and (no_quota or (own is not None and (run.queue or default) == own))
            and not judged
            and not run.preempted
            and now - run.started_at >= min_rt
            and now >= run.preemptible_after
        ):
            # victim() would say yes on priority alone: no queues, or a lower priority of the
            # preemptor's own queue whose withinQueue is not Never
            cost = work_lost_gpu_s(run, now)
        else:
            v = s.victim(run, product)
            if isinstance(v, str):
                reasons[uid] = v
                continue
            cost = v.cost_gpu_s
        cand.append((prio, cost, uid, gpus))
    if not cand:
        return None
    if len(cand) > 1:
        cand.sort()  # victim_key order (UIDs are unique: GPUs never compared)
    free = fc[0]
    spent = 0.0
    for i, (prio, cost, _uid, gpus) in enumerate(cand):
        free += gpus
        spent += cost
        if free >= demand:
            return Estimate(
                (prio, round(spent, 6), i + 1, c.name),
                b.key,
                [x[2] for x in cand[: i + 1]],
                runs=b,
            )
    return None


def cheapest(rows: list[Estimate], k: int) -> list[Estimate]:
    """The ``k`` first estimates in :meth:`Estimate.key` order, sorted, in O(rows): the UIDs
    are sorted only for rows that tie with the ``k``-th on the rest of the key."""
    if len(rows) <= k:
        return sorted(rows, key=Estimate.key)
    kth = heapq.nsmallest(k, (r.head for r in rows))[-1]
    return sorted((r for r in rows if r.head <= kth), key=Estimate.key)[:k]
