"""The block estimates kept across a cycle's preemptors give the plans a full scan gives.

:class:`~gpufed.placement.estimatebook.EstimateBook` re-estimates only the blocks an earlier
plan of the cycle changed. Over random busy fleets (HGX nodes and NVLink cliques of jobs of
mixed priorities, queues, checkpoints and past preemptions; with and without quotas), several
preemptors planned in one cycle, some of one shape, with running jobs added and removed from
the index between them:

* every answer (plan: member, victims, nodes, search; no plan: the reason) equals the answer
  of a cycle that scans every block for every preemptor (the book off);
* the cheapest blocks each decision tries equal those of an independent brute force: every
  running job of the member filed by block with :func:`~gpufed.placement.victimblocks.file_blocks`
  (no index, no bound, no book), each block's greedy estimate, the ``max_blocks`` first in
  :data:`~gpufed.placement.victimblocks.SetKey` order (ties by block key).
"""

from __future__ import annotations

import copy
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from placement_builders import GB200, H100, job, member
from preemption_builders import busy_node, running
from quota_builders import org_with_two_teams

from gpufed.placement import FleetSnapshot, Policy, place
from gpufed.placement import victims as victims_mod
from gpufed.placement.preemptcycle import PreemptionCycle
from gpufed.placement.preemption import (
    NoPreemption,
    PreemptionEvent,
    PreemptionPlan,
    PreemptionRules,
    Preemptor,
    QuotaView,
    Running,
)
from gpufed.placement.quota import QuotaUsage
from gpufed.placement.runindex import RunningIndex
from gpufed.placement.victimblocks import (
    Estimate,
    FleetChangedError,
    block_estimate,
    file_blocks,
    greedy,
    set_key,
)
from gpufed.placement.victims import Search
from gpufed.placement.whatif import freed

NOW = 50_000.0
POLICY = Policy()
SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
QUEUES = ("team-a", "team-b")


def _fill(
    draw: Any, cluster: str, n: str, gpus: int, runs: list[Running], full: bool = False, **kw: Any
) -> Any:
    """A node with jobs of 1-8 GPUs on some of its GPUs (``full``: on all of them)."""
    left, jobs = gpus, []
    while left and (full or draw(st.integers(0, 5))):
        g = draw(st.sampled_from([x for x in (1, 2, 4, 8) if x <= left]))
        uid = f"{n}-j{len(jobs)}"
        jobs.append((uid, g))
        runs.append(_running(draw, uid, cluster, {n: g}))
        left -= g
    return busy_node(n, jobs, gpus=gpus, **kw)


def _running(draw: Any, uid: str, cluster: str, gpus: dict[str, int]) -> Running:
    return running(
        uid,
        cluster,
        gpus,
        priority=draw(st.integers(0, 3)),
        started_at=draw(st.sampled_from([0.0, 1000.0, NOW - 100, NOW - 100, NOW - 5])),
        queue=draw(st.sampled_from(QUEUES)),
        interval=draw(st.sampled_from([None, 600.0])),
        # a checkpoint before the start counts from the start (a restart resumes from it)
        last_checkpoint=draw(st.sampled_from([None, None, None, 500.0, NOW - 30])),
        preempted=draw(st.sampled_from([(), (), (), ((NOW - 60, "x"),)])),
        submitted_at=draw(st.sampled_from([None, 10.0, 20.0])),
    )


@st.composite
def busy_fleets(draw: Any) -> tuple[FleetSnapshot, list[Running]]:
    members, runs = [], []
    for m in range(draw(st.integers(1, 3))):
        name = f"m{m}"
        nodes = [
            _fill(draw, name, f"{name}-n{i}", 8, runs, product=H100)
            for i in range(draw(st.integers(1, 4)))
        ]
        for c in range(draw(st.integers(0, 2))):  # cliques of 4 trays x 4 GPUs
            kw = {"product": GB200, "clique": f"{name}-fab.{c}"}
            first = 0
            if draw(st.booleans()):  # an 8-GPU job on trays 0 and 1
                uid, pair = f"{name}-c{c}-wide", [f"{name}-c{c}-t{t}" for t in (0, 1)]
                runs.append(_running(draw, uid, name, dict.fromkeys(pair, 4)))
                nodes += [busy_node(t, [(uid, 4)], gpus=4, **kw) for t in pair]
                first = 2
            for t in range(first, 4):
                nodes.append(_fill(draw, name, f"{name}-c{c}-t{t}", 4, runs, **kw))
        members.append(member(name, nodes))
    return FleetSnapshot(members), runs


