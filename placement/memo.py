"""The memo of ``place()``: answers derived from the snapshot, kept while what they read is unchanged.

Written and read by ``place()`` (:mod:`.engine`) and its plugins (:mod:`.plugins`); held by the
:class:`~gpufed.placement.snapshot.FleetSnapshot` it describes (``snapshot.memo``), which only
tells it when a pool leaves. It is not snapshot state: the indexes never read it, and clearing
it at any moment changes no answer, only how long the next decisions take. ``place()`` writes
here and nowhere in the snapshot's indexes.

Each value is valid for one version of what it was derived from, and is dropped (lazily, on the
next look-up) once that version moves:

* fleet-level results (the static filters' candidates and failures per job-constraint key):
  while :attr:`FleetSnapshot.generation <gpufed.placement.snapshot.FleetSnapshot.generation>`
  is unchanged (a member, its health or metadata, or a pool appearing or going);
* per pool, plans, ResourceFit results, score bounds and the tightest NVLink domain: while
  :attr:`PoolState.version <gpufed.placement.index.PoolState.version>` is unchanged (any change
  to any node of the pool, reservations included);
* per pool, "could it ever fit" answers: while
  :attr:`PoolState.static_version <gpufed.placement.index.PoolState.static_version>` is
  unchanged (a node joining or leaving the pool).

Sizes are capped (1,024 fleet entries, 256 per pool and kind) by clearing, not evicting.

Pool-memo keys name a job's fit key by a small int (:meth:`PlacementMemo.key_id`), so the key,
a nested tuple, is hashed once per decision rather than once per pool looked up. Ids are
never reused (a cleared table hands out new ones), so an id never stands for two keys.
"""

from __future__ import annotations

from typing import Any, Final

from gpufed.placement.index import PoolState

_FLEET_CAP: Final = 1024
_POOL_CAP: Final = 256
_IDS_CAP: Final = 4096


class PoolMemo:
    """What ``place()`` remembers about one pool (see the module docstring)."""

    __slots__ = ("_pool", "_static", "_values", "_version")

    def __init__(self, pool: PoolState) -> None:
        self._pool = pool
        self._values: dict[Any, Any] = {}
        self._version = pool.version
        #: key -> (pool.static_version when derived, value)
        self._static: dict[Any, tuple[int, Any]] = {}

    def recall(self, key: Any) -> Any:
        """A value remembered for the pool's current version, or None."""
        if self._version != self._pool.version:
            self._values.clear()
            self._version = self._pool.version
            return None
        return self._values.get(key)

    def current(self) -> dict[Any, Any]:
        """The values remembered for the pool's current version (read-only for the caller:
        :meth:`remember` writes), so one row of ``place()`` checks the version once and reads
        several keys."""
        if self._version != self._pool.version:
            self._values.clear()
            self._version = self._pool.version
        return self._values

    def remember(self, key: Any, value: Any) -> None:
        """Remember a value derived from the pool's current state (dropped on any change)."""
        if self._version != self._pool.version:
            self._values.clear()
            self._version = self._pool.version
        elif len(self._values) > _POOL_CAP:
            self._values.clear()
        self._values[key] = value

    def recall_static(self, key: Any) -> tuple[bool, Any]:
        """``(True, value)`` remembered for the pool's current set of nodes, else
        ``(False, None)`` (the value itself may be None)."""
        hit = self._static.get(key)
        if hit is not None and hit[0] == self._pool.static_version:
            return True, hit[1]
        return False, None

    def remember_static(self, key: Any, value: Any) -> None:
        """Remember a value derived from the pool's nodes' allocatable and labels only."""
        if len(self._static) > _POOL_CAP:
            self._static.clear()
        self._static[key] = (self._pool.static_version, value)

    def tightest_domain(self, gpus_per_pod: int, pods: int) -> int | None:
        """:meth:`PoolState.tightest_domain <gpufed.placement.index.PoolState.tightest_domain>`,
        remembered for the pool's version."""
        key = ("tightest", gpus_per_pod, pods)
        hit: int | None = self.recall(key)
        if hit is not None:
            return hit if hit >= 0 else None
        tight = self._pool.tightest_domain(gpus_per_pod, pods)
        self.remember(key, -1 if tight is None else tight)
        return tight


class PlacementMemo:
    """What ``place()`` remembers about one snapshot: fleet-level results and one
    :class:`PoolMemo` per pool (see the module docstring)."""

    __slots__ = ("_fleet", "_generation", "_ids", "_next_id", "_pools", "kept")

    def __init__(self) -> None:
        #: values kept across snapshot generations, by callers that check their own inputs
        #: (each under its own key; :func:`gpufed.placement.holds.whole_free_nodes`)
        self.kept: dict[Any, Any] = {}
        self._fleet: dict[Any, Any] = {}
        self._generation = 0
        self._pools: dict[PoolState, PoolMemo] = {}
        self._ids: dict[Any, int] = {}
        self._next_id = 0

    def key_id(self, key: Any) -> int:
        """A small int that stands for ``key`` (hashable) in pool-memo keys: the same int for
        equal keys while the table holds them; never one handed out before for another key
        (the table is cleared past 4,096 keys and new ids continue from the last)."""
        kid = self._ids.get(key)
        if kid is None:
            if len(self._ids) >= _IDS_CAP:
                self._ids.clear()
            kid = self._ids[key] = self._next_id
            self._next_id += 1
        return kid

    def recall(self, generation: int, key: Any) -> Any:
        """A fleet-level value remembered at snapshot ``generation``, or None."""
        if self._generation != generation:
            self._fleet.clear()
            self._generation = generation
            return None
        return self._fleet.get(key)

    def remember(self, generation: int, key: Any, value: Any) -> None:
        """Remember a fleet-level value derived at snapshot ``generation``."""
        if self._generation != generation:
            self._fleet.clear()
            self._generation = generation
        elif len(self._fleet) > _FLEET_CAP:
            self._fleet.clear()
        self._fleet[key] = value

    def pool(self, pool: PoolState) -> PoolMemo:
        """The memo of one pool of the snapshot (made on first use)."""
        memo = self._pools.get(pool)
        if memo is None:
            memo = self._pools[pool] = PoolMemo(pool)
        return memo

    def forget(self, pool: PoolState) -> None:
        """Drop a pool that left the snapshot (called by the snapshot)."""
        self._pools.pop(pool, None)
