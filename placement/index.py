"""The per-pool indexes of the fleet snapshot: nodes by free GPUs, groups by free GPUs, and
NVLink domains by how many pods of a size they hold.

Owned and updated by :class:`~gpufed.placement.member.ClusterState` (which files each node into its
pool and groups) on behalf of :class:`~gpufed.placement.snapshot.FleetSnapshot`; read by
``place()`` (:mod:`.engine`), its plugins (:mod:`.plugins`), the planner (:mod:`.fit`) and the
simulator. Nothing here remembers answers for ``place()``: that is :mod:`.memo`.

* per pool, a histogram of offering nodes by free GPUs (``counts[f]``) and, per free value, the
  nodes themselves, ordered partly-used first, then by name (``buckets[f]``);
* per pool and level (``nvlink`` for multi-node NVLink domains such as NVL72 cliques, ``rack``,
  ``block``), each group's free GPUs, capacity and own node histogram, and the groups ordered by
  free GPUs (``gbuckets[level]``; rack and block only once a job asked for them);
* per pool and pod size, the multi-node NVLink domains filed by how many pods of that size their
  nodes hold (``slot_index``; built per size on first use, then kept up to date).

Those first-use builds happen when ``place()`` first asks (:meth:`PoolState.index`,
:meth:`PoolState.best_domain`): the only writes ``place()`` makes to the snapshot, and they hold
what an eager build would.

Updating one node touches only that node's pool entry and its groups: O(log n). Every change to a
pool bumps its :attr:`PoolState.version`; a change to which nodes it has bumps
:attr:`PoolState.static_version`. Those counters are what the memo checks.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Final

from sortedcontainers import SortedDict, SortedList

from gpufed.api.inventory import NodeInventory, Taint
from gpufed.api.labels import GPU_RESOURCE
from gpufed.placement.devicecel import dra_kinds

if TYPE_CHECKING:
    from gpufed.placement.member import ClusterState

#: Topology levels indexed per pool, finest first.
LEVELS: Final = ("nvlink", "rack", "block")

#: (product, MIG-single slices?, scheduling taints as sorted (key, value, effect) triples,
#: DRA device kinds: :func:`~gpufed.placement.devicecel.group_json`
#: of each group, empty for nodes whose GPUs are the extended resource)
PoolKey = tuple[str, bool, tuple[tuple[str, str, str], ...], tuple[str, ...]]

NodeEntry = tuple[bool, str, "NodeState"]
#: a node's allocatable as sorted (resource, amount) pairs
AllocShape = tuple[tuple[str, int], ...]
GroupEntry = tuple[bool, str, "GroupState"]
#: (free GPUs, fully free?, key, group): best-fit order of NVLink domains
SlotEntry = tuple[int, bool, str, "GroupState"]


class NodeState:
    """One node inside the snapshot: its last inventory plus what placement derives from it.

    ``gpu_alloc``: allocatable ``nvidia.com/gpu`` (MIG slices on a single-strategy node).
    ``gpu_free``: free GPUs after reservations, 0 when the node offers nothing (NotReady,
    cordoned, degraded). ``reserved``: outstanding reservations on this node, or None.
    """

    __slots__ = (
        "block",
        "cluster",
        "domain",
        "entry",
        "gpu_alloc",
        "gpu_free",
        "inv",
        "name",
        "offers",
        "pool",
        "rack",
        "reserved",
    )

    def __init__(self, cluster: ClusterState, inv: NodeInventory) -> None:
        self.name = inv.name
        self.cluster = cluster
        self.inv = inv
        self.pool: PoolState | None = None
        self.domain: GroupState | None = None
        self.rack: GroupState | None = None
        self.block: GroupState | None = None
        self.offers = inv.ready and not inv.unschedulable and inv.degraded is None
        self.gpu_alloc = inv.allocatable.get(GPU_RESOURCE, 0)
        self.gpu_free = 0
        self.reserved: dict[str, int] | None = None
        self.entry: NodeEntry | None = None

    @property
    def domain_id(self) -> str:
        """The node's NVLink domain id (``node:<name>`` or ``clique:<value>``)."""
        return self.inv.nvlink_domain

    def free(self, resource: str) -> int:
        """Free amount of ``resource`` after reservations, never negative (0 if not offering)."""
        if not self.offers:
            return 0
        inv = self.inv
        f = inv.allocatable.get(resource, 0) - inv.requested.get(resource, 0)
        if f < 0:
            f = 0
        if self.reserved is not None:
            f -= self.reserved.get(resource, 0)
        return f if f > 0 else 0

    def compute_gpu_free(self) -> int:
        """``free(nvidia.com/gpu)``; the cached ``gpu_free`` is refreshed from this."""
        return self.free(GPU_RESOURCE) if self.gpu_alloc else 0

    def same_shape(self, inv: NodeInventory) -> bool:
        """Whether ``inv`` differs from the node's inventory only in what its pods request
        (the node stays in its pool and groups; only its free capacity moves)."""
        o = self.inv
        return (
            o.allocatable == inv.allocatable
            and o.gpu_product == inv.gpu_product
            and o.mig_strategy == inv.mig_strategy
            and o.nvlink_domain == inv.nvlink_domain
            and o.rack == inv.rack
            and o.block == inv.block
            and o.taints == inv.taints
            and o.labels == inv.labels
            and (not (o.dra_gpus or inv.dra_gpus) or dra_kinds(o) == dra_kinds(inv))
            and self.offers == (inv.ready and not inv.unschedulable and inv.degraded is None)
        )