#: one step of a cycle: a preemptor (shape, nvlink, priority, queue, past preemption), or a
#: running job removed from / put back in the index
#: a preemptor's shape: (GPUs, pods), nvlink, priority, queue
shapes = st.lists(
    st.tuples(
        st.sampled_from([(1, 1), (4, 1), (8, 1), (4, 2), (4, 4)]),
        st.sampled_from(["Required", "Preferred"]),
        st.integers(2, 5),
        st.sampled_from(QUEUES),
    ),
    min_size=1,
    max_size=3,
)
#: one step of a cycle: a preemptor (which shape, a past preemption or not), or a running job
#: removed from / put back in the index
steps = st.lists(
    st.one_of(
        st.tuples(st.just("plan"), st.integers(0, 2), st.integers(0, 5).map(lambda x: x == 0)),
        st.tuples(st.just("plan"), st.integers(0, 2), st.just(False)),
        st.tuples(st.just("change"), st.integers(0, 10_000), st.booleans()),
    ),
    min_size=1,
    max_size=8,
)


def _usage(runs: list[Running]) -> QuotaUsage:
    usage = QuotaUsage()
    for r in runs:
        usage.charge(r.uid, r.queue or "default", H100, r.gpu_count)
    return usage


def _same(a: PreemptionPlan | NoPreemption, b: PreemptionPlan | NoPreemption) -> None:
    assert type(a) is type(b), (a, b)
    if isinstance(a, PreemptionPlan):
        assert isinstance(b, PreemptionPlan)
        assert (a.cluster, a.victim_uids, a.nodes, a.search, a.cost_gpu_s) == (
            b.cluster,
            b.victim_uids,
            b.nodes,
            b.search,
            b.cost_gpu_s,
        )
        assert a.decision.node_requests() == b.decision.node_requests()
    else:
        assert a.reason == b.reason


def brute_cheapest(
    p: Preemptor,
    snap: FleetSnapshot,
    runs: list[Running],
    rules: PreemptionRules,
    quota: QuotaView | None,
    gone: list[Running],
    placed: list[Any],
    now: float = NOW,
) -> list[tuple[Any, str]]:
    """The ``max_blocks`` cheapest blocks' (SetKey, block key) at ``now``, by a scan of every
    running job of each member the search reads (no index, no bound, no book)."""
    s = Search(p, snap, POLICY, rules, now, None, quota, placed, gone)
    skip = {r.uid for r in gone} | {p.request.uid}
    with freed(snap, gone, placed, now):
        fits = place(p.request, snap, POLICY, now)
        never = {r.cluster for r in fits.rejections if r.code == "UnschedulableAndUnresolvable"}
        rows = []
        for name in sorted({r.cluster for r in runs}):
            c = snap.cluster(name)
            if name in never:
                continue
            mine = [r for r in runs if r.cluster == name and r.uid not in skip]
            for b in file_blocks(s, c, mine, {}):
                g = greedy(b, s.job.demand, s.job.max_gpus)
                if g is not None:
                    rows.append((set_key(name, g[0]), b.key))
    return sorted(rows)[: rules.max_blocks]


@SETTINGS
@given(busy_fleets(), shapes, steps, st.booleans(), st.integers(1, 3))
def test_kept_estimates_plan_as_a_full_scan(
    built: tuple[FleetSnapshot, list[Running]],
    kinds: list[Any],
    todo: list[Any],
    queues: bool,
    max_blocks: int,
) -> None:
    snap, runs = built
    rules = PreemptionRules(max_blocks=max_blocks, min_runtime_s=60.0)
    tree = org_with_two_teams(nominal=8) if queues else None
    quota = QuotaView(tree, _usage(runs)) if tree is not None else None
    index = RunningIndex(snap, runs)
    kept = PreemptionCycle(snap, POLICY, NOW, index, rules=rules, quota=quota)
    full = PreemptionCycle(snap, POLICY, NOW, index, rules=rules, quota=quota)
    full.book = None  # type: ignore[assignment]  # every preemptor scans every block
    live = list(runs)
    tried: list[list[Estimate]] = []
    real = victims_mod.cheapest

    def spy(rows: list[Estimate], k: int) -> list[Estimate]:
        got = real(rows, k)
        tried.append(got)
        return got

    for i, step in enumerate(todo):
        if step[0] == "change":
            _, pick, put_back = step
            if put_back and len(live) < len(runs):
                back = [r for r in runs if r not in live][pick % (len(runs) - len(live))]
                index.add(back)
                live.append(back)
            elif live:
                left = live.pop(pick % len(live))
                index.remove(left.uid, left.cluster)
            event("index changed")
            continue
        _, which, past = step
        (g, pods), nvl, prio, queue = kinds[which % len(kinds)]
        req = job(f"p{i}", gpus=g, pods=pods, nvlink=nvl, priority=prio).model_copy(
            update={"queue": queue if queues else None}
        )
        hist = (PreemptionEvent(NOW - 30, live[0].uid),) if past and live else ()
        p = Preemptor(req, preempted=hist)
        gone = list(kept._gone)
        placed = [q.decision for q in kept.plans]
        ledger = copy.deepcopy(kept.quota) if kept.quota is not None else None  # as planned
        tried.clear()
        before = kept.book.kept
        with mock.patch.object(victims_mod, "cheapest", spy):
            a = kept.plan(p)
        if kept.book.kept > before:
            event("estimates read back")
        b = full.plan(p)
        _same(a, b)
        event("plan" if isinstance(a, PreemptionPlan) else "no plan")
        if tried:
            want = brute_cheapest(p, snap, live, rules, ledger, gone, placed)
            assert [e.key() for e in tried[0]] == want
    assert kept.victims == full.victims


