"""The simulator's topology-blind baselines, ``cluster-sum`` and ``round-robin``: what
federation layers that see only per-cluster GPU sums do (docs/placement.md, "Simulator").

Called by :func:`~gpufed.placement.sim.simulate.simulate` only. A job is dispatched on arrival
to one member among those with at least one node shaped to hold one of its pods: the one with
the most free GPUs summed (``cluster-sum``) or the next in turn (``round-robin``). Inside the
member it waits in a FIFO queue; after every event each member starts, in order, every queued
job whose pods all find nodes with room at once (gang; no head-of-line blocking), pods taking
nodes the way kube-scheduler's default ``LeastAllocated`` scoring does: most free GPUs first
(``member_fit="spread"``; ``"pack"`` takes the fullest first). Pure: reads and changes only the
simulator's state (:mod:`.simstate`).
"""

from __future__ import annotations

from typing import Any

from gpufed.api.decision import Decision, Outcome, PodSetAssignment
from gpufed.api.labels import GPU_RESOURCE
from gpufed.placement.fit import fill
from gpufed.placement.index import NodeState, PoolState
from gpufed.placement.shape import JobShape
from gpufed.placement.sim.simstate import _NEVER, _drain, _Run, _Sim


def _eligible_pools(sim: _Sim, run: _Run, cluster: str) -> list[PoolState]:
    """Pools of ``cluster`` with a node shaped to hold one pod of the job (allocatable).

    Pools whose nodes carry a scheduling taint are never eligible: trace pods carry no
    tolerations, so the member's kube-scheduler would not bind them there.
    """
    c = sim.snapshot.cluster(cluster)
    g = run.job.gpus_per_pod
    want = run.job.gpu_product
    out = []
    for pool in c.pools_sorted():
        if pool.slices or pool.taints or (want is not None and pool.product != want):
            continue
        if any(dict(shape).get(GPU_RESOURCE, 0) >= g for shape in pool.alloc_shapes):
            out.append(pool)
    return out


def _try_start_in_member(sim: _Sim, run: _Run, cluster: str, member_fit: str, now: float) -> bool:
    """Start ``run`` in ``cluster`` if every pod finds a node with room now (gang)."""
    ps = JobShape.of(run.request).gpu_sets[0]
    pools = _eligible_pools(sim, run, cluster)
    nodes: list[NodeState] = [
        n
        for pool in pools
        for n in (
            pool.iter_nodes_descending(ps.gpus)
            if member_fit == "spread"
            else pool.iter_nodes_ascending(ps.gpus)
        )
    ]
    if len(pools) > 1:
        nodes.sort(key=lambda n: (-n.gpu_free if member_fit == "spread" else n.gpu_free, n.name))
    out: dict[str, int] = {}
    if fill(ps, nodes, ps.count, {}, {}, out) < ps.count:
        return False
    decision = Decision.model_construct(
        job=run.request.job,
        uid=run.request.uid,
        outcome=Outcome.PLACED,
        cluster=cluster,
        pod_sets=(PodSetAssignment.model_construct(name=ps.name, requests=ps.requests, nodes=out),),
    )
    sim.start(run, decision, now)
    return True


def run_baseline(sim: _Sim, horizon: float, policy: str, member_fit: str) -> None:
    """Run ``policy`` (``cluster-sum`` or ``round-robin``) on ``sim`` up to ``horizon``
    (module docstring)."""
    names = sim.snapshot.cluster_names
    queues: dict[str, list[_Run]] = {n: [] for n in names}
    turn = 0
    for now, finished, arrived, _ in _drain(sim, horizon):
        for uid in finished:
            sim.snapshot.release(uid)
        dispatched: list[_Run] = []
        for uid in arrived:
            run = sim.by_uid[uid]
            eligible = [n for n in names if _eligible_pools(sim, run, n)]
            if not eligible:
                continue  # no member could ever hold it: never started
            if policy == "cluster-sum":
                # max() keeps the first of equals: names are sorted, so ties go by name
                target = max(
                    eligible, key=lambda n: sum(p.free for p in _eligible_pools(sim, run, n))
                )
            else:
                target = eligible[turn % len(eligible)]
                turn += 1
            queues[target].append(run)
            dispatched.append(run)
        for name in names:
            q = queues[name]
            if not q:
                continue
            failed: set[Any] = set()
            keep: list[_Run] = []
            for run in q:
                if run.key in failed or not _try_start_in_member(sim, run, name, member_fit, now):
                    failed.add(run.key)
                    keep.append(run)
            queues[name] = keep
        sim.stranded += sum(1 for run in dispatched if run.start == _NEVER)
        sim.observe_idle(now, (run for q in queues.values() for run in q))
