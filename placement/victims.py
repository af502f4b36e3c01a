"""Victim search (pure): the cheapest running jobs to stop so a waiting job is placed.

:func:`plan_preemption` is the entry point of preemption for the hub's scheduling cycle, the
simulator (``--preemption on``) and the benchmark (``--preemption``); several preemptors of one
pass go through :class:`~gpufed.placement.preemptcycle.PreemptionCycle`. The vocabulary
(:class:`~gpufed.placement.preemption.Running`, ``Preemptor``, ``PreemptionPlan``, the cost
and the guard rails) is in :mod:`.preemption`; docs/placement.md, "Preemption".

**The rule.** For each member that has candidate victims, the cheapest set of running jobs
whose removal lets ``place()`` place the preemptor *in that member* (the real ``place()`` on
the snapshot with the victims' GPUs freed, :mod:`.whatif`: same NVLink domain / clique, nodes
and topology rules); then the member and set with the least cost: the highest victim priority
lowest first, then the least work lost, then the fewest victims, then member name and victim
UIDs. Nothing is planned when the job would not fit even with every candidate gone, nor when
it fits without preemption.

**The search, per member** (bounded): candidates are the eligible jobs on nodes of a GPU
product the job accepts; they are filed by the block the job must sit in (its NVLink domain
for a one-pod or ``nvlink: Required`` job, else its rack / block when required, else the whole
member); per block the cheapest victims are counted in until the block's free GPUs reach the
job's demand, the blocks of the whole fleet are ordered by that estimate and the
``max_blocks`` cheapest are tried; in each
the greedy set grows until the what-if places the job, then every victim whose removal still
lets it fit is dropped (most expensive first; freeing more never makes a job not fit, so one
pass leaves every victim necessary). At most ``max_whatifs`` what-if placements per decision
(:attr:`~gpufed.placement.preemption.PreemptionPlan.whatifs` says how many ran).

The snapshot is borrowed: each what-if changes it and puts it back before returning (not
thread-safe, like ``place()``).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpufed.api.decision import Decision, Outcome
from gpufed.placement.engine import place
from gpufed.placement.member import ClusterState
from gpufed.placement.policy import Policy
from gpufed.placement.preemption import (
    NoPreemption,
    PreemptionPlan,
    PreemptionRules,
    Preemptor,
    QuotaView,
    Running,
    Victim,
    preemptible,
    work_lost_gpu_s,
)
from gpufed.placement.queue import Hold
from gpufed.placement.quota import QueueTree, QuotaUsage, admit, demand_of, usage_rows
from gpufed.placement.shape import JobShape
from gpufed.placement.snapshot import FleetSnapshot
from gpufed.placement.whatif import OnlyMember, freed


def _cycle_back(p: Preemptor, run: Running, rules: PreemptionRules, now: float) -> bool:
    """Whether ``run`` preempted ``p`` less than ``cooldown_s`` ago (it may not go back)."""
    return any(e.by == run.uid and now - e.at < rules.cooldown_s for e in p.preempted)


def _set_key(
    cluster: str, victims: Sequence[Victim]
) -> tuple[int, float, int, str, tuple[str, ...]]:
    """Cost order of a plan: highest victim priority, work lost, victims, member, UIDs."""
    return (
        max(v.running.priority for v in victims),
        round(sum(v.cost_gpu_s for v in victims), 6),
        len(victims),
        cluster,
        tuple(sorted(v.running.uid for v in victims)),
    )


def _victim_key(v: Victim) -> tuple[int, float, str]:
    return (v.running.priority, v.cost_gpu_s, v.running.uid)


class _Search:
    """One decision's search state: the inputs and the what-if budget."""

    def __init__(
        self,
        p: Preemptor,
        snapshot: FleetSnapshot,
        policy: Policy,
        rules: PreemptionRules,
        now: float,
        hold: Mapping[str, Hold] | None,
        quota: QuotaView | None,
        placed: Sequence[Decision],
        gone: Sequence[Running],
    ) -> None:
        self.p = p
        self.gone = list(gone)
        self.job = JobShape.of(p.request)
        self.snapshot = snapshot
        self.policy = policy
        self.rules = rules
        self.now = now
        self.hold = hold
        self.quota = quota
        self.placed = placed
        self.whatifs = 0
        self.names = snapshot.cluster_names
        self._within: dict[tuple[str, str], bool] = {}

    # --- eligibility ------------------------------------------------------------------------
    def victim(self, run: Running, product: str | None) -> Victim | str:
        """The run as a victim of this preemptor, or why it is not one."""
        why = preemptible(run, self.rules, self.now)
        if why is not None:
            return why
        if self.p.preempted and _cycle_back(self.p, run, self.rules, self.now):
            return f"preempted {self.p.request.job} less than {self.rules.cooldown_s:.0f} s ago"
        cost = work_lost_gpu_s(run, self.now)
        if run.priority < self.p.request.priority:
            return Victim(run, cost, "priority")
        if self.rules.reclaim and product is not None and self._reclaims(run, product):
            return Victim(run, cost, "reclaim")
        return f"priority {run.priority} is not below {self.p.request.priority}"

    def _reclaims(self, run: Running, product: str) -> bool:
        """The preemptor's queue stays within its nominal of ``product`` with the job, and
        ``run``'s queue is another one that borrows ``product``."""
        if self.quota is None:
            return False
        tree, usage = self.quota.tree, self.quota.usage
        mine = self.p.request.queue or tree.default_queue
        theirs = run.queue or tree.default_queue
        if theirs == mine:
            return False
        within = self._within.get((mine, product))
        if within is None:
            gpus = demand_of(self.p.request, product).get(product, 0)
            row = _row(tree, usage, mine, product)
            within = self._within[(mine, product)] = row is not None and row[1] + gpus <= row[0]
        if not within:
            return False
        row = _row(tree, usage, theirs, product)
        return row is not None and row[1] > row[0]

    # --- what-if ----------------------------------------------------------------------------
    def fits(self, cluster: str, victims: Sequence[Victim]) -> Decision | None:
        """``place()`` in ``cluster`` with ``victims`` gone (and the cycle's earlier plans
        applied); the decision when it places the job there."""
        self.whatifs += 1
        runs = [v.running for v in victims]
        with freed(self.snapshot, self.gone + runs, self.placed, self.now):
            d = place(
                self.p.request,
                self.snapshot,
                self.policy,
                self.now,
                hold=OnlyMember(cluster, self.names, self.hold),
            )
        if d.outcome != Outcome.PLACED or d.cluster != cluster:
            return None
        if self.quota is not None and not self.admitted(d, runs):
            return None
        return d

    def admitted(self, d: Decision, runs: Sequence[Running]) -> bool:
        """Quota admission of the job once ``runs`` released their quota."""
        assert self.quota is not None
        tree = self.quota.tree
        q = self.p.request.queue or tree.default_queue
        if tree.unlimited(q) and q not in tree.broken:
            return True
        usage = copy.deepcopy(self.quota.usage)
        for r in [*self.gone, *runs]:
            usage.release(r.uid)
        for key, amount in sorted(demand_of(self.p.request, d.gpu_product).items()):
            if not admit(tree, usage, q, key, amount).ok:
                return False
        return True

    @property
    def spent(self) -> bool:
        return self.whatifs >= self.rules.max_whatifs


