"""Backfill by declared time limit: which held nodes a job may borrow, and a hold's expected start.

Called by :func:`gpufed.placement.queue.schedule_pass` (the pass) and by its callers that
estimate when a starving job will start on the nodes it holds (the simulator; the hub once
it wires ``hold_start``). Pure.

The rule (Slurm's backfill, docs/placement.md "Backfill by time limit"): nodes held for a
starving job by the backfill rule stay off-limits to the jobs behind it, except to a job that
declared a time limit (``PlacementRequest.time_limit_s``: ``spec.placement.timeLimitSeconds``,
a Job's ``activeDeadlineSeconds``) ending by the hold's expected start
(:attr:`Hold.starts_at`): such a job is gone, stopped at its limit if need be, before the
holder could start, so it delays nobody. A job without a limit never runs inside a hold; a hold
whose start cannot be estimated (a job without a limit runs on its nodes, or the caller gives no
estimate) lends nothing; holds other than the backfill rule's (a preemptor's, suspect nodes)
carry no start and lend nothing.

A starving job that weighs several node sets (``BackfillRule.hold_candidates``) holds the one
:func:`best_hold` picks: the earliest expected start, or (``hold_choice`` ``least-idle``) the
fewest GPU-seconds left idle until then (:func:`idle_until_start`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from gpufed.api.decision import Decision
from gpufed.api.labels import GPU_RESOURCE
from gpufed.api.request import PlacementRequest

if TYPE_CHECKING:
    from gpufed.placement.queue import Hold
    from gpufed.placement.snapshot import FleetSnapshot


def expected_start(
    now: float, demand: int, free_now: int, releases: Iterable[tuple[float | None, int]]
) -> float | None:
    """When ``demand`` GPUs are expected free on a hold's nodes, seconds (the ``now`` clock).

    ``free_now``: free GPUs of the held nodes now; ``releases``: ``(end, GPUs)`` per job
    running there, ``end`` = its start + its time limit (None: it has no limit), GPUs = what it
    holds on those nodes. The earliest time at which free plus released GPUs reach ``demand``
    (``now`` when already free), or None when that needs a job without a limit or never
    happens. An estimate summed over the nodes: node shapes are ignored, so it can come early,
    never late, when every running job keeps its limit.
    """
    have = free_now
    if have >= demand:
        return now
    for end, gpus in sorted(releases, key=lambda r: math.inf if r[0] is None else r[0]):
        if end is None:
            return None
        have += gpus
        if have >= demand:
            return max(now, end)
    return None


def idle_until_start(
    now: float, demand: int, free_now: int, releases: Iterable[tuple[float | None, int]]
) -> float | None:
    """GPU-seconds the hold's GPUs stand idle from ``now`` until :func:`expected_start` (same
    arguments), if nothing borrows them: its free GPUs for the whole wait, and each release
    before that start from its end on. None when the start is unknown. The cost
    ``BackfillRule.hold_choice`` ``least-idle`` ranks candidate holds by (less idle drain:
    more of the fleet's GPU time used)."""
    items = list(releases)
    start = expected_start(now, demand, free_now, items)
    if start is None:
        return None
    idle = free_now * (start - now)
    for end, gpus in items:
        if end is not None and end < start:
            idle += gpus * (start - max(now, end))
    return idle


def best_hold(
    req: PlacementRequest,
    hold: Hold,
    starts: float | None,
    held: Mapping[str, Hold],
    candidates: int,
    avoiding: Callable[[PlacementRequest, Mapping[str, Hold]], Hold | None],
    start_of: Callable[[PlacementRequest, Hold], float | None],
    rank_of: Callable[[PlacementRequest, Hold], float | None] | None = None,
) -> tuple[Hold, float | None]:
    """Of ``hold`` (whose expected start is ``starts``) and the next ``candidates - 1`` node
    sets ``avoiding`` names (each avoiding the pass's ``held`` and the candidates before it),
    the one of least rank, and its expected start. The rank is ``rank_of(req, candidate)``
    (``BackfillRule.hold_choice`` ``least-idle``: :func:`idle_until_start`), or without it
    the expected start (``earliest-start``, Slurm's choice); an unknown rank comes last; ties
    go to the earlier candidate."""

    def rank(h: Hold, start: float | None) -> float | None:
        return rank_of(req, h) if rank_of is not None else start

    best_rank = rank(hold, starts)
    avoid = dict(held)
    cand = hold
    for _ in range(candidates - 1):
        prior = avoid.get(cand.cluster)
        avoid[cand.cluster] = prior.merged(cand) if prior else cand
        nxt = avoiding(req, avoid)
        if nxt is None:
            break
        cand = nxt
        s = start_of(req, cand)
        r = rank(cand, s)
        if r is not None and (best_rank is None or r < best_rank):
            hold, starts, best_rank = cand, s, r
    return hold, starts


def releases_on(
    snapshot: FleetSnapshot, hold: Hold, end_of: Callable[[str], float | None]
) -> tuple[int, list[tuple[float | None, int]]]:
    """(free GPUs now, releases) of ``hold``'s nodes for :func:`expected_start`, read from the
    snapshot: the GPUs each job holds there, bound (``NodeInventory.job_requests``) or only
    reserved (the ledger), and ``end_of(job_uid)``, its start + time limit in the pass clock
    (None: no limit, or unknown). A whole-member hold: ``(0, [])``. For the hub's
    ``hold_start`` (not wired yet: docs/placement.md, "Choices and limits")."""
    if not hold.nodes:
        return 0, []
    free = 0
    held: dict[str, int] = {}
    for name in hold.nodes:
        free += snapshot.free(hold.cluster, name)
        for uid, req in snapshot.node(hold.cluster, name).job_requests.items():
            held[uid] = held.get(uid, 0) + req.get(GPU_RESOURCE, 0)
    for res in snapshot.reservations():
        if res.cluster != hold.cluster:
            continue
        for name, req in res.nodes.items():
            if name in hold.nodes:
                bound = snapshot.node(hold.cluster, name).job_requests.get(res.job_uid, {})
                extra = req.get(GPU_RESOURCE, 0) - bound.get(GPU_RESOURCE, 0)
                if extra > 0:
                    held[res.job_uid] = held.get(res.job_uid, 0) + extra
    return free, [(end_of(uid), g) for uid, g in sorted(held.items()) if g > 0]


def borrowable(
    req: PlacementRequest, now: float, seen: Any, holds: Mapping[str, Hold]
) -> tuple[Any, dict[str, Hold], list[Hold]]:
    """The holds binding ``req`` it may not use, those it may borrow, and a token naming both.

    ``holds``: member -> the holds that bind ``req`` (merged per member: borrowable only until
    the earliest start of the holds merged, not at all if one of them has none); ``seen``: the
    pass's token of those holds. A hold is borrowed when ``now + req.time_limit_s`` is at or
    before its ``starts_at``. Returns ``(token, holds kept, holds borrowed)``.
    """
    limit = req.time_limit_s
    if limit is None:
        return seen, dict(holds), []
    end = now + limit
    kept: dict[str, Hold] = {}
    borrowed: list[Hold] = []
    for cluster, h in holds.items():
        if h.starts_at is not None and end <= h.starts_at:
            borrowed.append(h)
        else:
            kept[cluster] = h
    if not borrowed:
        return seen, kept, []
    return (seen, tuple(sorted(h.cluster for h in borrowed))), kept, borrowed


def ran_inside(decision: Decision, borrowed: Iterable[Hold]) -> Hold | None:
    """The borrowed hold whose nodes ``decision`` uses (a whole-member hold: any node of that
    member), or None when it was placed outside every one of them."""
    used = {n for ps in decision.pod_sets for n in ps.nodes}
    for h in borrowed:
        if h.cluster == decision.cluster and (not h.nodes or used & h.nodes):
            return h
    return None


def backfill_note(decision: Decision, req: PlacementRequest, now: float, hold: Hold) -> str:
    """The decision's message with what ``gpufed explain`` says of a backfilled job: which
    hold it borrowed and why that delays nobody."""
    limit = req.time_limit_s or 0.0
    starts = hold.starts_at if hold.starts_at is not None else math.inf
    return (
        f"{decision.message}; backfill: runs on nodes {hold.reason}: its time limit "
        f"({limit:.0f} s) ends {starts - now - limit:.0f} s before the holder's expected "
        f"start (in {starts - now:.0f} s)"
    )
