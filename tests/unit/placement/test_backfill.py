"""Backfill by declared time limit (issue 29 item 1): who may run inside a starving job's hold,
the hold's expected start, and the starvation bound with limits on."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from placement_builders import GPU, gpus_on, hgx_cluster, job
from test_queue_order import Loop as QueueLoop

from gpufed.api.decision import Decision, Outcome
from gpufed.api.request import PlacementRequest
from gpufed.placement import BackfillRule, FleetSnapshot, Hold, Policy, place, schedule_pass
from gpufed.placement.backfill import expected_start, releases_on
from gpufed.placement.sim.simclasses import class_report
from gpufed.placement.sim.simulate import simulate
from gpufed.placement.sim.timelimits import TimeLimitModel, with_time_limits
from gpufed.placement.sim.trace import TraceJob

POLICY = Policy()


def limited(name: str, gpus: int, limit: float | None, at: float = 10.0) -> PlacementRequest:
    return job(name, gpus=gpus, requests={GPU: gpus}, submitted_at=at).model_copy(
        update={"time_limit_s": limit}
    )


class Loop(QueueLoop):
    """test_queue_order's loop; every hold is a-n000, its holder expected to start at
    ``starts``."""

    def __init__(self, snapshot: FleetSnapshot, starts: float | None) -> None:
        super().__init__(snapshot)
        self.starts = starts

    def hold_for(self, req: PlacementRequest) -> Hold | None:
        return Hold("a", frozenset({"a-n000"}), "held")

    def hold_start(self, req: PlacementRequest, hold: Hold) -> float | None:
        return self.starts


def _pass(
    small: PlacementRequest, starts: float | None = 5000.0
) -> tuple[Decision, dict[str, Hold]]:
    # a-n000 has 4 free, a-n001 none: the starving 8-GPU job holds a-n000
    loop = Loop(FleetSnapshot([hgx_cluster("a", free=[4, 0])]), starts)
    big = limited("big", 8, None, at=0.0).model_copy(update={"priority": 1})
    result = schedule_pass(
        [big, small], 4000.0, loop.attempt, loop.hold_for, hold_start=loop.hold_start
    )
    [d] = [d for r, d in result.decisions if r.uid == small.uid]
    return d, result.backfilled


def test_a_job_whose_limit_ends_before_the_holders_start_runs_inside_the_hold() -> None:
    d, backfilled = _pass(limited("short", 2, 1000.0))
    assert d.outcome == Outcome.PLACED
    assert set(backfilled) == {"uid-short"}
    assert "backfill: runs on nodes held for ns/big" in d.message
    assert "ends 0 s before the holder's expected start (in 1000 s)" in d.message


@pytest.mark.parametrize(
    ("limit", "starts"),
    [(None, 5000.0), (1001.0, 5000.0), (10.0, None)],
    ids=["no limit never backfills", "a limit past the start", "a hold without an estimate"],
)
def test_nothing_else_runs_inside_a_hold(limit: float | None, starts: float | None) -> None:
    d, backfilled = _pass(limited("small", 2, limit), starts)
    assert d.outcome == Outcome.UNSCHEDULABLE
    assert backfilled == {}


def test_merged_holds_lend_until_the_earliest_start_and_not_at_all_if_one_cannot() -> None:
    a = Hold("a", frozenset({"x"}), "A", 100.0)
    assert a.merged(Hold("a", frozenset({"y"}), "B", 50.0)).starts_at == 50.0
    assert a.merged(Hold("a", frozenset({"y"}), "B")).starts_at is None


def test_expected_start_is_when_enough_gpus_are_freed_by_the_limits() -> None:
    assert expected_start(10.0, 4, 4, []) == 10.0
    assert expected_start(10.0, 8, 2, [(500.0, 4), (300.0, 2), (900.0, 8)]) == 500.0
    # the job without a limit is not needed before 900 s, but is after
    assert expected_start(10.0, 8, 2, [(300.0, 2), (None, 4), (900.0, 8)]) == 900.0
    assert expected_start(10.0, 8, 2, [(300.0, 2), (None, 4), (900.0, 2)]) is None
    assert expected_start(10.0, 8, 0, [(5.0, 4)]) is None
    assert expected_start(10.0, 4, 0, [(5.0, 4)]) == 10.0


def _stream(until: float) -> list[TraceJob]:
    """As test_queue_order's: a 16-GPU job at t=50 among 1-GPU jobs every 100 s of 1,500 s."""
    small = [
        TraceJob(f"s{i}", i * 100.0, 1, 1500.0, 1, "Required") for i in range(int(until / 100))
    ]
    big = TraceJob("big", 50.0, 16, 1000.0, 8, "Preferred")
    return sorted([*small, big], key=lambda j: j.submit_s)


