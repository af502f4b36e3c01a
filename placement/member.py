"""One member cluster as placement sees it: metadata, health, nodes, and the filing of each node
into its pool and groups.

:class:`ClusterState` is built and changed only by
:class:`~gpufed.placement.snapshot.FleetSnapshot` (which passes in the reservation
:class:`~gpufed.placement.ledger.Ledger` so each node starts with what it owes); ``place()``,
its plugins, the planner and the simulator read it. The per-pool structures it fills are in
:mod:`.index`.

Nodes with whole GPUs (or MIG-single slices) are grouped into **pools**: one per GPU product,
MIG mode and set of scheduling taints (``NoSchedule``/``NoExecute``), i.e. a Kubernetes node pool.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from sortedcontainers import SortedList

from gpufed.api.inventory import ClusterHealth, NodeInventory, Taint
from gpufed.api.labels import GPU_RESOURCE, is_mig_resource
from gpufed.placement.devicecel import dra_kinds
from gpufed.placement.index import AllocShape, GroupState, NodeEntry, NodeState, PoolKey, PoolState
from gpufed.placement.ledger import Ledger


class ClusterState:
    """One member: metadata from the hub, health, nodes and their pools."""

    __slots__ = (
        "agent_version",
        "alloc_shapes",
        "extended",
        "filings",
        "health",
        "labels",
        "name",
        "names",
        "nodes",
        "pools",
        "served_kinds",
        "taints",
    )

    def __init__(self, name: str) -> None:
        self.name = name
        self.labels: dict[str, str] = {}
        self.taints: tuple[Taint, ...] = ()
        self.health = ClusterHealth(ready=True)
        self.served_kinds: frozenset[str] = frozenset()
        self.agent_version = ""
        self.nodes: dict[str, NodeState] = {}
        #: node objects filed or taken out so far (a node re-filed, its shape, labels or pool
        #: changed, counts twice; one updated in place, its GPUs in use, not at all): a
        #: reader that keeps a view of the filing compares it (O(1)) to see any change
        self.filings = 0
        self.pools: dict[PoolKey, PoolState] = {}
        #: non-GPU extended resources (MIG profiles, ...) -> names of nodes that have some
        self.extended: dict[str, SortedList[str]] = {}
        self.names: SortedList[str] = SortedList()
        #: distinct node allocatable shapes -> node count (for "could it ever fit")
        self.alloc_shapes: dict[AllocShape, int] = {}

    def pools_sorted(self) -> list[PoolState]:
        """Pools in a stable order (product, slices, taints)."""
        return [self.pools[k] for k in sorted(self.pools)]

    # --- maintenance (FleetSnapshot only) -------------------------------------------------------
    def add_node(self, inv: NodeInventory, ledger: Ledger) -> bool:
        """File a new node in its pool and groups; True when that made a new pool."""
        n, new_pool = self._make_node(inv, ledger)
        self.names.add(inv.name)
        if n.pool is not None:
            n.pool._attach_offer(n)
            for g in (n.domain, n.rack, n.block):
                if g is not None and g.entry is None:
                    n.pool._group_move(g, g.free, 0, 0)
        return new_pool

    def add_nodes(self, nodes: Sequence[NodeInventory], ledger: Ledger) -> bool:
        """:meth:`add_node` for each of ``nodes``, with each group they join re-filed once for
        all of them rather than once per node (the state is the same; a member's first
        inventory comes this way, a chunk at a time). True when that made a new pool. Raises
        ``ValueError``, changing nothing, for a node the member has or that is listed twice."""
        names = [inv.name for inv in nodes]
        if len(set(names)) != len(names) or not self.nodes.keys().isdisjoint(names):
            dup = next(x for i, x in enumerate(names) if x in self.nodes or x in names[:i])
            raise ValueError(f"member {self.name!r}: node {dup!r} is there already")
        new_pool = False
        made: list[NodeState] = []
        for inv in nodes:
            n, p = self._make_node(inv, ledger)
            new_pool |= p
            made.append(n)
        self.names.update(names)
        # group -> [its pool, free GPUs added, capacity added]
        moved: dict[GroupState, list[Any]] = {}
        for n in made:
            pool = n.pool
            if pool is None:
                continue
            if n.offers:
                f = n.gpu_free
                pool._add_entry(n)
                pool.free += f
                pool.cap += n.gpu_alloc
            for g in (n.domain, n.rack, n.block):
                if g is None:
                    continue
                acc = moved.get(g)
                if acc is None:
                    acc = moved[g] = [pool, 0, 0]
                if n.offers:
                    f = n.gpu_free
                    counts = g.counts  # GroupState.count_offering, inline
                    while len(counts) <= f:
                        counts.append(0)
                    counts[f] += 1
                    acc[1] += f
                    acc[2] += n.gpu_alloc
        for g, (pool, df, dcap) in moved.items():
            if dcap or g.entry is None:
                pool._group_move(g, g.free, df, dcap)
        return new_pool

    def remove_node(self, n: NodeState) -> PoolState | None:
        """Take a node out of its pool and groups; returns its pool when that left it empty
        (the pool is then gone)."""
        shape = _alloc_shape(n.inv.allocatable)
        _dec(self.alloc_shapes, shape)
        pool = n.pool
        dropped: PoolState | None = None
        if pool is not None:
            _dec(pool.alloc_shapes, shape)
            pool.version += 1
            pool._detach_offer(n)
            del pool.nodes[n.name]
            pool.static_version += 1
            if n.domain is None:
                pool.single_count -= 1
            for g in (n.domain, n.rack, n.block):
                if g is not None:
                    del g.nodes[n.name]
                    if not g.nodes:
                        pool._group_move(g, g.free, 0, 0)
                        del pool.groups[g.level][g.key]
            if not pool.nodes:
                del self.pools[pool.key]
                dropped = pool
        for r, lst in list(self.extended.items()):
            if n.name in lst:
                lst.remove(n.name)
                if not lst:
                    del self.extended[r]
        del self.nodes[n.name]
        self.filings += 1
        self.names.remove(n.name)
        return dropped

    def bulk_add(self, nodes: Iterable[NodeInventory], ledger: Ledger) -> None:
        """Build the member's indexes in one go: sorted structures are built once, not per
        node. Raises ``ValueError`` for a node listed twice."""
        made: list[NodeState] = []
        for inv in nodes:
            if inv.name in self.nodes:
                raise ValueError(f"member {self.name!r}: node {inv.name!r} appears twice")
            made.append(self._make_node(inv, ledger)[0])
        self.names = SortedList(self.nodes.keys())
        per_bucket: dict[tuple[PoolKey, int], list[NodeEntry]] = {}
        for n in made:
            pool = n.pool
            if pool is None or not n.offers:
                continue
            f = n.gpu_free
            entry: NodeEntry = (f == n.gpu_alloc, n.name, n)
            n.entry = entry
            per_bucket.setdefault((pool.key, f), []).append(entry)
            pool.free += f
            pool.cap += n.gpu_alloc
            for g in (n.domain, n.rack, n.block):
                if g is not None:
                    g.count_offering(f)
                    g.free += f
                    g.cap += n.gpu_alloc
        for (key, f), entries in per_bucket.items():
            pool = self.pools[key]
            pool._grow(f)
            pool.buckets[f] = SortedList(entries)
            pool.counts[f] = len(entries)
        for pool in self.pools.values():
            pool.indexed = set()
            for level in pool.indexed_levels_wanted():
                pool.index(level)

    def set_reserved(self, n: NodeState, reserved: dict[str, int] | None) -> None:
        """Give node ``n`` what the ledger now deducts on it and move its free GPUs."""
        n.reserved = reserved
        new = n.compute_gpu_free()
        if n.pool is not None:
            n.pool.version += 1
        if n.pool is not None and n.offers:
            n.pool._set_free(n, new)
        else:
            n.gpu_free = new

    def problems(self, ledger: Ledger) -> list[str]:
        """Recompute the member's indexes from its nodes and list where they disagree."""
        problems: list[str] = []
        if list(self.names) != sorted(self.nodes):
            problems.append(f"{self.name}: names index out of date")
        for n in self.nodes.values():
            want = ledger.outstanding(self.name, n.inv)
            if want != n.reserved:
                problems.append(f"{self.name}/{n.name}: reserved {n.reserved} != {want}")
            if n.gpu_free != n.compute_gpu_free():
                problems.append(f"{self.name}/{n.name}: gpu_free {n.gpu_free} is stale")
        for key, pool in self.pools.items():
            problems += pool.problems(f"{self.name}/{key[0]}")
        return problems

    def _make_node(self, inv: NodeInventory, ledger: Ledger) -> tuple[NodeState, bool]:
        n = NodeState(self, inv)
        self.nodes[inv.name] = n
        self.filings += 1
        shape = _alloc_shape(inv.allocatable)
        self.alloc_shapes[shape] = self.alloc_shapes.get(shape, 0) + 1
        n.reserved = ledger.outstanding(self.name, inv)
        n.gpu_free = n.compute_gpu_free()
        for r in _extended_of(shape):
            self.extended.setdefault(r, SortedList()).add(inv.name)
        new_pool = False
        if n.gpu_alloc > 0:
            key = pool_key(inv)
            pool = self.pools.get(key)
            if pool is None:
                blocking = tuple(t for t in inv.taints if t.effect != "PreferNoSchedule")
                pool = PoolState(self, key, blocking)
                self.pools[key] = pool
                new_pool = True
            n.pool = pool
            pool.nodes[inv.name] = n
            pool.version += 1
            pool.alloc_shapes[shape] = pool.alloc_shapes.get(shape, 0) + 1
            pool.static_version += 1
            dom = inv.nvlink_domain
            if not dom.startswith("node:"):
                n.domain = _group(pool, "nvlink", dom, n)
            else:
                pool.single_count += 1
            if inv.rack:
                n.rack = _group(pool, "rack", inv.rack, n)
            if inv.block:
                n.block = _group(pool, "block", inv.block, n)
        return n, new_pool


