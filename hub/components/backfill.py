"""Backfill at the hub: when a hold's nodes drain, from the running jobs' own time limits.

Also :func:`hold_avoiding`, the pass's other backfill callback: several starving jobs of one
shape hold different nodes (``--queue-holds-per-shape``).

The scheduling pass (:mod:`gpufed.hub.components.scheduling`, phase 3) gives
:func:`gpufed.placement.schedule_pass` :func:`hold_start` (bound to the pass's fleet, jobs and
clock with :func:`functools.partial`): the expected start of a starving job on the nodes the
backfill rule holds for it, so that a job whose declared time limit ends before then may run
there (:mod:`gpufed.placement.backfill`, docs/placement.md "Backfill by time limit"). Both are
plain functions, bound, not built, per pass: this module is entered only when a pass weighs a
hold (docs/design.md §9, "The path, measured").

The estimate reads only facts a new leader reads back, so a leader change changes no estimate
and no backfill decision: a job's end at the latest (:func:`end_of`) is its start plus its time
limit (``PlacementRequest.time_limit_s``: ``spec.placement.timeLimitSeconds``, else a batch/v1
Job's ``activeDeadlineSeconds``, both in the GPUJob's spec), where its start is the member's
start of the workload as mirrored in ``status.startTime`` (on the hub API server) or, while the
copy has not started, the job record's ``placed_at`` (etcd): a copy starts after it is placed,
so that end is never later than the real one, and an early end lends less, never more. Both
limits are enforced: the hub stops any kind at ``timeLimitSeconds``
(:mod:`gpufed.hub.rules.lifecycle` rule 6b; the copy of a Job carries it as
``activeDeadlineSeconds``, :mod:`gpufed.sync.manifests` step 9) and the member's Job controller
a Job at its ``activeDeadlineSeconds``.
"""

from __future__ import annotations

from collections.abc import Mapping

from gpufed.api.request import PlacementRequest
from gpufed.hub.components.term import JobState
from gpufed.placement import FleetSnapshot, Hold, Policy, hold_for
from gpufed.placement.backfill import expected_start, releases_on
from gpufed.placement.queue import gpus_of
from gpufed.placement.quota import QuotaGate


def end_of(job: JobState | None) -> float | None:
    """When ``job``'s current copy ends at the latest, wall seconds: its start in the member
    (``status.startTime``), or its placement (``record.placed_at``) while it has not started,
    plus its time limit. None for an unknown job (GPUs the hub does not account for), a job
    without a limit, or one with neither a start nor a placement: what holds nodes for an
    unknown time lends nothing."""
    if job is None or job.request is None or job.request.time_limit_s is None:
        return None
    start = job.started_at
    if start is None and job.record is not None and job.record.placed_at:
        start = job.record.placed_at
    return None if start is None else start + job.request.time_limit_s


def hold_start(
    snapshot: FleetSnapshot,
    jobs: Mapping[str, JobState],
    now: float,
    holder: PlacementRequest,
    hold: Hold,
) -> float | None:
    """``schedule_pass``'s ``hold_start`` for a pass at wall seconds ``now`` (the first three
    arguments bound per pass): for ``holder`` and its ``hold``, the earliest wall time at which
    the hold's free GPUs plus those its running and reserved jobs release by :func:`end_of`
    reach the holder's demand (:func:`gpufed.placement.backfill.expected_start`); None (the
    hold lends nothing) when that needs a job without a limit, or for a whole-member hold.
    ``jobs``: the leader's jobs by UID, read when the pass asks."""

    def ends(uid: str) -> float | None:
        return end_of(jobs.get(uid))

    return expected_start(now, gpus_of(holder), *releases_on(snapshot, hold, ends))


def hold_avoiding(
    snapshot: FleetSnapshot,
    policy: Policy,
    gate: QuotaGate,
    req: PlacementRequest,
    held: Mapping[str, Hold],
) -> Hold | None:
    """``schedule_pass``'s ``hold_avoiding`` for a pass (the first three arguments bound per
    pass): the nodes starving ``req`` should hold (:func:`gpufed.placement.hold_for` with its
    queue's quota), other than those of the pass's holds so far (``held``), so that up to
    ``BackfillRule.holds_per_shape`` starving jobs of one shape drain different nodes. The pass
    gives it only when ``holds_per_shape`` is above 1: with 1 it asks ``hold_for`` once per
    shape, and a second starving job of another shape may name nodes already held (as the
    simulator does, :mod:`gpufed.placement.sim.simulate`)."""
    return hold_for(req, snapshot, policy, gate.for_request(req), avoid=held)