@pytest.mark.parametrize(
    ("carry", "spare"),
    [(False, False), (True, False), (False, True), (True, True)],
    ids=["defaults", "carried holds", "spared whole nodes", "both"],
)
def test_with_drawn_limits_the_big_job_still_waits_at_most_sixteen_hours_and_a_drain(
    carry: bool, spare: bool
) -> None:
    """The starvation bound with backfill on: the limits drawn by the simulator's default model
    let small jobs run inside the big job's hold only when they end before its expected start,
    so it still starts within 16 h plus one drain (the longest small job's limit here); also
    with carried holds (the starving 1-GPU jobs take the four holds before it here) and with
    whole free nodes spared."""
    jobs = with_time_limits(_stream(70_000.0), TimeLimitModel())
    drain = max(j.time_limit_s or 0.0 for j in jobs if j.job_id != "big")
    rule = BackfillRule(carry_holds=carry, spare_whole_nodes_s=3600.0 if spare else 0.0)
    res = simulate([hgx_cluster("a", nodes=2)], jobs, "gpufed", backfill=rule)
    assert res.placed == res.jobs
    [rec] = [r for r in res.records if r.job_id == "big"]
    assert rec.wait_s is not None
    assert rec.wait_s <= 57_600 + drain
    report = class_report(res.records)
    assert report["time_limited"] == res.jobs
    assert report["backfill_limit_hits"] == 0  # drawn limits are never below the runtime


def test_a_job_past_its_limit_is_stopped_there_and_counted() -> None:
    jobs = [
        TraceJob("over", 0.0, 1, 1000.0, 1, "Required", time_limit_s=600.0),
        TraceJob("under", 0.0, 1, 1000.0, 1, "Required", time_limit_s=1200.0),
    ]
    res = simulate([hgx_cluster("a", nodes=1)], jobs, "gpufed")
    ends = {r.job_id: r.end_s for r in res.records}
    assert ends == {"over": 600.0, "under": 1000.0}
    assert [i.ended for i in res.intervals] == ["time-limit", "succeeded"]
    assert class_report(res.records)["time_limit_stops"] == 1


def test_drawn_limits_follow_the_f_model_rounded_up_to_modal_values() -> None:
    model = TimeLimitModel()
    for i, runtime in enumerate([1.0, 700.0, 3000.0, 20_000.0, 200_000.0]):
        limit = model.draw(str(i), runtime)
        assert runtime <= limit
        assert limit <= max(5 * runtime * 1.5, 300.0) or limit % 86_400 == 0
    assert model.draw("7", 3000.0) == TimeLimitModel().draw("7", 3000.0)
    with pytest.raises(ValueError, match="time limit factor"):
        TimeLimitModel(factor=0.5)


def test_releases_on_reads_what_runs_on_the_held_nodes_from_the_snapshot() -> None:
    s = FleetSnapshot([hgx_cluster("a", free=[8, 8])])
    d = place(limited("run", 4, 600.0), s, POLICY, 0.0)
    s.reserve(d, now=0.0, ttl_s=10**9)
    [node] = gpus_on(d)
    free, releases = releases_on(s, Hold("a", frozenset({node}), "held"), {"uid-run": 600.0}.get)
    assert (free, releases) == (4, [(600.0, 4)])
    assert expected_start(0.0, 8, free, releases) == 600.0
    assert releases_on(s, Hold("a", frozenset(), "whole member"), {}.get) == (0, [])


def test_the_rule_can_turn_backfill_off_whatever_the_caller_estimates() -> None:
    loop = Loop(FleetSnapshot([hgx_cluster("a", free=[4, 0])]), 5000.0)
    big = limited("big", 8, None, at=0.0).model_copy(update={"priority": 1})
    off = BackfillRule(backfill_by_limit=False)
    result = schedule_pass(
        [big, limited("short", 2, 1000.0)],
        4000.0,
        loop.attempt,
        loop.hold_for,
        off,
        hold_start=loop.hold_start,
    )
    assert result.backfilled == {}
    assert [d.outcome for _, d in result.decisions] == [Outcome.UNSCHEDULABLE] * 2