def _row(tree: QueueTree, usage: QuotaUsage, queue: str, product: str) -> tuple[int, int] | None:
    """(nominal, used) of the quota entry ``product`` resolves to at ``queue``."""
    node = tree.nodes.get(queue)
    entry = node.entry(product) if node is not None else None
    if entry is None:
        return None
    for r in usage_rows(tree, usage, queue):
        if r.key == entry.gpu_product:
            return (r.nominal, r.used)
    return None


def _level(job: JobShape) -> str | None:
    """The block the job must sit in: nvlink / rack / block, or None (the whole member)."""
    return next(
        (lv for lv in ("nvlink", "rack", "block") if lv in job.required),
        "nvlink" if job.gpu_pods == 1 else None,
    )


@dataclass
class _Block:
    key: str
    free: int
    cap: int
    victims: dict[str, Victim] = field(default_factory=dict)
    freed: dict[str, int] = field(default_factory=dict)  # victim uid -> GPUs freed in the block
    #: node -> (its free GPUs, its victims' uids): to order a whole-member block by node
    nodes: dict[str, tuple[int, list[str]]] = field(default_factory=dict)


def _blocks(
    s: _Search, c: ClusterState, runs: Iterable[Running], reasons: dict[str, str]
) -> list[_Block]:
    """Candidate victims of member ``c`` filed by block (module docstring)."""
    level = _level(s.job)
    products = s.job.products
    blocks: dict[str, _Block] = {}
    prio = s.p.request.priority
    for run in runs:
        if run.priority >= prio and s.quota is None:
            continue  # cheap reject before any look-up: no reclaim without queues
        for name, gpus in run.gpus.items() if len(run.gpus) == 1 else sorted(run.gpus.items()):
            n = c.nodes.get(name)
            if n is None or n.pool is None or n.pool.slices or gpus <= 0:
                continue
            if products is not None and n.pool.product not in products:
                continue
            v = s.victim(run, n.pool.product)
            if isinstance(v, str):
                reasons[run.uid] = v
                break
            if level is None:
                key, free, cap = "", 0, 0
            else:
                g = getattr(n, level if level != "nvlink" else "domain")
                if g is not None:
                    key, free, cap = g.key, g.free, g.cap
                elif level == "nvlink":
                    key, free, cap = n.domain_id, n.gpu_free, n.gpu_alloc
                else:
                    continue  # a node without that label can never hold a job that needs it
            b = blocks.get(key)
            if b is None:
                b = blocks[key] = _Block(key, free, cap)
            b.victims[run.uid] = v
            b.freed[run.uid] = b.freed.get(run.uid, 0) + gpus
            if level is None:
                b.nodes.setdefault(name, (n.gpu_free, []))[1].append(run.uid)
    if level is None and "" in blocks:
        b = blocks[""]
        pools = [p for p in c.pools.values() if not p.slices]
        if products is not None:
            pools = [p for p in pools if p.product in products]
        b.free = sum(p.free for p in pools)
        b.cap = sum(p.cap for p in pools)
    return [b for b in blocks.values() if b.cap >= s.job.demand]


