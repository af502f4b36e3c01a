"""Each job's quota charge on the hub, kept incrementally, with a periodic full recount.

Owned by :class:`gpufed.hub.components.queues.Queues`, which changes its ledgers by what
changed in these charges every cycle (:attr:`JobCharges.changed`,
:mod:`gpufed.hub.components.ledgers`) (:meth:`Queues.rebuild_usage
<gpufed.hub.components.queues.Queues.rebuild_usage>`). A job charges its queue from its etcd
record (``JobRecord.queue`` / ``JobRecord.charged``) while it is placed and not finished; a
record without a queue charges its job's queue now for the GPU product its status names; the
records whose GPUJob this term has not seen (orphans) charge too. What a victim still being
stopped charges carries its preemptor's UID (the preemptor's hold is charged only for the rest).

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
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Final

import structlog

from gpufed.hub.components.term import JobState, Term
from gpufed.hub.rules.records import JobRecord
from gpufed.placement.quota import demand_of

log = structlog.get_logger("gpufed.hub.components.charges")

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
