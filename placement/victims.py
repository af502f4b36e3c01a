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
member), read from the running jobs' index by block (:mod:`.runindex`; :mod:`.victimblocks`
files them and estimates each block); per block the cheapest victims are counted in until the
block's free GPUs reach the job's demand, the blocks of the whole fleet are ordered by that
estimate and the ``max_blocks`` cheapest are tried (:mod:`.victimsets`): exactly, best-first
over every subset of the blocks with at most 12 candidates (the first set that fits is the
cheapest and minimal), and by a bounded search (greedy prefix, prune, swaps) over larger
blocks or when the exact one stops early. Every set is first asked of :meth:`Search.allowed`.
At most ``max_whatifs`` what-if placements per decision
(:attr:`~gpufed.placement.preemption.PreemptionPlan.whatifs` says how many ran,
:attr:`~gpufed.placement.preemption.PreemptionPlan.search` which search found the plan).

The snapshot is borrowed: each what-if changes it and puts it back before returning (not
thread-safe, like ``place()``).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence

from gpufed.api.decision import Decision, Outcome
from gpufed.placement.engine import place
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
from gpufed.placement.runindex import RunningIndex
from gpufed.placement.shape import JobShape
from gpufed.placement.snapshot import FleetSnapshot
from gpufed.placement.victimblocks import (
    Bound,
    Estimate,
    SetKey,
    cheapest,
    estimates,
    victim_key,
)
from gpufed.placement.victimsets import search
from gpufed.placement.whatif import OnlyMember, freed


def _cycle_back(p: Preemptor, run: Running, rules: PreemptionRules, now: float) -> bool:
    """Whether ``run`` preempted ``p`` less than ``cooldown_s`` ago (it may not go back)."""
    return any(e.by == run.uid and now - e.at < rules.cooldown_s for e in p.preempted)


class Search:
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
        #: place() placed the job before any preemption (it then waits on quota only)
        self.fit_before = False
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

    def allowed(self, victims: Sequence[Victim]) -> bool:
        """set-level quota rule: whether removing these victims together respects each victim
        queue's nominal; the guarantees change fills it in"""
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


def _runs(running: Iterable[Running] | Mapping[str, Sequence[Running]]) -> Iterable[Running]:
    if isinstance(running, Mapping):
        return (r for rs in running.values() for r in rs)
    return running


def plan_preemption(
    preemptor: Preemptor,
    running: Iterable[Running] | Mapping[str, Sequence[Running]] | RunningIndex,
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
    choose): best a :class:`~gpufed.placement.runindex.RunningIndex` over ``snapshot`` that the
    caller keeps (a decision then reads only the blocks its job could use); an iterable, or
    jobs grouped by member, are indexed first, O(running jobs). ``now``: seconds, the clock of ``started_at`` and the events. ``hold``: the
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
    s = Search(preemptor, snapshot, policy, rules, now, hold, quota, placed, gone)
    s.whatifs += 1
    with freed(snapshot, gone, placed, now):
        fits = place(preemptor.request, snapshot, policy, now, hold=hold)
    if fits.outcome == Outcome.PLACED and (quota is None or s.admitted(fits, ())):
        return NoPreemption(uid, f"fits without preemption ({fits.message})", whatifs=1)
    s.fit_before = fits.outcome == Outcome.PLACED
    skip = {r.uid for r in gone} | {uid}
    index = running if isinstance(running, RunningIndex) else RunningIndex(snapshot, _runs(running))
    products = s.job.products
    # members that could never hold the job, whatever ran there (product, taints, selector,
    # node shapes): the fleet-wide place() above already said so, at no extra cost
    never = {
        r.cluster: r.reason for r in fits.rejections if r.code == "UnschedulableAndUnresolvable"
    }
    best: tuple[SetKey, list[Victim], Decision, str] | None = None
    members: dict[str, str] = {}
    everywhere: list[Estimate] = []
    known = set(snapshot.cluster_names)
    bound = Bound(rules.max_blocks)
    # free GPUs as the cycle's earlier plans leave them (not nested in a what-if: freeing a
    # victim twice would take its GPUs off twice)
    with freed(snapshot, s.gone, placed, now):
        for cluster in index.members:
            if cluster not in known:
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
            found_here = estimates(s, c, index, skip, reasons, bound)
            if not found_here and cluster not in bound.passed:
                members[cluster] = (
                    "no block of the job's GPUs frees enough with eligible victims"
                    + (f" ({len(reasons)} running jobs not eligible)" if reasons else "")
                )
                continue
            everywhere += found_here
            members[cluster] = "not searched: cheaper blocks elsewhere"
        # the cheapest blocks of the whole fleet by their estimate, at most max_blocks of them
        tried = [
            (e.cluster, e.block(s, snapshot.cluster(e.cluster), skip, {}))
            for e in cheapest(everywhere, rules.max_blocks)
        ]
    found = search(s, [(cluster, block, split) for cluster, (block, split) in tried])
    members.update(found.members)
    best = found.best
    if best is None:
        reason = "no member can place the job by preempting lower-priority or borrowing jobs"
        if s.spent:
            reason += f" (stopped after {s.whatifs} what-if placements)"
        return NoPreemption(uid, reason, members, s.whatifs)
    key, victims, decision, cluster = best
    victims = sorted(victims, key=victim_key)
    nodes = frozenset(n for v in victims for n in v.running.gpus)
    cost = sum(v.cost_gpu_s for v in victims)
    names = ", ".join(v.running.job or v.running.uid for v in victims)
    reason = (
        f"preempting {len(victims)} job(s) in {cluster} ({names}; priority at most {key[0]}, "
        f"{cost / 3600:.2f} GPU-hours of work lost) frees "
        + (", ".join(decision.nvlink_domains) or f"{len(nodes)} node(s)")
        + f" for {preemptor.request.job} (priority {preemptor.request.priority}; {found.how})"
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
        search=found.how,
    )