def _by_node(b: _Block, pod_gpus: int) -> list[Victim]:
    """A whole-member block's victims in node order: per node, the cheapest victims that free
    one pod of the largest size there; nodes by the cost of that; then the rest. GPUs freed
    across many half-used nodes hold no pod, so the cost order alone would take far too many."""
    heads: list[tuple[tuple[int, float, int, str, tuple[str, ...]], list[Victim]]] = []
    tail: list[Victim] = []
    seen: set[str] = set()
    for name, (free, uids) in sorted(b.nodes.items()):
        vs = sorted((b.victims[u] for u in uids), key=_victim_key)
        k = 0
        while k < len(vs) and free < pod_gpus:
            free += vs[k].running.gpus.get(name, 0)
            k += 1
        if free >= pod_gpus and k:
            heads.append((_set_key(name, vs[:k]), vs[:k]))
            tail += vs[k:]
        else:
            tail += vs
    order: list[Victim] = []
    for _, vs in sorted(heads, key=lambda h: h[0]):
        for v in vs:
            if v.running.uid not in seen:
                seen.add(v.running.uid)
                order.append(v)
    for v in sorted(tail, key=_victim_key):
        if v.running.uid not in seen:
            seen.add(v.running.uid)
            order.append(v)
    return order


def _greedy(b: _Block, demand: int, pod_gpus: int) -> tuple[list[Victim], list[Victim]] | None:
    """(the cheapest victims that bring the block's free GPUs to ``demand``, the rest in cost
    order), or None when even all of them would not. A whole-member block goes node by node
    (:func:`_by_node`)."""
    order = _by_node(b, pod_gpus) if b.nodes else sorted(b.victims.values(), key=_victim_key)
    free = b.free
    for i, v in enumerate(order):
        free += b.freed[v.running.uid]
        if free >= demand:
            return order[: i + 1], order[i + 1 :]
    return None


