"""The fleet as placement sees it: one long-lived, incrementally updated, indexed snapshot.

The hub keeps one :class:`FleetSnapshot`, feeds it every member's inventory (whole states with
:meth:`FleetSnapshot.set_member`, deltas with :meth:`~FleetSnapshot.upsert_node` /
:meth:`~FleetSnapshot.remove_node`, health with :meth:`~FleetSnapshot.set_health`) and the
reservation ledger (:meth:`~FleetSnapshot.reserve`, :meth:`~FleetSnapshot.release`,
:meth:`~FleetSnapshot.expire_reservations`), and hands it to ``place()``, which only reads it.
The simulator and the benchmark drive it the same way.

Free capacity seen by placement is ``max(0, allocatable - requested) - reserved`` per node and
resource, clamped at 0, where ``reserved`` is the part of the ledger's entries for that node
that the member has not yet reported as requested by the job's bound pods
(``NodeInventory.job_requests[job_uid]``): a job's GPUs are never deducted twice, and never
seen free twice.

Indexes (so that a decision never scans every node):

* nodes are grouped into **pools**: one per member, GPU product, whole GPUs vs MIG-single slices,
  and set of scheduling taints (a Kubernetes node pool);
* per pool, a histogram of offering nodes by free GPUs (``counts[f]``) and, per free value, the
  nodes themselves, ordered partly-used first, then by name (``buckets[f]``);
* per pool and level (``nvlink`` for multi-node NVLink domains such as NVL72 cliques, ``rack``,
  ``block``), each group's free GPUs, capacity and own node histogram, and the groups ordered by
  free GPUs (``gbuckets[level]``).

Updating one node or one reservation touches only that node's pool entry and its groups:
O(log n). Structural changes (a member, its health, a new pool) bump :attr:`generation`, which
invalidates the memo of cluster-level filter results kept here for ``place()``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, Final

from sortedcontainers import SortedDict, SortedList

from gpufed.api.decision import Decision, Reservation
from gpufed.api.inventory import (
    ClusterHealth,
    ClusterInventory,
    GPUSummary,
    MemberClusterState,
    NodeInventory,
    Taint,
)
from gpufed.api.labels import GPU_RESOURCE, is_mig_resource
from gpufed.api.resources import ResourceList

#: Topology levels indexed per pool, finest first.
LEVELS: Final = ("nvlink", "rack", "block")

#: (product, MIG-single slices?, scheduling taints as sorted (key, value, effect) triples)
PoolKey = tuple[str, bool, tuple[tuple[str, str, str], ...]]

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
        "free",
        "gbuckets",
        "groups",
        "indexed",
        "key",
        "memo",
        "memo_version",
        "nodes",
        "product",
        "single_count",
        "slices",
        "slot_index",
        "static_cache",
        "static_version",
        "taints",
        "version",
    )

    def __init__(self, cluster: ClusterState, key: PoolKey, taints: tuple[Taint, ...]) -> None:
        self.cluster = cluster
        self.key = key
        self.product = key[0]
        self.slices = key[1]
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
        #: bumped on every change to any node of the pool; keys :attr:`memo`
        self.version = 0
        #: results derived from the pool at ``memo_version`` (plans, bounds); see :meth:`recall`
        self.memo: dict[Any, Any] = {}
        self.memo_version = 0
        self.static_version = 0
        self.static_cache: dict[Any, Any] = {}
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

    def recall(self, key: Any) -> Any:
        """A value remembered for the pool's current version, or None."""
        if self.memo_version != self.version:
            self.memo.clear()
            self.memo_version = self.version
            return None
        return self.memo.get(key)

    def remember(self, key: Any, value: Any) -> None:
        """Remember a value derived from the pool's current state (dropped on any change)."""
        if self.memo_version != self.version:
            self.memo.clear()
            self.memo_version = self.version
        elif len(self.memo) > 256:
            self.memo.clear()
        self.memo[key] = value

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
        ``pods`` pods of ``gpus_per_pod`` GPUs, judged by free GPUs per node; None if none."""
        key = ("tightest", gpus_per_pod, pods)
        hit: int | None = self.recall(key)
        if hit is not None:
            return hit if hit >= 0 else None
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
        self.remember(key, tight)
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

    # --- maintenance (FleetSnapshot only) ------------------------------------------------
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
                while len(g.counts) <= f:
                    g.counts.append(0)
                g.counts[f] += 1
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
                g.counts[old] -= 1
                while len(g.counts) <= new:
                    g.counts.append(0)
                g.counts[new] += 1
                if d:
                    self._group_move(g, g.free, d, 0)


class ClusterState:
    """One member: metadata from the hub, health, nodes and their pools."""

    __slots__ = (
        "agent_version",
        "alloc_shapes",
        "extended",
        "health",
        "labels",
        "name",
        "names",
        "nodes",
        "pools",
        "served_kinds",
        "static_cache",
        "static_version",
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
        self.pools: dict[PoolKey, PoolState] = {}
        #: non-GPU extended resources (MIG profiles, ...) -> names of nodes that have some
        self.extended: dict[str, SortedList[str]] = {}
        self.names: SortedList[str] = SortedList()
        self.static_version = 0
        self.static_cache: dict[Any, Any] = {}
        #: distinct node allocatable shapes -> node count (for "could it ever fit")
        self.alloc_shapes: dict[AllocShape, int] = {}

    def pools_sorted(self) -> list[PoolState]:
        """Pools in a stable order (product, slices, taints)."""
        return [self.pools[k] for k in sorted(self.pools)]


def _stale_sums(where: str, free: int, cap: int, nodes: list[NodeState]) -> list[str]:
    out = []
    if free != sum(n.gpu_free for n in nodes):
        out.append(f"{where}: free {free} is stale")
    if cap != sum(n.gpu_alloc for n in nodes):
        out.append(f"{where}: cap {cap} is stale")
    return out


def _alloc_shape(alloc: dict[str, int]) -> AllocShape:
    return tuple(sorted(alloc.items()))


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
    """The pool a node belongs to: (GPU product, MIG-single?, scheduling taints)."""
    return (inv.gpu_product or "unknown", inv.mig_strategy == "single", _taint_key(inv.taints))


class _Entry:
    __slots__ = ("res", "settled", "totals")

    def __init__(self, res: Reservation) -> None:
        self.res = res
        self.totals = res.totals()
        self.settled = False


class FleetSnapshot:
    """The indexed fleet state that ``place()`` reads (see the module docstring).

    Not thread-safe: the hub's scheduling loop owns it. ``place()`` never mutates it except for
    memo caches that do not change any answer.
    """

    def __init__(
        self,
        members: Iterable[MemberClusterState] = (),
        *,
        reservations: Iterable[Reservation] = (),
    ) -> None:
        self._clusters: SortedDict[str, ClusterState] = SortedDict()
        #: bumped on every change that can alter cluster-level filter results
        self.generation = 0
        #: memo of place(): static filter results per job shape key (cleared per generation)
        self.memo: dict[Any, Any] = {}
        self.memo_generation = 0
        self._ledger: dict[str, _Entry] = {}
        self._res_by_node: dict[tuple[str, str], set[str]] = {}
        #: (cluster, job uid) -> resources the member reports as requested by the job's pods
        self._seen: dict[tuple[str, str], dict[str, int]] = {}
        for res in reservations:
            self.add_reservation(res)
        for state in members:
            self.set_member(state)

    # --- reading ----------------------------------------------------------------------------
    @property
    def cluster_names(self) -> list[str]:
        """Member names, sorted."""
        return list(self._clusters.keys())

    def clusters(self) -> list[ClusterState]:
        """Members in name order (placement's internal view)."""
        return list(self._clusters.values())

    def cluster(self, name: str) -> ClusterState:
        """One member's internal view; ``KeyError`` naming the member when unknown."""
        try:
            return self._clusters[name]
        except KeyError:
            raise KeyError(f"member cluster {name!r} is not in the snapshot") from None

    def node(self, cluster: str, name: str) -> NodeInventory:
        """The last inventory of one node."""
        return self.cluster(cluster).nodes[name].inv

    def free(self, cluster: str, node: str, resource: str = GPU_RESOURCE) -> int:
        """Free amount of ``resource`` on one node as placement sees it (after reservations)."""
        return self.cluster(cluster).nodes[node].free(resource)

    def member(self, name: str) -> MemberClusterState:
        """Rebuild the :class:`MemberClusterState` of one member from what the snapshot holds."""
        c = self.cluster(name)
        return MemberClusterState(
            name=c.name,
            labels=dict(c.labels),
            taints=c.taints,
            health=c.health,
            inventory=ClusterInventory(
                cluster=c.name,
                nodes=tuple(c.nodes[n].inv for n in c.names),
                served_kinds=c.served_kinds,
                agent_version=c.agent_version,
            ),
        )

    def summary(self, cluster: str) -> GPUSummary:
        """Whole-GPU summary of one member as placement sees it (free after reservations).

        Same rules as :func:`gpufed.api.inventory.summarize` (Ready, schedulable nodes, taints
        ignored, MIG slices excluded), read from the indexes.
        """
        c = self.cluster(cluster)
        total: dict[str, int] = {}
        free: dict[str, int] = {}
        blocks: dict[str, int] = {}
        best = 0
        for pool in c.pools.values():
            if pool.slices:
                continue
            total[pool.product] = total.get(pool.product, 0) + pool.cap
            free[pool.product] = free.get(pool.product, 0) + pool.free
            best = max(best, pool.max_free)
            for key, g in pool.groups["nvlink"].items():
                blocks[key] = blocks.get(key, 0) + g.free
        best = max(best, max(blocks.values(), default=0))
        return GPUSummary(gpus_total=total, gpus_free=free, largest_free_nvlink_block=best)

    # --- members ----------------------------------------------------------------------------
    def set_member(self, state: MemberClusterState) -> None:
        """Add or replace one member's whole state (metadata, health, inventory).

        Raises ``ValueError`` (and keeps the member's previous state) when the inventory names
        another cluster or lists a node twice.
        """
        if state.inventory.cluster != state.name:
            raise ValueError(
                f"inventory.cluster {state.inventory.cluster!r} does not match member name "
                f"{state.name!r}"
            )
        seen: set[str] = set()
        for inv in state.inventory.nodes:
            if inv.name in seen:
                raise ValueError(f"member {state.name!r}: node {inv.name!r} appears twice")
            seen.add(inv.name)
        old = self._clusters.get(state.name)
        if old is not None:
            self._drop_cluster(old)
        c = ClusterState(state.name)
        c.labels = dict(state.labels)
        c.taints = state.taints
        c.health = state.health
        c.served_kinds = state.inventory.served_kinds
        c.agent_version = state.inventory.agent_version
        self._clusters[state.name] = c
        self._bulk_add(c, state.inventory.nodes)
        self.generation += 1

    def remove_member(self, name: str) -> None:
        """Forget a member (its reservations stay in the ledger until released or expired)."""
        c = self._clusters.pop(name, None)
        if c is not None:
            self._drop_cluster(c)
            self.generation += 1

    def set_health(self, cluster: str, health: ClusterHealth) -> None:
        """Change a member's health (a NotReady member is filtered out by ``Health``)."""
        c = self.cluster(cluster)
        if c.health != health:
            c.health = health
            self.generation += 1

    def set_metadata(
        self,
        cluster: str,
        *,
        labels: dict[str, str] | None = None,
        taints: tuple[Taint, ...] | None = None,
        served_kinds: frozenset[str] | None = None,
    ) -> None:
        """Change a member's labels, member-level taints or served workload kinds."""
        c = self.cluster(cluster)
        if labels is not None:
            c.labels = dict(labels)
        if taints is not None:
            c.taints = taints
        if served_kinds is not None:
            c.served_kinds = served_kinds
        self.generation += 1

    # --- nodes ------------------------------------------------------------------------------
    def upsert_node(self, cluster: str, node: NodeInventory) -> None:
        """Add or replace one node of a member (an inventory delta)."""
        c = self.cluster(cluster)
        old = c.nodes.get(node.name)
        if old is not None and self._same_shape(old, node):
            self._update_in_place(c, old, node)
            return
        if old is not None:
            self._remove_node(c, old)
        self._add_node(c, node)

    def remove_node(self, cluster: str, name: str) -> None:
        """Remove one node of a member (no error when it is not there)."""
        c = self.cluster(cluster)
        old = c.nodes.get(name)
        if old is not None:
            self._remove_node(c, old)

    # --- reservation ledger -------------------------------------------------------------------
    def reserve(self, decision: Decision, now: float, ttl_s: float = 600.0) -> Reservation:
        """Record a ``Placed`` decision: its resources are deducted at once.

        Returns the ledger entry (persist it; reload with :meth:`add_reservation`). Raises
        ``ValueError`` for a decision that is not ``Placed``. Reserving a job again replaces
        its previous entry.
        """
        if decision.outcome.value != "Placed" or decision.cluster is None:
            raise ValueError(
                f"decision for {decision.job or decision.uid} is {decision.outcome.value}; "
                "only a Placed decision can be reserved"
            )
        if ttl_s <= 0:
            raise ValueError(f"ttl_s: {ttl_s} must be > 0")
        # the decision came from place(): its fields are already valid
        res = Reservation.model_construct(
            job_uid=decision.uid,
            job=decision.job,
            cluster=decision.cluster,
            nodes=decision.node_requests(),
            created_at=now,
            ttl_s=ttl_s,
        )
        self.add_reservation(res)
        return res

    def add_reservation(self, res: Reservation) -> None:
        """Load one ledger entry (after a hub restart, or from :meth:`reserve`)."""
        if res.job_uid in self._ledger:
            self.release(res.job_uid)
        entry = _Entry(res)
        self._ledger[res.job_uid] = entry
        entry.settled = self._is_settled(entry)
        for node in res.nodes:
            self._res_by_node.setdefault((res.cluster, node), set()).add(res.job_uid)
        self._refresh_nodes(res.cluster, res.nodes)

    def release(self, job_uid: str) -> Reservation | None:
        """Drop a job's entry (pods bound and reported, job deleted, or entry expired)."""
        entry = self._ledger.pop(job_uid, None)
        if entry is None:
            return None
        res = entry.res
        for node in res.nodes:
            uids = self._res_by_node.get((res.cluster, node))
            if uids is not None:
                uids.discard(job_uid)
                if not uids:
                    del self._res_by_node[(res.cluster, node)]
        self._refresh_nodes(res.cluster, res.nodes)
        return res

    def expire_reservations(self, now: float) -> list[Reservation]:
        """Drop and return every entry whose ``created_at + ttl_s <= now``."""
        due = [e.res for e in self._ledger.values() if e.res.expires_at <= now]
        for res in due:
            self.release(res.job_uid)
        return due

    def settled_reservations(self) -> list[Reservation]:
        """Entries whose pods the member already reports in full (safe to release)."""
        return [e.res for e in self._ledger.values() if e.settled]

    def reservations(self) -> list[Reservation]:
        """Every ledger entry, by job UID."""
        return [self._ledger[k].res for k in sorted(self._ledger)]

    def outstanding(self, cluster: str, node: str) -> ResourceList:
        """What the ledger still deducts on one node (reserved and not yet reported bound)."""
        n = self.cluster(cluster).nodes.get(node)
        return dict(n.reserved) if n is not None and n.reserved else {}

    def verify_indexes(self) -> list[str]:
        """Recompute every index from the nodes and list where they disagree (empty = sound).

        O(nodes); for tests and debugging, never on the hot path.
        """
        problems: list[str] = []
        for c in self._clusters.values():
            if list(c.names) != sorted(c.nodes):
                problems.append(f"{c.name}: names index out of date")
            for n in c.nodes.values():
                want = self._outstanding(c.name, n.inv)
                if want != n.reserved:
                    problems.append(f"{c.name}/{n.name}: reserved {n.reserved} != {want}")
                if n.gpu_free != n.compute_gpu_free():
                    problems.append(f"{c.name}/{n.name}: gpu_free {n.gpu_free} is stale")
            for key, pool in c.pools.items():
                where = f"{c.name}/{key[0]}"
                offering = [n for n in pool.nodes.values() if n.offers]
                problems += _stale_sums(where, pool.free, pool.cap, offering)
                for f, bucket in enumerate(pool.buckets):
                    names = {e[1] for e in bucket}
                    want_names = {n.name for n in offering if n.gpu_free == f}
                    if names != want_names or pool.counts[f] != len(want_names):
                        problems.append(f"{where}: bucket {f} holds {sorted(names)}")
                    for e in bucket:
                        if e[0] != (e[2].gpu_free == e[2].gpu_alloc):
                            problems.append(f"{where}: {e[1]} fully-free flag is stale")
                for level, groups in pool.groups.items():
                    for gkey, g in groups.items():
                        members = [n for n in g.nodes.values() if n.offers]
                        problems += _stale_sums(f"{where}: {level} {gkey}", g.free, g.cap, members)
                        for f, cnt in enumerate(g.counts):
                            if cnt != sum(1 for n in members if n.gpu_free == f):
                                problems.append(f"{where}: {level} {gkey} counts[{f}] stale")
                        if level in pool.indexed:
                            gb = pool.gbuckets[level]
                            if g.entry is None or g.entry not in gb.get(g.free, ()):
                                problems.append(f"{where}: {level} {gkey} not filed by free")
                    if level in pool.indexed:
                        filed = sum(len(v) for v in pool.gbuckets[level].values())
                        if filed != len(groups):
                            problems.append(f"{where}: {level} index holds {filed} groups")
                for gp, index in pool.slot_index.items():
                    for g in pool.groups["nvlink"].values():
                        slots = g.slots(gp)
                        filed_at = [s for s, lst in index.items() if any(e[3] is g for e in lst)]
                        want_at = [slots] if slots > 0 else []
                        if filed_at != want_at:
                            problems.append(f"{where}: {g.key} filed at slots {filed_at} for {gp}")
                        got = g.slot_entries.get(gp)
                        if got is not None and got[1][0] != g.free:
                            problems.append(f"{where}: {g.key} slot entry has stale free")
        return problems

    # --- internals ------------------------------------------------------------------------------
    def _is_settled(self, entry: _Entry) -> bool:
        seen = self._seen.get((entry.res.cluster, entry.res.job_uid))
        if not seen:
            return False
        return all(seen.get(r, 0) >= a for r, a in entry.totals.items() if a > 0)

    def _outstanding(self, cluster: str, inv: NodeInventory) -> dict[str, int] | None:
        uids = self._res_by_node.get((cluster, inv.name))
        if not uids:
            return None
        out: dict[str, int] = {}
        for uid in uids:
            entry = self._ledger[uid]
            if entry.settled:
                continue
            seen = inv.job_requests.get(uid, {})
            for r, a in entry.res.nodes[inv.name].items():
                d = a - seen.get(r, 0)
                if d > 0:
                    out[r] = out.get(r, 0) + d
        return out or None

    def _refresh_nodes(self, cluster: str, names: Iterable[str]) -> None:
        c = self._clusters.get(cluster)
        if c is None:
            return
        for name in names:
            n = c.nodes.get(name)
            if n is None:
                continue
            n.reserved = self._outstanding(cluster, n.inv)
            new = n.compute_gpu_free()
            if n.pool is not None:
                n.pool.version += 1
            if n.pool is not None and n.offers:
                n.pool._set_free(n, new)
            else:
                n.gpu_free = new

    def _seen_add(self, cluster: str, inv: NodeInventory, sign: int) -> set[str]:
        changed: set[str] = set()
        for uid, res in inv.job_requests.items():
            acc = self._seen.setdefault((cluster, uid), {})
            for r, a in res.items():
                acc[r] = acc.get(r, 0) + sign * a
            if sign < 0 and not any(acc.values()):
                del self._seen[(cluster, uid)]
            if uid in self._ledger:
                changed.add(uid)
        return changed

    def _resettle(self, cluster: str, uids: Iterable[str]) -> None:
        for uid in uids:
            entry = self._ledger.get(uid)
            if entry is None or entry.res.cluster != cluster:
                continue
            settled = self._is_settled(entry)
            if settled != entry.settled:
                entry.settled = settled
                self._refresh_nodes(cluster, entry.res.nodes)

    def _same_shape(self, old: NodeState, inv: NodeInventory) -> bool:
        o = old.inv
        return (
            o.allocatable == inv.allocatable
            and o.gpu_product == inv.gpu_product
            and o.mig_strategy == inv.mig_strategy
            and o.nvlink_domain == inv.nvlink_domain
            and o.rack == inv.rack
            and o.block == inv.block
            and o.taints == inv.taints
            and o.labels == inv.labels
            and old.offers == (inv.ready and not inv.unschedulable and inv.degraded is None)
        )

    def _update_in_place(self, c: ClusterState, node: NodeState, inv: NodeInventory) -> None:
        """Only requested/job_requests changed: move the node's free GPUs (hot path)."""
        changed = self._seen_add(c.name, node.inv, -1)
        node.inv = inv
        changed |= self._seen_add(c.name, inv, +1)
        if changed:
            self._resettle(c.name, changed)
        node.reserved = self._outstanding(c.name, inv)
        new = node.compute_gpu_free()
        if node.pool is not None:
            node.pool.version += 1
        if node.pool is not None and node.offers:
            node.pool._set_free(node, new)
        else:
            node.gpu_free = new

    def _make_node(self, c: ClusterState, inv: NodeInventory) -> NodeState:
        n = NodeState(c, inv)
        c.nodes[inv.name] = n
        shape = _alloc_shape(inv.allocatable)
        c.alloc_shapes[shape] = c.alloc_shapes.get(shape, 0) + 1
        n.reserved = self._outstanding(c.name, inv)
        n.gpu_free = n.compute_gpu_free()
        for r, a in inv.allocatable.items():
            if a > 0 and r != GPU_RESOURCE and (is_mig_resource(r) or "/" in r):
                c.extended.setdefault(r, SortedList()).add(inv.name)
        if n.gpu_alloc > 0:
            key = pool_key(inv)
            pool = c.pools.get(key)
            if pool is None:
                blocking = tuple(t for t in inv.taints if t.effect != "PreferNoSchedule")
                pool = PoolState(c, key, blocking)
                c.pools[key] = pool
                self.generation += 1
            n.pool = pool
            pool.nodes[inv.name] = n
            pool.version += 1
            pool.alloc_shapes[shape] = pool.alloc_shapes.get(shape, 0) + 1
            pool.static_version += 1
            dom = inv.nvlink_domain
            if not dom.startswith("node:"):
                n.domain = self._group(pool, "nvlink", dom, n)
            else:
                pool.single_count += 1
            if inv.rack:
                n.rack = self._group(pool, "rack", inv.rack, n)
            if inv.block:
                n.block = self._group(pool, "block", inv.block, n)
        return n

    @staticmethod
    def _group(pool: PoolState, level: str, key: str, node: NodeState) -> GroupState:
        g = pool.groups[level].get(key)
        if g is None:
            g = GroupState(level, key)
            pool.groups[level][key] = g
        g.nodes[node.name] = node
        return g

    def _add_node(self, c: ClusterState, inv: NodeInventory) -> None:
        if not c.nodes:
            self.generation += 1
        changed = self._seen_add(c.name, inv, +1)
        if changed:
            self._resettle(c.name, changed)
        n = self._make_node(c, inv)
        c.names.add(inv.name)
        c.static_version += 1
        if n.pool is not None:
            n.pool._attach_offer(n)
            for g in (n.domain, n.rack, n.block):
                if g is not None and g.entry is None:
                    n.pool._group_move(g, g.free, 0, 0)

    def _remove_node(self, c: ClusterState, n: NodeState) -> None:
        changed = self._seen_add(c.name, n.inv, -1)
        shape = _alloc_shape(n.inv.allocatable)
        _dec(c.alloc_shapes, shape)
        pool = n.pool
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
                del c.pools[pool.key]
                self.generation += 1
        for r, lst in list(c.extended.items()):
            if n.name in lst:
                lst.remove(n.name)
                if not lst:
                    del c.extended[r]
        del c.nodes[n.name]
        c.names.remove(n.name)
        c.static_version += 1
        if not c.nodes:
            self.generation += 1
        if changed:
            self._resettle(c.name, changed)

    def _bulk_add(self, c: ClusterState, nodes: Iterable[NodeInventory]) -> None:
        """Build a member's indexes in one go: sorted structures are built once, not per node."""
        made: list[NodeState] = []
        changed: set[str] = set()
        for inv in nodes:
            if inv.name in c.nodes:
                raise ValueError(f"member {c.name!r}: node {inv.name!r} appears twice")
            changed |= self._seen_add(c.name, inv, +1)
            made.append(self._make_node(c, inv))
        c.names = SortedList(c.nodes.keys())
        c.static_version += 1
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
                    while len(g.counts) <= f:
                        g.counts.append(0)
                    g.counts[f] += 1
                    g.free += f
                    g.cap += n.gpu_alloc
        for (key, f), entries in per_bucket.items():
            pool = c.pools[key]
            pool._grow(f)
            pool.buckets[f] = SortedList(entries)
            pool.counts[f] = len(entries)
        for pool in c.pools.values():
            pool.indexed = set()
            for level in pool.indexed_levels_wanted():
                pool.index(level)
        if changed:
            self._resettle(c.name, changed)

    def _drop_cluster(self, c: ClusterState) -> None:
        for n in c.nodes.values():
            self._seen_add(c.name, n.inv, -1)
        for e in self._ledger.values():
            if e.res.cluster == c.name:
                e.settled = self._is_settled(e)
