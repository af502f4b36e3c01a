"""``place()``: one placement decision for one job over the fleet snapshot.

Called by the hub's scheduling loop (through the queue pass in :mod:`.queue`), by the simulator
and by the benchmark. Pure: no I/O, no clock, no randomness, no logging; it reads the snapshot
and writes only to the memo the snapshot carries (``snapshot.memo``, :mod:`.memo`: static filter
results per fleet generation, plans and bounds per pool version), which changes no answer. The
one exception: an index the snapshot builds on first demand (rack and block orderings, the NVLink
slot index per pod size, :mod:`.index`) is built when a job first asks for it, with the contents
an eager build would have.

Phases:

1. reduce the request to a :class:`~gpufed.placement.shape.JobShape`;
2. static filters (member health, workload kind, cluster selector, member taints, GPU product,
   node taints), memoised per job constraints and fleet generation: the members and pools
   that could take the job at all, pruned in bulk;
3. the ``Quota`` filter (pools of a product the job's queue cannot admit now, when a quota is
   given: :mod:`.quota`); dynamic bound (ResourceFit over each pool's free-GPU histogram) and an upper bound of each
   candidate's score; candidates ordered by the clique tier (:func:`.topocost.clique_tier`:
   NVL72 pools last for jobs that do not need a clique), then that bound, then member name;
4. plan candidates in that order (TopologyFit), scoring each plan; stop as soon as no later
   candidate can beat the best (a later tier never does; branch and bound; with ``explain``
   every candidate is planned);
5. the :class:`~gpufed.api.decision.Decision`: the best plan, or, when none, ``Rejected`` if
   no member could ever hold the job and ``Unschedulable`` otherwise. Rejections are built
   only when the job did not fit or when ``explain`` is set.
"""

from __future__ import annotations

import collections
import operator
from collections.abc import Mapping
from typing import Any, Final

from gpufed.api.decision import (
    ClusterRejection,
    ClusterScore,
    Decision,
    Outcome,
    PodSetAssignment,
    RejectionCode,
)
from gpufed.api.request import PlacementRequest
from gpufed.placement import computedomain as cdrule
from gpufed.placement.filters import is_condition_taint
from gpufed.placement.fit import Plan
from gpufed.placement.index import PoolState
from gpufed.placement.ledger import Ledger
from gpufed.placement.member import ClusterState
from gpufed.placement.memo import PlacementMemo
from gpufed.placement.plugins import (
    Code,
    Plugins,
    Status,
    never_reason,
    plugins_for,
)
from gpufed.placement.policy import Policy
from gpufed.placement.queue import Hold
from gpufed.placement.quota import QUOTA_PLUGIN, JobQuota
from gpufed.placement.scorers import Scored, scored_plan
from gpufed.placement.shape import JobShape
from gpufed.placement.snapshot import FleetSnapshot
from gpufed.placement.topocost import clique_tier, cost_note

#: The plugin name used for members held back by the backfill rule (see :mod:`.queue`).
BACKFILL_PLUGIN: Final = "Backfill"

_STAGE: Final = {
    "Health": 0,
    "WorkloadKind": 1,
    "ClusterSelector": 2,
    "ClusterTaints": 3,
    "GPUProduct": 4,
    "DeviceSelectors": 5,
    "NodeTaints": 6,
    QUOTA_PLUGIN: 7,
    BACKFILL_PLUGIN: 8,
    "ResourceFit": 9,
    "TopologyFit": 10,
}
_NO_POOL: Final = ("", False, (), ())
_CODES: Final[dict[Code, RejectionCode]] = {
    Code.UNSCHEDULABLE: "Unschedulable",
    Code.UNRESOLVABLE: "UnschedulableAndUnresolvable",
    Code.ERROR: "Error",
    Code.SUCCESS: "Unschedulable",
}

Candidate = tuple[ClusterState, PoolState | None]
Failure = tuple[str, Status, PoolState | None]


class StaticCandidates:
    """Memoised result of the static filters for one job-constraint key."""

    __slots__ = ("candidates", "failures")

    def __init__(self, candidates: list[Candidate], failures: dict[str, Failure]) -> None:
        self.candidates = candidates
        self.failures = failures


