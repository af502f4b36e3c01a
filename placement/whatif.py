"""What-if placements for preemption: ``place()`` on the snapshot with some running jobs gone.

Called by :mod:`.preemption` only. :func:`freed` takes running jobs' GPUs off the live snapshot
for the length of a ``with`` block and puts every change back on the way out, even on an
exception; :class:`OnlyMember` is the ``hold`` mapping that keeps ``place()`` inside one member.
Nothing is copied: a what-if costs O(victim nodes) snapshot updates (in-place index moves),
not O(member nodes), which is what keeps preemption usable on a 5,000-node member.

How a victim's GPUs are freed on one of its nodes (the three ways a running job shows in the
snapshot, :mod:`.ledger`):

* the node reports the victim's pods (``NodeInventory.job_requests[uid]``): those requests
  leave ``requested`` and ``job_requests``;
* the ledger holds an entry for the victim (placed, not yet settled; the simulator's jobs):
  the entry is released;
* neither (a member that reports only totals, hand-built test fleets): the victim's GPUs on
  that node leave ``requested``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING

from gpufed.api.decision import Decision, Reservation
from gpufed.api.inventory import NodeInventory
from gpufed.api.labels import GPU_RESOURCE
from gpufed.placement.queue import Hold
from gpufed.placement.snapshot import FleetSnapshot

if TYPE_CHECKING:
    from gpufed.placement.preemption import Running


class OnlyMember(Mapping[str, Hold]):
    """``hold`` for ``place()`` that holds every member but ``cluster`` whole (and passes
    ``cluster``'s own hold from ``base`` through), so a what-if answers for one member."""

    __slots__ = ("_base", "_cluster", "_names", "_other")

    def __init__(
        self, cluster: str, names: Iterable[str], base: Mapping[str, Hold] | None = None
    ) -> None:
        self._cluster = cluster
        self._names = tuple(names)
        self._base = base or {}
        self._other = Hold("", frozenset(), f"preemption looks at {cluster} only")

    def __getitem__(self, name: str) -> Hold:
        if name == self._cluster:
            return self._base[name]
        return self._other

    def __iter__(self) -> Iterator[str]:
        return (n for n in self._names if n != self._cluster or n in self._base)

    def __len__(self) -> int:
        return len(self._names)

    def get(self, name: str, default: Hold | None = None) -> Hold | None:  # type: ignore[override]
        if name == self._cluster:
            return self._base.get(name, default)
        return self._other


def _without(inv: NodeInventory, uid: str, gpus: int) -> NodeInventory | None:
    """``inv`` with the victim ``uid``'s requests (or ``gpus`` GPUs) taken off; None when the
    node reports nothing of it and the caller released a ledger entry instead."""
    jr = inv.job_requests.get(uid)
    if jr is not None:
        requested = {r: max(0, a - jr.get(r, 0)) for r, a in inv.requested.items()}
        rest = {k: v for k, v in inv.job_requests.items() if k != uid}
        return inv.model_copy(update={"requested": requested, "job_requests": rest})
    requested = dict(inv.requested)
    requested[GPU_RESOURCE] = max(0, requested.get(GPU_RESOURCE, 0) - gpus)
    return inv.model_copy(update={"requested": requested})


@contextmanager
def freed(
    snapshot: FleetSnapshot,
    victims: Iterable[Running],
    placed: Iterable[Decision] = (),
    now: float = 0.0,
) -> Iterator[None]:
    """Within the block, ``victims`` are gone from ``snapshot`` and ``placed`` decisions are
    reserved (the GPUs freed for earlier preemptors of a cycle stay theirs); everything is put
    back on exit. Victims in members or on nodes the snapshot lacks are skipped. Do not nest
    two blocks over the same victims (the inner one would free them again)."""
    undo_nodes: list[tuple[str, NodeInventory]] = []
    undo_res: list[Reservation] = []
    reserved: list[str] = []
    seen: set[str] = set()
    members = set(snapshot.cluster_names)  # once, not a list of every member per victim
    try:
        for v in victims:
            if v.uid in seen or v.cluster not in members:
                continue  # a victim named twice is freed once
            seen.add(v.uid)
            res = snapshot.reservation(v.uid)
            if res is not None:
                snapshot.release(v.uid)
                undo_res.append(res)
            nodes = snapshot.cluster(v.cluster).nodes
            for name, gpus in sorted(v.gpus.items()):
                n = nodes.get(name)
                if n is None:
                    continue
                if res is not None and v.uid not in n.inv.job_requests:
                    continue
                new = _without(n.inv, v.uid, gpus)
                if new is not None:
                    undo_nodes.append((v.cluster, n.inv))
                    snapshot.upsert_node(v.cluster, new)
        for d in placed:
            snapshot.reserve(d, now, ttl_s=1e18)
            reserved.append(d.uid)
        yield
    finally:
        for uid in reversed(reserved):
            snapshot.release(uid)
        for cluster, inv in reversed(undo_nodes):
            snapshot.upsert_node(cluster, inv)
        for res in reversed(undo_res):
            snapshot.add_reservation(res)
