"""Invariants of a simulated run, recomputed from its run intervals alone
(``gpufed simulate --check-invariants``; docs/placement.md, "Simulator").

Owns the *check*, not the rules: it reads the run intervals (:class:`~.simreport.RunInterval`,
what ``--intervals-out`` writes) and the GPUQueue objects (the pydantic models of
:mod:`gpufed.api.queue`), and recomputes from them, at every instant where usage changes, what
each queue holds. It deliberately does not import :mod:`.quota` or :mod:`.queuetree`: it
writes gpufed's cap model down a second time, from the documentation, so that a mistake in
the admission arithmetic shows up here instead of being repeated. Called by the CLI and tests.

**Tree.** ``spec.parent``, for *every* queue of the file: broken queues (a parent cycle, an
unknown parent, a namespace listed by two queues, a key listed twice) still charge what their
jobs run to their ancestors. The walk up stops at a queue already seen (a cycle) or a parent
not in the file; a queue whose parent is not in the file is checked as a root. A key listed
twice resolves to its first entry. An interval's queue that is not in the file (the default
queue, or '' without queues) charges nobody.

**Keys.** A run on product ``P`` charges key ``P`` (MIG runs their resource names). At queue
``n`` a key resolves to the entry listing it, else ``*`` (whole GPUs only, never MIG), else
none. With no entry, ``nominal(n)`` is the sum of its children's nominal for the key (a
grouping queue), 0 for a leaf that lists any quota, no limit for a leaf that lists none.

**Used** ``used(n)``: with an entry, the GPUs running in ``n``'s subtree (``n`` and every
descendant) charged to concrete keys that resolve at ``n`` to that entry; with none, ``n``'s
own running GPUs of the key plus ``used(c)`` of each child (the same pooling as its nominal).

**Cap** ``cap(n)``: ``nominal(n)`` at a root; ``nominal(n) + borrowingLimit(n)`` for a
non-root whose entry has a borrowing limit; no limit otherwise.

**Lending limits, at every level.** ``X(n) = Σ Y(c)`` over ``n``'s children, ``Y(c) =
max(X(c), nominal(c) - lendingLimit(c) - used(c), 0)`` when ``c``'s entry has a lending limit,
else ``X(c)``: what a subtree does not lend is usable only inside it, however deep. The
invariant at every queue with a cap whose subtree runs the key: ``used(n) + X(n) <= cap(n)``.

Also: at every instant, each member's running GPUs of a product at most its capacity (when
given), and no job with two runs at once (overlapping intervals; touching ones, an end and a
start at the same instant, are fine: intervals are half-open, ``[start, end)``, and all ends
and starts of an instant are applied before it is checked). Pure.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

from gpufed.api.labels import is_mig_resource
from gpufed.api.queue import ANY_GPU, GPUQueue, QueueQuota
from gpufed.placement.sim.simreport import RunInterval

__all__ = ["InvariantReport", "Violation", "check_intervals"]

#: Kinds of violation, as :attr:`Violation.kind` and the summary's keys.
KINDS = ("quota", "member", "overlap")


@dataclass(frozen=True, slots=True)
class Violation:
    """One broken invariant at ``time_s``.

    ``kind`` ``quota``: ``queue``'s ``key`` (the entry's key: ``*``, a product, a MIG
    resource) has ``used + reserved > cap`` (``reserved`` = ``X``, what queues under it keep
    unlent). ``member``: member ``queue`` runs ``used`` GPUs of product ``key``, above its
    capacity ``cap``. ``overlap``: job ``queue`` starts run ``used`` while run ``reserved`` is
    still going.
    """

    time_s: float
    kind: str
    queue: str
    key: str
    used: int
    reserved: int
    cap: int | None
    message: str


@dataclass(frozen=True)
class InvariantReport:
    """What :func:`check_intervals` found: every violation in time order, and what it read."""

    violations: tuple[Violation, ...]
    intervals: int
    instants: int
    by_kind: Mapping[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """True when nothing is violated."""
        return not self.violations

    def summary(self) -> dict[str, Any]:
        """Counts: ``violations``, per kind, intervals and instants checked, first time."""
        return {
            "violations": len(self.violations),
            **{k: self.by_kind.get(k, 0) for k in KINDS},
            "intervals": self.intervals,
            "instants": self.instants,
            "first_s": self.violations[0].time_s if self.violations else None,
        }


class _Tree:
    """The queues of the file with the cap model above, every queue kept (broken ones too)."""

    def __init__(self, queues: Sequence[GPUQueue]) -> None:
        self.specs = {q.metadata.name: q.spec for q in queues if q.metadata.name}
        self.children: dict[str, list[str]] = defaultdict(list)
        for name in sorted(self.specs):
            parent = self.specs[name].parent
            if parent is not None and parent in self.specs:
                self.children[parent].append(name)
        self._entry: dict[tuple[str, str], QueueQuota | None] = {}
        self._nominal: dict[tuple[str, str], int | None] = {}
        self.subtree = {n: self._below(n) for n in self.specs}
        # ancestors-first order fails on cycles; children before parents, each queue once
        self.bottom_up = self._bottom_up()

    def _below(self, name: str) -> tuple[str, ...]:
        out, stack, seen = [], [name], {name}
        while stack:
            n = stack.pop()
            out.append(n)
            for c in self.children.get(n, ()):
                if c not in seen:
                    seen.add(c)
                    stack.append(c)
        return tuple(out)

    def _bottom_up(self) -> list[str]:
        out: list[str] = []
        done: set[str] = set()
        for root in sorted(self.specs):
            stack: list[tuple[str, bool]] = [(root, False)]
            while stack:
                n, expanded = stack.pop()
                if expanded:
                    out.append(n)
                    continue
                if n in done:
                    continue
                done.add(n)
                stack.append((n, True))
                stack.extend((c, False) for c in self.children.get(n, ()) if c not in done)
        return out

    def is_root(self, name: str) -> bool:
        parent = self.specs[name].parent
        return parent is None or parent not in self.specs

    def entry(self, name: str, key: str) -> QueueQuota | None:
        hit = self._entry.get((name, key), False)
        if hit is False:
            quotas = self.specs[name].quotas
            hit = next((q for q in quotas if q.gpu_product == key), None)
            if hit is None and not is_mig_resource(key):
                hit = next((q for q in quotas if q.gpu_product == ANY_GPU), None)
            self._entry[(name, key)] = hit
        return hit  # type: ignore[return-value]

    def nominal(self, name: str, key: str) -> int | None:
        """None: no limit."""
        if (name, key) not in self._nominal:
            self._nominal[(name, key)] = self._nominal_of(name, key, frozenset())
        return self._nominal[(name, key)]

    def _nominal_of(self, name: str, key: str, seen: frozenset[str]) -> int | None:
        e = self.entry(name, key)
        if e is not None:
            return e.nominal
        kids = [c for c in self.children.get(name, ()) if c not in seen]
        if kids:
            total = 0
            for c in kids:
                n = self._nominal_of(c, key, seen | {name})
                if n is None:
                    return None
                total += n
            return total
        return 0 if self.specs[name].quotas else None

    def cap(self, name: str, key: str) -> int | None:
        if self.is_root(name):
            return self.nominal(name, key)
        e = self.entry(name, key)
        if e is None or e.borrowing_limit is None:
            return None
        return e.nominal + e.borrowing_limit


def _check_queues(tree: _Tree, own: Mapping[str, Mapping[str, int]], t: float) -> list[Violation]:
    """The quota invariant at one instant; ``own``: queue -> concrete key -> GPUs its own jobs
    run now."""
    out: list[Violation] = []
    keys = sorted({k for amounts in own.values() for k, a in amounts.items() if a > 0})
    for key in keys:
        used: dict[str, int] = {}
        x: dict[str, int] = {}
        for n in tree.bottom_up:
            e = tree.entry(n, key)
            if e is not None:
                used[n] = sum(
                    a
                    for q in tree.subtree[n]
                    for k, a in own.get(q, {}).items()
                    if tree.entry(n, k) is e
                )
            else:
                used[n] = own.get(n, {}).get(key, 0) + sum(
                    used.get(c, 0) for c in tree.children.get(n, ())
                )
            reserved = 0
            for c in tree.children.get(n, ()):
                ce = tree.entry(c, key)
                xc = x.get(c, 0)
                if ce is not None and ce.lending_limit is not None:
                    xc = max(xc, ce.nominal - ce.lending_limit - used.get(c, 0), 0)
                reserved += xc
            x[n] = reserved
            cap = tree.cap(n, key)
            if cap is None or used[n] <= 0 or used[n] + reserved <= cap:
                continue
            label = e.gpu_product if e is not None else key
            kept = f" + {reserved} its queues do not lend" if reserved else ""
            out.append(
                Violation(
                    t,
                    "quota",
                    n,
                    label,
                    used[n],
                    reserved,
                    cap,
                    f"queue {n} {label}: {used[n]} used{kept} > cap {cap}",
                )
            )
    # one row per queue and entry: concrete keys resolving to the same entry repeat it
    seen: set[tuple[str, str, int, int]] = set()
    unique = []
    for v in out:
        if (v.queue, v.key, v.used, v.reserved) not in seen:
            seen.add((v.queue, v.key, v.used, v.reserved))
            unique.append(v)
    return unique


def check_intervals(
    intervals: Iterable[RunInterval],
    queues: Sequence[GPUQueue] = (),
    capacity: Mapping[tuple[str, str], int] | None = None,
) -> InvariantReport:
    """Check one run's ``intervals`` against ``queues`` (the module doc's cap model) and, when
    given, ``capacity`` ((member, GPU product) -> whole GPUs). Cost: O(instants x keys x
    queues x subtree) for the quota check, O(intervals log intervals) for the rest."""
    rows = list(intervals)
    tree = _Tree(queues)
    violations: list[Violation] = []
    # 1. overlapping runs of one job (rows of one run share its interval)
    runs: dict[str, dict[int, tuple[float, float]]] = defaultdict(dict)
    for i in rows:
        runs[i.job_id].setdefault(i.run, (i.start_s, i.end_s))
    for job, by_run in sorted(runs.items()):
        ordered = sorted((s, e, n) for n, (s, e) in by_run.items())
        for (_, e0, n0), (s1, _, n1) in pairwise(ordered):
            if s1 < e0:
                violations.append(
                    Violation(
                        s1, "overlap", job, "", n1, n0, None,
                        f"job {job}: run {n1} starts at {s1} while run {n0} runs until {e0}",
                    )
                )  # fmt: skip
    # 2. sweep: every instant where usage changes, all its ends and starts applied first
    deltas: dict[float, list[tuple[RunInterval, int]]] = defaultdict(list)
    for i in rows:
        if i.start_s < i.end_s and i.gpus > 0:
            deltas[i.start_s].append((i, i.gpus))
            deltas[i.end_s].append((i, -i.gpus))
    own: dict[str, dict[str, int]] = defaultdict(dict)
    members: dict[tuple[str, str], int] = defaultdict(int)
    for t in sorted(deltas):
        touched: set[tuple[str, str]] = set()
        for i, d in deltas[t]:
            if i.queue in tree.specs:
                mine = own[i.queue]
                mine[i.gpu_product] = mine.get(i.gpu_product, 0) + d
            members[(i.member, i.gpu_product)] += d
            touched.add((i.member, i.gpu_product))
        if tree.specs:
            violations += _check_queues(tree, own, t)
        if capacity is not None:
            for m, key in sorted(touched):
                cap = capacity.get((m, key))
                if cap is not None and members[(m, key)] > cap:
                    violations.append(
                        Violation(
                            t, "member", m, key, members[(m, key)], 0, cap,
                            f"member {m} runs {members[(m, key)]} {key or 'GPUs'} > {cap}",
                        )
                    )  # fmt: skip
    violations.sort(key=lambda v: (v.time_s, KINDS.index(v.kind), v.queue, v.key))
    by_kind: dict[str, int] = {}
    for v in violations:
        by_kind[v.kind] = by_kind.get(v.kind, 0) + 1
    return InvariantReport(tuple(violations), len(rows), len(deltas), by_kind)
