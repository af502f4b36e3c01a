"""The running-jobs index for preemption (pure): running jobs filed by member, GPU pool and
block (NVLink domain / clique, rack, block, node), kept up to date as jobs start and end.

Built by :class:`~gpufed.placement.preemptcycle.PreemptionCycle` once per cycle (or kept by a
caller across decisions, :meth:`RunningIndex.add` / :meth:`RunningIndex.remove` as jobs start
and end: the benchmark does), read by :mod:`.victims` for every decision: a decision reads only
the pools of the GPU products its job accepts and, in them, the blocks of the level its job
must sit in, instead of every running job of the fleet (docs/placement.md, "Preemption").
Per block and per pool it keeps a :class:`Floor` of the jobs filed there, from which
:func:`~gpufed.placement.victimblocks.block_floor` bounds the block's estimate, so a decision
reads the blocks in that order and stops early.

The index files a job under the pool and groups its nodes had when it was added. It stays
true while the snapshot's nodes keep their pools and groups: what-ifs, reservations and pods
starting or ending change only free GPUs and keep it true; a member whose nodes change labels,
taints or shape must be re-indexed (:meth:`RunningIndex.reindex`). A job on a node the snapshot
lacks is kept but filed nowhere until the member is re-indexed.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator
from typing import Final

from gpufed.placement.index import GroupState, NodeState, PoolKey
from gpufed.placement.member import ClusterState
from gpufed.placement.preemption import Running, cost_anchor
from gpufed.placement.snapshot import FleetSnapshot

#: The block levels a job can require (:func:`gpufed.placement.victims.level_of`); ``""``: the
#: whole member (one block per pool).
LEVELS: Final = ("nvlink", "rack", "block", "")

#: One running job in one block: the job, and its GPUs on the block's nodes.
Entry = tuple[Running, int]


class Floor:
    """Bounds over the jobs filed in a block (or a pool's blocks), loose once a job leaves (not
    tightened then): ``low`` at most their lowest priority, ``gmin`` at most their fewest GPUs
    (:attr:`~gpufed.placement.preemption.Running.gpu_count`), ``amax`` at least their latest
    :func:`~gpufed.placement.preemption.cost_anchor`, ``umin`` at most their least UID. What
    :func:`~gpufed.placement.victimblocks.block_floor` bounds a block's estimate with."""

    __slots__ = ("amax", "gmin", "low", "umin")

    def __init__(self, run: Running) -> None:
        self.low = run.priority
        self.gmin = run.gpu_count
        self.amax = cost_anchor(run)
        self.umin = run.uid

    def add(self, run: Running) -> None:
        """Widen the bounds to cover ``run``."""
        if run.priority < self.low:
            self.low = run.priority
        g = run.gpu_count
        if g < self.gmin:
            self.gmin = g
        a = cost_anchor(run)
        if a > self.amax:
            self.amax = a
        if run.uid < self.umin:
            self.umin = run.uid


class BlockRuns(Floor):
    """The running jobs of one block of one pool: ``runs`` (uid -> :data:`Entry`), a node of
    the block (``node``) through which the block's live free and allocatable GPUs are read, and
    the :class:`Floor` of its jobs (``low``: at most the lowest priority of its jobs, and so on;
    bounds: not tightened when a job leaves)."""

    __slots__ = ("key", "node", "runs")

    def __init__(self, key: str, node: str, run: Running) -> None:
        super().__init__(run)
        self.key = key
        self.node = node
        self.runs: dict[str, Entry] = {}

    def free_cap(self, c: ClusterState, level: str) -> tuple[int, int] | None:
        """The block's (free, allocatable) GPUs now (None: its node left the snapshot)."""
        n = c.nodes.get(self.node)
        if n is None:
            return None
        g = block_group(n, level)
        if g is None:
            return (n.gpu_free, n.gpu_alloc)
        return (g.free, g.cap)


def block_group(n: NodeState, level: str) -> GroupState | None:
    """The :class:`~gpufed.placement.index.GroupState` of ``n`` at ``level`` (None: the node is
    its own NVLink domain, or has no such label)."""
    if level == "nvlink":
        return n.domain
    if level == "rack":
        return n.rack
    if level == "block":
        return n.block
    return None


def block_key(n: NodeState, level: str) -> str | None:
    """The key of ``n``'s block at ``level`` (None: the node has no such label, so no job
    that needs the level can sit on it); ``""`` for the whole member."""
    if level == "":
        return ""
    g = block_group(n, level)
    if g is not None:
        return str(g.key)
    if level == "nvlink":
        return n.domain_id
    return None


class _Member:
    """One member's part of the index: by pool, then level, then block."""

    __slots__ = ("filed", "floors", "levels", "runs")

    def __init__(self) -> None:
        self.runs: dict[str, Running] = {}
        #: uid -> the blocks it is filed in (for removal without a search)
        self.filed: dict[str, list[tuple[dict[str, BlockRuns], str]]] = {}
        #: level -> pool key -> block key -> BlockRuns (a level is filed on first demand)
        self.levels: dict[str, dict[PoolKey, dict[str, BlockRuns]]] = {}
        #: level -> pool key -> the Floor of every job filed in the pool's blocks at that level
        self.floors: dict[str, dict[PoolKey, Floor]] = {}