def place(
    request: PlacementRequest,
    snapshot: FleetSnapshot,
    policy: Policy,
    now: float,
    *,
    explain: bool = False,
    hold: Mapping[str, Hold] | None = None,
    quota: JobQuota | None = None,
) -> Decision:
    """Choose a member cluster (and nodes) for ``request``; see the module docstring.

    ``now``: seconds (wall or simulated), recorded as ``decided_at``. ``explain``: plan every
    candidate and record every rejection even when the job fits. ``hold``: nodes the backfill
    rule keeps for older jobs (member -> :class:`~gpufed.placement.queue.Hold`); this job
    keeps off them (off the whole member when a hold names no nodes). ``quota``: the job's
    ``Quota`` filter (:meth:`gpufed.placement.quota.QuotaGate.for_request`): pools of a GPU
    product its queue cannot admit now are left out, ``Unschedulable`` with the quota's reason.
    Raises nothing for a job that does not fit; a malformed request fails earlier, when the
    :class:`PlacementRequest` is validated.
    """
    # 1. shape
    job = JobShape.of(request)
    plugins = plugins_for(policy)
    # 2. static filters (memoised)
    memo = snapshot.memo
    static = static_candidates(job, snapshot, plugins)
    # 3. dynamic bound, memoised plans, ordering
    dyn = plugins.dynamic_pool_filters
    scorers = plugins.scorers
    total_w = plugins.total_weight
    # the fit key by its memo id: hashed here once, not in every pool's look-up
    fid = memo.key_id(job.fit_key) if job.fit_key is not None else None
    fkey = ("plan", fid) if fid is not None else None
    # the bound holds ResourceAllocation's score, which follows the job's own allocation
    rkey = ("fit-bound", id(plugins), fid, request.allocation)
    # a remembered plan's scores, computed once per pool version: they read the plan, the
    # pool, the fit key's shapes and wishes, the job's allocation mode and the policy's weights
    skey = ("scored", id(plugins), fid, request.allocation)
    ordered: list[_Row] = []
    failures: dict[str, Failure] = {}
    for c, pool in static.candidates:
        name = c.name
        if quota is not None:
            qst = quota.status(pool.product if pool is not None else None)
            if not qst.ok:
                _keep(failures, name, (QUOTA_PLUGIN, qst, pool))
                continue
        held = hold.get(name) if hold else None
        if held is not None and not held.nodes:
            _keep(failures, name, (BACKFILL_PLUGIN, Status(Code.UNSCHEDULABLE, held.reason), pool))
            continue
        if pool is None:
            ub = sum(sc.weight * sc.bound(job, None, None) for sc in scorers) / total_w
            ordered.append((0, -ub, name, _NO_POOL, c, None, None))
            continue
        pmemo = memo.pool(pool)
        tier = clique_tier(job, pool) if policy.keep_cliques else 0
        if fkey is not None and not cdrule.applies(job, c, pool):
            values = pmemo.current()
            if held is None:
                known: Scored | None = values.get(skey)
                if known is not None:
                    ordered.append((tier, -known.total, name, pool.key, c, pool, known))
                    continue
                hit = values.get(fkey)
                if hit is not None:
                    if isinstance(hit, Plan):
                        known = scored_plan(job, hit, scorers, total_w)
                        pmemo.remember(skey, known)
                        ordered.append((tier, -known.total, name, pool.key, c, pool, known))
                    else:
                        _keep(failures, name, hit)
                    continue
            # ResourceFit and the bound read only the pool: remembered whatever the holds
            cached = values.get(rkey)
            if cached is not None:
                if isinstance(cached, float):
                    ordered.append((tier, -cached, name, pool.key, c, pool, None))
                else:
                    _keep(failures, name, cached)
                continue
        bad: Failure | None = None
        for f in dyn:
            st = f.filter(job, c, pool, pmemo)
            if not st.ok:
                bad = (f.name, st, pool)
                break
        if bad is not None:
            _keep(failures, name, bad)
            if fkey is not None:
                pmemo.remember(rkey, bad)
            continue
        ub = sum(sc.weight * sc.bound(job, pool, pmemo) for sc in scorers if sc.weight) / total_w
        if fkey is not None:
            pmemo.remember(rkey, ub)
        ordered.append((tier, -ub, name, pool.key, c, pool, None))
    ordered.sort(key=_ROW_ORDER)
    # 4. plan in bound order (branch and bound)
    # ties go by member name, then pool key, whatever order the memo let plans be made in
    planner = plugins.planner
    best: tuple[int, float, str, Any, Scored] | None = None
    scored: dict[str, tuple[float, Scored, Any]] = {}
    for tier, neg, name, pkey, c, pool, known in ordered:
        if best is not None and not explain:
            ub = -neg
            if tier > best[0] or (
                ub < best[1] or (ub == best[1] and (name, pkey) >= (best[2], best[3]))
            ):
                break
        if known is None:
            held = hold.get(name) if hold else None
            exclude = held.nodes if held is not None else frozenset()
            cd = cdrule.applies(job, c, pool)
            if cd:  # ComputeDomain rules: no clique that holds a domain, at most 18 nodes
                result = cdrule.plan_domain(job, c, pool, exclude, planner, snapshot)
            else:
                result = planner.plan(job, c, pool, exclude)
            plan_memo = (
                memo.pool(pool)
                if pool is not None and fkey is not None and not exclude and not cd
                else None
            )
            if isinstance(result, Status):
                if exclude and held is not None:
                    result = Status(
                        result.code, f"{result.reason}; {_n(len(exclude), 'node')} {held.reason}"
                    )
                _keep(failures, name, (planner.name, result, pool))
                if plan_memo is not None:
                    plan_memo.remember(fkey, (planner.name, result, pool))
                continue
            known = scored_plan(job, result, scorers, total_w)
            if plan_memo is not None:
                plan_memo.remember(fkey, result)
                plan_memo.remember(skey, known)
        total = known.total
        prev = scored.get(name)
        if prev is None or total > prev[0] or (total == prev[0] and pkey < prev[2]):
            scored[name] = (total, known, pkey)
        if best is None or (tier, -total, name, pkey) < (best[0], -best[1], best[2], best[3]):
            best = (tier, total, name, pkey, known)
    # 5. decision
    if best is not None:
        if explain:
            all_failures = dict(static.failures)
            all_failures.update(failures)
            for name in scored:
                all_failures.pop(name, None)
        else:
            all_failures = {}
        winner = (best[1], best[2], best[4])
        return _placed(job, policy, now, winner, scored, all_failures, explain, plugins, snapshot)
    all_failures = dict(static.failures)
    all_failures.update(failures)
    return _not_placed(job, policy, now, all_failures, snapshot, plugins)


