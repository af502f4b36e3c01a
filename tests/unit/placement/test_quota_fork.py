"""Forks of the quota ledger (``QuotaUsage.fork``, ``copy.deepcopy``) are independent ledgers.

A Hypothesis state machine keeps a base ledger and forks of it (and forks of forks, and deep
copies), charges, releases and rebuilds any of them in random order, and drops forks. Each
ledger has a model here: a plain dict job -> (queue, amounts), from which every answer the
ledger gives (per-queue sums, the keys charged, the jobs, each job's charge) is recomputed by
brute force after every step. A change to the base must never show in a fork taken before it,
nor a fork's change in the base or another fork.
"""

from __future__ import annotations

import copy
import pickle
import random
import sys
import threading
from collections import Counter
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from gpufed.placement.quota import QuotaUsage

UIDS = st.sampled_from([f"u{i}" for i in range(6)])
QUEUES = st.sampled_from(["a", "b", "c"])
KEYS = st.sampled_from(["H100", "A100", "mig-1g"])
AMOUNTS = st.integers(0, 8)

Model = dict[str, tuple[str, dict[str, int]]]


def model_charge(m: Model, uid: str, queue: str, demand: dict[str, int]) -> None:
    """The ledger's rule, written plainly: a new queue replaces the job, keys are replaced."""
    if not demand:
        return
    prev = m.get(uid)
    amounts = dict(prev[1]) if prev is not None and prev[0] == queue else {}
    amounts.update(demand)
    m[uid] = (queue, amounts)


def check(ledger: QuotaUsage, m: Model) -> None:
    own: dict[str, Counter[str]] = {}
    for queue, amounts in m.values():
        own.setdefault(queue, Counter()).update(amounts)
    for queue in ("a", "b", "c"):
        assert dict(ledger.own(queue)) == dict(+own.get(queue, Counter())), queue
    assert sorted(ledger.queues()) == sorted(q for q, c in own.items() if +c)
    assert ledger.keys() == frozenset(k for c in own.values() for k, v in c.items() if v)
    assert ledger.jobs() == len(m)
    assert {u: (q, dict(a)) for u, q, a in ledger.rows()} == m
    for uid in (f"u{i}" for i in range(6)):
        assert ledger.holds(uid) == (uid in m)
        assert ledger.charged(uid) == m.get(uid)
        assert ledger.queue_of_job(uid) == (m[uid][0] if uid in m else None)


