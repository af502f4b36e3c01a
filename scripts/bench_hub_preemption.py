#!/usr/bin/env python3
"""Hub preemption benchmark: one scheduling cycle that preempts, through a real leader term.

Usage::

    .venv/bin/python scripts/bench_hub_preemption.py [--members 4] [--nodes 64] [--high 8]
        [--gc freeze|default] [--deadline-s 2.0] [--lease-s 15] [--cold]

A leader term (``gpufed.hub.components.core.Controller``) over the typed fakes of the hub unit tests
(tests/unit/hub/term.py: etcd and the hub API in memory), ``--members`` members of ``--nodes``
8-GPU HGX nodes each, every node running one low-priority 8-GPU job (placed by the hub's own
cycles, then reported bound), then, after 600 s on the term's clock (in which the hub's status loop
refreshed the queues and, where the hub keeps them, the running jobs preemption plans from:
``--cold`` leaves that out), ``--high`` high-priority 8-GPU jobs arrive. Prints one JSON
line: the cycle that plans and commits their preemptions (``preempt_cycle_s``: planning, the
etcd transactions against the in-memory store, the Deletes queued), the planning alone
(``planning_s``, the hub's ``gpufed_preemption_planning_seconds``), and how many jobs were
preempted. The store answers at once: what etcd adds is one transaction per plan.

Cycles run until every preemptor's plan is committed (at most ``--max-cycles``; a plan left
for the planning deadline is planned next cycle). While they run, the hub's loop-stall watch
(:mod:`gpufed.hub.edge.loopwatch`) and a lease-renewal ticker with the leader's rule
(:meth:`gpufed.hub.edge.leader.LeaderElector.hold`: a renewal every third of ``--lease-s``,
missed when its turn comes a whole interval late) run on the same event loop. Also printed:
``decision_p99_ms`` / ``decision_p50_ms`` (nearest rank; wall time from the start of the first
cycle that sees a preemptor eligible to its plan committed), ``preempted`` (victims marked),
``lease_renewals_missed``, ``loop_stall_max_ms`` (the longest the event loop was held, wall)
and ``loop_stall_cpu_max_ms`` (the part of a stall the loop thread was on the CPU: without
the time the process waited for a CPU on a loaded machine),
``cycles``, ``cycle_cpu_s`` (process CPU over the cycles) and the full garbage collections in
them (``gc_full``, ``gc_full_cpu_s``; ``gc_whole_walks``: those that walked the whole
heap). ``--gc freeze`` (the hub's default,
:mod:`gpufed.hub.edge.heap`) freezes what survives each full collection; ``--gc default``
leaves CPython's collector as it is (for a before/after).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import structlog  # noqa: E402

from gpufed.api.stream import InventoryDelta  # noqa: E402
from gpufed.hub.adapters.ports import WatchEvent  # noqa: E402
from gpufed.hub.components.config import HubConfig  # noqa: E402
from gpufed.hub.edge.heap import HeapPolicy  # noqa: E402
from gpufed.hub.edge.loopwatch import watch_loop  # noqa: E402
from tests.unit.hub.builders import batch_job, gpujob_obj, hgx_node  # noqa: E402
from tests.unit.hub.term import Term, settle  # noqa: E402
from tests.unit.hub.test_priorities import priorityclass  # noqa: E402


def submit(t: Term, uid: str, cls: str) -> None:
    obj: dict[str, Any] = gpujob_obj(uid, uid, template=batch_job(8))
    obj["spec"]["placement"] = {"priorityClassName": cls}
    t.kube.objects["gpujobs"].append(obj)
    t.ctrl.intake.on_job_event(WatchEvent("ADDED", obj))


def nearest_rank(values: list[float], q: float) -> float:
    """The ``q`` quantile of ``values`` by nearest rank (0 when empty)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


async def lease_ticker(lease_s: float, missed: list[float]) -> None:
    """The leader's renewal rule on this loop: a turn every third of the lease; one that comes
    a whole interval late is missed (appends how late, seconds)."""
    interval = lease_s / 3
    last = time.monotonic()
    while True:
        await asyncio.sleep(interval)
        now = time.monotonic()
        if now - last >= 2 * interval:
            missed.append(now - last - interval)
        last = now