def _group(pool: PoolState, level: str, key: str, node: NodeState) -> GroupState:
    g = pool.groups[level].get(key)
    if g is None:
        g = GroupState(level, key)
        pool.groups[level][key] = g
    g.nodes[node.name] = node
    return g


def _alloc_shape(alloc: dict[str, int]) -> AllocShape:
    return tuple(sorted(alloc.items()))


#: allocatable shape -> its non-GPU extended resources with some (MIG profiles, ...): nodes of
#: a fleet have few shapes; cleared past _SHAPES_CAP
_EXTENDED: dict[AllocShape, tuple[str, ...]] = {}
_SHAPES_CAP = 4096


def _extended_of(shape: AllocShape) -> tuple[str, ...]:
    got = _EXTENDED.get(shape)
    if got is None:
        if len(_EXTENDED) >= _SHAPES_CAP:
            _EXTENDED.clear()
        got = _EXTENDED[shape] = tuple(
            r for r, a in shape if a > 0 and r != GPU_RESOURCE and (is_mig_resource(r) or "/" in r)
        )
    return got


def _dec(d: dict[AllocShape, int], key: AllocShape) -> None:
    left = d.get(key, 0) - 1
    if left > 0:
        d[key] = left
    else:
        d.pop(key, None)


def _taint_key(taints: Iterable[Taint]) -> tuple[tuple[str, str, str], ...]:
    return tuple(
        sorted((t.key, t.value, t.effect) for t in taints if t.effect != "PreferNoSchedule")
    )


def pool_key(inv: NodeInventory) -> PoolKey:
    """The pool a node belongs to: (GPU product, MIG-single?, scheduling taints, kinds of DRA
    GPU): nodes whose GPUs are claimed through DRA never share a pool with nodes of the
    extended resource, whose pods could not use them."""
    if not inv.taints and not inv.dra_gpus:  # most nodes
        return (inv.gpu_product or "unknown", inv.mig_strategy == "single", (), ())
    return (
        inv.gpu_product or "unknown",
        inv.mig_strategy == "single",
        _taint_key(inv.taints),
        dra_kinds(inv),
    )
