"""The queues' quota usage on the hub: each job's charge and the two ledgers it feeds, kept by
what changed, with a periodic full recount.

Owned by :class:`gpufed.hub.components.queues.Queues`, which calls :meth:`KeptUsage.update`
once a cycle (:meth:`Queues.rebuild_usage <gpufed.hub.components.queues.Queues.rebuild_usage>`)
and between cycles (its status loop's refresh).

**Charges** (:class:`JobCharges`). A job charges its queue from its etcd record
(``JobRecord.queue`` / ``JobRecord.charged``) while it is placed and not finished; a record
without a queue charges its job's queue now for the GPU product its status names; the records
whose GPUJob this term has not seen (orphans) charge too. What a victim still being stopped
charges carries its preemptor's UID (the preemptor's hold is charged only for the rest).
Incremental: :meth:`JobCharges.update` reads only the jobs touched since the last update
(``HubState.touched``: :class:`~gpufed.hub.components.term.JobTable` marks every job that
enters or leaves the term's jobs and every change of a job's record, status, request, GPUJob or
claim, whichever path makes it: a placement committed or adopted, a job finishing, its GPUJob
deleted, its copy stopped for a requeue or a preemptor, a re-run), the orphan records, and the
few jobs whose record has no queue; never the running jobs that did not change, nor the
finished jobs the term keeps. Every :data:`RECOUNT_S` (and at the first update of a term) a
full count over every job replaces the incremental charges, and each job whose charge differed
is counted in ``gpufed_hub_incremental_drift_total{kind="queue_usage"}`` and logged
(``hub.queue.usage_drift``): 0 unless a change bypassed the table (a test changing a record
behind the hub's back). The scheduling cycle never waits for that count: it runs from the
status loop's refresh (:meth:`Queues.refresh <gpufed.hub.components.queues.Queues.refresh>`).

**Ledgers** (:class:`QueueLedgers`), fed each update by the charges that changed (a job
placed, finished, requeued, moved to another queue or amount, or become a victim being stopped
for a preemptor):

- **Admission** (``usage``): every job's charge, victims still being stopped included (their
  pods run), and each waiting preemptor's hold for what its stopping victims do not charge.
- **Planning** (``planning_usage``): the usage to come: the victims being stopped count as
  gone, the holds in full.

A job's charge row wins over a hold of the same UID; of two holds of one UID, the last. Each
ledger is a base :class:`~gpufed.placement.quota.QuotaUsage` changed in O(changed charges) and
a per-cycle fork (O(1)) carrying the holds (few): a pass's gate charges its fork, so neither
the base nor the next cycle's ledgers see a pass's charges, and a fork keeps its values when
the base changes under a cycle still using it (the base hands the fork the old entries).

When the charges are counted in full, :meth:`QueueLedgers.recount` builds both bases from
scratch from the same charges, counts the entries that differ in
``gpufed_hub_incremental_drift_total{kind="queue_ledger"}`` and logs them
(``hub.queue.ledger_drift``; 0 unless this module has a bug), then starts from the full
count's charges (new base objects: forks of the old ones are left as they were).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Final

import structlog

from gpufed.hub.components.term import JobState, Term
from gpufed.hub.rules.records import JobRecord
from gpufed.placement.quota import QuotaUsage, demand_of

log = structlog.get_logger("gpufed.hub.components.usage")

#: Seconds between full recounts of the charges kept incrementally (the drift check).
RECOUNT_S: Final = 30.0

#: One job's charge: its queue, amounts per concrete key (GPU product or MIG resource), and the
#: preemptor's UID when the job is a victim still being stopped (else None).
Charge = tuple[str, Mapping[str, int], str | None]


class JobCharges:
    """Job UID -> :data:`Charge`, kept incrementally (module docstring).

    ``orphans``: the job records whose GPUJob the term has not seen
    (:meth:`gpufed.hub.components.lifecycle.Lifecycle.orphan_records`); ``queue_of``: the queue
    a job of a record without a queue charges now.
    """

    def __init__(
        self,
        term: Term,
        orphans: Callable[[], list[JobRecord]],
        queue_of: Callable[[JobState], str],
    ) -> None:
        self._term = term
        self._orphans = orphans
        self._queue_of = queue_of
        #: the charges at the last update (None until the term's first full count)
        self._charges: dict[str, Charge] | None = None
        #: jobs that may have changed since the last update (the term's shared set,
        #: ``HubState.touched``: every change of a job's record, status, request, GPUJob or
        #: claim, and every job entering or leaving the term's jobs)
        self._touched = term.state.touched
        #: the charging jobs whose record has no queue (re-read every update)
        self._legacy: set[str] = set()
        #: the orphan records that charged at the last update (re-read: one adopted or
        #: cleaned up leaves the orphans without a touch)
        self._was_orphan: set[str] = set()
        self._recounted = 0.0
        #: what the last update changed against the one before, by job UID (None: the job
        #: charges nothing now); on a recount, the incremental changes (before the full count
        #: replaced them); empty after the term's first count
        self.changed: dict[str, Charge | None] = {}
        #: True when the last update was a full count (:meth:`update`)
        self.recounted = False
        term.metrics.incremental_drift.labels("queue_usage")  # exported from 0

    def update(self, *, recount: bool = True) -> Mapping[str, Charge]:
        """The charges now (read-only; the same mapping, changed in place, each update).
        Incremental, except the first time and, with ``recount``, every :data:`RECOUNT_S`
        (monotonic clock): a full count, and the incremental charges compared with it (drift
        counted). The scheduling cycle passes ``recount=False`` (a decision never waits for
        the full count); the status loop's refresh recounts."""
        now = self._term.mono()
        if self._charges is None or (recount and now - self._recounted >= RECOUNT_S):
            full = self.count_all()
            self.changed = {}
            if self._charges is not None:
                self._count_changed()
                self._check_drift(self._charges, full)
            self._charges, self._recounted = full, now
            self._legacy = {u for u, j in self._term.state.jobs.items() if _legacy(j, full)}
            self._was_orphan = {r.uid for r in self._orphans() if r.uid in full}
            self._touched.clear()
            self.recounted = True
        else:
            self._count_changed()
            self.recounted = False
        return self._charges

    def count_all(self) -> dict[str, Charge]:
        """Every job's charge from every job the term knows and the orphan records (the full
        count)."""
        out: dict[str, Charge] = {}
        for j in self._term.state.jobs.values():
            c = self._charge_of(j)
            if c is not None:
                out[j.uid] = c
        for r in self._orphans():
            if (c := _orphan_charge(r)) is not None:
                out[r.uid] = c
        return out

    def _count_changed(self) -> None:
        """Change the charges in place, reading only the jobs touched since the last update
        (``HubState.touched``), the orphan records and the jobs that charged as orphans at
        the last update, and the jobs whose record has no queue (they charge their job's
        queue now, which may change without a touch); the differences in :attr:`changed`.
        O(those jobs), never every job."""
        jobs = self._term.state.jobs
        orphans = {r.uid: r for r in self._orphans()}
        charges = self._charges
        assert charges is not None
        changed: dict[str, Charge | None] = {}
        legacy = self._legacy
        was_orphan: set[str] = set()
        touched = self._touched
        # take out what is read (a change made meanwhile marks it again)
        read = set(touched)
        touched.difference_update(read)
        for uid in read | orphans.keys() | self._was_orphan | legacy:
            j = jobs.get(uid)
            r = orphans.get(uid) if j is None else None
            c = self._charge_of(j) if j is not None else _orphan_charge(r) if r else None
            old = charges.get(uid)
            if old != c:
                changed[uid] = c
                if c is None:
                    del charges[uid]
                else:
                    charges[uid] = c
            if j is not None and _legacy(j, charges):
                legacy.add(uid)
            else:
                legacy.discard(uid)
            if r is not None and c is not None:
                was_orphan.add(uid)
        self._was_orphan = was_orphan
        self.changed = changed

    def _charge_of(self, j: JobState) -> Charge | None:
        """What job ``j`` charges now (None: nothing)."""
        r = j.record
        if r is None or r.cluster is None or j.terminal:
            return None
        by = r.stopping.by_uid if r.stopping is not None and r.stopping.by_uid else None
        if r.queue is not None:
            return (r.queue, r.charged, by) if r.charged else None
        if j.request is None:
            return None
        # A record without a queue: written before queues existed, or adopted by the rebuild
        # after a loss of etcd state (docs/design.md §7 item 7). Its job's queue now, and what
        # it takes on the product its status names.
        placed = j.status.placement
        demand = demand_of(j.request, placed.gpu_product if placed else None)
        return (self._queue_of(j), demand, by) if demand else None

    def _check_drift(self, kept: Mapping[str, Charge], full: Mapping[str, Charge]) -> None:
        """Count (and log) the jobs whose incremental charge differs from the full count."""
        differ = sorted(u for u in kept.keys() | full.keys() if kept.get(u) != full.get(u))
        if differ:
            self._term.metrics.incremental_drift.labels("queue_usage").inc(len(differ))
            log.warning("hub.queue.usage_drift", jobs=len(differ), first=differ[:5])


