"""Preemption planning off the event loop (gpufed.hub.components.preemption): the planning
deadline leaves the preemptors not yet planned to the next cycle, a plan the fleet outgrew
while it was made is not committed, a worker that met the fleet changing under it commits
nothing, and the event loop runs while a plan is being made."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

import pytest

from gpufed.hub.components import preemption as preemption_module
from gpufed.hub.components.config import HubConfig
from gpufed.placement.preemptcycle import PreemptionCycle
from tests.unit.hub.term import Term
from tests.unit.hub.test_preemption import full_member, node


class SteppingClock:
    """``time`` for the preemption module: ``perf_counter`` advances 1 s per call."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        self.now += 1.0
        return self.now


def missed(t: Term, reason: str) -> float:
    return t.ctrl.metrics.preemption_plans_missed.labels(reason)._value.get()


def preempted(t: Term) -> int:
    return sum(1 for r, _ in t.store.jobs.values() if r.stopping is not None)


async def two_preemptors(*, deadline_s: float) -> Term:
    """A full member and two 8-GPU high-priority jobs waiting to preempt, planning deadline
    ``deadline_s``."""
    f = await full_member(Term(config=HubConfig(insecure=True, preemption_deadline_s=deadline_s)))
    await f.submit("hi1", "uh1", 8, "high")
    await f.submit("hi2", "uh2", 8, "high")
    return f.t


async def test_a_preemptor_left_at_the_deadline_is_planned_in_the_next_cycle(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # each clock read is 1 s later, the deadline 0.5 s after the start: the first preemptor is
    # planned all the same (a worker that starts late still makes progress), the second not
    t = await two_preemptors(deadline_s=0.5)
    monkeypatch.setattr(preemption_module, "time", SteppingClock())
    t.ctrl.state.cycle_due.clear()
    await t.ctrl.scheduler.cycle()
    assert t.store.calls.count("preempt") == 1
    assert missed(t, "deadline") == 1
    assert t.ctrl.state.cycle_due.is_set(), "a cycle comes soon for the one left"
    [left] = [u for u in ("uh1", "uh2") if u not in t.store.reservations]
    assert "preempting nothing" not in t.ctrl.state.jobs[left].status.message
    await t.ctrl.scheduler.cycle()
    assert t.store.calls.count("preempt") == 2
    held = [set(json.loads(t.store.reservations[u])["nodes"]) for u in ("uh1", "uh2")]
    assert sorted(map(sorted, held)) == [["m1-n0"], ["m1-n1"]]
    assert preempted(t) == 4


class SettableClock:
    """``time`` for the preemption module: ``perf_counter`` reads ``now``, moved by the test."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


async def test_the_deadline_counts_planning_not_reading_the_running_jobs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # reading the running jobs takes 5 s of the fake clock, each plan 0.1 s, the deadline is
    # 0.5 s: both preemptors are planned in one cycle (the setup, paid once a cycle whatever
    # the deadline, is not planning); counted from before the setup, the second would wait
    t = await two_preemptors(deadline_s=0.5)
    clock = SettableClock()
    monkeypatch.setattr(preemption_module, "time", clock)
    read = preemption_module.Preemption.running
    real = PreemptionCycle.plan

    def running(self: preemption_module.Preemption) -> Any:
        clock.now += 5.0
        return read(self)

    def plan(self: PreemptionCycle, *args: Any, **kw: Any) -> Any:
        clock.now += 0.1
        return real(self, *args, **kw)

    monkeypatch.setattr(preemption_module.Preemption, "running", running)
    monkeypatch.setattr(PreemptionCycle, "plan", plan)
    t.ctrl.state.cycle_due.clear()
    await t.ctrl.scheduler.cycle()
    assert t.store.calls.count("preempt") == 2
    assert missed(t, "deadline") == 0
    assert preempted(t) == 4


async def test_a_plan_the_fleet_outgrew_while_it_was_made_is_not_committed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    f = await full_member(Term())
    t = f.t
    await f.submit("hi", "uh", 8, "high")
    real = PreemptionCycle.plan

    def plan(self: PreemptionCycle, *args: Any, **kw: Any) -> Any:
        answer = real(self, *args, **kw)
        # meanwhile, on the loop's side: both nodes are taken by two more 4-GPU jobs each
        # (reported by the member), so neither node frees 8 GPUs with the plan's victims
        f.report(
            node("m1-n0", **dict.fromkeys(f.n0, 4), x0=0),
            node("m1-n1", **dict.fromkeys(f.n1, 4), x1=0),
        )
        for n in ("m1-n0", "m1-n1"):
            t.ctrl.snapshot.cluster("m1").nodes[n].reserved = {"nvidia.com/gpu": 8}
        return answer

    monkeypatch.setattr(PreemptionCycle, "plan", plan)
    await t.ctrl.scheduler.cycle()
    assert t.store.calls.count("preempt") == 0, "nothing written for a stale plan"
    assert preempted(t) == 0
    assert missed(t, "stale") == 1
    assert "the fleet changed while the plan was made" in t.ctrl.state.jobs["uh"].status.message


async def test_a_worker_that_met_the_fleet_changing_commits_nothing_and_tries_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    f = await full_member(Term())
    t = f.t
    await f.submit("hi", "uh", 8, "high")
    real = PreemptionCycle.plan
    calls = {"n": 0}

    def plan(self: PreemptionCycle, *args: Any, **kw: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("dictionary changed size during iteration")
        return real(self, *args, **kw)

    monkeypatch.setattr(PreemptionCycle, "plan", plan)
    t.ctrl.state.cycle_due.clear()
    await t.ctrl.scheduler.cycle()
    assert t.store.calls.count("preempt") == 0
    assert missed(t, "raced") == 1
    assert t.ctrl.state.cycle_due.is_set()
    await t.ctrl.scheduler.cycle()
    assert t.store.calls.count("preempt") == 1
    assert preempted(t) == 2


async def test_the_event_loop_runs_while_a_plan_is_made(monkeypatch: pytest.MonkeyPatch) -> None:
    f = await full_member(Term())
    t = f.t
    await f.submit("hi", "uh", 8, "high")
    real = PreemptionCycle.plan
    ticks: list[float] = []
    planning = threading.Event()

    def plan(self: PreemptionCycle, *args: Any, **kw: Any) -> Any:
        assert threading.current_thread() is not threading.main_thread()
        planning.set()
        deadline = time.monotonic() + 5
        while len(ticks) < 3 and time.monotonic() < deadline:  # a long plan
            time.sleep(0.001)
        return real(self, *args, **kw)

    async def ticker() -> None:
        while True:
            await asyncio.sleep(0.001)
            if planning.is_set():
                ticks.append(time.monotonic())

    monkeypatch.setattr(PreemptionCycle, "plan", plan)
    task = asyncio.create_task(ticker())
    await t.ctrl.scheduler.cycle()
    task.cancel()
    assert len(ticks) >= 3, "the loop turned while the plan was being made"
    assert t.store.calls.count("preempt") == 1