@pytest.mark.parametrize(
    ("starts", "within", "old", "held"),
    [
        (8000.0, False, False, True),  # off: it holds whatever its start
        (8000.0, True, False, False),  # drain 4,000 s ahead, waited 3,000 s: not yet
        (7000.0, True, False, True),  # drain exactly as long as it waited: it holds
        (None, True, False, True),  # no estimate: it holds
        (8000.0, True, True, True),  # past oldest_first_s: it always holds (the bound)
    ],
)
def test_hold_within_wait_takes_a_hold_only_when_the_drain_is_within_the_wait(
    starts: float | None, within: bool, old: bool, held: bool
) -> None:
    """BackfillRule.hold_within_wait: the 8-GPU job submitted at 1,000 s has waited 3,000 s
    at 4,000 s; it holds a-n000 only when its expected start there is <= 3,000 s away."""
    loop = Loop(FleetSnapshot([hgx_cluster("a", free=[4, 0])]), starts)
    big = limited("big", 8, None, at=1000.0)
    rule = BackfillRule(hold_within_wait=within, oldest_first_s=2000.0 if old else 57_600.0)
    result = schedule_pass(
        [big], 4000.0, loop.attempt, loop.hold_for, rule, hold_start=loop.hold_start
    )
    assert ("a" in result.holds) is held
    if held and starts is not None:
        assert result.holds["a"].starts_at == starts


@pytest.mark.parametrize(
    ("candidates", "starts", "node"),
    [
        (1, {"a-n000": 5000.0, "a-n001": 3000.0}, "a-n000"),  # hold_for's choice
        (2, {"a-n000": 5000.0, "a-n001": 3000.0}, "a-n001"),  # the earlier start
        (2, {"a-n000": 3000.0, "a-n001": 3000.0}, "a-n000"),  # a tie: the first candidate
        (2, {"a-n000": None, "a-n001": 9000.0}, "a-n001"),  # an unknown start comes last
        (3, {"a-n000": 5000.0, "a-n001": 6000.0}, "a-n000"),  # no third node set: two weighed
    ],
)
def test_a_starving_job_holds_the_candidate_where_it_is_expected_to_start_first(
    candidates: int, starts: dict[str, float | None], node: str
) -> None:
    """BackfillRule.hold_candidates: hold_for names a-n000, hold_avoiding then a-n001 (and
    nothing once both are avoided); the hold goes where hold_start is earliest."""
    loop = QueueLoop(FleetSnapshot([hgx_cluster("a", free=[4, 4])]))

    def first(req: PlacementRequest) -> Hold | None:
        return Hold("a", frozenset({"a-n000"}), "held")

    def avoiding(req: PlacementRequest, held: Mapping[str, Hold]) -> Hold | None:
        taken = held["a"].nodes if "a" in held else frozenset()
        free = [n for n in ("a-n000", "a-n001") if n not in taken]
        return Hold("a", frozenset(free[:1]), "held") if free else None

    def start(req: PlacementRequest, hold: Hold) -> float | None:
        (n,) = hold.nodes
        return starts[n]

    big = limited("big", 8, None, at=0.0)
    rule = BackfillRule(hold_candidates=candidates, holds_per_shape=1)
    result = schedule_pass(
        [big], 4000.0, loop.attempt, first, rule, hold_start=start, hold_avoiding=avoiding
    )
    assert result.holds["a"].nodes == {node}
    assert result.holds["a"].starts_at == starts[node]


@pytest.mark.parametrize(
    ("carry", "small", "placed", "borrowed"),
    [
        (False, limited("fresh", 1, None, at=4050.0), True, False),  # off: it takes a-n000
        (True, limited("fresh", 1, None, at=4050.0), False, False),  # carried: kept off
        (True, limited("fresh", 1, 900.0, at=4050.0), True, True),  # ends by the start
        (True, limited("fresh", 1, 901.0, at=4050.0), False, False),  # a second too long
        (True, limited("older", 1, None, at=-100.0), True, False),  # older than the holder
    ],
)
def test_carried_holds_keep_younger_jobs_walked_first_off_the_draining_nodes(
    carry: bool, small: PlacementRequest, placed: bool, borrowed: bool
) -> None:
    """BackfillRule.carry_holds: the 8-GPU job (submitted at 0) held a-n000 (4 of 8 free) in
    the pass at 4,000 s; in the next one, at 4,100 s, a 1-GPU job is walked before it
    (smallest-first). Carried, the hold keeps a younger job off a-n000 (a-n001 is full) unless
    its limit ends by the holder's re-estimated start (5,000 s); an older job is never kept off.
    The carried hold ends when its holder is walked: it holds afresh (the same nodes)."""
    s = FleetSnapshot([hgx_cluster("a", free=[4, 0])])
    loop = Loop(s, 5000.0)
    big = limited("big", 8, None, at=0.0)
    rule = BackfillRule(carry_holds=carry)
    first = schedule_pass(
        [big], 4000.0, loop.attempt, loop.hold_for, rule, hold_start=loop.hold_start
    )
    assert [(r.uid, h.nodes) for r, h in first.taken] == [("uid-big", {"a-n000"})]
    result = schedule_pass(
        [big, small],
        4100.0,
        loop.attempt,
        loop.hold_for,
        rule,
        hold_start=loop.hold_start,
        carry=first.taken,
    )
    assert [r.uid for r, _ in result.decisions] == [small.uid, "uid-big"]  # small walked first
    d = result.decisions[0][1]
    assert d.placed is placed
    assert (small.uid in result.backfilled) is borrowed
    if not placed:
        assert "held for ns/big" in d.message
    assert [(r.uid, h.nodes) for r, h in result.taken] == [("uid-big", {"a-n000"})]


