"""The block floors let a decision read few blocks and still try the blocks a full scan tries.

:func:`~gpufed.placement.victimblocks.block_floor` bounds a block's estimate from the
:class:`~gpufed.placement.runindex.Floor` the index keeps per block and per pool (widened as
jobs are filed, loose once they leave); a decision reads blocks in floor order and stops at the
``max_blocks``-th cheapest estimate found. Over random busy fleets (test_estimatebook's: HGX
nodes and NVLink cliques, mixed priorities, queues, checkpoints reported or by interval, past
preemptions; with and without quotas), one index kept across several cycles whose clock moves
on, with jobs ending, starting again later (a new start, a checkpoint reported since, another
priority or size of GPUs freed) and coming back between the cycles, and several preemptors per
cycle (the estimate book on):

* the cheapest blocks each decision tries equal those of the independent brute force of
  test_estimatebook (every running job of the member filed by block with ``file_blocks``, no
  index, no floor, no book; each block's greedy estimate; the ``max_blocks`` first);
* every answer equals that of the same cycle on an index built afresh with the floors off
  (``Bound.beyond`` never true: every block the priority bound keeps is read, as before).
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any
from unittest import mock

from hypothesis import event, given
from hypothesis import strategies as st
from placement_builders import GB200, H100, job, member
from preemption_builders import busy_node
from quota_builders import org_with_two_teams
from test_estimatebook import (
    NOW,
    POLICY,
    SETTINGS,
    _fill,
    _same,
    _usage,
    brute_cheapest,
    busy_fleets,
    shapes,
)

from gpufed.placement import FleetSnapshot
from gpufed.placement import victims as victims_mod
from gpufed.placement.preemptcycle import PreemptionCycle
from gpufed.placement.preemption import (
    PreemptionEvent,
    PreemptionPlan,
    PreemptionRules,
    Preemptor,
    QuotaView,
    Running,
)
from gpufed.placement.runindex import RunningIndex
from gpufed.placement.victimblocks import Bound, Estimate

#: a change between two cycles: (pick, what) -- what: "end" (leaves the index), "back" (an
#: ended job comes back as it was), "restart" (an ended or running job starts again: a later
#: start, maybe another priority, a checkpoint since or its interval dropped)
changes = st.lists(
    st.tuples(
        st.integers(0, 10_000),
        st.sampled_from(["end", "back", "restart"]),
        st.integers(0, 3),
        st.sampled_from([None, "now", "interval"]),
    ),
    max_size=4,
)
#: a cycle: seconds since the last one, its changes, then its preemptors (which shape, a past
#: preemption or not)
cycles = st.lists(
    st.tuples(
        st.sampled_from([0.0, 5.0, 60.0, 3600.0]),
        changes,
        st.lists(
            st.tuples(st.integers(0, 2), st.integers(0, 5).map(lambda x: x == 0)),
            min_size=1,
            max_size=3,
        ),
    ),
    min_size=2,
    max_size=4,
)


@st.composite
def packed_fleets(draw: Any) -> tuple[FleetSnapshot, list[Running]]:
    """Members full of jobs (a preemptor must preempt): 1-6 HGX nodes, 0-1 GB200 clique."""
    members, runs = [], []
    for m in range(draw(st.integers(1, 3))):
        name = f"m{m}"
        nodes = [
            _fill(draw, name, f"{name}-n{i}", 8, runs, full=True, product=H100)
            for i in range(draw(st.integers(1, 6)))
        ]
        if draw(st.booleans()):
            kw = {"product": GB200, "clique": f"{name}-fab.0"}
            nodes += [
                _fill(draw, name, f"{name}-c0-t{t}", 4, runs, full=True, **kw) for t in range(4)
            ]
        members.append(member(name, nodes))
    return FleetSnapshot(members), runs


@st.composite
def tied_fleets(draw: Any) -> tuple[FleetSnapshot, list[Running]]:
    """The hub's worst case, and its near misses: HGX members whose nodes each hold jobs of one
    size, of one or two priorities and starts, so most estimates tie but the member and UID."""
    members, runs = [], []
    for m in range(draw(st.integers(1, 3))):
        name, size = f"m{m}", draw(st.sampled_from([4, 8]))
        nodes = []
        for i in range(draw(st.integers(2, 8))):
            n, jobs = f"{name}-n{i}", []
            for j in range(8 // size):
                uid = f"j{draw(st.integers(0, 99)):02d}-{n}-{j}"  # UIDs in no node order
                jobs.append((uid, size))
                start = draw(st.sampled_from([1000.0, 1000.0, NOW - 100]))
                runs.append(
                    Running(
                        uid=uid,
                        job=f"ns/{uid}",
                        cluster=name,
                        priority=draw(st.sampled_from([0, 0, 1])),
                        gpus={n: size},
                        started_at=start,
                        last_checkpoint=draw(st.sampled_from([None, None, NOW - 30])),
                    )
                )
            nodes.append(busy_node(n, jobs, product=H100))
        members.append(member(name, nodes))
    # filed in any order: a block's first job need not hold its least UID
    return FleetSnapshot(members), draw(st.permutations(runs))


def _change(live: list[Running], ended: list[Running], change: Any, now: float) -> str:
    """Apply one change to the lists of running and ended jobs; what it did."""
    pick, what, prio, since = change
    if what == "end" and live:
        ended.append(live.pop(pick % len(live)))
        return "end"
    if what == "back" and ended:
        live.append(ended.pop(pick % len(ended)))
        return "back"
    if what == "restart" and (live or ended):
        pool = ended if ended else live
        old = pool.pop(pick % len(pool))
        new = dataclasses.replace(
            old,
            priority=prio,
            started_at=now - 10 * pick % 400,
            last_checkpoint=now - 2 if since == "now" else old.last_checkpoint,
            checkpoint_interval_s=None if since == "interval" else old.checkpoint_interval_s,
        )
        live.append(new)
        return "restart"
    return "none"


def _sync(index: RunningIndex, live: list[Running], was: dict[str, Running]) -> None:
    """Bring ``index`` from the jobs ``was`` to ``live`` by removes and adds (as the hub's
    RunningJobs does)."""
    now = {r.uid: r for r in live}
    for uid, r in was.items():
        if now.get(uid) is not r:
            index.remove(uid, r.cluster)
    for uid, r in now.items():
        if was.get(uid) is not r:
            index.add(r)


@SETTINGS
@given(
    st.one_of(busy_fleets(), packed_fleets(), tied_fleets()),
    shapes,
    cycles,
    st.booleans(),
    st.integers(1, 3),
)
def test_floors_try_the_blocks_a_full_scan_tries_across_cycles(
    built: tuple[FleetSnapshot, list[Running]],
    kinds: list[Any],
    todo: list[Any],
    queues: bool,
    max_blocks: int,
) -> None:
    snap, runs = built
    rules = PreemptionRules(max_blocks=max_blocks, min_runtime_s=60.0)
    tree = org_with_two_teams(nominal=8) if queues else None
    index = RunningIndex(snap, runs)  # kept across the cycles, as the hub keeps it
    live, ended = list(runs), []
    now = NOW
    tried: list[list[Estimate]] = []
    real = victims_mod.cheapest
    real_beyond = Bound.beyond

    def spy(rows: list[Estimate], k: int) -> list[Estimate]:
        got = real(rows, k)
        tried.append(got)
        return got

    for n, (dt, moves, preemptors) in enumerate(todo):
        now += dt
        was = {r.uid: r for r in live}
        for change in moves:
            event(f"change: {_change(live, ended, change, now)}")
        _sync(index, live, was)
        quota = QuotaView(tree, _usage(live)) if tree is not None else None
        kept = PreemptionCycle(snap, POLICY, now, index, rules=rules, quota=quota)
        full = PreemptionCycle(snap, POLICY, now, list(live), rules=rules, quota=quota)
        full.book = None  # type: ignore[assignment]  # every preemptor scans every block
        for i, (which, past) in enumerate(preemptors):
            (g, pods), nvl, prio, queue = kinds[which % len(kinds)]
            req = job(f"p{n}-{i}", gpus=g, pods=pods, nvlink=nvl, priority=prio).model_copy(
                update={"queue": queue if queues else None}
            )
            hist = (PreemptionEvent(now - 30, live[0].uid),) if past and live else ()
            p = Preemptor(req, preempted=hist)
            gone = list(kept._gone)
            placed = [q.decision for q in kept.plans]
            ledger = copy.deepcopy(kept.quota) if kept.quota is not None else None
            tried.clear()
            skipped: list[bool] = []

            def beyond(self: Bound, floor: Any, skipped: list[bool] = skipped) -> bool:
                out = real_beyond(self, floor)
                skipped.append(out)
                return out

            with (
                mock.patch.object(victims_mod, "cheapest", spy),
                mock.patch.object(Bound, "beyond", beyond),
            ):
                a = kept.plan(p)
            event(f"a floor passed blocks over: {any(skipped)}")
            with mock.patch.object(Bound, "beyond", return_value=False):
                b = full.plan(p)
            _same(a, b)
            event("plan" if isinstance(a, PreemptionPlan) else f"no plan: {a.reason[:25]}")
            if tried:
                want = brute_cheapest(p, snap, live, rules, ledger, gone, placed, now)
                assert [e.key() for e in tried[0]] == want
        assert kept.victims == full.victims
        # the victims end, as the hub's next cycle would see them
        for uid in kept.victims:
            r = next(x for x in live if x.uid == uid)
            live.remove(r)
            index.remove(uid, r.cluster)
            ended.append(r)
