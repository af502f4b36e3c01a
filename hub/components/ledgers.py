"""The queues' two quota ledgers on the hub, kept by the jobs whose charge changed.

Owned by :class:`gpufed.hub.components.queues.Queues` (:meth:`~gpufed.hub.components.queues.
Queues.rebuild_usage`), fed each cycle by :class:`gpufed.hub.components.charges.JobCharges`:
the charges that changed since the last cycle (a job placed, finished, requeued, moved to
another queue or amount, or become a victim being stopped for a preemptor).

- **Admission** (``usage``): every job's charge, victims still being stopped included (their
  pods run), and each waiting preemptor's hold for what its stopping victims do not charge.
- **Planning** (``planning_usage``): the usage to come: the victims being stopped count as
  gone, the holds in full.

A job's charge row wins over a hold of the same UID; of two holds of one UID, the last. Each
ledger is a base :class:`~gpufed.placement.quota.QuotaUsage` changed in O(changed charges) and
a per-cycle fork (O(1)) carrying the holds (few): a pass's gate charges its fork, so neither
the base nor the next cycle's ledgers see a pass's charges, and a fork keeps its values when
the base changes under a cycle still using it (the base hands the fork the old entries).

When the charges are counted in full (:data:`~gpufed.hub.components.charges.RECOUNT_S`),
:meth:`QueueLedgers.recount` builds both bases from scratch from the same charges, counts
the entries that differ in ``gpufed_hub_incremental_drift_total{kind="queue_ledger"}`` and
logs them (``hub.queue.ledger_drift``; 0 unless this module has a bug), then starts from the
full count's charges (new base objects: forks of the old ones are left as they were).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

import structlog

from gpufed.hub.components.charges import Charge
from gpufed.placement.quota import QuotaUsage

log = structlog.get_logger("gpufed.hub.components.ledgers")

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