def test_a_carried_hold_binds_nobody_once_its_holder_has_left_the_queue() -> None:
    s = FleetSnapshot([hgx_cluster("a", free=[4, 0])])
    loop = Loop(s, 5000.0)
    rule = BackfillRule(carry_holds=True)
    carry = [(limited("gone", 8, None, at=0.0), Hold("a", frozenset({"a-n000"}), "held"))]
    fresh = limited("fresh", 1, None, at=4050.0)
    result = schedule_pass(
        [fresh], 4100.0, loop.attempt, loop.hold_for, rule, hold_start=loop.hold_start, carry=carry
    )
    assert result.decisions[0][1].placed


@pytest.mark.parametrize(
    ("spare_s", "eight", "placed"),
    [
        (0.0, True, {"uid-small": "a-n000"}),  # off: walked first, the 1-GPU job breaks a-n000
        (600.0, True, {"uid-eight": "a-n000"}),  # spared: the 8-GPU job gets it whole
        (600.0, False, {"uid-small": "a-n000"}),  # nobody needs it whole: the retry takes it
        (100.0, True, {"uid-small": "a-n000"}),  # it has waited 100 s: no longer spared
    ],
)
def test_spare_whole_nodes_gives_a_free_node_to_the_job_that_needs_it_whole(
    spare_s: float, eight: bool, placed: dict[str, str]
) -> None:
    """BackfillRule.spare_whole_nodes_s: a-n000 is free end to end, a-n001 full. The 1-GPU job
    (waiting 100 s) is walked before the 8-GPU one (smallest-first); spared, it is first tried
    off a-n000, finds no room, and is tried again after the 8-GPU job."""
    from gpufed.placement.holds import whole_free_nodes

    s = FleetSnapshot([hgx_cluster("a", free=[8, 0])])
    loop = QueueLoop(s)
    jobs = [limited("small", 1, None, at=100.0)]
    if eight:
        jobs.append(limited("eight", 8, None, at=150.0))
    rule = BackfillRule(spare_whole_nodes_s=spare_s)
    result = schedule_pass(
        jobs, 200.0, loop.attempt, loop.hold_for, rule, spare=whole_free_nodes(s)
    )
    assert {r.uid: set(gpus_on(d)) for r, d in result.decisions if d.placed} == {
        uid: {node} for uid, node in placed.items()
    }
    assert sorted(r.uid for r, _ in result.decisions) == sorted(j.uid for j in jobs)  # once each


def test_a_job_past_the_oldest_first_age_is_not_spared() -> None:
    """The 16 h bound: the 1-GPU job that has waited oldest_first_s takes the whole free node
    before the younger 8-GPU job, however long spare_whole_nodes_s is."""
    from gpufed.placement.holds import whole_free_nodes

    s = FleetSnapshot([hgx_cluster("a", free=[8, 0])])
    loop = QueueLoop(s)
    old = limited("old", 1, None, at=0.0)
    eight = limited("eight", 8, None, at=50_000.0)
    rule = BackfillRule(spare_whole_nodes_s=10**9)
    result = schedule_pass(
        [old, eight], 60_000.0, loop.attempt, loop.hold_for, rule, spare=whole_free_nodes(s)
    )
    assert {r.uid for r, d in result.decisions if d.placed} == {"uid-old"}


def test_a_one_pod_job_is_spared_off_whole_free_clique_trays_too() -> None:
    """whole_free_nodes: a 4-GPU job of one pod would not break a free 4-GPU GB200 tray, but the
    tray's clique is for the jobs of several pods that need it: it is spared off it; a job of
    several pods is not (it may need the clique)."""
    from placement_builders import nvl72_cluster

    from gpufed.placement.holds import whole_free_nodes

    s = FleetSnapshot([nvl72_cluster("g", trays=2)])
    spare = whole_free_nodes(s)
    one = limited("one", 4, None)
    assert set(spare(one)["g"].nodes) == set(s.cluster("g").nodes)
    two = job("two", gpus=4, pods=2, requests={GPU: 4})
    assert spare(two) == {}
