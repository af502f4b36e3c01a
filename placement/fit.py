"""Topology fit: choosing the nodes (and NVLink domain) for a gang job inside one pool.

Called by the ``TopologyFit`` plugin for each candidate member, best-scored first. Works on a
private overlay of what the job has taken so far (try on a copy, commit only if every pod of
every pod set fits); never changes the snapshot.

Phases of :func:`plan` (docs/placement.md, "Topology fit"):

1. for each :class:`~gpufed.placement.shape.Attempt` of the job (finest wish first): grouped
   attempts walk the groups of that level (NVLink domains, racks, blocks) in best-fit order
   (fewest free GPUs first, partly-used before fully-free, then name) and take the first whose
   nodes hold every GPU pod; ungrouped attempts fill nodes of the whole pool, tightest first
   (``bestfit``) or fewest domains first (``fewest``, for ``nvlink: Preferred``);
2. pod sets without GPUs (launchers, MIG slices) then go to any node of the member with room;
3. the plan records the NVLink domains used and their free GPUs before placement (for
   NVLinkBestFit) and the finest wished level that all GPU pods share (for TopologyLocality).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Set
from dataclasses import dataclass

from gpufed.api.inventory import tolerates_all
from gpufed.placement.index import GroupState, NodeState, PoolState
from gpufed.placement.member import ClusterState
from gpufed.placement.shape import Attempt, JobShape, PodSetShape

_Taken = dict[str, int]
_TakenRes = dict[str, dict[str, int]]


@dataclass(slots=True)
class Plan:
    """Where every pod of a job would go in one member.

    ``assign[i]``: node name -> pods of pod set ``i`` (request order). ``domains``: NVLink
    domain id -> its free GPUs before placement, for the domains the GPU pods use. ``shared``:
    the finest wished level all GPU pods share (None when none).
    """

    cluster: ClusterState
    pool: PoolState | None
    assign: list[dict[str, int]]
    domains: dict[str, int]
    shared_rank: int | None
    fit: float
    topo: float


def plan(
    job: JobShape,
    cluster: ClusterState,
    pool: PoolState | None,
    exclude: Set[str] = frozenset(),
) -> Plan | str:
    """The best plan for ``job`` in ``pool`` of ``cluster``, or the reason none exists.

    ``exclude``: names of nodes this job may not use (held for another job by the backfill
    rule).
    """
    assign: list[dict[str, int]] = [{} for _ in job.sets]
    taken: _Taken = {}
    taken_res: _TakenRes = {}
    used_attempt: Attempt | None = None
    if pool is not None and job.gpu_sets:
        attempts = (Attempt(None, None),) if pool.slices else job.attempts
        for attempt in attempts:
            if attempt.level is None:
                ok = _fill_all(job, None, pool, assign, taken, taken_res, attempt.mode, exclude)
            else:
                ok = _grouped(job, pool, attempt.level, assign, taken, taken_res, exclude)
            if ok:
                used_attempt = attempt
                break
            for a in assign:
                a.clear()
            taken.clear()
            taken_res.clear()
        if used_attempt is None:
            return _no_room_reason(job, pool)
    if job.other_sets:
        why = _place_other(job, cluster, assign, taken, taken_res, exclude)
        if why:
            return why
    domains: dict[str, int] = {}
    if pool is not None:
        for s in job.gpu_sets:
            for name in assign[s.index]:
                n = pool.nodes[name]
                d = n.domain
                if d is not None:
                    domains[d.key] = d.free
                else:
                    domains[n.inv.nvlink_domain] = n.gpu_free
    fit = 100.0 * job.demand / sum(domains.values()) if domains else 100.0
    rank = _shared_rank(job, pool, assign) if pool is not None and not pool.slices else 0
    k = len(job.wished)
    topo = (
        100.0
        if k == 0 or (pool is not None and pool.slices)
        else (0.0 if rank is None else 100.0 * (k - rank) / k)
    )
    return Plan(cluster, pool, assign, domains, rank, fit, topo)


def _shared_rank(job: JobShape, pool: PoolState, assign: list[dict[str, int]]) -> int | None:
    nodes = [pool.nodes[name] for s in job.gpu_sets for name in assign[s.index]]
    for rank, (level, _) in enumerate(job.wished):
        if level == "nvlink":
            if len({n.inv.nvlink_domain for n in nodes}) == 1:
                return rank
        elif level == "rack":
            racks = {n.inv.rack for n in nodes}
            if len(racks) == 1 and None not in racks:
                return rank
        else:
            blocks = {n.inv.block for n in nodes}
            if len(blocks) == 1 and None not in blocks:
                return rank
    return None


def fill(
    ps: PodSetShape,
    nodes: Iterable[NodeState],
    need: int,
    taken: _Taken,
    taken_res: _TakenRes,
    out: dict[str, int],
    *,
    check_taints: bool = False,
    exclude: Set[str] = frozenset(),
) -> int:
    """Put up to ``need`` pods of ``ps`` on ``nodes`` in order; returns how many fit.

    A node takes as many pods as its free GPUs and other free resources allow, minus what this
    job already took (``taken``/``taken_res``, updated here).
    """
    g = ps.gpus
    other = ps.other
    sel = ps.selector
    remaining = need
    for n in nodes:
        name = n.name
        if exclude and name in exclude:
            continue
        if g:
            f = n.gpu_free - taken.get(name, 0)
            k = f // g
            if k <= 0:
                continue
        else:
            if not n.offers:
                continue
            k = remaining
        if sel:
            labels = n.inv.labels
            if any(labels.get(a) != b for a, b in sel):
                continue
        if check_taints and n.inv.taints and not tolerates_all(ps.tolerations, n.inv.taints):
            continue
        if other:
            used = taken_res.get(name)
            for r, a in other:
                avail = n.free(r)
                if used:
                    avail -= used.get(r, 0)
                q = avail // a
                if q < k:
                    k = q
                    if k <= 0:
                        break
            if k <= 0:
                continue
        if k > remaining:
            k = remaining
        out[name] = out.get(name, 0) + k
        if g:
            taken[name] = taken.get(name, 0) + k * g
        if other:
            t = taken_res.setdefault(name, {})
            for r, a in other:
                t[r] = t.get(r, 0) + a * k
        remaining -= k
        if remaining == 0:
            break
    return need - remaining


def _fill_all(
    job: JobShape,
    nodes_for: Iterable[NodeState] | None,
    pool: PoolState,
    assign: list[dict[str, int]],
    taken: _Taken,
    taken_res: _TakenRes,
    order: str,
    exclude: Set[str] = frozenset(),
) -> bool:
    for s in job.gpu_sets:
        if nodes_for is not None:
            nodes: Iterable[NodeState] = nodes_for
        elif order == "fewest":
            nodes = _fewest_domains(pool, s.gpus)
        else:
            nodes = pool.iter_nodes_ascending(s.gpus)
        got = fill(s, nodes, s.count, taken, taken_res, assign[s.index], exclude=exclude)
        if got < s.count:
            return False
    return True


def _fewest_domains(pool: PoolState, min_free: int) -> Iterator[NodeState]:
    """Nodes so that the job touches as few NVLink domains as it can: most free first."""
    for g in pool.iter_groups_descending("nvlink"):
        for n in reversed(g.offering()):
            if n.gpu_free >= min_free:
                yield n
    if pool.single_count:
        for n in pool.iter_nodes_descending(min_free):
            if n.domain is None:
                yield n


def _group_quick(job: JobShape, g: GroupState) -> bool:
    counts = g.counts
    for s in job.gpu_sets:
        gp = s.gpus
        slots = 0
        for f in range(gp, len(counts)):
            slots += counts[f] * (f // gp)
        if slots < s.count:
            return False
    return True


def _coarser_ok(job: JobShape, level: str, nodes: list[NodeState]) -> bool:
    """Required levels coarser than ``level`` hold too (all nodes share one rack/block)."""
    for req in job.required:
        if req == level or req == "nvlink":
            continue
        if level == "block" and req == "rack":
            continue
        vals = {(n.inv.rack if req == "rack" else n.inv.block) for n in nodes}
        if len(vals) != 1 or None in vals:
            return False
    return True


def _try_in(
    job: JobShape,
    nodes: list[NodeState],
    pool: PoolState,
    level: str,
    assign: list[dict[str, int]],
    taken: _Taken,
    taken_res: _TakenRes,
    exclude: Set[str],
) -> bool:
    if not _fill_all(job, nodes, pool, assign, taken, taken_res, "bestfit", exclude):
        for a in assign:
            a.clear()
        taken.clear()
        taken_res.clear()
        return False
    if job.required and not _coarser_ok(
        job, level, [pool.nodes[x] for s in job.gpu_sets for x in assign[s.index]]
    ):
        for a in assign:
            a.clear()
        taken.clear()
        taken_res.clear()
        return False
    return True


def _grouped(
    job: JobShape,
    pool: PoolState,
    level: str,
    assign: list[dict[str, int]],
    taken: _Taken,
    taken_res: _TakenRes,
    exclude: Set[str],
) -> bool:
    """Best-fit group of ``level`` that holds every GPU pod (single-node domains included)."""
    demand = job.demand
    best_key: tuple[int, bool, str] | None = None
    best: tuple[list[dict[str, int]], _Taken, _TakenRes] | None = None
    groups: Iterable[GroupState] = pool.iter_groups_ascending(level, demand)
    if level == "nvlink" and len(job.gpu_sets) == 1 and pool.groups["nvlink"]:
        # the slot index names the best-fit domain directly; scan only if its nodes then
        # fail on CPU, memory or node selector
        s = job.gpu_sets[0]
        first = pool.best_domain(s.gpus, s.count)
        if first is None:
            groups = ()
        elif _try_in(job, first.offering(), pool, level, assign, taken, taken_res, exclude):
            groups = ()
            best_key = (first.free, first.free == first.cap, first.key)
            best = _take(assign, taken, taken_res)
    for g in groups:
        if not _group_quick(job, g):
            continue
        if _try_in(job, g.offering(), pool, level, assign, taken, taken_res, exclude):
            best_key = (g.free, g.free == g.cap, g.key)
            best = _take(assign, taken, taken_res)
            break
    if level == "nvlink" and pool.single_count:
        for n in pool.iter_nodes_ascending(demand):
            if n.domain is not None or n.name in exclude:
                continue
            key = (n.gpu_free, n.gpu_free == n.gpu_alloc, n.inv.nvlink_domain)
            if best_key is not None and key >= best_key:
                break
            if _try_in(job, [n], pool, level, assign, taken, taken_res, exclude):
                return True
    if best is None:
        return False
    for a, b in zip(assign, best[0], strict=True):
        a.update(b)
    taken.update(best[1])
    taken_res.update(best[2])
    return True


def _take(
    assign: list[dict[str, int]], taken: _Taken, taken_res: _TakenRes
) -> tuple[list[dict[str, int]], _Taken, _TakenRes]:
    """Move the overlay's content out (and clear it) so the next candidate starts fresh."""
    out = ([dict(a) for a in assign], dict(taken), {k: dict(v) for k, v in taken_res.items()})
    for a in assign:
        a.clear()
    taken.clear()
    taken_res.clear()
    return out


