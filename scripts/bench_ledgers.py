#!/usr/bin/env python3
"""CPU cost of one scheduling cycle's queue ledgers on the hub (``Queues.rebuild_usage``
after :meth:`JobCharges.update <gpufed.hub.components.usage.JobCharges.update>`), before and
after the ledgers were kept by the charges that changed (docs/benchmarks.md, "Queue ledgers
kept by the changed charges").

Usage::

    nice -n 19 .venv/bin/python scripts/bench_ledgers.py [--jobs 10000 50000 100000]
        [--changed 0 10 100] [--repeat 7]

Each running job charges one of 40 queues 1-8 GPUs of one of two products; 1 % are victims
being stopped for one of 8 waiting preemptors, whose holds are charged too. Per cycle,
``--changed`` jobs change their charge (a third end, a third are placed, a third change
amount or become a victim). Two ways, alternated within each repeat, process CPU time:

- ``before_ms``: the old ``Queues._build_ledgers`` (two ``QuotaUsage.rebuild`` over every
  charge and the holds), replayed here from the old code, on the old ``QuotaUsage`` (read
  with ``git show`` from ``--before-rev``, default the commit before this work).
- ``after_ms``: :meth:`QueueLedgers.apply <gpufed.hub.components.usage.QueueLedgers.apply>`
  of the changed charges and :meth:`~gpufed.hub.components.usage.QueueLedgers.views`.

Besides, once per size: ``charges_ms``: the incremental :meth:`JobCharges.update` itself
with ``--changed`` jobs marked touched (fake jobs, no recount, median of 5), and
``charges_every_ms`` with every job marked (what each update read before the charges followed
only the touched jobs, stop 39), and
``recount_ms``: :meth:`QueueLedgers.recount` (the check every 30 s); ``copy_before_ms`` /
``copy_after_ms``: one ``copy.deepcopy`` of the planning ledger (preemption planning takes one
per cycle and one per what-if's admission check), old ledger / a fork. Prints one JSON line per
(jobs, changed), medians of ``--repeat``, and ``ratio`` = before / after.
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpufed.hub.components.metrics import HubMetrics  # noqa: E402
from gpufed.hub.components.usage import Charge, Hold, JobCharges, QueueLedgers  # noqa: E402
from gpufed.placement.quota import QuotaUsage  # noqa: E402

#: the commit whose ``placement/quotausage.py`` is the "before" ledger
BEFORE_REV = "7f4aeb0"

PRODUCTS = ("NVIDIA-H100-80GB-HBM3", "NVIDIA-GB200")
QUEUES = tuple(f"team-{i}" for i in range(40))
PREEMPTORS = tuple(f"p{i}" for i in range(8))


def _charge(rng: random.Random, victim: bool) -> Charge:
    by = rng.choice(PREEMPTORS) if victim else None
    return (rng.choice(QUEUES), {rng.choice(PRODUCTS): rng.choice((1, 2, 4, 8))}, by)


def old_ledger(rev: str) -> Any:
    """The ``QuotaUsage`` class of ``placement/quotausage.py`` at commit ``rev``."""
    source = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{rev}:placement/quotausage.py"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    module = ModuleType("old_quotausage")
    sys.modules[module.__name__] = module
    exec(compile(source, f"{rev}:placement/quotausage.py", "exec"), module.__dict__)
    return module.QuotaUsage


def old_build(
    ledger: Any, charges: Mapping[str, Charge], holds: Sequence[Hold]
) -> tuple[QuotaUsage, ...]:
    """The old ``Queues._build_ledgers`` (holds already resolved to their queue and demand)."""
    stopping_for: dict[str, Counter[str]] = {}
    rows: list[tuple[str, str, Mapping[str, int]]] = []
    running: list[tuple[str, str, Mapping[str, int]]] = []
    for uid, (queue, charged, by) in charges.items():
        rows.append((uid, queue, charged))
        if by is not None:
            stopping_for.setdefault(by, Counter()).update(charged)
        else:
            running.append((uid, queue, charged))
    held: list[tuple[str, str, Mapping[str, int]]] = []
    full_holds: list[tuple[str, str, Mapping[str, int]]] = []
    for uid, queue, full in holds:
        if full:
            full_holds.append((uid, queue, full))
        still = stopping_for.get(uid, Counter())
        if demand := {k: v - still[k] for k, v in full.items() if v - still[k] > 0}:
            held.append((uid, queue, demand))
    usage = ledger()
    usage.rebuild(held + rows)
    planning = ledger()
    planning.rebuild(full_holds + running)
    return usage, planning


def _changes(
    charges: dict[str, Charge], k: int, rng: random.Random, serial: list[int]
) -> dict[str, Charge | None]:
    uids = rng.sample(sorted(charges), k) if k else []
    out: dict[str, Charge | None] = {}
    for i, uid in enumerate(uids):
        if i % 3 == 0:
            out[uid] = None  # finished
        elif i % 3 == 1:
            serial[0] += 1
            out[f"new{serial[0]}"] = _charge(rng, victim=False)  # placed
        else:
            out[uid] = _charge(rng, victim=rng.random() < 0.5)  # changed or stopping
    for uid, c in out.items():
        if c is None:
            charges.pop(uid, None)
        else:
            charges[uid] = c
    return out


def _charges_update_ms(charges: Mapping[str, Charge], touched: int) -> float:
    """One incremental JobCharges.update over fake jobs that charge ``charges``, ``touched`` of
    them marked touched (``HubState.touched``) before each."""
    jobs = {}
    for uid, (queue, charged, by) in charges.items():
        stopping = SimpleNamespace(by_uid=by) if by else None
        record = SimpleNamespace(cluster="m", queue=queue, charged=charged, stopping=stopping)
        jobs[uid] = SimpleNamespace(uid=uid, record=record, terminal=False, request=None)
    clock = [0.0]
    marks: set[str] = set()
    term: Any = SimpleNamespace(
        state=SimpleNamespace(jobs=jobs, touched=marks),
        metrics=HubMetrics(),
        mono=lambda: clock[0],
    )
    jc = JobCharges(term, list, lambda j: "default")
    jc.update()  # the term's first (full) count
    spent = []
    uids = list(jobs)
    for i in range(5):
        clock[0] = 1.0 + i
        marks.update(uids[i * touched : (i + 1) * touched] if touched < len(uids) else uids)
        t0 = time.process_time()
        jc.update()
        spent.append((time.process_time() - t0) * 1000)
    return statistics.median(spent)


def bench(n: int, changed: int, repeat: int, seed: int, ledger_old: Any) -> dict[str, Any]:
    rng = random.Random(seed)
    charges = {f"u{i}": _charge(rng, victim=rng.random() < 0.01) for i in range(n)}
    holds: list[Hold] = [(p, rng.choice(QUEUES), {PRODUCTS[0]: 64}) for p in PREEMPTORS]
    ledgers = QueueLedgers()
    ledgers.apply(charges)
    serial = [0]
    before: list[float] = []
    after: list[float] = []
    for r in range(repeat):
        change = _changes(charges, changed, rng, serial)
        for way in (0, 1) if r % 2 == 0 else (1, 0):
            t0 = time.process_time()
            if way == 0:
                built = old_build(ledger_old, charges, holds)
            else:
                ledgers.apply(change)
                new = ledgers.views(holds)
            (before if way == 0 else after).append((time.process_time() - t0) * 1000)
        for a, b in zip(built, new, strict=True):  # the same ledgers both ways
            assert all(dict(a.own(q)) == dict(b.own(q)) for q in QUEUES)
            assert a.jobs() == b.jobs()
    copies: tuple[list[float], list[float]] = ([], [])
    for _ in range(3):
        for way, ledger in enumerate((built[1], new[1])):
            t0 = time.process_time()
            copy.deepcopy(ledger)
            copies[way].append((time.process_time() - t0) * 1000)
    t0 = time.process_time()
    assert ledgers.recount(charges) == 0
    recount_ms = (time.process_time() - t0) * 1000
    b, a = statistics.median(before), statistics.median(after)
    return {
        "jobs": n,
        "changed": changed,
        "holds": len(holds),
        "before_ms": round(b, 3),
        "after_ms": round(a, 4),
        "ratio": round(b / a, 1) if a else None,
        "charges_ms": round(_charges_update_ms(charges, changed), 3),
        "charges_every_ms": round(_charges_update_ms(charges, n), 2),
        "recount_ms": round(recount_ms, 1),
        "copy_before_ms": round(statistics.median(copies[0]), 2),
        "copy_after_ms": round(statistics.median(copies[1]), 4),
        "repeat": repeat,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, nargs="+", default=[10_000, 50_000, 100_000])
    ap.add_argument("--changed", type=int, nargs="+", default=[0, 10, 100])
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--before-rev", default=BEFORE_REV)
    args = ap.parse_args()
    ledger_old = old_ledger(args.before_rev)
    for n in args.jobs:
        for k in args.changed:
            print(json.dumps(bench(n, k, args.repeat, args.seed, ledger_old)), flush=True)


if __name__ == "__main__":
    main()
