"""Backfill holds: the nodes a starving job keeps for itself (pure; the rule is in :mod:`.queue`).

:func:`hold_for` answers, for a job that has waited past the starvation limit, which nodes of
which member it should hold so that the work running there drains until it fits (docs/placement.md,
"Queue and backfill"). It reads the snapshot and the same static filters as ``place()``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Set
from functools import partial
from typing import cast

from gpufed.api.inventory import tolerates_all
from gpufed.api.request import PlacementRequest
from gpufed.placement.engine import static_candidates
from gpufed.placement.index import NodeEntry, NodeState, PoolState
from gpufed.placement.member import ClusterState
from gpufed.placement.memo import PlacementMemo, PoolMemo
from gpufed.placement.nodenames import NodeUnion, parts_of
from gpufed.placement.plugins import never_reason, plugins_for
from gpufed.placement.policy import Policy
from gpufed.placement.queue import Hold, gpus_of
from gpufed.placement.quota import JobQuota
from gpufed.placement.shape import JobShape, PodSetShape
from gpufed.placement.snapshot import FleetSnapshot


def hold_for(
    request: PlacementRequest,
    snapshot: FleetSnapshot,
    policy: Policy,
    quota: JobQuota | None = None,
    avoid: Mapping[str, Hold] | None = None,
    start_on: NodeStart | None = None,
    free_first: bool = False,
    now: float = 0.0,
    busy: bool = False,
    busy_start_on: NodeStart | None = None,
    keep: Hold | None = None,
) -> Hold | None:
    """The nodes a starving job should hold (:mod:`.queue`), or None.

    ``start_on(member, node, gpus)``: when ``gpus`` GPUs of that node are expected free
    (seconds, the pass clock; None: never known, as with a job without a time limit there;
    ``BackfillRule.hold_nodes`` ``earliest-drain``). With it the nodes are chosen by when
    they drain, not by how many GPUs are free now (:func:`_nodes_by_drain`): a job of one
    pod holds the node (or group) where it is expected to start first, a job of several pods
    the nodes that drain first, and the member where that start is earliest wins (ties: more
    free GPUs, then name). Nodes whose start is unknown come last. ``free_first`` (with
    ``start_on``, and ``now``, the pass clock): a job of several pods holds, of the nodes
    expected drained within :data:`FREE_FIRST_SLACK` times its earliest start's wait, those
    with the most free GPUs now (``BackfillRule.hold_nodes`` ``earliest-drain-multi-free``), so
    the busy nodes that drain soon stay for the jobs that want them whole.

    ``busy`` (``BackfillRule.hold_busy_nodes``): a job that must sit in one HGX node (one pod)
    may hold a node with no free GPU when no node of the pool has one (the first by name);
    without it such a job holds nothing in a pool whose every node is full, so on a saturated
    fleet one-node jobs never hold (docs/benchmarks.md, issue 29, ``backfill6``).
    ``busy_start_on`` (with ``busy``; ``BackfillRule.hold_busy_by_drain``): that full node is
    the one where the job is expected to start first (as ``start_on``; unknown starts last,
    ties by name) instead of the first by name.

    ``keep`` (``BackfillRule.hold_keep_one_node``; the caller passes the hold this job took in
    the last pass): a job of one GPU pod holds those nodes again, before any other choice
    (``start_on``, ``busy``, most free), while their member still passes the filters below and
    is not held whole in ``avoid``, every one of them is still in one pool of that member and
    not in ``avoid``, and they would hold the job once drained; otherwise the choice is made
    afresh. So a one-node job's hold stays on the node that has been draining for it instead of
    moving to whichever node is now expected to drain first (docs/benchmarks.md, issue 29,
    ``backfill8``). A job of several pods ignores it.

    ``avoid``: holds already taken in the pass (member -> hold); their nodes are not chosen
    again (a whole-member hold: that member is skipped), so several starving jobs of one shape
    drain different nodes.

    ``quota``: the job's ``Quota`` filter; pools of a product its queue cannot admit now are
    never held (the job could not use them once drained, and holding them would only keep
    other queues' jobs off them).

    Among pools that pass the static filters and could ever hold the job: for a job that must
    sit in one NVLink domain (one pod, or ``nvlink: Required``), rack or block, the group of
    that level whose nodes could hold it when drained and that has the most free GPUs now (an
    HGX node is its own domain); otherwise the nodes with the most free GPUs, as many as the
    job needs when they are empty. The member where those nodes have the most free GPUs wins
    (ties by name). A job without GPU pods holds its whole member. "Could hold it when
    drained" reads each node's allocatable and labels: only nodes the pods' nodeSelector
    allows count, and a job that no drained node could take (None) holds nothing, since
    holding would then block later jobs forever.
    """
    job = JobShape.of(request)
    static = static_candidates(job, snapshot, plugins_for(policy))
    best: tuple[int, str, frozenset[str]] | None = None
    soonest: tuple[float, int, str, frozenset[str]] | None = None
    for c, pool in static.candidates:
        if never_reason(job, c, pool, _pool_memo(snapshot.memo, pool)) is not None:
            continue
        if quota is not None and pool is not None and not quota.status(pool.product).ok:
            continue
        taken = avoid.get(c.name) if avoid else None
        if taken is not None and not taken.nodes:
            continue  # the whole member is held already
        skip = taken.nodes if taken is not None else frozenset()
        if keep is not None and _keeps(job, keep, c, pool, skip):
            return Hold(c.name, frozenset(keep.nodes), f"held for {request.job}")
        if pool is not None and start_on is not None:
            drained = _nodes_by_drain(job, pool, skip, partial(start_on, c.name), free_first, now)
            if drained is not None:
                key = (drained[0], -drained[1], c.name, drained[2])
                if soonest is None or key[:3] < soonest[:3]:
                    soonest = key
            continue
        if pool is None:
            found: tuple[int, frozenset[str]] | None = (
                (0, frozenset()) if not skip and _drained_fits_other(job, c) else None
            )
        else:
            by_drain = partial(busy_start_on, c.name) if busy_start_on is not None else None
            found = _nodes_to_hold(job, pool, skip, busy, by_drain)
        if found is None:
            continue
        if best is None or found[0] > best[0] or (found[0] == best[0] and c.name < best[1]):
            best = (found[0], c.name, found[1])
    if soonest is not None:  # only with start_on
        return Hold(soonest[2], soonest[3], f"held for {request.job}")
    if best is None:
        return None
    return Hold(best[1], best[2], f"held for {request.job}")


def _keeps(
    job: JobShape, keep: Hold, c: ClusterState, pool: PoolState | None, skip: Set[str]
) -> bool:
    """Whether ``job`` (one GPU pod) holds ``keep``'s nodes again in ``pool`` of ``c``
    (``hold_for``'s ``keep``): all of them in the pool, none in ``skip``, and the job fits
    them drained."""
    if pool is None or job.gpu_pods != 1 or keep.cluster != c.name:
        return False
    if not keep.nodes or not skip.isdisjoint(keep.nodes):
        return False
    nodes = [pool.nodes.get(name) for name in sorted(keep.nodes)]
    kept = [n for n in nodes if n is not None]
    return len(kept) == len(nodes) and _drained_fits(job, kept)


#: ``hold_for``'s ``free_first``: how much later than the earliest start a hold of several
#: nodes may start to take nodes with more free GPUs now (x the earliest start's wait)
FREE_FIRST_SLACK = 1.5

#: ``hold_for``'s ``start_on``: (member, node, GPUs) -> when that many GPUs of the node are
#: expected free, seconds (None: unknown)
NodeStart = Callable[[str, str, int], "float | None"]


def _nodes_by_drain(
    job: JobShape,
    pool: PoolState,
    skip: Set[str],
    start_on: Callable[[str, int], float | None],
    free_first: bool = False,
    now: float = 0.0,
) -> tuple[float, int, frozenset[str]] | None:
    """(expected start, free GPUs now, node names) of the nodes ``job`` should hold in
    ``pool`` when nodes are chosen by when they drain (``hold_for``'s ``start_on``, here per
    node name and GPUs): for a job that must sit in one NVLink domain, rack or block, the
    group of that level (an HGX node is its own NVLink domain) where it is expected to start
    first; otherwise the nodes in order of their expected drain (each node asked for the GPUs
    the job's largest pods would take there), as many as hold the job once drained. A
    group's or a set's start is that of the last node it needs. ``free_first``: of the nodes
    expected drained within :data:`FREE_FIRST_SLACK` times the earliest such start's wait
    (from ``now``), those with the most free GPUs now (the nodes still busy that drain soon
    stay for the jobs that want them whole). None when no nodes hold the job drained or its
    start is unknown."""
    inf = float("inf")
    level = next(
        (lv for lv in ("nvlink", "rack", "block") if lv in job.required),
        "nvlink" if job.gpu_pods == 1 else None,
    )
    big = job.gpu_sets[0]

    def need(n: NodeState) -> int:
        return min(n.gpu_alloc, _drained_slots(big, n) * big.gpus)

    def greedy(nodes: list[NodeState]) -> tuple[float, int, frozenset[str]] | None:
        timed = []
        for n in nodes:
            if n.name in skip or _drained_slots(big, n) <= 0:
                continue
            t = start_on(n.name, need(n))
            timed.append((inf if t is None else t, -n.gpu_free, n.name, n))
        timed.sort(key=lambda x: x[:3])
        chosen: list[NodeState] = []
        slots = 0
        for t, _, _, n in timed:
            chosen.append(n)
            slots += _drained_slots(big, n)
            if slots >= job.gpu_pods and _drained_fits(job, chosen):
                if t == inf:
                    return None
                if free_first:  # a start a little later, from the nodes with most free now
                    until = now + FREE_FIRST_SLACK * max(0.0, t - now)
                    chosen = most_free_first([x for x in timed if x[0] <= until])
                    t = max(x[0] for x in timed if x[3] in chosen)
                return t, sum(x.gpu_free for x in chosen), frozenset(x.name for x in chosen)
        return None

    def most_free_first(timed: list[tuple[float, int, str, NodeState]]) -> list[NodeState]:
        chosen: list[NodeState] = []
        slots = 0
        for _, _, _, n in sorted(timed, key=lambda x: (x[1], x[0], x[2])):
            chosen.append(n)
            slots += _drained_slots(big, n)
            if slots >= job.gpu_pods and _drained_fits(job, chosen):
                break
        return chosen

    if pool.slices:
        return None
    best: tuple[float, int, frozenset[str]] | None = None
    if level is not None:
        if level == "nvlink" and pool.single_count:
            for n in _offering(pool):
                if n.domain is not None or n.name in skip or not _drained_fits(job, [n]):
                    continue
                t = start_on(n.name, job.demand)
                if t is not None and (best is None or (t, -n.gpu_free) < (best[0], -best[1])):
                    best = (t, n.gpu_free, frozenset({n.name}))
        for g in pool.groups[level].values():
            if skip and not skip.isdisjoint(g.nodes):
                continue
            got = greedy(list(g.nodes.values()))
            if got is not None and (best is None or (got[0], -got[1]) < (best[0], -best[1])):
                best = got
        return best
    return greedy(_offering(pool))


def _offering(pool: PoolState) -> list[NodeState]:
    """The nodes of ``pool`` that offer capacity, by name."""
    return [n for _, n in sorted(pool.nodes.items()) if n.offers]


def whole_free_nodes(snapshot: FleetSnapshot) -> Callable[[PlacementRequest], Mapping[str, Hold]]:
    """``schedule_pass``'s ``spare`` (``BackfillRule.spare_whole_nodes_s``) for one pass.

    For a job, the nodes it would break: offering nodes of whole-GPU pools with every
    allocatable GPU free and more GPUs than the job asks in all (:func:`gpus_of`), and, for a
    job of one pod, every such node of a multi-node NVLink domain (a clique tray: the jobs of
    several pods that need the clique whole go first; TopologyCost would have kept it off them
    anyway, had the other whole nodes not been spared), as holds by member (no estimated
    start: nothing borrows them); empty for a job of no whole GPUs. The free nodes are read
    once, at this call (within a pass nodes only fill up).

    Cost: each pool's whole free nodes are kept in the placement memo for the pool's version
    (:class:`~gpufed.placement.memo.PoolMemo`), so a call reads again only the pools that
    changed since the last (O(pools) plus the whole free nodes of the changed pools), and a
    job's answer is built from per-pool node sets kept there too: a member's answer is a
    :class:`~gpufed.placement.nodenames.NodeUnion` of its pools' sets (never a copy), kept
    across calls while none of the member's pools changed."""
    memo = snapshot.memo
    #: member -> (its pools' _WholeFree, (job GPUs, one pod?) -> its hold or None), kept
    #: across passes: a member whose pools are all unchanged answers with the same holds
    kept: dict[str, tuple[tuple[_WholeFree, ...], dict[tuple[int, bool], Hold | None]]]
    kept = memo.kept.setdefault(_WHOLE_KEY, {})
    whole: list[tuple[str, dict[tuple[int, bool], Hold | None], tuple[_WholeFree, ...]]] = []
    names: set[str] = set()
    for c in snapshot.clusters():
        names.add(c.name)
        found = tuple(
            w for w in (_whole_free(memo, p) for p in c.pools.values() if not p.slices) if w.sets
        )
        entry = kept.get(c.name)
        if entry is None or entry[0] != found:  # _WholeFree compares by identity
            entry = kept[c.name] = (found, {})
        if len(entry[1]) > _ANSWERS_CAP:  # distinct job sizes are the caller's: bounded
            entry[1].clear()
        if found:
            whole.append((c.name, entry[1], found))
    if len(kept) > len(names):  # members that left the snapshot (every member has an entry)
        for gone in kept.keys() - names:
            del kept[gone]
    cache: dict[tuple[int, bool], Mapping[str, Hold]] = {}

    def spare(request: PlacementRequest) -> Mapping[str, Hold]:
        demand = gpus_of(request)
        if demand <= 0 or not whole:
            return {}
        one_pod = sum(ps.count for ps in request.pod_sets) == 1
        key = (demand, one_pod)
        out = cache.get(key)
        if out is None:
            out = {}
            for cluster, answers, pools in whole:
                if key in answers:
                    hold = answers[key]
                else:
                    # the pools' own sets, not a copy of their union (nodenames.py: the copy
                    # per member, job size and pass was most of the hub's CPU on a large idle
                    # fleet)
                    union = NodeUnion.of(
                        p for w in pools for p in parts_of(w.spared(demand, one_pod))
                    )
                    hold = (
                        Hold(cluster, union, "whole free nodes kept for bigger jobs")
                        if union
                        else None
                    )
                    answers[key] = hold
                if hold is not None:
                    out[cluster] = hold
            cache[key] = out
        return out

    return spare


#: sorts before every entry of a fully free node and after every partly used one (a prefix of
#: the first; never compared with a NodeState)
_FIRST_WHOLE = cast(NodeEntry, (True,))
#: answers (job GPUs, one pod?) kept per member between its pools' changes, at most
_ANSWERS_CAP = 64
#: the PoolMemo key of a pool's whole free nodes (:func:`whole_free_nodes`)
_WHOLE_KEY = ("holds.whole_free",)


class _WholeFree:
    """One pool's whole free nodes at one version: their names by (GPUs, clique tray?) (an HGX
    pool has one such set, a pool of NVL72 trays another), and per (job GPUs, one pod?) the
    names a job of that kind would break (one of those sets itself when only one applies, else
    a :class:`~gpufed.placement.nodenames.NodeUnion` of them: no copy)."""

    __slots__ = ("_spared", "sets")

    def __init__(self, sets: dict[tuple[int, bool], frozenset[str]]) -> None:
        self.sets = sets
        self._spared: dict[tuple[int, bool], Set[str]] = {}

    def spared(self, demand: int, one_pod: bool) -> Set[str]:
        got = self._spared.get((demand, one_pod))
        if got is None:
            got = NodeUnion.of(
                names
                for (gpus, tray), names in self.sets.items()
                if gpus > demand or (tray and one_pod)
            )
            self._spared[(demand, one_pod)] = got
        return got


def _whole_free(memo: PlacementMemo, pool: PoolState) -> _WholeFree:
    """The pool's whole free nodes, from the memo while the pool is unchanged. In bucket ``f``
    the entries of nodes with every GPU free (``entry[0]``) come after the partly used ones,
    so only those are read."""
    pm = memo.pool(pool)
    got: _WholeFree | None = pm.recall(_WHOLE_KEY)
    if got is None:
        sets: dict[tuple[int, bool], frozenset[str]] = {}
        trays = bool(pool.groups["nvlink"])  # else every node is its own NVLink domain
        for f in range(len(pool.buckets) - 1, 0, -1):
            if not pool.counts[f]:
                continue
            bucket = pool.buckets[f]
            start = bucket.bisect_left(_FIRST_WHOLE)
            if start == len(bucket):
                continue
            if not trays:
                sets[(f, False)] = frozenset(e[1] for e in bucket.islice(start))
                continue
            split: dict[bool, list[str]] = {False: [], True: []}
            for e in bucket.islice(start):
                split[e[2].domain is not None].append(e[1])
            for tray, names in split.items():
                if names:
                    sets[(f, tray)] = frozenset(names)
        got = _WholeFree(sets)
        pm.remember(_WHOLE_KEY, got)
    return got


def _nodes_to_hold(
    job: JobShape,
    pool: PoolState,
    skip: Set[str] = frozenset(),
    busy: bool = False,
    busy_start_on: Callable[[str, int], float | None] | None = None,
) -> tuple[int, frozenset[str]] | None:
    """(free GPUs now, node names) of the nodes ``job`` should hold in ``pool``, none of them
    in ``skip`` (a group with a node in ``skip`` is not chosen). ``busy``: a job of one node
    that finds no node with a free GPU holds the first full one (``hold_for``), or with
    ``busy_start_on`` (node name, GPUs -> expected start, seconds, None: unknown) the one
    where it is expected to start first (unknown last, ties by name)."""
    level = next(
        (lv for lv in ("nvlink", "rack", "block") if lv in job.required),
        "nvlink" if job.gpu_pods == 1 else None,
    )
    if level is not None and not pool.slices:
        best: tuple[int, str, list[str]] | None = None
        if level == "nvlink" and pool.single_count:
            for n in pool.iter_nodes_descending(1):
                if n.domain is None and n.name not in skip and _drained_fits(job, [n]):
                    best = (n.gpu_free, n.name, [n.name])
                    break
        groups = pool.groups[level]
        for g in sorted(groups.values(), key=lambda g: (-g.free, g.key)):
            if best is not None and g.free <= best[0]:
                break
            if skip and not skip.isdisjoint(g.nodes):
                continue
            if _drained_fits(job, list(g.nodes.values())):
                best = (g.free, g.key, sorted(g.nodes))
                break
        if best is None and busy and job.gpu_pods == 1 and level == "nvlink" and pool.single_count:
            soonest: tuple[float, str] | None = None
            for entry in pool.buckets[0]:  # every node full: the first that holds it drained
                n = entry[2]
                if n.domain is None and n.name not in skip and _drained_fits(job, [n]):
                    if busy_start_on is None:
                        return 0, frozenset({n.name})
                    start = busy_start_on(n.name, job.gpu_sets[0].gpus)
                    key = (math.inf if start is None else start, n.name)
                    if soonest is None or key < soonest:
                        soonest = key
            if soonest is not None:
                return 0, frozenset({soonest[1]})
        return (best[0], frozenset(best[2])) if best is not None else None
    chosen: list[NodeState] = []
    free = 0
    slots = 0
    big = job.gpu_sets[0]  # the largest pods
    for f in range(len(pool.buckets) - 1, -1, -1):
        for entry in pool.buckets[f]:
            n = entry[2]
            if n.name in skip:
                continue
            k = _drained_slots(big, n)
            if k <= 0:
                continue
            chosen.append(n)
            free += f
            slots += k
            if slots >= job.gpu_pods and _drained_fits(job, chosen):
                return free, frozenset(x.name for x in chosen)
    return None


def _drained_slots(s: PodSetShape, n: NodeState) -> int:
    """Pods of ``s`` that node ``n`` holds once empty: its allocatable GPUs and other
    resources, if it offers capacity and its labels match the pod set's nodeSelector."""
    if not n.offers:
        return 0
    labels = n.inv.labels
    if any(labels.get(k) != v for k, v in s.selector):
        return 0
    alloc = n.inv.allocatable
    k = n.gpu_alloc // s.gpus if s.gpus else 10**9
    for r, a in s.other:
        k = min(k, alloc.get(r, 0) // a)
    return k


def _drained_fits(job: JobShape, nodes: list[NodeState]) -> bool:
    """Whether ``nodes``, once empty, hold every GPU pod of ``job`` (allocatable only)."""
    for s in job.gpu_sets:
        if sum(_drained_slots(s, n) for n in nodes) < s.count:
            return False
    return sum(n.gpu_alloc for n in nodes if n.offers) >= job.demand


def _drained_fits_other(job: JobShape, c: ClusterState) -> bool:
    """Whether member ``c``, once empty, holds every pod of a job without GPU pods (nodes
    whose taints the pods tolerate and whose labels match their nodeSelector)."""
    for s in job.other_sets:
        slots = 0
        for n in c.nodes.values():
            if n.inv.taints and not tolerates_all(s.tolerations, n.inv.taints):
                continue
            slots += _drained_slots(s, n)
            if slots >= s.count:
                break
        else:
            return False
    return True


def _pool_memo(memo: PlacementMemo, pool: PoolState | None) -> PoolMemo | None:
    return memo.pool(pool) if pool is not None else None