class RunningIndex:
    """Running (or placed) jobs by member, pool and block (see the module docstring).

    Iterating it yields every job, in the order added. Each query is O(blocks read); adding or
    removing a job is O(its nodes x levels filed so far). Not thread-safe (like the snapshot).
    """

    def __init__(self, snapshot: FleetSnapshot, running: Iterable[Running] = ()) -> None:
        self.snapshot = snapshot
        self._members: dict[str, _Member] = {}
        #: moves on every add, remove and reindex (a reader that keeps what it derived from
        #: the index knows it is stale)
        self.version = 0
        for run in running:
            self.add(run)

    def __iter__(self) -> Iterator[Running]:
        for m in self._members.values():
            yield from m.runs.values()

    def __len__(self) -> int:
        return sum(len(m.runs) for m in self._members.values())

    def __contains__(self, uid: object) -> bool:
        return any(uid in m.runs for m in self._members.values())

    def find(self, uid: str) -> Running | None:
        """The job ``uid`` (None: not filed), O(members)."""
        for m in self._members.values():
            run = m.runs.get(uid)
            if run is not None:
                return run
        return None

    @property
    def members(self) -> list[str]:
        """Members with at least one job filed, sorted."""
        return sorted(name for name, m in self._members.items() if m.runs)

    def runs(self, cluster: str) -> list[Running]:
        """The jobs of one member, in the order added."""
        m = self._members.get(cluster)
        return list(m.runs.values()) if m is not None else []

    def add(self, run: Running) -> None:
        """File ``run`` (a job started or placed); replaces a job of the same UID."""
        self.version += 1
        m = self._members.setdefault(run.cluster, _Member())
        if run.uid in m.runs:
            self.remove(run.uid, run.cluster)
        m.runs[run.uid] = run
        for level, pools in m.levels.items():
            self._file(m, run, level, pools)

    def remove(self, uid: str, cluster: str) -> Running | None:
        """Forget the job ``uid`` of ``cluster`` (it ended or was preempted); None when unknown."""
        m = self._members.get(cluster)
        run = m.runs.pop(uid, None) if m is not None else None
        if m is None or run is None:
            return None
        self.version += 1
        for blocks, key in m.filed.pop(uid, ()):
            b = blocks.get(key)
            if b is not None and b.runs.pop(uid, None) is not None and not b.runs:
                del blocks[key]
        return run

    def reindex(self, cluster: str) -> None:
        """File ``cluster``'s jobs again from the snapshot's nodes as they are now."""
        self.version += 1
        m = self._members.get(cluster)
        if m is not None:
            m.levels.clear()
            m.floors.clear()
            m.filed.clear()

    def file_levels(self, levels: Iterable[str] = LEVELS) -> None:
        """File every job at ``levels`` now rather than on a level's first query (a caller that
        keeps the index across decisions: no decision pays for it)."""
        for name in list(self._members):
            for level in levels:
                self.blocks(name, level, ("", False, (), ()))

    def blocks(self, cluster: str, level: str, pool: PoolKey) -> Collection[BlockRuns]:
        """The blocks at ``level`` (one of :data:`LEVELS`) of one pool of ``cluster`` that run
        at least one filed job."""
        m = self._members.get(cluster)
        if m is None:
            return ()
        pools = m.levels.get(level)
        if pools is None:
            pools = m.levels[level] = {}
            m.floors[level] = {}
            for run in m.runs.values():
                self._file(m, run, level, pools)
        return pools.get(pool, {}).values()

    def floor(self, cluster: str, level: str, pool: PoolKey) -> Floor | None:
        """The :class:`Floor` of every job filed in the blocks of :meth:`blocks` (call it after
        :meth:`blocks`, which files the level); None when none was filed there. O(1)."""
        m = self._members.get(cluster)
        floors = m.floors.get(level) if m is not None else None
        return floors.get(pool) if floors is not None else None

    def block_of(self, cluster: str, level: str, node: str) -> BlockRuns | None:
        """The block at ``level`` (one of :data:`LEVELS`) holding ``node`` of ``cluster``, as
        filed so far (None: no filed job runs in it, the level is not filed yet, or the node
        has no pool or no such label). O(1)."""
        m = self._members.get(cluster)
        pools = m.levels.get(level) if m is not None else None
        if pools is None:
            return None
        try:
            n = self.snapshot.cluster(cluster).nodes.get(node)
        except KeyError:
            return None
        if n is None or n.pool is None:
            return None
        key = block_key(n, level)
        blocks = pools.get(n.pool.key)
        return blocks.get(key) if blocks is not None and key is not None else None

    def _file(
        self, m: _Member, run: Running, level: str, pools: dict[PoolKey, dict[str, BlockRuns]]
    ) -> None:
        try:
            c = self.snapshot.cluster(run.cluster)
        except KeyError:
            return  # filed once the member is re-indexed
        for name, gpus in run.gpus.items():
            n = c.nodes.get(name)
            if n is None or n.pool is None or n.pool.slices or gpus <= 0:
                continue
            key = block_key(n, level)
            if key is None:
                continue
            blocks = pools.setdefault(n.pool.key, {})
            b = blocks.get(key)
            if b is None:
                b = blocks[key] = BlockRuns(key, name, run)
            else:
                b.add(run)
            floors = m.floors.setdefault(level, {})
            f = floors.get(n.pool.key)
            if f is None:
                floors[n.pool.key] = Floor(run)
            else:
                f.add(run)
            prev = b.runs.get(run.uid)
            b.runs[run.uid] = (run, gpus + (prev[1] if prev is not None else 0))
            if prev is None:
                m.filed.setdefault(run.uid, []).append((blocks, key))