def test_a_second_preemptor_reads_only_the_blocks_the_first_changed() -> None:
    """Four HGX members full of one 8-GPU job a node: the second 8-GPU preemptor of the cycle
    reads the node the first one freed (its victim left, its hold placed there), not the pool."""
    members, runs = [], []
    for m in range(4):
        nodes = []
        for i in range(16):
            uid = f"m{m}-n{i}-j"
            nodes.append(busy_node(f"m{m}-n{i}", [(uid, 8)], product=H100))
            runs.append(running(uid, f"m{m}", {f"m{m}-n{i}": 8}, started_at=0.0))
        members.append(member(f"m{m}", nodes))
    snap = FleetSnapshot(members)
    cycle = PreemptionCycle(snap, POLICY, NOW, runs)
    first = cycle.plan(Preemptor(job("p0", gpus=8, nvlink="Required", priority=5)))
    assert isinstance(first, PreemptionPlan)
    read = cycle.book.read
    assert read == 8  # max_blocks: every floor ties but the UID; m0's 8 least, the rest unread
    second = cycle.plan(Preemptor(job("p1", gpus=8, nvlink="Required", priority=5)))
    assert isinstance(second, PreemptionPlan)
    assert cycle.book.read - read == 2  # the first plan's node, and the next by floor (8 again)
    assert second.victim_uids != first.victim_uids
    ref = PreemptionCycle(snap, POLICY, NOW, runs)
    ref.book = None  # type: ignore[assignment]
    for i, mine in enumerate((first, second)):
        _same(ref.plan(Preemptor(job(f"p{i}", gpus=8, nvlink="Required", priority=5))), mine)


def test_a_quota_answer_the_first_plan_changed_is_read_again() -> None:
    """team-b borrows (24 of its nominal 8 H100s); team-a's first 8-GPU preemptor is within its
    nominal and reclaims one of team-b's jobs; once charged for it, team-a's second one would
    have to borrow, so team-b's other jobs are no longer its victims: the kept estimates of the
    untouched nodes must not be read back as they were."""
    nodes, runs = [], []
    for i in range(3):
        uid = f"b{i}"
        nodes.append(busy_node(f"m0-n{i}", [(uid, 8)], product=H100))
        runs.append(running(uid, "m0", {f"m0-n{i}": 8}, priority=900, queue="team-b"))
    snap = FleetSnapshot([member("m0", nodes)])
    quota = QuotaView(org_with_two_teams(nominal=8, org_nominal=64), _usage(runs))

    def team_a(name: str) -> Preemptor:
        req = job(name, gpus=8, nvlink="Required", priority=100)
        return Preemptor(req.model_copy(update={"queue": "team-a"}))

    kept = PreemptionCycle(snap, POLICY, NOW, runs, quota=quota)
    full = PreemptionCycle(snap, POLICY, NOW, runs, quota=quota)
    full.book = None  # type: ignore[assignment]
    answers = [kept.plan(team_a("p0")), kept.plan(team_a("p1"))]
    assert isinstance(answers[0], PreemptionPlan)
    assert isinstance(answers[1], NoPreemption)
    for name, mine in zip(("p0", "p1"), answers, strict=True):
        _same(full.plan(team_a(name)), mine)


def test_a_block_that_no_longer_frees_enough_says_the_fleet_changed() -> None:
    """A kept estimate whose block, filed now, no longer reaches the demand (the snapshot moved
    under a worker by more than the cycle's plans) raises FleetChangedError (a RuntimeError) the hub
    counts as ``raced`` and plans again, instead of an assertion."""
    snap = FleetSnapshot([member("m0", [busy_node("m0-n0", [("v", 8)], product=H100)])])
    runs = [running("v", "m0", {"m0-n0": 8})]
    p = Preemptor(job("p", gpus=8, nvlink="Required", priority=5))
    index = RunningIndex(snap, runs)
    s = Search(p, snap, POLICY, PreemptionRules(), NOW, None, None, (), ())
    c = snap.cluster("m0")
    [blk] = index.blocks("m0", "nvlink", next(iter(c.pools.values())).key)
    e = block_estimate(s, c, blk, "nvlink", H100, set(), {})
    assert e is not None
    assert e.uids == ["v"]
    with pytest.raises(FleetChangedError, match="changed since its estimate"):
        e.block(s, c, {"v"}, {})  # its only victim is gone: nothing left to free
    assert issubclass(FleetChangedError, RuntimeError)