def _place_other(
    job: JobShape,
    cluster: ClusterState,
    assign: list[dict[str, int]],
    taken: _Taken,
    taken_res: _TakenRes,
    exclude: Set[str],
) -> str | None:
    """Pod sets without whole GPUs: MIG slices best fit, CPU pods first fit by node name."""
    for s in job.other_sets:
        if s.extended:
            r0 = s.extended[0]
            names = cluster.extended.get(r0, ())
            cands = [cluster.nodes[x] for x in names]
            cands.sort(key=lambda n: (n.free(r0), n.name))
            nodes: Iterable[NodeState] = cands
        else:
            nodes = (cluster.nodes[x] for x in cluster.names)
        got = fill(
            s, nodes, s.count, taken, taken_res, assign[s.index], check_taints=True, exclude=exclude
        )
        if got < s.count:
            what = ", ".join(f"{r}={a}" for r, a in s.other) or "no resources"
            return (
                f"pod set {s.name}: only {got} of {s.count} pods ({what} each) find a node "
                "with room"
            )
    return None


def _no_room_reason(job: JobShape, pool: PoolState) -> str:
    shape = " + ".join(f"{s.count}x{s.gpus} GPUs" for s in job.gpu_sets)
    first = job.attempts[0]
    if first.level is not None and all(a.level is not None for a in job.attempts):
        # the level that binds: a Required one (a single pod is tried only as one NVLink
        # domain, but a Required rack or block still limits which nodes it may use)
        lv = next(
            (x for x in ("nvlink", "rack", "block") if x in job.required),
            job.attempts[-1].level or "nvlink",
        )
        best = max(pool.max_group_free(lv), pool.max_free if lv == "nvlink" else 0)
        what = {"nvlink": "NVLink domain", "rack": "rack", "block": "block"}[lv]
        return (
            f"no {what} of {pool.product} has room for {shape} (largest free {what}: {best} GPUs)"
        )
    return (
        f"{pool.product} nodes cannot hold {shape} together "
        f"({pool.free} GPUs free, at most {pool.max_free} on one node; node selector, CPU or "
        "memory may also limit)"
    )