async def bench(
    members: int,
    nodes: int,
    high: int,
    *,
    gc_mode: str = "freeze",
    deadline_s: float = 2.0,
    lease_s: float = 15.0,
    max_cycles: int = 20,
    warm: bool = True,
) -> dict[str, Any]:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    t = Term(config=HubConfig(insecure=True, preemption_deadline_s=deadline_s))
    heap = HeapPolicy(t.ctrl.metrics)  # with the metrics, as the hub installs it
    if gc_mode == "freeze":
        heap.install()
    t.ctrl.state.priorities.listed([priorityclass("low", 100), priorityclass("high", 1000)])
    for m in range(members):
        t.member(f"m{m}", *(hgx_node(f"m{m}-n{i}") for i in range(nodes)))
    for j in range(members * nodes):
        submit(t, f"l{j}", "low")
    await settle()
    await t.ctrl.scheduler.cycle()
    await settle()
    by_node: dict[tuple[str, str], str] = {}
    for uid, text in t.store.reservations.items():
        res = json.loads(text)
        [name] = res["nodes"]
        by_node[(res["cluster"], name)] = uid
    for m in range(members):
        ms = t.ctrl.state.members[f"m{m}"]
        ups = []
        for i in range(nodes):
            uid = by_node[(f"m{m}", f"m{m}-n{i}")]
            ups.append(hgx_node(f"m{m}-n{i}", requested=8, job_uid=uid))
        t.ctrl.members.on_delta(ms, InventoryDelta(seq=2, upserts=tuple(ups)))
    await settle()
    t.clock.advance(600)
    if warm:
        # what the hub's status loop did meanwhile: the queues' recount, and (where the hub
        # has it) the kept running jobs of preemption brought up to date
        t.ctrl.queues.refresh()
        refresh = getattr(t.ctrl.scheduler, "refresh_preemption", None)
        if refresh is not None:
            await refresh()
    for h in range(high):
        submit(t, f"h{h}", "high")
    await settle()
    committed: dict[str, float] = {}
    real_preempt = t.store.preempt

    async def preempt(hold_uid: str, *args: Any, **kw: Any) -> int:
        rev = await real_preempt(hold_uid, *args, **kw)
        committed[hold_uid] = time.perf_counter()
        return rev

    t.store.preempt = preempt  # type: ignore[method-assign]
    missed: list[float] = []
    metrics = t.ctrl.metrics
    watch = asyncio.create_task(watch_loop(metrics, interval_s=0.01))
    ticker = asyncio.create_task(lease_ticker(lease_s, missed))
    await asyncio.sleep(0)
    full0, full_s0, whole0 = heap.full_collections, heap.full_seconds, heap.whole_walks
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    first_cycle_s = 0.0
    cycles = 0
    while cycles < max_cycles and len(committed) < high:
        c0 = time.perf_counter()
        await t.ctrl.scheduler.cycle()
        await settle()
        cycles += 1
        if cycles == 1:
            first_cycle_s = time.perf_counter() - c0
        if len(committed) < high:
            await asyncio.sleep(0.05)  # the hub's next cycle
    cycle_cpu_s = time.process_time() - cpu0
    for task in (watch, ticker):
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    heap.uninstall()
    decisions = [(at - t0) * 1000 for at in committed.values()]
    planning = metrics.preemption_planning_seconds
    planning_s = sum(s.value for s in planning.collect()[0].samples if s.name.endswith("_sum"))
    preempted = sum(1 for r, _ in t.store.jobs.values() if r.stopping is not None)
    return {
        "members": members,
        "nodes_per_member": nodes,
        "running_jobs": members * nodes,
        "preemptors": high,
        "gc": gc_mode,
        "deadline_s": deadline_s,
        "warm": warm,
        "preempted": preempted,
        "holds": sum(1 for u in t.store.reservations if u.startswith("h")),
        "committed": len(committed),
        "decision_p50_ms": round(nearest_rank(decisions, 0.5), 1),
        "decision_p99_ms": round(nearest_rank(decisions, 0.99), 1),
        "lease_renewals_missed": len(missed),
        "loop_stall_max_ms": round(metrics.event_loop_stall_max._value.get() * 1000, 1),
        "loop_stall_cpu_max_ms": round(metrics.event_loop_stall_cpu_max._value.get() * 1000, 1),
        "cycles": cycles,
        "preempt_cycle_s": round(first_cycle_s, 4),
        "cycle_cpu_s": round(cycle_cpu_s, 3),
        "planning_s": round(planning_s, 4),
        "plans_missed": {
            r: metrics.preemption_plans_missed.labels(r)._value.get()
            for r in ("deadline", "raced", "stale")
        },
        "gc_full": heap.full_collections - full0,
        "gc_full_cpu_s": round(heap.full_seconds - full_s0, 3),
        "gc_whole_walks": heap.whole_walks - whole0,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--members", type=int, default=4)
    ap.add_argument("--nodes", type=int, default=64)
    ap.add_argument("--high", type=int, default=8)
    ap.add_argument("--gc", choices=("freeze", "default"), default="freeze")
    ap.add_argument("--deadline-s", type=float, default=2.0)
    ap.add_argument("--lease-s", type=float, default=15.0)
    ap.add_argument("--max-cycles", type=int, default=20)
    ap.add_argument(
        "--cold",
        action="store_true",
        help="no status-loop refresh before the preemptors arrive",
    )
    a = ap.parse_args()
    result = asyncio.run(
        bench(
            a.members,
            a.nodes,
            a.high,
            gc_mode=a.gc,
            deadline_s=a.deadline_s,
            lease_s=a.lease_s,
            max_cycles=a.max_cycles,
            warm=not a.cold,
        )
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
