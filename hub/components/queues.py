"""Queues on the hub: the GPUQueues of the hub cluster, the queue tree admission runs on, the
one quota-usage ledger of the leader term, fair share, and every GPUQueue's status and metrics.

Fed by :mod:`gpufed.hub.components.intake` (list+watch of ``gpuqueues``, the same loop as GPUJobs); asked
by :mod:`gpufed.hub.components.scheduling` each cycle. The rules are pure and not repeated here
(:mod:`gpufed.placement.quota`: tree, validation, a job's queue, admission with borrowing;
:mod:`gpufed.placement.fairshare`: decayed usage and the queue order).

- **Intake.** Each GPUQueue is validated (:class:`gpufed.api.queue.GPUQueue`; a spec that does
  not validate is broken with the field and the fix in its message) and the tree is rebuilt
  with :func:`~gpufed.placement.quota.build_tree`, which also refuses cycles of parents,
  unknown parents, a namespace in two queues and keys listed twice. A broken queue admits
  nothing: its jobs wait with its message; nothing else changes. Only a change of the specs
  rebuilds the tree (our own status writes come back through the watch).
- **Usage** (:meth:`Queues.rebuild_usage`) follows the placements: a job charges its queue
  from the placement's etcd transaction (``JobRecord.queue`` / ``JobRecord.charged``) until it
  ends, is deleted (its record forgotten) or waits to be placed again (record without a
  cluster); a job being stopped for a preemptor charges until its copy is gone, and the
  preemptor's hold is charged to the preemptor's queue, until it is placed, for what its
  stopping victims do not charge (so the GPUQueue status shows it). Each job's charge is
  kept incrementally from those records (:meth:`Queues.rebuild_usage`): every cycle reads only
  the jobs marked touched since (``HubState.touched``: the term's job table marks every change
  of a job's record, status, request, GPUJob or claim) and the orphan records; running jobs
  that did not change and finished jobs are never walked
  (:mod:`gpufed.hub.components.usage`). Every 30 s (the status loop's :meth:`refresh`,
  never a scheduling cycle) and at the start of a term, a full count over every job replaces
  it and any job whose charge differs is counted in
  ``gpufed_hub_incremental_drift_total{kind="queue_usage"}`` (0 unless a change path was
  missed). The ledgers follow the charges at every cycle, kept by the charges that changed
  (:mod:`gpufed.hub.components.usage`: each cycle a fork with the holds, so a pass's gate
  never charges the kept ledgers; checked against sums from scratch at each full recount,
  ``kind="queue_ledger"``), so a restart, a failover or a placement that etcd refused can
  neither double nor lose a job; within a cycle the pass
  charges each placement at once (:meth:`gpufed.placement.quota.QuotaGate.charge`), so two jobs
  of one pass never exceed a quota together. Not the reservation ledger: a reservation also
  ends when the pods bind, while the job keeps its GPUs.
- **Unlisted namespaces** (``--unlisted-namespaces``): a job whose namespace no GPUQueue
  lists goes to the default queue, or, with ``reject``, waits until one does
  (:meth:`Queues.unlisted`; jobs placed before are never refused). The default queue's cap
  without a ``spec.maxPriority`` of its own is ``--default-queue-max-priority``.
- **Before the first GPUQueue list** of a term nothing is admitted (:attr:`Queues.synced`):
  placing before the quotas are known could exceed them.
- **Status** (:meth:`Queues.publish`): ``Active``, ``usage``, ``pendingJobs``, ``admittedJobs``
  (counted over the jobs counted last time, the wanted ones and those charged, never the
  finished ones; a full count every 30 s, drift ``kind="queue_jobs"``), ``fairShare``, through :meth:`gpufed.hub.components.mirror.Mirror.queue_status` (coalesced, fenced,
  resourceVersion-guarded); gauges ``gpufed_queue_gpus`` and ``gpufed_queue_pending_jobs``.

Bounded: at most :data:`MAX_QUEUES` GPUQueues are admitted by (the rest, by name, are broken
with a message saying so). One instance per leader term.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

import structlog
from pydantic import ValidationError

from gpufed.api.gpujob import StatusCondition
from gpufed.api.queue import (
    ACTIVE_CONDITION,
    MAX_SHARE_SAMPLES,
    SHARE_SAMPLE_S,
    GPUQueue,
    GPUQueueStatus,
    QueueUsage,
    ShareSample,
)
from gpufed.hub.components.lifecycle import Lifecycle
from gpufed.hub.components.metrics import MAX_QUEUE_SERIES
from gpufed.hub.components.mirror import Mirror
from gpufed.hub.components.term import JobState, Term
from gpufed.hub.components.usage import RECOUNT_S, Hold, JobCharges, KeptUsage
from gpufed.hub.rules import lifecycle as lc
from gpufed.hub.rules import status as st
from gpufed.hub.rules.admission import PriorityCap
from gpufed.hub.rules.records import FairShareRecord
from gpufed.placement.fairshare import DecayedUsage
from gpufed.placement.quota import (
    QueueChoice,
    QueueTree,
    QuotaGate,
    QuotaUsage,
    build_tree,
    demand_of,
    queue_of,
    usage_rows,
)

log = structlog.get_logger("gpufed.hub.components.queues")

#: Seconds between writes of the queues' decayed usage to etcd (key ``fairshare``).
FAIR_SHARE_SAVE_S: Final = 60.0

#: The hub flag that caps the default queue without a ``spec.maxPriority`` of its own.
DEFAULT_QUEUE_CAP_FLAG: Final = "--default-queue-max-priority"

#: Most GPUQueues the hub admits by; more are broken (bounded memory and cycle time).
MAX_QUEUES: Final = 1000

#: Seconds after intake within which a job not yet wanted (its first reconcile has not run)
#: is not counted as drift by the full count of :meth:`Queues.publish`.
_FRESH_S: Final = 10.0


def _field_of(exc: ValidationError) -> str:
    """``spec.quotas[0].nominal: Input should be ...`` for the first error."""
    err = exc.errors()[0]
    path = ""
    for part in err.get("loc", ()):
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return f"{path or 'spec'}: {err.get('msg', 'invalid')}"


class Queues:
    """The GPUQueues, the tree, the usage ledger and the queues' status (module docstring)."""

    def __init__(self, term: Term, mirror: Mirror, lifecycle: Lifecycle) -> None:
        self._term = term
        self._mirror = mirror
        self._lifecycle = lifecycle
        #: the waiting preemptors' holds the last cycle charged: (job uid, GPU product)
        self._holds: tuple[tuple[str, str | None], ...] = ()
        cfg = term.config
        self._specs: dict[str, GPUQueue] = {}
        self._invalid: dict[str, str] = {}
        #: conditions as last read or written (transition times survive a restart)
        self._conditions: dict[str, list[StatusCondition]] = {}
        #: per queue, its fair share over the last day (``status.fairShareHistory``; a new
        #: leader takes it from the status it lists)
        self._history: dict[str, list[ShareSample]] = {}
        #: queue -> the status last computed (what the mirror writes)
        self.shown: dict[str, GPUQueueStatus] = {}
        self._exported: set[tuple[str, str, str]] = set()
        self._exported_pending: set[str] = set()
        self.tree: QueueTree = build_tree([], default_queue=cfg.default_queue)
        self.usage = QuotaUsage()
        #: the usage preemption plans on (:meth:`rebuild_usage`)
        self.planning_usage = QuotaUsage()
        #: the jobs :meth:`publish` counted last: uid -> (admitted?, queue; "" for a waiting
        #: job no pending count shows), the counts per queue, and when it last counted every
        #: job (monotonic seconds)
        self._rows: dict[str, tuple[bool, str]] = {}
        #: the uids of :attr:`_rows` counted pending (not admitted): read again each publish
        self._pending_rows: set[str] = set()
        self._pending: Counter[str] = Counter()
        self._admitted: Counter[str] = Counter()
        self._counted_at: float | None = None
        #: what may have changed a job's count since the last publish: the jobs marked
        #: touched (HubState.follow), those whose charge changed, the holds' jobs
        self._count_touched = term.state.follow()
        self._usage_changed: set[str] = set()
        term.metrics.incremental_drift.labels("queue_jobs")  # exported from 0
        #: each job's charge and the ledgers' bases, kept by what changed (:meth:`rebuild_usage`)
        charges = JobCharges(term, lifecycle.orphan_records, lambda j: self.queue_of(j).queue)
        self._usage = KeptUsage(term, charges)
        term.metrics.incremental_drift.labels("queue_ledger")  # exported from 0
        self.decayed = DecayedUsage(cfg.fair_share_half_life_s)
        self._saved_at: float | None = None
        #: set once the first GPUQueue list of this term is in
        self.synced = asyncio.Event()
        #: the last error of the GPUQueue list+watch ("" after a good list)
        self.list_error = ""

    # --- intake ----------------------------------------------------------------------------------

    def on_event(self, type_: str, obj: Mapping[str, Any]) -> bool:
        """A GPUQueue watch event; True when the specs (so the tree) changed."""
        meta = obj.get("metadata") or {}
        name = str(meta.get("name", ""))
        if type_ == "DELETED":
            self._conditions.pop(name, None)
            self._history.pop(name, None)
            self.shown.pop(name, None)
            self._mirror.forget_queue(name)
            changed = self._specs.pop(name, None) is not None
            changed |= self._invalid.pop(name, None) is not None
            return self._rebuild() if changed else False
        try:
            q = GPUQueue.model_validate(obj)
        except ValidationError as exc:
            message = _field_of(exc)
            if self._invalid.get(name) == message and name not in self._specs:
                return False
            self._specs.pop(name, None)
            self._invalid[name] = message
            log.info("hub.queue.invalid", queue=name, error=message)
            return self._rebuild()
        if q.status is not None and name not in self._conditions:
            self._conditions[name] = list(q.status.conditions)
        if q.status is not None and name not in self._history:
            self._history[name] = _readable(q.status.fair_share_history)[-MAX_SHARE_SAMPLES:]
        prev = self._specs.get(name)
        if prev is not None and prev.spec == q.spec and name not in self._invalid:
            return False
        self._invalid.pop(name, None)
        self._specs[name] = q
        return self._rebuild()

    def listed(self, items: Iterable[Mapping[str, Any]]) -> None:
        """After a (re)list: queues gone meanwhile are deleted; the rest arrive as ADDED."""
        items = list(items)
        present = {str((o.get("metadata") or {}).get("name", "")) for o in items}
        for name in [n for n in (*self._specs, *self._invalid) if n not in present]:
            self.on_event("DELETED", {"metadata": {"name": name}})
        for obj in items:
            self.on_event("ADDED", obj)
        self.list_error = ""
        self.synced.set()

    def list_failed(self, exc: Exception) -> None:
        """The GPUQueue list or watch failed (missing CRD or RBAC rule: jobs wait, see log)."""
        self.list_error = str(exc)

    def _rebuild(self) -> bool:
        names = sorted(self._specs)
        over = {n: "" for n in names[MAX_QUEUES:]}
        invalid = dict(self._invalid)
        for n in over:
            invalid[n] = (
                f"metadata.name: more than {MAX_QUEUES} GPUQueues; the hub admits by the first "
                f"{MAX_QUEUES} by name: delete or merge queues"
            )
        self.tree = build_tree(
            (self._specs[n] for n in names[:MAX_QUEUES]),
            invalid=invalid,
            default_queue=self._term.config.default_queue,
        )
        for name, message in sorted(self.tree.broken.items()):
            log.info("hub.queue.broken", queue=name, reason=message)
        return True

    # --- a job's queue ---------------------------------------------------------------------------

    def queue_of(self, job: JobState) -> QueueChoice:
        """The queue of ``job`` (its namespace's, else the default queue), or the error of a
        ``spec.placement.queue`` that names another queue."""
        return queue_of(
            self.tree, job.obj.metadata.namespace or "default", job.obj.spec.placement.queue
        )

    def max_priority(self, queue: str) -> PriorityCap | None:
        """The highest priority a job of ``queue`` may use: the lowest ``spec.maxPriority`` of
        the queue and its ancestors (None: no cap). The default queue's own cap, when no
        GPUQueue of its name sets one, is ``--default-queue-max-priority`` (None: none); so it
        caps the default queue's children too, as its ``spec.maxPriority`` would."""
        cfg = self._term.config
        cap: PriorityCap | None = None
        seen: set[str] = set()
        name: str | None = queue
        while name is not None and name not in seen:
            seen.add(name)
            q = self._specs.get(name)
            own: PriorityCap | None = None
            if q is not None and q.spec.max_priority is not None:
                own = PriorityCap(q.spec.max_priority)
            elif name == cfg.default_queue and cfg.default_queue_max_priority is not None:
                own = PriorityCap(cfg.default_queue_max_priority, flag=DEFAULT_QUEUE_CAP_FLAG)
            if own is not None and (cap is None or own.value < cap.value):
                cap = own
            name = q.spec.parent if q is not None else None
        return cap

    def unlisted(self, job: JobState) -> str | None:
        """Why ``job`` may not be placed: under ``--unlisted-namespaces reject``, a job never
        placed (no job record) whose namespace no GPUQueue lists, whatever its
        ``spec.placement.queue``; None when it may. Judged each cycle, so listing the
        namespace lets the job in; a job placed before is never refused (it keeps running,
        and a requeue sends it back to its queue)."""
        if self._term.config.unlisted_namespaces != "reject" or job.record is not None:
            return None
        namespace = job.obj.metadata.namespace or "default"
        if namespace in self.tree.namespaces:
            return None
        return (
            f"namespace {namespace} is listed by no GPUQueue and this hub runs no job of an "
            f"unlisted namespace: list namespace {namespace} in a GPUQueue's spec.namespaces, "
            "or run the hub with --unlisted-namespaces default-queue"
        )

    def view(self, job: JobState) -> lc.QueueView:
        """This cycle's view of ``job``'s GPUQueue and priority (:meth:`unlisted`,
        :meth:`queue_of`, its PriorityClass resolved under :meth:`max_priority`): a fact of the
        lifecycle's rule 7."""
        unlisted = self.unlisted(job)
        if unlisted is not None:
            return lc.QueueView(unlisted=unlisted)
        choice = self.queue_of(job)
        if choice.error is not None:
            return lc.QueueView(queue=choice.queue, queue_error=choice.error)
        res = self._term.state.priorities.resolve(
            job.priority, queue=choice.queue, cap=self.max_priority(choice.queue)
        )
        return lc.QueueView(
            queue=choice.queue,
            priority=res.priority,
            preemption_policy=res.preemption_policy,
            priority_refused=res.error,
            priority_field=res.error_field,
            priority_missing=res.waiting,
        )

    # --- usage -----------------------------------------------------------------------------------

    def rebuild_usage(
        self, holds: Sequence[tuple[str, str | None]] | None = None, *, recount: bool = True
    ) -> None:
        """Rebuild the ledgers from the placements: the etcd records of jobs not finished, and
        the records whose GPUJob this term has not seen (their copies still run). A record
        without a queue (from before queues, or adopted after a loss of etcd state) charges its
        job's queue now for the GPU product its status names.

        ``holds``: (job uid, GPU product) of each waiting preemptor's confirmed hold, charged
        to its queue while it waits (docs/hub.md, "Preemption"): the quota it reclaimed stays
        its own, so its requeued victims cannot take it back on other free GPUs. A victim
        still being stopped keeps charging its own queue until its copy is gone (its pods
        still run: no other job of its queue may take that quota meanwhile), and the hold is
        charged only for what its stopping victims do not charge, so the two never count the
        same GPUs twice. The scheduling cycle passes them; between cycles (:meth:`refresh`)
        the last ones count.

        Cost: reading the jobs touched since the last count and the orphan records (module
        docstring); the ledgers, the charges that changed and the holds
        (:class:`~gpufed.hub.components.usage.KeptUsage`). With ``recount`` (the status
        loop's :meth:`refresh`; the scheduling cycle passes False, so no decision waits for
        it), a full count over every job every
        :data:`~gpufed.hub.components.usage.RECOUNT_S` counts the jobs
        whose incremental charge differed
        (:class:`~gpufed.hub.components.usage.JobCharges`) and checks the kept ledgers
        against sums from scratch, counting what they had different
        (``gpufed_hub_incremental_drift_total{kind="queue_ledger"}``) and rebuilding them
        only then."""
        self._usage_changed.update(u for u, _ in self._holds)
        if holds is not None:
            self._holds = tuple(holds)
            self._usage_changed.update(u for u, _ in self._holds)
        resolved: list[Hold] = []
        for uid, product in self._holds:
            held = self._term.state.jobs.get(uid)
            if held is None or held.request is None or not held.wants_placement:
                continue
            resolved.append((uid, self.queue_of(held).queue, demand_of(held.request, product)))
        # New ledger objects (forks of the kept bases): a pass's gate keeps charging the one
        # it started with, and its charges never reach the bases.
        self.usage, self.planning_usage, changed = self._usage.update(resolved, recount=recount)
        self._usage_changed.update(changed)

    def gate(self) -> QuotaGate:
        """Admission for one pass over the current tree and ledger (the pass charges it)."""
        return QuotaGate(self.tree, self.usage)

    def observe(self, now: float) -> dict[str, float]:
        """Advance decayed usage to ``now`` (wall seconds) with each queue's own GPUs in use;
        returns the queues' fair-share values."""
        per_queue = {q: float(sum(self.usage.own(q).values())) for q in self.tree.nodes}
        self.decayed.observe(now, per_queue)
        return self.decayed.shares(self.tree)

    def restore_history(self, record: FairShareRecord | None) -> None:
        """Start decayed usage from what the last leader saved (``Controller.load``); a queue
        deleted meanwhile keeps a value nothing reads, dropped at the next save."""
        if record is not None:
            self.decayed.restore(record.values, record.at)

    async def save_history(self) -> None:
        """Write decayed usage to etcd, at most every :data:`FAIR_SHARE_SAVE_S` (the term's
        flush loop); a new leader restores it, so fair share survives a restart."""
        now = self._term.wall()
        if self._saved_at is not None and now - self._saved_at < FAIR_SHARE_SAVE_S:
            return
        self.decayed.advance(now)
        values = {q: v for q in self.tree.nodes if (v := self.decayed.value(q)) > 0}
        await self._term.store.put_fair_share(FairShareRecord(values=values, at=now))
        self._saved_at = now

    def refresh(self) -> None:
        """Between cycles (the term's status loop): ledger, fair share and status again, so a
        job that ended shows in its queue's usage without waiting for a cycle."""
        self.rebuild_usage()
        self.publish(self.observe(self._term.wall()))

    # --- status ----------------------------------------------------------------------------------

    def publish(self, shares: Mapping[str, float], *, recount: bool = True) -> None:
        """Write every GPUQueue's status (skipped when unchanged) and refresh the gauges
        (``shares``: from :meth:`observe`). ``recount``: as for :meth:`rebuild_usage` (the
        scheduling cycle passes False)."""
        pending, admitted = self._job_counts(recount)
        now = self._mirror.now()
        exported: set[tuple[str, str, str]] = set()
        exported_pending: set[str] = set()
        names = sorted({*self._specs, *self._invalid})
        for i, name in enumerate(names):
            rows = usage_rows(self.tree, self.usage, name)
            status = self._status(name, rows, pending[name], admitted[name], shares, now)
            self.shown[name] = status
            self._mirror.queue_status(name, status)
            if i < MAX_QUEUE_SERIES:
                exported_pending.add(name)
                self._term.metrics.queue_pending_jobs.labels(name).set(pending[name])
                for row in status.usage:
                    for state, value in (
                        ("nominal", row.nominal),
                        ("used", row.used),
                        ("borrowed", row.borrowed),
                    ):
                        exported.add((name, row.gpu_product, state))
                        self._term.metrics.queue_gpus.labels(name, row.gpu_product, state).set(
                            value
                        )
        for labels in self._exported - exported:
            self._term.metrics.queue_gpus.remove(*labels)
        for name in self._exported_pending - exported_pending:
            self._term.metrics.queue_pending_jobs.remove(name)
        self._exported, self._exported_pending = exported, exported_pending

    def _job_counts(self, recount: bool = True) -> tuple[Counter[str], Counter[str]]:
        """(pending, admitted) jobs per queue: a job charged in :attr:`usage` is admitted to
        the queue it charges; one that wants placement (and may be placed: :meth:`unlisted`)
        is pending in its queue. Kept across publishes: reads again only the jobs marked
        touched since (``HubState.follow``), those whose charge or hold changed, the wanted
        ones (``HubState.wanted``) and those counted waiting last time (their queue and
        whether it is listed may change without a mark), never the running jobs that did not
        change nor the finished ones; with ``recount``, every
        :data:`~gpufed.hub.components.usage.RECOUNT_S` every job, counting any job whose
        count the kept one missed in ``gpufed_hub_incremental_drift_total{kind="queue_jobs"}``
        (except jobs taken in within :data:`_FRESH_S`, not wanted yet)."""
        state = self._term.state
        now = self._term.mono()
        read = set(self._count_touched)
        self._count_touched.difference_update(read)
        read |= self._usage_changed
        self._usage_changed = set()
        read.update(state.wanted)
        read.update(self._pending_rows)
        for uid in read:
            self._recount_job(uid)
        if self._counted_at is None or (recount and now - self._counted_at >= RECOUNT_S):
            pending, admitted, rows = self._count_jobs(state.jobs)
            if self._counted_at is not None:
                # a job intake took in moments ago is wanted at its first reconcile
                missed = [
                    u
                    for u in rows.keys() ^ self._rows.keys()
                    | {u for u in rows.keys() & self._rows.keys() if rows[u] != self._rows[u]}
                    if u not in state.jobs or now - state.jobs[u].seen_mono >= _FRESH_S
                ]
                if missed:
                    self._term.metrics.incremental_drift.labels("queue_jobs").inc(len(missed))
                    log.warning("hub.queue.jobs_drift", jobs=len(missed), first=sorted(missed)[:5])
            self._pending, self._admitted, self._rows = pending, admitted, rows
            self._pending_rows = {u for u, (counted, _) in rows.items() if not counted}
            self._counted_at = now
        return +self._pending, +self._admitted

    def _row(self, uid: str) -> tuple[bool, str] | None:
        """Job ``uid``'s count now: (True, the queue it charges) when admitted, (False, its
        queue; "" when unlisted) when it wants placement, else None."""
        job = self._term.state.jobs.get(uid)
        if job is None:
            return None
        charged = self.usage.queue_of_job(uid)
        if charged is not None:
            return (True, charged)
        if job.wants_placement:
            return (False, self.queue_of(job).queue if self.unlisted(job) is None else "")
        return None

    def _recount_job(self, uid: str) -> None:
        """Move job ``uid``'s kept count to what it is now."""
        old = self._rows.get(uid)
        new = self._row(uid)
        if old == new:
            return
        if old is not None:
            (self._admitted if old[0] else self._pending)[old[1]] -= 1
            del self._rows[uid]
            self._pending_rows.discard(uid)
        if new is not None:
            (self._admitted if new[0] else self._pending)[new[1]] += 1
            self._rows[uid] = new
            if not new[0]:
                self._pending_rows.add(uid)

    def _count_jobs(
        self, uids: Iterable[str]
    ) -> tuple[Counter[str], Counter[str], dict[str, tuple[bool, str]]]:
        """(pending, admitted, each counted job's row) over the jobs of ``uids``."""
        pending: Counter[str] = Counter()
        admitted: Counter[str] = Counter()
        rows: dict[str, tuple[bool, str]] = {}
        for uid in uids:
            row = self._row(uid)
            if row is not None:
                (admitted if row[0] else pending)[row[1]] += 1
                rows[uid] = row
        return pending, admitted, rows

    def _status(
        self,
        name: str,
        rows: list[Any],
        pending: int,
        admitted: int,
        shares: Mapping[str, float],
        now: str,
    ) -> GPUQueueStatus:
        broken = self.tree.broken.get(name)
        if broken is not None:
            active, reason, message = "False", "InvalidSpec", broken
        else:
            node = self.tree.nodes[name]
            keys = ", ".join(sorted(node.quotas)) or "none of its own"
            active, reason = "True", "Admitting"
            message = f"admitting by quotas: {keys}"
        conditions = st.set_condition(
            self._conditions.get(name, []),
            ACTIVE_CONDITION,
            active,
            reason=reason,
            message=message,
            now=now,
        )
        self._conditions[name] = conditions
        share = shares.get(name)
        value = None if share is None else f"{share:.6g}"
        return GPUQueueStatus(
            conditions=conditions,
            usage=[
                QueueUsage(gpu_product=r.key, nominal=r.nominal, used=r.used, borrowed=r.borrowed)
                for r in rows
            ],
            pending_jobs=pending,
            admitted_jobs=admitted,
            fair_share=value,
            fair_share_history=self._sampled(name, value),
        )

    def _sampled(self, name: str, value: str | None) -> list[ShareSample]:
        """The queue's fair-share history with ``value`` added when the last sample is
        :data:`SHARE_SAMPLE_S` old (at most :data:`MAX_SHARE_SAMPLES`, oldest first)."""
        line = self._history.setdefault(name, [])
        if value is None:
            return list(line)
        wall = self._term.wall()
        last = st.parse_rfc3339(line[-1].time) if line else None
        if last is None or wall - last >= SHARE_SAMPLE_S:
            line.append(ShareSample(time=st.rfc3339(wall), value=value))
            del line[:-MAX_SHARE_SAMPLES]
        return list(line)


def _readable(samples: Iterable[ShareSample]) -> list[ShareSample]:
    """The samples whose time parses (a status edited by hand must not stop the term)."""
    out = []
    for sample in samples:
        try:
            st.parse_rfc3339(sample.time)
        except ValueError:
            continue
        out.append(sample)
    return out