def _search_block(
    s: _Search, cluster: str, b: _Block, chosen: list[Victim], rest: list[Victim]
) -> tuple[list[Victim], Decision] | None:
    """Grow ``chosen`` from ``rest`` until the what-if fits, then prune (module docstring).

    Growing doubles the number of victims added until the job fits, then bisects back to the
    shortest prefix of the cost order that fits (freeing more never makes a job not fit), so
    O(log victims) what-ifs; pruning skips the what-if for a victim without which the
    block's free GPUs would fall below the job's demand (it cannot fit, the victim stays)."""
    order = chosen + rest
    lo = len(chosen)  # shorter prefixes cannot reach the demand's GPU count
    d = s.fits(cluster, order[:lo])
    if d is None:
        fail, step, hit = lo, 1, None
        while hit is None and fail < len(order) and not s.spent:
            n = min(len(order), fail + step)
            d = s.fits(cluster, order[:n])
            if d is None:
                fail, step = n, step * 2
            else:
                hit = n
        if hit is None:
            return None
        while hit - fail > 1 and not s.spent:
            mid = (fail + hit) // 2
            d2 = s.fits(cluster, order[:mid])
            if d2 is None:
                fail = mid
            else:
                hit, d = mid, d2
        lo = hit
    assert d is not None
    chosen = order[:lo]
    # prune, most expensive first: by monotonicity one pass leaves every victim necessary
    inside = all(b.freed[v.running.uid] == v.running.gpu_count for v in chosen)
    for v in sorted(chosen, key=_victim_key, reverse=True):
        if s.spent or len(chosen) == 1:
            break
        trial = [x for x in chosen if x is not v]
        if inside and b.free + sum(b.freed[x.running.uid] for x in trial) < s.job.demand:
            continue
        d2 = s.fits(cluster, trial)
        if d2 is not None:
            chosen, d = trial, d2
    return chosen, d


