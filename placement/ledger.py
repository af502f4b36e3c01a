"""The reservation ledger: what was placed but not yet reported bound, per job and per node.

Owned by :class:`~gpufed.placement.snapshot.FleetSnapshot`, which is the only caller: its
``reserve`` / ``add_reservation`` / ``release`` / ``expire_reservations`` /
``settled_reservations`` / ``reservations`` verbs are the ledger's public face, and it asks the
ledger how much to deduct on a node whenever that node's inventory or entries change.

An entry is a plain :class:`~gpufed.api.decision.Reservation` (``job_uid, job, cluster, nodes:
node -> resource -> amount, created_at, ttl_s``). What the ledger deducts on a node is
``max(0, reserved - reported)`` per resource, where ``reported`` is what the node's inventory
says the job's bound pods request (``NodeInventory.job_requests[job_uid]``). Once the member
reports the job's whole request (summed over the member, whichever nodes the pods landed on)
the entry is *settled*: it deducts nothing and is listed by :meth:`Ledger.settled` so the hub
can delete it.
"""

from __future__ import annotations

from collections.abc import Iterable

from gpufed.api.decision import Reservation
from gpufed.api.inventory import NodeInventory


class _Entry:
    __slots__ = ("res", "settled", "totals")

    def __init__(self, res: Reservation) -> None:
        self.res = res
        self.totals = res.totals()
        self.settled = False


class Ledger:
    """Reservations by job UID, the nodes each one names, and what members report bound.

    Knows nothing of the indexes: the snapshot refreshes the nodes an entry names after every
    change here (:meth:`add` and :meth:`pop` return the entry; :meth:`resettle` the entries
    whose settled state flipped).
    """

    __slots__ = ("_by_node", "_entries", "_seen")

    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}
        self._by_node: dict[tuple[str, str], set[str]] = {}
        #: (cluster, job uid) -> resources the member reports as requested by the job's pods
        self._seen: dict[tuple[str, str], dict[str, int]] = {}

    def __contains__(self, job_uid: str) -> bool:
        return job_uid in self._entries

    def get(self, job_uid: str) -> Reservation | None:
        """A job's entry (None when there is none)."""
        entry = self._entries.get(job_uid)
        return entry.res if entry is not None else None

    # --- entries --------------------------------------------------------------------------------
    def add(self, res: Reservation) -> None:
        """File a new entry (the caller has released any previous one of the same job)."""
        entry = _Entry(res)
        self._entries[res.job_uid] = entry
        entry.settled = self._is_settled(entry)
        for node in res.nodes:
            self._by_node.setdefault((res.cluster, node), set()).add(res.job_uid)

    def pop(self, job_uid: str) -> Reservation | None:
        """Remove and return a job's entry (None when there is none)."""
        entry = self._entries.pop(job_uid, None)
        if entry is None:
            return None
        res = entry.res
        for node in res.nodes:
            uids = self._by_node.get((res.cluster, node))
            if uids is not None:
                uids.discard(job_uid)
                if not uids:
                    del self._by_node[(res.cluster, node)]
        return res

    def due(self, now: float) -> list[Reservation]:
        """Entries whose ``created_at + ttl_s <= now``, in filing order."""
        return [e.res for e in self._entries.values() if e.res.expires_at <= now]

    def settled(self) -> list[Reservation]:
        """Entries whose pods the member already reports in full, in filing order."""
        return [e.res for e in self._entries.values() if e.settled]

    def all(self) -> list[Reservation]:
        """Every entry, by job UID."""
        return [self._entries[k].res for k in sorted(self._entries)]

    # --- what a node owes -----------------------------------------------------------------------
    def outstanding(self, cluster: str, inv: NodeInventory) -> dict[str, int] | None:
        """What the unsettled entries still deduct on node ``inv`` of ``cluster``: reserved
        minus what the node reports their pods request, per resource; None when nothing."""
        uids = self._by_node.get((cluster, inv.name))
        if not uids:
            return None
        out: dict[str, int] = {}
        for uid in uids:
            entry = self._entries[uid]
            if entry.settled:
                continue
            seen = inv.job_requests.get(uid, {})
            for r, a in entry.res.nodes[inv.name].items():
                d = a - seen.get(r, 0)
                if d > 0:
                    out[r] = out.get(r, 0) + d
        return out or None

    # --- what members report --------------------------------------------------------------------
    def seen_add(self, cluster: str, inv: NodeInventory, sign: int) -> set[str]:
        """Count (``sign=+1``) or uncount (``-1``) what node ``inv`` reports its jobs' pods
        request; returns the UIDs with an entry, whose settled state may have changed."""
        changed: set[str] = set()
        for uid, res in inv.job_requests.items():
            acc = self._seen.setdefault((cluster, uid), {})
            for r, a in res.items():
                acc[r] = acc.get(r, 0) + sign * a
            if sign < 0 and not any(acc.values()):
                del self._seen[(cluster, uid)]
            if uid in self._entries:
                changed.add(uid)
        return changed

    def resettle(self, cluster: str, uids: Iterable[str]) -> list[Reservation]:
        """Recompute the settled state of ``uids``' entries on ``cluster``; returns those
        whose state flipped (their nodes need refreshing)."""
        flipped: list[Reservation] = []
        for uid in uids:
            entry = self._entries.get(uid)
            if entry is None or entry.res.cluster != cluster:
                continue
            settled = self._is_settled(entry)
            if settled != entry.settled:
                entry.settled = settled
                flipped.append(entry.res)
        return flipped

    def forget_cluster(self, cluster: str, nodes: Iterable[NodeInventory]) -> None:
        """A member left the snapshot (or is being replaced): uncount what its ``nodes``
        reported and recompute its entries' settled state. The entries themselves stay."""
        for inv in nodes:
            self.seen_add(cluster, inv, -1)
        for e in self._entries.values():
            if e.res.cluster == cluster:
                e.settled = self._is_settled(e)

    def _is_settled(self, entry: _Entry) -> bool:
        seen = self._seen.get((entry.res.cluster, entry.res.job_uid))
        if not seen:
            return False
        return all(seen.get(r, 0) >= a for r, a in entry.totals.items() if a > 0)