class GroupState:
    """One NVLink domain (multi-node), rack or block inside one pool.

    ``free``/``cap``: free and allocatable GPUs of its offering nodes; ``counts[f]``: offering
    nodes with ``f`` free GPUs; ``nodes``: every node of the group (offering or not).
    """

    __slots__ = ("cap", "counts", "entry", "free", "key", "level", "nodes", "slot_entries")

    def __init__(self, level: str, key: str) -> None:
        self.level = level
        self.key = key
        self.nodes: dict[str, NodeState] = {}
        self.free = 0
        self.cap = 0
        self.counts: list[int] = []
        self.entry: GroupEntry | None = None
        #: pod size -> (slots, entry) in the pool's ``slot_index``
        self.slot_entries: dict[int, tuple[int, SlotEntry]] = {}

    def offering(self) -> list[NodeState]:
        """Offering nodes, ascending free GPUs, partly-used before fully-free, then name."""
        nodes = [n for n in self.nodes.values() if n.offers and n.gpu_alloc]
        nodes.sort(key=_node_order)
        return nodes

    def count_offering(self, f: int) -> None:
        """Count one more offering node with ``f`` free GPUs in :attr:`counts`."""
        c = self.counts
        while len(c) <= f:
            c.append(0)
        c[f] += 1

    def slots(self, gpus_per_pod: int) -> int:
        """How many pods of ``gpus_per_pod`` GPUs its free GPUs hold, node by node."""
        c = self.counts
        return sum(c[f] * (f // gpus_per_pod) for f in range(gpus_per_pod, len(c)))


def _node_order(n: NodeState) -> tuple[int, bool, str]:
    return (n.gpu_free, n.gpu_free == n.gpu_alloc, n.name)


class PoolState:
    """Nodes of one member with the same GPU product, MIG mode and scheduling taints."""

    __slots__ = (
        "alloc_shapes",
        "buckets",
        "cap",
        "cluster",
        "counts",
        "dra",
        "free",
        "gbuckets",
        "groups",
        "indexed",
        "key",
        "nodes",
        "product",
        "single_count",
        "slices",
        "slot_index",
        "static_version",
        "taints",
        "version",
    )

    def __init__(self, cluster: ClusterState, key: PoolKey, taints: tuple[Taint, ...]) -> None:
        self.cluster = cluster
        self.key = key
        self.product = key[0]
        self.slices = key[1]
        #: the kinds of DRA GPU of the pool's nodes (empty: GPUs are the extended resource)
        self.dra = key[3]
        self.taints = taints
        self.nodes: dict[str, NodeState] = {}
        #: nodes that are their own NVLink domain (HGX); the rest belong to a multi-node one
        self.single_count = 0
        self.buckets: list[SortedList[NodeEntry]] = []
        self.counts: list[int] = []
        self.free = 0
        self.cap = 0
        self.groups: dict[str, dict[str, GroupState]] = {lv: {} for lv in LEVELS}
        self.gbuckets: dict[str, SortedDict[int, SortedList[GroupEntry]]] = {
            lv: SortedDict() for lv in LEVELS
        }
        #: pod size g -> slots -> multi-node NVLink domains that hold exactly that many pods of
        #: g GPUs, best fit first (built per g on first use, then kept up to date)
        self.slot_index: dict[int, SortedDict[int, SortedList[SlotEntry]]] = {}
        #: levels whose ``gbuckets`` are maintained (rack/block only once a job asked for them)
        self.indexed: set[str] = {"nvlink"}
        #: bumped on every change to any node of the pool (the memo's plans and bounds)
        self.version = 0
        #: bumped when a node joins or leaves the pool (the memo's "could it ever fit")
        self.static_version = 0
        #: distinct node allocatable shapes -> node count (for "could it ever fit")
        self.alloc_shapes: dict[AllocShape, int] = {}

    @property
    def max_free(self) -> int:
        """Largest free GPUs on one offering node (0 if none)."""
        c = self.counts
        for f in range(len(c) - 1, 0, -1):
            if c[f]:
                return f
        return 0

    def max_group_free(self, level: str) -> int:
        """Largest free GPUs of one group at ``level`` (0 if the pool has none)."""
        gb = self.index(level)
        return int(gb.peekitem(-1)[0]) if gb else 0

    def slots(self, gpus_per_pod: int) -> int:
        """Pods of ``gpus_per_pod`` GPUs the pool's free GPUs hold, node by node."""
        c = self.counts
        return sum(c[f] * (f // gpus_per_pod) for f in range(gpus_per_pod, len(c)))

    def iter_nodes_ascending(self, min_free: int) -> Iterator[NodeState]:
        """Offering nodes with at least ``min_free`` free GPUs, best fit first."""
        for f in range(max(min_free, 1), len(self.buckets)):
            if self.counts[f]:
                for entry in self.buckets[f]:
                    yield entry[2]

    def iter_nodes_descending(self, min_free: int) -> Iterator[NodeState]:
        """Offering nodes with at least ``min_free`` free GPUs, most free first (then
        partly-used before fully-free, then name)."""
        for f in range(len(self.buckets) - 1, max(min_free, 1) - 1, -1):
            if self.counts[f]:
                for entry in self.buckets[f]:
                    yield entry[2]

    def best_domain(self, gpus_per_pod: int, pods: int) -> GroupState | None:
        """The multi-node NVLink domain with the fewest free GPUs (then partly used first,
        then by id) whose nodes hold ``pods`` pods of ``gpus_per_pod`` GPUs; None if none.

        Reads :attr:`slot_index`: O(distinct slot counts), not O(domains).
        """
        index = self.slot_index.get(gpus_per_pod)
        if index is None:
            index = SortedDict()
            for g in self.groups["nvlink"].values():
                self._slot_put(index, gpus_per_pod, g)
            self.slot_index[gpus_per_pod] = index
        best: SlotEntry | None = None
        for s in index.irange(minimum=pods):
            head = index[s][0]
            if best is None or head[:3] < best[:3]:
                best = head
        return best[3] if best is not None else None

    def tightest_domain(self, gpus_per_pod: int, pods: int) -> int | None:
        """Free GPUs of the tightest NVLink domain (HGX node or multi-node domain) that holds
        ``pods`` pods of ``gpus_per_pod`` GPUs, judged by free GPUs per node; None if none.

        Not memoised here: :meth:`gpufed.placement.memo.PoolMemo.tightest_domain` is."""
        tight = -1
        demand = gpus_per_pod * pods
        if self.single_count:
            counts = self.counts
            for f in range(demand, len(counts)):
                if counts[f]:
                    tight = f
                    break
        if self.groups["nvlink"]:
            g = self.best_domain(gpus_per_pod, pods)
            if g is not None and (tight < 0 or g.free < tight):
                tight = g.free
        return tight if tight >= 0 else None

    @staticmethod
    def _slot_put(index: SortedDict[int, SortedList[SlotEntry]], gp: int, g: GroupState) -> None:
        slots = g.slots(gp)
        if slots <= 0 or not g.nodes:
            g.slot_entries.pop(gp, None)
            return
        entry: SlotEntry = (g.free, g.free == g.cap and g.cap > 0, g.key, g)
        lst = index.get(slots)
        if lst is None:
            index[slots] = SortedList([entry])
        else:
            lst.add(entry)
        g.slot_entries[gp] = (slots, entry)

    def _slot_update(self, g: GroupState) -> None:
        for gp, index in self.slot_index.items():
            old = g.slot_entries.get(gp)
            if old is not None:
                lst = index[old[0]]
                lst.remove(old[1])
                if not lst:
                    del index[old[0]]
            self._slot_put(index, gp, g)

    def iter_groups_ascending(self, level: str, min_free: int) -> Iterator[GroupState]:
        """Groups of ``level`` with at least ``min_free`` free GPUs, best fit first."""
        gb = self.index(level)
        for f in gb.irange(minimum=min_free):
            for entry in gb[f]:
                yield entry[2]

    def iter_groups_descending(self, level: str) -> Iterator[GroupState]:
        """Groups of ``level`` with free GPUs, most free first."""
        gb = self.index(level)
        for f in gb.irange(minimum=1, reverse=True):
            for entry in reversed(gb[f]):
                yield entry[2]

    def indexed_levels_wanted(self) -> tuple[str, ...]:
        """Levels indexed eagerly when a member is (re)built: NVLink domains only."""
        return ("nvlink",)

    def index(self, level: str) -> SortedDict[int, SortedList[GroupEntry]]:
        """Groups of ``level`` by free GPUs (built on first use, then kept up to date)."""
        if level not in self.indexed:
            per_free: dict[int, list[GroupEntry]] = {}
            for g in self.groups[level].values():
                entry: GroupEntry = (g.free == g.cap and g.cap > 0, g.key, g)
                g.entry = entry
                per_free.setdefault(g.free, []).append(entry)
            self.gbuckets[level] = SortedDict({f: SortedList(es) for f, es in per_free.items()})
            self.indexed.add(level)
        return self.gbuckets[level]

    def problems(self, where: str) -> list[str]:
        """Recompute the pool's indexes from its nodes and list where they disagree (O(nodes);
        for :meth:`~gpufed.placement.snapshot.FleetSnapshot.verify_indexes`)."""
        problems: list[str] = []
        offering = [n for n in self.nodes.values() if n.offers]
        problems += _stale_sums(where, self.free, self.cap, offering)
        for f, bucket in enumerate(self.buckets):
            names = {e[1] for e in bucket}
            want_names = {n.name for n in offering if n.gpu_free == f}
            if names != want_names or self.counts[f] != len(want_names):
                problems.append(f"{where}: bucket {f} holds {sorted(names)}")
            for e in bucket:
                if e[0] != (e[2].gpu_free == e[2].gpu_alloc):
                    problems.append(f"{where}: {e[1]} fully-free flag is stale")
        for level, groups in self.groups.items():
            for gkey, g in groups.items():
                members = [n for n in g.nodes.values() if n.offers]
                problems += _stale_sums(f"{where}: {level} {gkey}", g.free, g.cap, members)
                for f, cnt in enumerate(g.counts):
                    if cnt != sum(1 for n in members if n.gpu_free == f):
                        problems.append(f"{where}: {level} {gkey} counts[{f}] stale")
                if level in self.indexed:
                    gb = self.gbuckets[level]
                    if g.entry is None or g.entry not in gb.get(g.free, ()):
                        problems.append(f"{where}: {level} {gkey} not filed by free")
            if level in self.indexed:
                filed = sum(len(v) for v in self.gbuckets[level].values())
                if filed != len(groups):
                    problems.append(f"{where}: {level} index holds {filed} groups")
        for gp, index in self.slot_index.items():
            for g in self.groups["nvlink"].values():
                slots = g.slots(gp)
                filed_at = [s for s, lst in index.items() if any(e[3] is g for e in lst)]
                want_at = [slots] if slots > 0 else []
                if filed_at != want_at:
                    problems.append(f"{where}: {g.key} filed at slots {filed_at} for {gp}")
                got = g.slot_entries.get(gp)
                if got is not None and got[1][0] != g.free:
                    problems.append(f"{where}: {g.key} slot entry has stale free")
        return problems

    # --- maintenance (ClusterState only) -------------------------------------------------
    def _grow(self, f: int) -> None:
        while len(self.counts) <= f:
            self.counts.append(0)
            self.buckets.append(SortedList())

    def _add_entry(self, node: NodeState) -> None:
        self.version += 1
        f = node.gpu_free
        if f >= len(self.counts):
            self._grow(f)
        entry: NodeEntry = (f == node.gpu_alloc, node.name, node)
        self.buckets[f].add(entry)
        self.counts[f] += 1
        node.entry = entry

    def _remove_entry(self, node: NodeState) -> None:
        self.version += 1
        entry = node.entry
        if entry is not None:
            self.buckets[node.gpu_free].remove(entry)
            self.counts[node.gpu_free] -= 1
            node.entry = None

    def _group_move(self, g: GroupState, old_free: int, dfree: int, dcap: int) -> None:
        if g.level not in self.indexed:
            g.free += dfree
            g.cap += dcap
            return
        if g.level == "nvlink" and self.slot_index:
            # counts changed already; re-file the domain under its new slot counts
            self._group_move_plain(g, old_free, dfree, dcap)
            self._slot_update(g)
            return
        self._group_move_plain(g, old_free, dfree, dcap)

    def _group_move_plain(self, g: GroupState, old_free: int, dfree: int, dcap: int) -> None:
        gb = self.gbuckets[g.level]
        if g.entry is not None:
            lst = gb[old_free]
            lst.remove(g.entry)
            if not lst:
                del gb[old_free]
        g.free += dfree
        g.cap += dcap
        if g.nodes:
            entry: GroupEntry = (g.free == g.cap and g.cap > 0, g.key, g)
            if g.free in gb:
                gb[g.free].add(entry)
            else:
                gb[g.free] = SortedList([entry])
            g.entry = entry
        else:
            g.entry = None

    def _attach_offer(self, node: NodeState) -> None:
        """Count an offering node's free GPUs in the pool and its groups."""
        if not node.offers:
            return
        f = node.gpu_free
        self._add_entry(node)
        self.free += f
        self.cap += node.gpu_alloc
        for g in (node.domain, node.rack, node.block):
            if g is not None:
                g.count_offering(f)
                self._group_move(g, g.free, f, node.gpu_alloc)

    def _detach_offer(self, node: NodeState) -> None:
        if not node.offers:
            return
        f = node.gpu_free
        self._remove_entry(node)
        self.free -= f
        self.cap -= node.gpu_alloc
        for g in (node.domain, node.rack, node.block):
            if g is not None:
                g.counts[f] -= 1
                self._group_move(g, g.free, -f, -node.gpu_alloc)

    def _set_free(self, node: NodeState, new: int) -> None:
        """Move an offering node from one free value to another (the hot path)."""
        old = node.gpu_free
        if old == new and node.entry is not None and node.entry[0] == (new == node.gpu_alloc):
            return
        self._remove_entry(node)
        node.gpu_free = new
        self._add_entry(node)
        d = new - old
        self.free += d
        for g in (node.domain, node.rack, node.block):
            if g is not None:
                # inline, not count_offering(): this is the path every reservation takes
                g.counts[old] -= 1
                while len(g.counts) <= new:
                    g.counts.append(0)
                g.counts[new] += 1
                if d:
                    self._group_move(g, g.free, d, 0)


def _stale_sums(where: str, free: int, cap: int, nodes: list[NodeState]) -> list[str]:
    out = []
    if free != sum(n.gpu_free for n in nodes):
        out.append(f"{where}: free {free} is stale")
    if cap != sum(n.gpu_alloc for n in nodes):
        out.append(f"{where}: cap {cap} is stale")
    return out
