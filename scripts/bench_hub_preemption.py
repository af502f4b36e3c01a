#!/usr/bin/env python3
"""Hub preemption benchmark: one scheduling cycle that preempts, through a real leader term.

Usage::

    .venv/bin/python scripts/bench_hub_preemption.py [--members 4] [--nodes 64] [--high 8]

A leader term (``gpufed.hub.components.core.Controller``) over the typed fakes of the hub unit tests
(tests/unit/hub/term.py: etcd and the hub API in memory), ``--members`` members of ``--nodes``
8-GPU HGX nodes each, every node running one low-priority 8-GPU job (placed by the hub's own
cycles, then reported bound), then ``--high`` high-priority 8-GPU jobs arrive. Prints one JSON
line: the cycle that plans and commits their preemptions (``preempt_cycle_s``: planning, the
etcd transactions against the in-memory store, the Deletes queued), the planning alone
(``planning_s``, the hub's ``gpufed_preemption_planning_seconds``), and how many jobs were
preempted. The store answers at once: what etcd adds is one transaction per plan.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import structlog  # noqa: E402

from gpufed.api.stream import InventoryDelta  # noqa: E402
from gpufed.hub.adapters.ports import WatchEvent  # noqa: E402
from tests.unit.hub.builders import batch_job, gpujob_obj, hgx_node  # noqa: E402
from tests.unit.hub.term import Term, settle  # noqa: E402
from tests.unit.hub.test_priorities import priorityclass  # noqa: E402


def submit(t: Term, uid: str, cls: str) -> None:
    obj: dict[str, Any] = gpujob_obj(uid, uid, template=batch_job(8))
    obj["spec"]["placement"] = {"priorityClassName": cls}
    t.kube.objects["gpujobs"].append(obj)
    t.ctrl.intake.on_job_event(WatchEvent("ADDED", obj))


async def bench(members: int, nodes: int, high: int) -> dict[str, Any]:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    t = Term()
    t.ctrl.priorities.listed([priorityclass("low", 100), priorityclass("high", 1000)])
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
    for h in range(high):
        submit(t, f"h{h}", "high")
    await settle()
    t0 = time.perf_counter()
    await t.ctrl.scheduler.cycle()
    cycle_s = time.perf_counter() - t0
    planning = t.ctrl.metrics.preemption_planning_seconds
    planning_s = sum(s.value for s in planning.collect()[0].samples if s.name.endswith("_sum"))
    preempted = sum(1 for r, _ in t.store.jobs.values() if r.stopping is not None)
    return {
        "members": members,
        "nodes_per_member": nodes,
        "running_jobs": members * nodes,
        "preemptors": high,
        "preempted": preempted,
        "holds": sum(1 for u in t.store.reservations if u.startswith("h")),
        "preempt_cycle_s": round(cycle_s, 4),
        "planning_s": round(planning_s, 4),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--members", type=int, default=4)
    ap.add_argument("--nodes", type=int, default=64)
    ap.add_argument("--high", type=int, default=8)
    a = ap.parse_args()
    print(json.dumps(asyncio.run(bench(a.members, a.nodes, a.high))))


if __name__ == "__main__":
    main()
