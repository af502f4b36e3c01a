"""Holds on the fleet's capacity: the one owner of the GPUs the hub promised to placed jobs
(reservations, preemption holds; docs/design.md §3) and of the nodes it keeps out of placement
after an infrastructure failure (suspect nodes).

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
  written, :meth:`discard` puts the hold back); :meth:`hold_charges` gives the quota ledger
  the waiting preemptors' holds, and :meth:`let_go` drops the hold of a preemptor not placed
  on it once its victims are gone.

**Suspect nodes** (:class:`SuspectNodes`): member nodes an infrastructure failure happened on,
kept out of placement for a cool-down. :mod:`gpufed.hub.components.lifecycle` marks the nodes a
failure cause names when Kubernetes observed them (:meth:`SuspectNodes.mark_failure`) and the
not Ready nodes a re-run's old pods were left on (:meth:`SuspectNodes.mark_unconfirmed`); the
scheduler keeps them off every placement while the mark lasts (:meth:`SuspectNodes.holds`,
merged into placement's ``hold`` argument, the same mechanism the backfill uses, so ``gpufed
explain`` names them); the member status writer shows them (:meth:`SuspectNodes.of_member`,
``MemberCluster.status.suspectNodes``, ``gpufed get clusters``). A mark lasts ``cooldown_s``
(hub ``--suspect-node-cooldown``, default 3,600 s) on the hub's monotonic clock; a node marked
again starts a new cool-down. The marks of a member are also kept in its etcd meta record
(:meth:`SuspectNodes.records_of`, written by the lifecycle that marks them;
:meth:`SuspectNodes.restore` at a new term), so a hub restart or a leader change keeps them
until their wall-clock expiry.

Called by the scheduling cycle, preemption, the lifecycle, reports and member handling of one
leader term.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

import structlog

from gpufed.api.decision import Decision, Reservation
from gpufed.api.work import FailureCause
from gpufed.hub.components.term import MemberState, Term
from gpufed.hub.rules.records import SuspectRecord
from gpufed.placement import FleetSnapshot
from gpufed.placement.queue import Hold
from gpufed.sync.failure import NODE_EVIDENCE

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

    def hold_charges(self, waiting: Iterable[str]) -> list[tuple[str, str | None]]:
        """(job uid, GPU product) of each ``waiting`` job's confirmed preemption hold, by UID:
        the quota ledger charges them to the preemptors' queues
        (:meth:`gpufed.hub.components.queues.Queues.rebuild_usage`)."""
        return [(res.job_uid, self._product_of(res)) for res in self.confirmed_holds(waiting)]

    def _product_of(self, res: Reservation) -> str | None:
        """The GPU product of the nodes a reservation holds (None when none is known)."""
        if res.cluster not in self._snapshot.cluster_names:
            return None
        nodes = self._snapshot.cluster(res.cluster).nodes
        for name in sorted(res.nodes):
            n = nodes.get(name)
            if n is not None and n.pool is not None:
                return n.pool.product
        return None

    def let_go(self, job: str, decision: Decision, *, victims_stopping: bool) -> Decision:
        """A preemptor (``job``: its key) not placed on its own hold: while its victims stop
        (``victims_stopping``) it keeps the hold; once they are gone it lets the hold go (a
        held node never sits idle while its holder cannot be admitted there; it may preempt
        again). Returns the decision to report, its message naming the hold let go."""
        uid = decision.uid
        res = self.held(uid)
        if victims_stopping or res is None or uid in self._tentative:
            return decision
        nodes = ", ".join(sorted(res.nodes)[:8])
        self.release(uid, "its holder cannot be placed on it")
        log.info("preemption.hold_released", job=job, cluster=res.cluster, nodes=nodes)
        return decision.model_copy(
            update={
                "message": f"{decision.message}; let go of its preemption hold on {res.cluster} "
                f"({nodes}): not placed there once its victims were gone"
            }
        )

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


# --- suspect nodes ---------------------------------------------------------------------------

#: Default cool-down of a suspect node, seconds.
DEFAULT_SUSPECT_COOLDOWN_S = 3600.0
#: Most suspect nodes kept per member (the oldest marks go first beyond it).
MAX_SUSPECTS_PER_MEMBER = 256


@dataclass(frozen=True, slots=True)
class Suspect:
    """One suspect node: ``node`` of ``cluster``, why (``reason``, one line), and until when
    (``until_mono``, hub monotonic seconds; ``until_wall``, wall seconds, for display)."""

    cluster: str
    node: str
    reason: str
    until_mono: float
    until_wall: float


class SuspectNodes:
    """The suspect marks of one leader term (module docstring)."""

    def __init__(self, cooldown_s: float = DEFAULT_SUSPECT_COOLDOWN_S) -> None:
        if not cooldown_s >= 0:
            raise ValueError(f"--suspect-node-cooldown: {cooldown_s} is not >= 0 seconds")
        self.cooldown_s = cooldown_s
        self._marks: dict[tuple[str, str], Suspect] = {}

    def mark(
        self, cluster: str, nodes: Iterable[str], reason: str, *, mono: float, wall: float
    ) -> list[str]:
        """Mark ``nodes`` of ``cluster`` suspect for the cool-down from now; returns them."""
        out: list[str] = []
        if self.cooldown_s <= 0:
            return out
        for node in nodes:
            self._marks[(cluster, node)] = Suspect(
                cluster, node, reason, mono + self.cooldown_s, wall + self.cooldown_s
            )
            out.append(node)
        mine = sorted(
            (s for s in self._marks.values() if s.cluster == cluster), key=lambda s: s.until_mono
        )
        for s in mine[: max(0, len(mine) - MAX_SUSPECTS_PER_MEMBER)]:
            del self._marks[(s.cluster, s.node)]
        return out

    def mark_failure(
        self, m: MemberState, cause: FailureCause, job: str, *, mono: float, wall: float
    ) -> list[str]:
        """An infrastructure failure of ``job``'s copy in member ``m``: mark the nodes
        ``cause`` names, when it is what Kubernetes observed of them
        (:data:`gpufed.sync.failure.NODE_EVIDENCE`); returns the nodes marked."""
        # Never what the tenant can cause itself (its own exit codes, a pressure eviction it
        # provoked, a drain or a member-side preemption): else one tenant could walk the fleet
        # marking nodes and keep every other tenant off them for the cool-down.
        if cause.reason not in NODE_EVIDENCE:
            return []
        return self._mark_in(m, cause.nodes, f"{cause.reason} under {job}", mono, wall)

    def mark_unconfirmed(
        self, m: MemberState, uid: str, job: str, *, mono: float, wall: float
    ) -> tuple[list[str], list[str]]:
        """A re-run of job ``uid`` (``job``: its key) starts while pods of its old copy are
        left on nodes of ``m`` that are not Ready (unreachable: never confirmed gone): those
        nodes become suspect (Kubernetes observed them not Ready). Returns (those nodes, the
        ones marked)."""
        nodes = sorted(n.name for n in m.nodes.values() if uid in n.job_requests and not n.ready)
        if not nodes:
            return [], []
        reason = f"pods of {job} not confirmed gone (node not Ready)"
        return nodes, self._mark_in(m, nodes, reason, mono, wall)

    def _mark_in(
        self, m: MemberState, nodes: Iterable[str], reason: str, mono: float, wall: float
    ) -> list[str]:
        """Mark ``nodes`` of ``m`` and keep the member's marks in its meta record (written
        before a re-run decision is stored, else at the next flush)."""
        marked = self.mark(m.name, nodes, reason, mono=mono, wall=wall)
        if marked:
            m.meta = m.meta.model_copy(update={"suspects": self.records_of(m.name, mono)})
            m.meta_dirty = True
        return marked

    def records_of(self, cluster: str, mono: float) -> dict[str, SuspectRecord]:
        """The member's marks still on at ``mono``, as its etcd meta record keeps them."""
        return {
            s.node: SuspectRecord(reason=s.reason, until=s.until_wall)
            for s in self.of_member(cluster, mono)
        }

    def restore(
        self, cluster: str, records: dict[str, SuspectRecord], *, mono: float, wall: float
    ) -> None:
        """A new term: take the member's marks from etcd; each ends at its wall-clock expiry
        (marks already over are dropped)."""
        for node, rec in records.items():
            left = min(rec.until - wall, self.cooldown_s)
            if left > 0:
                self._marks[(cluster, node)] = Suspect(
                    cluster, node, rec.reason, mono + left, wall + left
                )

    def expire(self, mono: float) -> bool:
        """Drop the marks whose cool-down ended; True when any did (the fleet changed)."""
        gone = [k for k, s in self._marks.items() if s.until_mono <= mono]
        for k in gone:
            del self._marks[k]
        return bool(gone)

    def holds(self, mono: float) -> dict[str, Hold]:
        """Per member, a placement hold over its suspect nodes (none when there are none)."""
        self.expire(mono)
        nodes: dict[str, set[str]] = {}
        for (cluster, node), _ in sorted(self._marks.items()):
            nodes.setdefault(cluster, set()).add(node)
        return {
            c: Hold(
                c,
                frozenset(ns),
                f"suspect nodes after an infrastructure failure: {', '.join(sorted(ns))}",
            )
            for c, ns in nodes.items()
        }

    def of_member(self, cluster: str, mono: float) -> list[Suspect]:
        """The member's suspect nodes now, by node name."""
        return sorted(
            (s for s in self._marks.values() if s.cluster == cluster and s.until_mono > mono),
            key=lambda s: s.node,
        )

    def next_expiry(self) -> float | None:
        """Monotonic seconds of the next cool-down end, None without marks."""
        return min((s.until_mono for s in self._marks.values()), default=None)


def with_suspects(hold: dict[str, Hold] | None, suspects: dict[str, Hold]) -> dict[str, Hold]:
    """Placement's holds with the suspect holds merged in (nodes unioned per member)."""
    out = dict(hold or {})
    for cluster, h in suspects.items():
        out[cluster] = out[cluster].merged(h) if cluster in out else h
    return out