def _legacy(j: JobState, charges: Mapping[str, Charge]) -> bool:
    """Whether job ``j`` charges by a record without a queue (its job's queue now)."""
    return j.uid in charges and j.record is not None and j.record.queue is None


def _orphan_charge(r: JobRecord) -> Charge | None:
    """What an orphan record charges (its own queue and amounts while placed)."""
    if r.cluster is not None and r.queue is not None and r.charged:
        return (r.queue, r.charged, None)
    return None


#: A waiting preemptor's hold: (job UID, its queue, key -> amount of its full demand).
Hold = tuple[str, str, Mapping[str, int]]


class QueueLedgers:
    """The admission and planning bases, the charges they hold, and per preemptor what its
    stopping victims charge (module docstring)."""

    def __init__(self) -> None:
        #: job uid -> the charge both bases hold
        self.charges: dict[str, Charge] = {}
        self.admission = QuotaUsage()
        self.planning = QuotaUsage()
        #: preemptor uid -> key -> what its victims still being stopped charge
        self.stopping_for: dict[str, Counter[str]] = {}

    def apply(self, changed: Mapping[str, Charge | None]) -> None:
        """Change both bases by ``changed`` (job uid -> its charge now, None: it charges
        nothing). O(len(changed))."""
        for uid, new in changed.items():
            old = self.charges.get(uid)
            if old == new:
                continue
            if old is not None:
                self.admission.release(uid)
                if old[2] is None:
                    self.planning.release(uid)
                else:
                    self._stopping(old[2], old[1], -1)
                del self.charges[uid]
            if new is not None:
                queue, charged, by = new
                self.admission.charge_demand(uid, queue, charged)
                if by is None:
                    self.planning.charge_demand(uid, queue, charged)
                else:
                    self._stopping(by, charged, 1)
                self.charges[uid] = new

    def _stopping(self, by: str, charged: Mapping[str, int], sign: int) -> None:
        c = self.stopping_for.setdefault(by, Counter())
        for key, amount in charged.items():
            c[key] += sign * amount
            if not c[key]:
                del c[key]
        if not c:
            del self.stopping_for[by]

    def views(self, holds: Sequence[Hold]) -> tuple[QuotaUsage, QuotaUsage]:
        """(admission, planning) ledgers for one cycle: forks of the bases with ``holds``
        charged (a hold whose job charges a row of its own is left out). O(holds)."""
        usage = self.admission.fork()
        planning = self.planning.fork()
        for uid, queue, full in holds:
            row = self.charges.get(uid)
            if row is None:
                still: Mapping[str, int] = self.stopping_for.get(uid) or {}
                demand = {k: v - still.get(k, 0) for k, v in full.items()}
                if demand := {k: v for k, v in demand.items() if v > 0}:
                    usage.release(uid)
                    usage.charge_demand(uid, queue, demand)
            if full and (row is None or row[2] is not None):
                planning.release(uid)
                planning.charge_demand(uid, queue, full)
        return usage, planning

    def recount(self, full: Mapping[str, Charge]) -> int:
        """Check the bases against sums recomputed from scratch from :attr:`charges` (each
        job's entry in both bases, the per-queue sums per key, the job counts, the preemptors'
        stopping sums), then move to ``full`` (the full count of the charges): by the charges
        that differ, or, when the check found a difference, by a build from scratch (new
        objects: forks of the old bases keep what they had). Returns the entries that
        differed. O(charges), no ledger built when nothing differs."""
        differ = _differences(self)
        if differ:
            log.warning("hub.queue.ledger_drift", entries=len(differ), first=differ[:5])
            fresh = QueueLedgers()
            fresh.apply(full)
            self.charges = fresh.charges
            self.admission, self.planning = fresh.admission, fresh.planning
            self.stopping_for = fresh.stopping_for
        else:
            kept = self.charges
            self.apply(
                {u: full.get(u) for u in kept.keys() | full.keys() if kept.get(u) != full.get(u)}
            )
        return len(differ)