def plan_preemption(
    preemptor: Preemptor,
    running: Iterable[Running] | Mapping[str, Sequence[Running]],
    snapshot: FleetSnapshot,
    policy: Policy,
    now: float,
    *,
    rules: PreemptionRules | None = None,
    hold: Mapping[str, Hold] | None = None,
    quota: QuotaView | None = None,
    gone: Sequence[Running] = (),
    placed: Sequence[Decision] = (),
) -> PreemptionPlan | NoPreemption:
    """The cheapest preemption that lets ``preemptor`` be placed, or why there is none.

    ``running``: every running or placed job (victims-to-be; jobs of any priority, the rules
    choose), as one iterable or already grouped by member (member -> jobs; what a caller
    deciding often keeps, since grouping is O(running jobs)). ``now``: seconds, the clock of ``started_at`` and the events. ``hold``: the
    backfill holds of the pass (the job keeps off them in the what-if too). ``quota``: for
    reclaim and for admission once the victims are gone (None: no queues). ``gone``: the
    victims already chosen this cycle (taken off the fleet, never chosen again); ``placed``:
    the what-if decisions of earlier preemptors this cycle (their GPUs stay held). Call it for a job ``place()`` left
    ``Unschedulable``; raises nothing for a job that cannot preempt (the answer says why).
    """
    rules = rules or PreemptionRules()
    uid = preemptor.request.uid
    if not preemptor.may_preempt:
        return NoPreemption(uid, "its PriorityClass has preemptionPolicy Never")
    s = _Search(preemptor, snapshot, policy, rules, now, hold, quota, placed, gone)
    s.whatifs += 1
    with freed(snapshot, gone, placed, now):
        fits = place(preemptor.request, snapshot, policy, now, hold=hold)
    if fits.outcome == Outcome.PLACED and (quota is None or s.admitted(fits, ())):
        return NoPreemption(uid, f"fits without preemption ({fits.message})", whatifs=1)
    skip = {r.uid for r in gone} | {uid}
    by_member: Mapping[str, Sequence[Running]]
    if isinstance(running, Mapping):
        by_member = running  # kept by member by the caller: no O(running) pass per decision
    else:
        grouped: dict[str, list[Running]] = {}
        for run in running:
            grouped.setdefault(run.cluster, []).append(run)
        by_member = grouped
    products = s.job.products
    # members that could never hold the job, whatever ran there (product, taints, selector,
    # node shapes): the fleet-wide place() above already said so, at no extra cost
    never = {
        r.cluster: r.reason for r in fits.rejections if r.code == "UnschedulableAndUnresolvable"
    }
    best: tuple[tuple[int, float, int, str, tuple[str, ...]], list[Victim], Decision, str] | None
    best = None
    members: dict[str, str] = {}
    everywhere: list[tuple[Any, str, str, tuple[list[Victim], list[Victim]], _Block]] = []
    for cluster in sorted(by_member):
        if cluster not in snapshot.cluster_names:
            continue
        c = snapshot.cluster(cluster)
        if products is not None and not any(p.product in products for p in c.pools.values()):
            continue
        if cluster in never:
            members[cluster] = f"could never hold the job: {never[cluster]}"
            continue
        if not c.health.ready:
            members[cluster] = "member is not Ready"
            continue
        reasons: dict[str, str] = {}
        estimates = []
        runs = (r for r in by_member[cluster] if r.uid not in skip)
        # free GPUs as the cycle's earlier plans leave them (not nested in a what-if: freeing
        # a victim twice would take its GPUs off twice)
        with freed(snapshot, s.gone, placed, now):
            blocks = {b.key: b for b in _blocks(s, c, runs, reasons)}
        for b in blocks.values():
            g = _greedy(b, s.job.demand, s.job.max_gpus)
            if g is not None:
                estimates.append((_set_key(cluster, g[0]), b.key, g))
        if not estimates:
            members[cluster] = "no block of the job's GPUs frees enough with eligible victims" + (
                f" ({len(reasons)} running jobs not eligible)" if reasons else ""
            )
            continue
        for key, bkey, g in estimates:
            everywhere.append((key, bkey, cluster, g, blocks[bkey]))
        members[cluster] = "not searched: cheaper blocks elsewhere"
    # the cheapest blocks of the whole fleet by their estimate, at most max_blocks of them
    everywhere.sort(key=lambda e: (e[0], e[1]))
    found: dict[str, tuple[int, float, int, str, tuple[str, ...]]] = {}
    for _key, _bkey, cluster, (chosen, rest), block in everywhere[: rules.max_blocks]:
        if s.spent:
            break
        r = _search_block(s, cluster, block, list(chosen), list(rest))
        if r is None:
            if cluster not in found:
                members[cluster] = "the job does not fit even with the candidate victims gone"
            continue
        k = _set_key(cluster, r[0])
        if cluster not in found or k < found[cluster]:
            found[cluster] = k
            members[cluster] = f"{len(r[0])} victims, {k[1]:.0f} GPU-s lost"
        if best is None or k < best[0]:
            best = (k, r[0], r[1], cluster)
    if best is None:
        reason = "no member can place the job by preempting lower-priority or borrowing jobs"
        if s.spent:
            reason += f" (stopped after {s.whatifs} what-if placements)"
        return NoPreemption(uid, reason, members, s.whatifs)
    key, victims, decision, cluster = best
    victims = sorted(victims, key=_victim_key)
    nodes = frozenset(n for v in victims for n in v.running.gpus)
    cost = sum(v.cost_gpu_s for v in victims)
    names = ", ".join(v.running.job or v.running.uid for v in victims)
    reason = (
        f"preempting {len(victims)} job(s) in {cluster} ({names}; priority at most {key[0]}, "
        f"{cost / 3600:.2f} GPU-hours of work lost) frees "
        + (", ".join(decision.nvlink_domains) or f"{len(nodes)} node(s)")
        + f" for {preemptor.request.job} (priority {preemptor.request.priority})"
    )
    return PreemptionPlan(
        preemptor=uid,
        cluster=cluster,
        victims=tuple(victims),
        nodes=nodes,
        domains=decision.nvlink_domains,
        decision=decision,
        cost_gpu_s=cost,
        reason=reason,
        whatifs=s.whatifs,
    )