_Row = tuple[int, float, str, Any, ClusterState, PoolState | None, "Scored | None"]


#: rows sort by clique tier, best bound first, member name, pool key (a C-level key function)
_ROW_ORDER: Final = operator.itemgetter(0, 1, 2, 3)


def explain(
    request: PlacementRequest, snapshot: FleetSnapshot, policy: Policy, now: float
) -> Decision:
    """``place()`` with every member scored or rejected, for ``gpufed explain``."""
    return place(request, snapshot, policy, now, explain=True)


def _keep(into: dict[str, Failure], cluster: str, failure: Failure) -> None:
    """Keep, per member, the failure from the latest stage (its most telling reason)."""
    prev = into.get(cluster)
    if prev is None or _STAGE.get(failure[0], 11) > _STAGE.get(prev[0], 11):
        into[cluster] = failure


def static_candidates(job: JobShape, snapshot: FleetSnapshot, plugins: Plugins) -> StaticCandidates:
    """The members and pools that pass the static filters for ``job`` (and why the others do
    not), memoised per job-constraint key and fleet generation (``place()`` and
    :func:`gpufed.placement.holds.hold_for` share it)."""
    memo = snapshot.memo
    key = (job.static_key, id(plugins))
    hit = memo.recall(snapshot.generation, key)
    if isinstance(hit, StaticCandidates):
        return hit
    candidates: list[Candidate] = []
    failures: dict[str, Failure] = {}
    static_pool_filters = tuple(f for f in plugins.pool_filters if f.static)
    for c in snapshot.clusters():
        bad: Failure | None = None
        for f in plugins.cluster_filters:
            st = f.filter(job, c)
            if not st.ok:
                bad = (f.name, st, None)
                break
        if bad is not None:
            failures[c.name] = bad
            continue
        if not job.gpu_sets:
            candidates.append((c, None))
            continue
        found = False
        for pool in c.pools_sorted():
            pbad: Failure | None = None
            for pf in static_pool_filters:
                st = pf.filter(job, c, pool, memo.pool(pool))
                if not st.ok:
                    pbad = (pf.name, st, pool)
                    break
            if pbad is None:
                candidates.append((c, pool))
                found = True
            else:
                _keep(failures, c.name, pbad)
        if not found and c.name not in failures:
            failures[c.name] = (
                "GPUProduct",
                Status(Code.UNRESOLVABLE, "member has no nodes with whole GPUs"),
                None,
            )
        elif found:
            failures.pop(c.name, None)
    result = StaticCandidates(candidates, failures)
    memo.remember(snapshot.generation, key, result)
    return result


