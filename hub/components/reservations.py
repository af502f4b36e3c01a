"""Reservations: the one owner of the GPUs the hub promised to placed jobs (docs/design.md §3).

A reservation is what a placed job holds until the member reports its pods bound; placement
sees ``free = reported free - reserved``, so the same GPUs are never handed out twice
(docs/design.md §7 item 1). The ledger that placement reads lives in the
:class:`gpufed.placement.FleetSnapshot`; its durable copy lives in etcd
(``reservations/<uid>``). Only :class:`Reservations` changes either, with the domain's verbs:

- :meth:`reserve` at decision time: the entry is **tentative** (later jobs of the same cycle
  see its GPUs taken); it is written to etcd in the placement's one transaction
  (:meth:`gpufed.hub.adapters.store.Store.place`), then :meth:`confirm` (it landed) or :meth:`discard`
  (it did not: nothing was written, so nothing is undone in etcd);
- :meth:`release` with a reason (the job finished, was deleted, refused, lost): memory now,
  etcd soon;
- :meth:`expire`: entries whose pods never showed up within the TTL;
- :meth:`settle`: entries whose pods the member now reports, dropped from etcd only after
  the inventory that covers them is written (a hub that restarts in between must find those
  GPUs used in the stored inventory or in the stored ledger, never in neither);
- :meth:`restore`: after a failover, with every timer restarted from the new leader's start;
- :meth:`hold`: a preemption's commit landed (the preemptor's hold on the nodes its victims
  free, written with the victims' marks in one transaction: :mod:`gpufed.hub.components.preemption`);
  the hold deducts like any entry, so no other job takes those GPUs; :meth:`lifted` lets its
  own job's placement attempt see them (a job that waits for placement and has an entry
  holds it for preemption), and the placement's reservation replaces it (or, if that is not
  written, :meth:`discard` puts the hold back).

Called by the scheduling cycle, dispatch, deletion and member handling of one leader term.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Iterable, Iterator, Mapping
from contextlib import contextmanager

import structlog

from gpufed.api.decision import Decision, Reservation
from gpufed.hub.components.term import Term
from gpufed.placement import FleetSnapshot

log = structlog.get_logger("gpufed.hub.components.reservations")


class Reservations:
    """Reserve / confirm / discard / release / expire / settle (see the module docstring).

    Entries live ``config.reservation_ttl_s`` seconds without their pods showing up; the etcd
    deletes of :meth:`release` and :meth:`settle` run in the term's background tasks.
    """

    def __init__(
        self,
        term: Term,
        snapshot: FleetSnapshot,
    ) -> None:
        self._term = term
        self._snapshot = snapshot
        self._tentative: set[str] = set()
        self._restarted: dict[str, str] = {}
        #: holds lifted for their job's own placement, replaced by a tentative reservation
        self._replaced: dict[str, Reservation] = {}

    # --- a leader term starts ---------------------------------------------------------------------

    def restore(self, stored: Mapping[str, str], now: float) -> None:
        """Load the previous leader's entries (job uid -> JSON); a hub that was down restarts
        every timer from its own start (``now``, wall seconds)."""
        for uid, text in stored.items():
            res = Reservation.model_validate_json(text)
            if res.created_at < now:
                res = res.model_copy(update={"created_at": now})
                self._restarted[uid] = res.model_dump_json()
            self._snapshot.add_reservation(res)

    async def persist_restarted(self) -> None:
        """Write the entries whose timers :meth:`restore` restarted."""
        if self._restarted:
            await self._term.store.put_reservations(self._restarted)
            self._restarted = {}

    # --- placement ----------------------------------------------------------------------------------

    def reserve(self, decision: Decision, now: float) -> Reservation:
        """Deduct a ``Placed`` decision's resources at once, as a tentative entry; returns it
        (its JSON goes into the placement transaction). ``ValueError`` for another outcome."""
        res = self._snapshot.reserve(decision, now, self._term.config.reservation_ttl_s)
        self._tentative.add(res.job_uid)
        return res

    def confirm(self, uid: str) -> None:
        """The placement transaction that holds the entry landed in etcd."""
        self._tentative.discard(uid)
        self._replaced.pop(uid, None)

    def discard(self, uid: str, reason: str) -> None:
        """Drop a tentative entry whose placement was not written (``reason`` for the log); a
        preemption hold it replaced comes back."""
        if uid in self._tentative:
            self._tentative.discard(uid)
            if self._snapshot.release(uid) is not None:
                log.debug("hub.reservation.discarded", job_uid=uid, reason=reason)
        held = self._replaced.pop(uid, None)
        if held is not None:
            self._snapshot.add_reservation(held)

    # --- preemption holds ----------------------------------------------------------------------------

    def hold(self, res: Reservation) -> None:
        """The preemption transaction that wrote ``res`` (the preemptor's hold) landed."""
        self._snapshot.add_reservation(res)
        log.info("hub.reservation.held", job=res.job, cluster=res.cluster, nodes=sorted(res.nodes))

    def held(self, uid: str) -> Reservation | None:
        """Job ``uid``'s entry, if any (for a job waiting to be placed: its hold)."""
        return self._snapshot.reservation(uid)

    @contextmanager
    def lifted(self, uid: str) -> Iterator[None]:
        """Within the block, job ``uid``'s own hold does not deduct (its placement attempt); on
        exit it is back unless :meth:`reserve` replaced it (then :meth:`confirm` drops it for
        good and :meth:`discard` restores it). Nothing happens without an entry."""
        res = self._snapshot.reservation(uid)
        if res is None or uid in self._tentative:
            yield
            return
        self._snapshot.release(uid)
        try:
            yield
        finally:
            if uid in self._tentative:
                self._replaced[uid] = res
            else:
                self._snapshot.add_reservation(res)

    def confirmed_holds(self, uids: Iterable[str]) -> list[Reservation]:
        """The confirmed entries of ``uids`` (by UID), tentative ones left out: for jobs that
        wait to be placed, their preemption holds (the quota ledger and the console's "held")."""
        out = []
        for uid in sorted(uids):
            res = self._snapshot.reservation(uid)
            if res is not None and uid not in self._tentative:
                out.append(res)
        return out

    def is_tentative(self, uid: str) -> bool:
        """True between :meth:`reserve` and :meth:`confirm` / :meth:`discard`."""
        return uid in self._tentative

    # --- the job moves on ----------------------------------------------------------------------------

    def release(self, uid: str, reason: str) -> None:
        """Drop the job's entry: in memory now, in etcd soon (nothing happens without one)."""
        self._tentative.discard(uid)
        self._replaced.pop(uid, None)
        res = self._snapshot.release(uid)
        if res is not None:
            log.debug("hub.reservation.released", job=res.job, cluster=res.cluster, reason=reason)
            self._term.spawn(self._term.store.delete_reservations([uid]))

    async def expire(self, now: float, *, keep: Collection[str] = ()) -> None:
        """Drop entries whose pods never showed up within the TTL (``now``: wall seconds).

        ``keep``: jobs whose preemption hold lasts whatever its TTL (their victims are still
        stopping: a grace period longer than the TTL must not hand the freed GPUs to someone
        else); their entries are renewed in memory (a new leader renews them again from the
        victims' records)."""
        for uid in keep:
            res = self._snapshot.reservation(uid)
            if res is not None and uid not in self._tentative and res.expires_at <= now + 1:
                self._snapshot.release(uid)
                self._snapshot.add_reservation(res.model_copy(update={"created_at": now}))
        expired = self._snapshot.expire_reservations(now)
        if expired:
            for r in expired:
                self._tentative.discard(r.job_uid)
            await self._term.store.delete_reservations(r.job_uid for r in expired)
            for r in expired:
                log.info("hub.reservation.expired", job=r.job, cluster=r.cluster)
            self._term.metrics.reservations_ended.labels("expired").inc(len(expired))

    def settle(self, flush_nodes: Callable[[str], Awaitable[None]]) -> bool:
        """Drop the entries whose pods the members now report bound (after an inventory
        change). In memory now; in etcd once ``flush_nodes(cluster)`` wrote the inventory that
        covers them (module docstring). True when any entry settled."""
        settled = self._snapshot.settled_reservations()
        for res in settled:
            self._snapshot.release(res.job_uid)
            self._tentative.discard(res.job_uid)
            log.info("hub.reservation.settled", job=res.job, cluster=res.cluster)
        if not settled:
            return False
        self._term.metrics.reservations_ended.labels("settled").inc(len(settled))
        clusters = sorted({r.cluster for r in settled})
        uids = [r.job_uid for r in settled]

        async def persist() -> None:
            for name in clusters:
                await flush_nodes(name)
            await self._term.store.delete_reservations(uids)

        self._term.spawn(persist())
        return True

    # --- queries ----------------------------------------------------------------------------------

    def of_cluster(self, cluster: str) -> list[Reservation]:
        """The entries on one member, by job uid."""
        return [r for r in self._snapshot.reservations() if r.cluster == cluster]