def _differences(kept: QueueLedgers) -> list[str]:
    """What the bases and stopping sums of ``kept`` have that a recount of its charges does
    not, one line each (sorted)."""
    out: list[str] = []
    sums: dict[str, dict[tuple[str, str], int]] = {"admission": {}, "planning": {}}
    stopping: dict[str, Counter[str]] = {}
    jobs = {"admission": 0, "planning": 0}
    for uid, (queue, charged, by) in kept.charges.items():
        for name, ledger in (("admission", kept.admission), ("planning", kept.planning)):
            if name == "planning" and by is not None:
                if kept.planning.holds(uid):
                    out.append(f"planning job {uid}")
                continue
            jobs[name] += 1
            entry = ledger.entry(uid)
            if entry is None or entry[0] != queue or entry[1] != charged:
                out.append(f"{name} job {uid}")
            own = sums[name]
            for key, amount in charged.items():
                own[(queue, key)] = own.get((queue, key), 0) + amount
        if by is not None:
            stopping.setdefault(by, Counter()).update(charged)
    for name, ledger in (("admission", kept.admission), ("planning", kept.planning)):
        if ledger.jobs() != jobs[name]:
            out.append(f"{name} jobs {ledger.jobs()} != {jobs[name]}")
        have = {(q, k): a for q in ledger.queues() for k, a in ledger.own(q).items() if a}
        want = {qk: a for qk, a in sums[name].items() if a}
        out += [
            f"{name} queue {q} {k}"
            for q, k in have.keys() | want.keys()
            if have.get((q, k)) != want.get((q, k))
        ]
    for by in kept.stopping_for.keys() | stopping.keys():
        if +kept.stopping_for.get(by, Counter()) != +stopping.get(by, Counter()):
            out.append(f"stopping for {by}")
    return sorted(out)