def _shape_text(job: JobShape) -> str:
    if not job.gpu_sets:
        return f"{sum(s.count for s in job.sets)} pods without GPUs"
    parts = [f"{_n(s.count, 'pod')} x {_n(s.gpus, 'GPU')}" for s in job.gpu_sets]
    return f"{' + '.join(parts)} ({_n(job.demand, 'GPU')})"


def _n(k: int, word: str) -> str:
    return f"{k} {word}{'' if k == 1 else 's'}"


def _placed(
    job: JobShape,
    policy: Policy,
    now: float,
    best: tuple[float, str, Scored],
    scored: dict[str, tuple[float, Scored, Any]],
    failures: dict[str, Failure],
    explained: bool,
    plugins: Plugins,
    snapshot: FleetSnapshot,
) -> Decision:
    total, cluster, won = best
    plan = won.plan
    scorers = plugins.scorers
    parts = {sc.name: round(p, 3) for sc, p in zip(scorers, won.parts, strict=True)}
    pod_sets = tuple(
        PodSetAssignment.model_construct(
            name=s.name, requests=s.requests, nodes=dict(sorted(plan.assign[s.index].items()))
        )
        for s in job.sets
    )
    details: tuple[ClusterScore, ...] = ()
    if explained:
        details = tuple(
            ClusterScore.model_construct(
                cluster=n,
                score=round(v[0], 3),
                gpu_product=v[1].plan.pool.product if v[1].plan.pool is not None else None,
                parts={sc.name: round(p, 3) for sc, p in zip(scorers, v[1].parts, strict=True)},
            )
            for n, v in sorted(scored.items(), key=lambda kv: (-kv[1][0], kv[0]))
        )
    pool = plan.pool
    nodes = {n for a in plan.assign for n in a}
    domains = tuple(sorted(plan.domains))
    product = pool.product if pool is not None else None
    message = (
        f"placed {_shape_text(job)} on {cluster}"
        + (f" ({product})" if product else "")
        + f": {_n(len(nodes), 'node')}"
        + (f", {_n(len(domains), 'NVLink domain')}" if domains else "")
        + f", score {total:.1f}"
        + cost_note(job, plan, policy.keep_cliques, won.cost)
    )
    return Decision.model_construct(
        job=job.request.job,
        uid=job.request.uid,
        outcome=Outcome.PLACED,
        cluster=cluster,
        gpu_product=product,
        nvlink_domains=domains,
        pod_sets=pod_sets,
        score=round(total, 3),
        score_parts=parts,
        cluster_scores={n: round(v[0], 3) for n, v in sorted(scored.items())},
        scores=details,
        rejections=_rejections(job, failures, snapshot, plugins) if explained else (),
        message=message,
        explained=explained,
        policy=policy.name,
        decided_at=now,
        compute_domain=cdrule.gets_domain(job, plan.cluster, plan),
    )


def _rejections(
    job: JobShape, failures: dict[str, Failure], snapshot: FleetSnapshot, plugins: Plugins
) -> tuple[ClusterRejection, ...]:
    out = []
    for cluster in sorted(failures):
        plugin, st, _ = failures[cluster]
        code, reason = st.code, st.reason
        if code is Code.UNSCHEDULABLE:
            never = _member_never(job, snapshot.cluster(cluster), plugins, snapshot.memo)
            if never is not None:
                code = Code.UNRESOLVABLE
                if plugin in ("ResourceFit", "TopologyFit"):
                    reason = never
                else:
                    reason = f"{reason}; and it could never hold the job: {never}"
        out.append(
            ClusterRejection.model_construct(
                cluster=cluster, plugin=plugin, code=_CODES[code], reason=reason
            )
        )
    return tuple(out)


