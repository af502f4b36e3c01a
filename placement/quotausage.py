"""The quota usage ledger (pure): GPUs charged per job and queue, and what a job charges.

Split out of :mod:`.quota` (which re-exports both names and owns the admission rules that read
the ledger; docs/placement.md, "Queues and quotas"). :class:`QuotaUsage` is the one owner of
quota usage: the hub's scheduling cycle and the simulator charge and release through it.
:func:`demand_of` is the concrete keys a placed job charges. No I/O, no clock.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable, Iterator, Mapping
from typing import Final

from gpufed.api.labels import GPU_RESOURCE, is_mig_resource
from gpufed.api.request import PlacementRequest
from gpufed.placement.queuetree import QueueTree


class QuotaUsage:
    """The quota usage ledger: per job UID, its queue and amounts per concrete key.

    ``charge`` on reservation, ``release`` when the job finishes (or its reservation is dropped);
    both are idempotent by job UID, so a ledger rebuilt from the hub's records (``rebuild``)
    after a restart never doubles or loses a job. Amounts are GPUs (MIG keys: slices).

    **Forks** (:meth:`fork`, and ``copy.deepcopy``): a fork is a ledger of its own that starts
    equal to this one and costs O(1) to take: it reads through to this ledger (its base) and
    keeps only what changed in it (copy on write per job and per queue). Changes to either side
    never show in the other: before the base changes a job or a queue's sums, it hands each
    live fork the old entry (O(changes x live forks)). The hub keeps one base per term, changed
    by the jobs whose charge changed, and gives each scheduling pass a fork to charge
    (docs/hub.md, "Queues"). A fork of a fork reads the same base (no chains).

    Threads: one thread changes a base while others take, change and read forks of it (the
    hub's preemption planning runs in a worker thread): a base's changes and the taking of a
    fork hold the base's lock; a fork reads the base before its own entries, the base hands
    the old entries over before it changes (``setdefault``: never over a fork's own) and, while
    it has forks, never changes a queue's sums in place; so a fork reads only values as they
    were when it was taken or as it changed them. Each fork is changed by one thread at a time.
    :meth:`rebuild` of a base with live forks is for one thread only (the hub builds a new base
    instead). Only a base's own thread reads the base itself.
    """

    def __init__(self) -> None:
        #: job uid -> (queue, amounts); entries are never mutated once stored (forks share
        #: them). In a fork: only the jobs changed there or handed over, None = not charged.
        self._jobs: dict[str, tuple[str, dict[str, int]] | None] = {}
        #: queue -> concrete key -> amount. A base replaces a queue's dict on a change (copy
        #: on write); a fork keeps its own copies of the queues changed there or handed over.
        self._own: dict[str, dict[str, int]] = {}
        #: bumped on every change (caches of derived sums compare it)
        self.version = 0
        self._keys: frozenset[str] = frozenset()
        self._keys_at = -1
        self._count = 0
        #: the ledger a fork reads through to (None: not a fork)
        self._base: QuotaUsage | None = None
        #: a base's live forks (weak: a fork nobody holds is gone), under ``_lock``
        self._forks: list[weakref.ref[QuotaUsage]] = []
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"QuotaUsage(jobs={self._count}, version={self.version}, fork={self.is_fork})"

    def __deepcopy__(self, memo: dict[int, object]) -> QuotaUsage:
        return self.fork()

    def __reduce__(self) -> tuple[object, tuple[list[tuple[str, str, dict[str, int]]]]]:
        # pickled (to another process) as a whole ledger: forks do not cross processes
        return (_from_rows, ([(u, q, dict(a)) for u, q, a in self.rows()],))

    @property
    def is_fork(self) -> bool:
        """True for a fork that still reads through to a base (:meth:`fork`)."""
        return self._base is not None

    def fork(self) -> QuotaUsage:
        """A ledger equal to this one now, independent from here on: O(1) from a base, O(what
        this fork changed) from a fork (class docstring)."""
        base = self._base if self._base is not None else self
        out = QuotaUsage()
        out._base = base
        with base._lock:
            base._forks = [r for r in base._forks if r() is not None]
            base._forks.append(weakref.ref(out))
            out._count = self._count
            out.version = self.version
        if base is not self:
            # registered first: what the base hands over from now on reaches both; this
            # fork's own entries win over the handed-over ones
            out._jobs.update(dict(self._jobs))
            out._own.update({q: dict(own) for q, own in dict(self._own).items()})
        return out

    def _entry(self, job_uid: str) -> tuple[str, dict[str, int]] | None:
        base = self._base
        if base is None:
            return self._jobs.get(job_uid)
        under = base._jobs.get(job_uid)  # the base first (class docstring, threads)
        hit = self._jobs.get(job_uid, _MISSING)
        return under if hit is _MISSING else hit  # type: ignore[return-value]

    def _live_forks(self) -> list[QuotaUsage]:
        """A base's live forks (under ``_lock``)."""
        if not self._forks:
            return _NONE
        live = [f for r in self._forks if (f := r()) is not None]
        if len(live) != len(self._forks):
            self._forks = [weakref.ref(f) for f in live]
        return live

    def charge(self, job_uid: str, queue: str, key: str, gpus: int) -> None:
        """Record that ``job_uid`` of ``queue`` holds ``gpus`` of ``key`` (replacing any
        earlier amount of that key; a different queue moves the whole job). ``gpus`` >= 0,
        else ValueError."""
        self.charge_demand(job_uid, queue, {key: gpus})

    def charge_demand(self, job_uid: str, queue: str, demand: Mapping[str, int]) -> None:
        """``charge`` every key of ``demand`` (see :func:`demand_of`); an empty ``demand``
        changes nothing. ValueError (and nothing charged) for a negative amount."""
        for key, gpus in demand.items():
            if gpus < 0:
                raise ValueError(f"gpus: {gpus} of {key} is negative")
        if not demand:
            return
        if self._base is not None:
            self._charge(job_uid, queue, demand, _NONE)
        else:
            with self._lock:
                self._charge(job_uid, queue, demand, self._live_forks())

    def release(self, job_uid: str) -> None:
        """Forget ``job_uid`` (no-op when unknown)."""
        if self._base is not None:
            self._release(job_uid, _NONE)
        else:
            with self._lock:
                self._release(job_uid, self._live_forks())

    def _charge(
        self, job_uid: str, queue: str, demand: Mapping[str, int], forks: list[QuotaUsage]
    ) -> None:
        prev = self._entry(job_uid)
        if prev is not None and prev[0] != queue:
            self._release(job_uid, forks)
            prev = None
        if prev is None:
            amounts: dict[str, int] = {}
            self._count += 1
        else:
            amounts = dict(prev[1])
        for f in forks:
            f._jobs.setdefault(job_uid, prev)
        for key, gpus in demand.items():
            self._add(queue, key, gpus - amounts.get(key, 0), forks)
            amounts[key] = gpus
        self._jobs[job_uid] = (queue, amounts)

    def _release(self, job_uid: str, forks: list[QuotaUsage]) -> None:
        prev = self._entry(job_uid)
        if prev is None:
            return
        for f in forks:
            f._jobs.setdefault(job_uid, prev)
        if self._base is not None:
            self._jobs[job_uid] = None  # never a pop: the base may charge it meanwhile
        else:
            del self._jobs[job_uid]
        self._count -= 1
        for key, amount in prev[1].items():
            self._add(prev[0], key, -amount, forks)

    def _add(self, queue: str, key: str, delta: int, forks: list[QuotaUsage]) -> None:
        if not delta:
            return
        self.version += 1
        base = self._base
        if base is not None:  # a fork: its own copy of the queue, changed in place
            under = base._own.get(queue)
            own = self._own.get(queue)
            if own is None:
                own = self._own.setdefault(queue, dict(under or {}))
        elif forks:  # a base with forks: a new dict (they may be reading the old one)
            old = self._own.get(queue)
            for f in forks:
                f._own.setdefault(queue, dict(old or {}))
            own = self._own[queue] = dict(old or {})
        else:  # no fork reads this base (none can be taken while it changes: the lock)
            own = self._own.get(queue)
            if own is None:
                own = self._own[queue] = {}
        left = own.get(key, 0) + delta
        if left:
            own[key] = left
        else:
            own.pop(key, None)

    def rebuild(self, jobs: Iterable[tuple[str, str, Mapping[str, int]]]) -> None:
        """Replace everything with ``(job_uid, queue, demand)`` rows (a uid twice: the last).
        A fork stops reading its base; a base's live forks first take a whole copy (O(jobs)
        each)."""
        with self._lock:
            for f in self._live_forks():
                for uid, entry in self._jobs.items():
                    f._jobs.setdefault(uid, entry)
                for queue, own in self._own.items():
                    f._own.setdefault(queue, dict(own))
                f._base = None
            self._forks = []
        base = self._base
        if base is not None:
            with base._lock:
                base._forks = [r for r in base._forks if r() not in (None, self)]
        self._base = None
        self._jobs = {}
        self._own = {}
        self._count = 0
        self.version += 1
        for uid, queue, demand in jobs:
            self.release(uid)
            self.charge_demand(uid, queue, demand)

    def _owns(self) -> list[tuple[str, dict[str, int]]]:
        """(queue, key -> amount) of every queue with an entry (a snapshot)."""
        base = self._base
        under = dict(base._own) if base is not None else {}  # the base first
        mine = dict(self._own)
        return [*mine.items(), *((q, own) for q, own in under.items() if q not in mine)]

    def keys(self) -> frozenset[str]:
        """Every concrete key some queue is charged for now."""
        if self._keys_at != self.version:
            self._keys = frozenset(k for _, own in self._owns() for k in own)
            self._keys_at = self.version
        return self._keys

    def holds(self, job_uid: str) -> bool:
        """True when ``job_uid`` is charged."""
        return self._entry(job_uid) is not None

    def entry(self, job_uid: str) -> tuple[str, Mapping[str, int]] | None:
        """(queue, key -> amount) ``job_uid`` is charged, read-only (no copy), or None."""
        return self._entry(job_uid)

    def charged(self, job_uid: str) -> tuple[str, dict[str, int]] | None:
        """(queue, key -> amount) ``job_uid`` is charged (a copy), or None."""
        prev = self._entry(job_uid)
        return (prev[0], dict(prev[1])) if prev is not None else None

    def queue_of_job(self, job_uid: str) -> str | None:
        """The queue ``job_uid`` is charged to (None when not charged)."""
        prev = self._entry(job_uid)
        return prev[0] if prev is not None else None

    def own(self, queue: str) -> Mapping[str, int]:
        """Concrete key -> amount charged by ``queue``'s own jobs (read-only)."""
        base = self._base
        under = base._own.get(queue) if base is not None else None  # the base first
        hit = self._own.get(queue)
        if hit is None:
            hit = under
        return hit if hit is not None else {}

    def queues(self) -> list[str]:
        """Every queue charged something now."""
        return [q for q, own in self._owns() if own]

    def rows(self) -> Iterator[tuple[str, str, Mapping[str, int]]]:
        """Every charged job as (job uid, queue, key -> amount) (read-only; O(jobs))."""
        base = self._base
        under = dict(base._jobs) if base is not None else {}  # the base first
        mine = dict(self._jobs)
        for uid, entry in mine.items():
            if entry is not None:
                yield uid, entry[0], entry[1]
        for uid, entry in under.items():
            if entry is not None and uid not in mine:
                yield uid, entry[0], entry[1]

    def jobs(self) -> int:
        """Jobs charged."""
        return self._count

    def subtree(self, tree: QueueTree, queue: str) -> dict[str, int]:
        """Concrete key -> amount charged by ``queue``, its descendants and the broken queues
        below it (``QueueTree.orphans``)."""
        out: dict[str, int] = {}
        stack = [queue]
        while stack:
            name = stack.pop()
            for owner in (name, *tree.orphans.get(name, ())):
                for key, amount in self.own(owner).items():
                    out[key] = out.get(key, 0) + amount
            node = tree.nodes.get(name)
            if node is not None:
                stack.extend(node.children)
        return out


#: Not in a fork's own entries (it reads its base).
_MISSING: Final = object()

#: No forks (never appended to).
_NONE: Final[list[QuotaUsage]] = []


def _from_rows(rows: list[tuple[str, str, dict[str, int]]]) -> QuotaUsage:
    out = QuotaUsage()
    out.rebuild(rows)
    return out


def demand_of(request: PlacementRequest, product: str | None) -> dict[str, int]:
    """Concrete key -> amount ``request`` charges when placed on GPU ``product``.

    Whole GPUs under ``product`` (``nvidia.com/gpu`` on a pool of that product), MIG resources
    under their resource names; a job with neither charges nothing.
    """
    out: dict[str, int] = {}
    for ps in request.pod_sets:
        for res, amount in ps.requests.items():
            if amount <= 0:
                continue
            if res == GPU_RESOURCE and product is not None:
                out[product] = out.get(product, 0) + amount * ps.count
            elif is_mig_resource(res):
                out[res] = out.get(res, 0) + amount * ps.count
    return out