class Forks(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.ledgers: list[tuple[QuotaUsage, Model]] = [(QuotaUsage(), {})]

    def pick(self, i: int) -> tuple[QuotaUsage, Model]:
        return self.ledgers[i % len(self.ledgers)]

    @rule(i=st.integers(0, 20), uid=UIDS, queue=QUEUES, demand=st.dictionaries(KEYS, AMOUNTS))
    def charge(self, i: int, uid: str, queue: str, demand: dict[str, int]) -> None:
        ledger, m = self.pick(i)
        ledger.charge_demand(uid, queue, demand)
        model_charge(m, uid, queue, demand)

    @rule(i=st.integers(0, 20), uid=UIDS)
    def release(self, i: int, uid: str) -> None:
        ledger, m = self.pick(i)
        ledger.release(uid)
        m.pop(uid, None)

    @rule(i=st.integers(0, 20), deep=st.booleans())
    def fork(self, i: int, deep: bool) -> None:
        ledger, m = self.pick(i)
        other = copy.deepcopy(ledger) if deep else ledger.fork()
        self.ledgers.append((other, {u: (q, dict(a)) for u, (q, a) in m.items()}))

    @precondition(lambda self: len(self.ledgers) > 1)
    @rule(i=st.integers(0, 20))
    def drop(self, i: int) -> None:
        del self.ledgers[i % len(self.ledgers)]

    @rule(
        i=st.integers(0, 20),
        rows=st.lists(st.tuples(UIDS, QUEUES, st.dictionaries(KEYS, AMOUNTS)), max_size=5),
    )
    def rebuild(self, i: int, rows: list[tuple[str, str, dict[str, int]]]) -> None:
        ledger, m = self.pick(i)
        ledger.rebuild(rows)
        m.clear()
        for uid, queue, demand in rows:
            m.pop(uid, None)
            model_charge(m, uid, queue, demand)

    @invariant()
    def every_ledger_equals_its_model(self) -> None:
        for ledger, m in self.ledgers:
            check(ledger, m)


TestForks = Forks.TestCase
TestForks.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


def test_a_fork_costs_what_changed_not_the_jobs() -> None:
    """Taking a fork copies nothing of the base; a fork's change copies one job and one queue."""
    base = QuotaUsage()
    for i in range(1000):
        base.charge(f"u{i}", "a", "H100", 1)
    f = base.fork()
    assert not f._jobs
    assert not f._own
    f.charge("new", "a", "H100", 8)
    assert len(f._jobs) == 1
    assert list(f._own) == ["a"]
    assert base.own("a") == {"H100": 1000}
    assert f.own("a") == {"H100": 1008}
    base.release("u0")
    assert base.own("a") == {"H100": 999}
    assert f.own("a") == {"H100": 1008}
    assert f.holds("u0")
    assert not base.holds("u0")


def test_a_ledger_pickles_whole() -> None:
    base = QuotaUsage()
    base.charge("u1", "a", "H100", 4)
    f = base.fork()
    f.charge("u2", "b", "A100", 2)
    back = pickle.loads(pickle.dumps(f))
    assert not back.is_fork
    assert {u: (q, dict(a)) for u, q, a in back.rows()} == {
        "u1": ("a", {"H100": 4}),
        "u2": ("b", {"A100": 2}),
    }


def test_a_negative_amount_charges_nothing() -> None:
    u = QuotaUsage()
    with pytest.raises(ValueError, match="negative"):
        u.charge_demand("u1", "a", {"H100": 2, "A100": -1})
    assert u.jobs() == 0
    assert not u.own("a")


def test_forks_read_a_still_ledger_while_another_thread_changes_the_base() -> None:
    """The hub's preemption planning forks and reads the planning ledger in a worker thread
    while the event loop changes the base: every fork must read one ledger as it was, the
    same at every read (the sums of its queues equal the sum of its jobs), whatever the
    interleaving (switching threads every microsecond)."""
    base = QuotaUsage()
    for i in range(50):
        base.charge(f"u{i}", "abc"[i % 3], "H100", 1 + i % 4)
    errors: list[BaseException] = []
    stop = threading.Event()

    def snapshot(ledger: QuotaUsage) -> tuple[Any, ...]:
        rows = {u: (q, dict(a)) for u, q, a in ledger.rows()}
        own = {q: dict(ledger.own(q)) for q in "abc"}
        per_job = [ledger.entry(u) for u in sorted(rows)]
        return rows, own, per_job, ledger.jobs(), ledger.keys()

    def consistent(snap: tuple[Any, ...]) -> None:
        rows, own, _, jobs, _ = snap
        sums: dict[str, Counter[str]] = {}
        for queue, amounts in rows.values():
            sums.setdefault(queue, Counter()).update(amounts)
        assert {q: dict(+sums.get(q, Counter())) for q in "abc"} == own
        assert jobs == len(rows)

    def reader() -> None:
        try:
            while not stop.is_set():
                f = base.fork()
                first = snapshot(f)
                consistent(first)
                g = copy.deepcopy(f)
                g.release("u1")
                g.charge("mine", "a", "H100", 3)
                assert snapshot(f) == first
                consistent(snapshot(g))
                assert snapshot(copy.deepcopy(g)) == snapshot(g)
        except BaseException as exc:  # reported on the main thread
            errors.append(exc)
            stop.set()

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        t = threading.Thread(target=reader)
        t.start()
        rng = random.Random(7)
        for _ in range(3000):
            if stop.is_set():
                break
            uid = f"u{rng.randrange(60)}"
            if rng.random() < 0.2:
                base.release(uid)
            else:
                base.charge_demand(
                    uid, rng.choice("abc"), {rng.choice(("H100", "A100")): rng.randint(0, 8)}
                )
        stop.set()
        t.join()
    finally:
        sys.setswitchinterval(old)
    assert not errors, errors[0]