def _member_never(
    job: JobShape, c: ClusterState, plugins: Plugins, memo: PlacementMemo
) -> str | None:
    """Why member ``c`` could never hold ``job`` whatever its health, load or holds (None if
    some pool of it could)."""
    if not c.nodes:
        return None  # nothing reported yet: unknown, not never
    for f in plugins.cluster_filters:
        st = f.filter(job, c)
        if st.code is Code.UNRESOLVABLE:
            return st.reason
    if not job.gpu_sets:
        return never_reason(job, c, None, None)
    first: str | None = None
    for pool in c.pools_sorted():
        pmemo = memo.pool(pool)
        bad = next(
            (
                x
                for x in (
                    pf.filter(job, c, pool, pmemo) for pf in plugins.pool_filters if pf.static
                )
                if not x.ok
            ),
            None,
        )
        if bad is not None and bad.code is Code.UNRESOLVABLE:
            first = first or bad.reason
            continue
        why = never_reason(job, c, pool, pmemo)
        if why is None:
            return None
        first = first or why
    if any(_condition_tainted(p) for p in c.pools.values()):
        # a node-condition taint (not-ready, unreachable) puts its node in a pool of its own
        # while the condition lasts; judged as one pool, the nodes might hold the job together
        # once it clears (found by the chaos soak: one GB200 tray unreachable made a 2-tray
        # NVLink gang "never" fit)
        return _member_never(job, _without_condition_taints(c), plugins, PlacementMemo())
    return first or "member has no nodes with whole GPUs"


def _condition_tainted(pool: PoolState) -> bool:
    return any(is_condition_taint(t) for t in pool.taints)


def _without_condition_taints(c: ClusterState) -> ClusterState:
    """A copy of member ``c`` whose nodes carry no node-condition taint (O(its nodes): built
    only for a job that every pool of ``c`` turned away while some node has one)."""
    healed = ClusterState(c.name)
    healed.labels, healed.taints, healed.health = c.labels, c.taints, c.health
    healed.served_kinds, healed.agent_version = c.served_kinds, c.agent_version
    healed.bulk_add(
        (
            n.inv.model_copy(
                update={"taints": tuple(t for t in n.inv.taints if not is_condition_taint(t))}
            )
            for n in c.nodes.values()
        ),
        Ledger(),
    )
    return healed


def _not_placed(
    job: JobShape,
    policy: Policy,
    now: float,
    failures: dict[str, Failure],
    snapshot: FleetSnapshot,
    plugins: Plugins,
) -> Decision:
    rejections = _rejections(job, failures, snapshot, plugins)
    shape = _shape_text(job)
    if not rejections:
        outcome = Outcome.UNSCHEDULABLE
        message = f"waiting: no member clusters yet to hold {shape}"
    elif any(r.code == Code.UNSCHEDULABLE.value for r in rejections):
        outcome = Outcome.UNSCHEDULABLE
        closest = min(
            (r for r in rejections if r.code == Code.UNSCHEDULABLE.value),
            key=lambda r: (-_STAGE.get(r.plugin, 11), r.cluster),
        )
        message = (
            f"waiting: no member can hold {shape} now; closest: {closest.cluster} "
            f"({closest.plugin}: {closest.reason})"
        )
    else:
        outcome = Outcome.REJECTED
        first = min(rejections, key=lambda r: (-_STAGE.get(r.plugin, 11), r.cluster))
        # Which filters turned the members away: a product or selector mismatch on every
        # member must not read like a capacity problem of one of them.
        by_plugin = collections.Counter(r.plugin for r in rejections)
        tally = ", ".join(f"{p} {n}" for p, n in sorted(by_plugin.items()))
        message = (
            f"rejected: no member of the fleet could ever hold {shape} "
            f"(all {len(rejections)} members rejected: {tally}); "
            f"{first.cluster}: {first.reason}"
        )
    return Decision.model_construct(
        job=job.request.job,
        uid=job.request.uid,
        outcome=outcome,
        cluster=None,
        gpu_product=None,
        nvlink_domains=(),
        pod_sets=(),
        score=None,
        score_parts={},
        cluster_scores={},
        scores=(),
        rejections=rejections,
        message=message,
        explained=True,
        policy=policy.name,
        decided_at=now,
    )
