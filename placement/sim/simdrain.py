"""The nodes about to drain whole, kept off fresh small jobs for one pass (simulator only).

``BackfillRule.spare_draining_s`` (``gpufed simulate --queue-spare-draining S``; issue 29,
``backfill8``): a partly used node whose running jobs all end, by their time limits, within
``S`` seconds is about to be free from end to end, the only way a job of one whole HGX node (8
GPUs) or of several nodes gets room on a fleet whose nodes never empty on their own. A job
that would run past that drain (its own limit ends later, or it has none) is first tried off
such nodes, with the whole free nodes of ``spare_whole_nodes_s`` (:func:`spare_draining`); if
it finds no room elsewhere it is tried again after the pass, anywhere (``schedule_pass``'s
``spare`` stage), so it still starts in the same pass when it fits anywhere.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from gpufed.api.request import PlacementRequest
from gpufed.placement.queue import Hold, gpus_of
from gpufed.placement.sim.simstate import _Sim
from gpufed.placement.snapshot import FleetSnapshot


def drain_ends(
    sim: _Sim, snapshot: FleetSnapshot, now: float
) -> dict[str, list[tuple[str, float]]]:
    """Member -> (node, drain end) of the partly used nodes (a free GPU and a running job)
    whose every running job has a time limit: the drain end is the latest ``start + limit``
    (seconds, the simulation clock). A node with a job without a limit never drains by the
    limits and is left out."""
    out: dict[str, list[tuple[str, float]]] = {}
    for (cluster, node), runs in sim.node_runs.items():
        if not runs or snapshot.free(cluster, node) <= 0:
            continue
        end = now
        known = False
        for uid, (began, _gpus) in runs.items():
            run = sim.live.get(uid)
            if run is None or run.seg_start != began or run.end <= now:
                continue  # ended or restarted since (releases() prunes these)
            limit = run.job.time_limit_s
            if limit is None:
                known = False
                break
            end = max(end, began + limit)
            known = True
        if known:
            out.setdefault(cluster, []).append((node, end))
    return out


def spare_draining(
    sim: _Sim,
    snapshot: FleetSnapshot,
    now: float,
    within_s: float,
    whole: Callable[[PlacementRequest], Mapping[str, Hold]] | None,
) -> Callable[[PlacementRequest], Mapping[str, Hold]]:
    """``schedule_pass``'s ``spare`` for one pass: ``whole``'s answer (the whole free nodes,
    :func:`gpufed.placement.holds.whole_free_nodes`; None: none) plus, for a job of GPUs, the
    partly used nodes expected to drain (:func:`drain_ends`) after ``now`` and within
    ``within_s`` seconds whose drain the job would delay (``now`` + its time limit past the
    drain end; a job without a limit delays every one), as holds by member (no estimated
    start: nothing borrows them). The drain ends are read once, at the first call: a node a
    job of the pass lands on stays listed, as before that job, for the rest of the pass."""
    ends: dict[str, list[tuple[str, float]]] | None = None

    def spare(request: PlacementRequest) -> Mapping[str, Hold]:
        nonlocal ends
        base = whole(request) if whole is not None else {}
        if gpus_of(request) <= 0:
            return base
        if ends is None:
            ends = drain_ends(sim, snapshot, now)
        limit = request.time_limit_s
        out = dict(base)
        for cluster, nodes in ends.items():
            names = frozenset(
                n
                for n, end in nodes
                if end <= now + within_s and (limit is None or now + limit > end)
            )
            if not names:
                continue
            h = Hold(cluster, names, "about to drain whole")
            prior = out.get(cluster)
            out[cluster] = prior.merged(h) if prior else h
        return out

    return spare