class KeptUsage:
    """The charges and the ledgers they feed (module docstring), changed together in one call:
    ``charges`` (:class:`JobCharges`) feeds a new :class:`QueueLedgers`; drift goes to
    ``term``'s metrics."""

    def __init__(self, term: Term, charges: JobCharges) -> None:
        self.charges = charges
        self.ledgers = QueueLedgers()
        self._metrics = term.metrics

    def update(
        self, holds: Sequence[Hold], *, recount: bool
    ) -> tuple[QuotaUsage, QuotaUsage, Mapping[str, Charge | None]]:
        """The charges brought up to date (:meth:`JobCharges.update`, a full count every
        :data:`RECOUNT_S` with ``recount``), the ledgers changed by them (checked against sums
        from scratch after a full count, the entries that differed counted in
        ``gpufed_hub_incremental_drift_total{kind="queue_ledger"}``); returns this cycle's
        (admission, planning) ledgers with ``holds`` charged (:meth:`QueueLedgers.views`: new
        forks) and the charges that changed (job UID -> its charge now, None: nothing).
        O(changed charges + holds), O(jobs) on a full count."""
        charges = self.charges.update(recount=recount)
        self.ledgers.apply(self.charges.changed)
        if self.charges.recounted:
            differ = self.ledgers.recount(charges)
            if differ:
                self._metrics.incremental_drift.labels("queue_ledger").inc(differ)
        usage, planning = self.ledgers.views(holds)
        return usage, planning, self.charges.changed
