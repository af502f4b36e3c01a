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
from gpufed.api.queue import DEFAULT_PREEMPTION
from gpufed.placement.engine import place
from gpufed.placement.estimatebook import EstimateBook, served
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
from gpufed.placement.quota import KeyView, admit, demand_of
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


def _newer(run: Running, submitted_at: float) -> bool:
    """Whether ``run`` was submitted after the preemptor (``LowerOrNewerEqualPriority``)."""
    return (run.submitted_at if run.submitted_at is not None else run.started_at) > submitted_at


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
        self._views: dict[str, KeyView] = {}
        self._above: dict[tuple[str, str], str] = {}
        self._within_cache: dict[tuple[str, str], bool] = {}
        #: victim uid -> the GPU product it was judged on (the set rule reads it)
        self._product: dict[str, str] = {}
        #: victims eligible only because the preemptor borrows (borrowWithinParent)
        self._borrow: set[str] = set()
        #: with queues, the preemptor's queue (None: no queues) and its ``spec.preemption``
        self.queue: str | None = None
        self.preemption = DEFAULT_PREEMPTION
        if quota is not None:
            self.queue = p.request.queue or quota.tree.default_queue
            node = quota.tree.nodes.get(self.queue)
            if node is not None:
                self.preemption = node.preemption
        #: with queues, the preemptor's queue when its ``withinQueue`` lets it preempt lower
        #: priorities there (a job of that queue below its priority then needs no full rule)
        self.own_queue = self.queue if self.preemption.within_queue != "Never" else None

    # --- eligibility (docs/placement.md, "Who may preempt whom, when") ----------------------
    def victim(self, run: Running, product: str | None) -> Victim | str:
        """The run as a victim of this preemptor, or why it is not one."""
        why = preemptible(run, self.rules, self.now)
        if why is not None:
            return why
        if self.p.preempted and _cycle_back(self.p, run, self.rules, self.now):
            return f"preempted {self.p.request.job} less than {self.rules.cooldown_s:.0f} s ago"
        cost = work_lost_gpu_s(run, self.now)
        mine = self.p.request.priority
        if self.quota is None:  # no queues: priority decides
            if run.priority < mine:
                return Victim(run, cost, "priority")
            return f"priority {run.priority} is not below {mine}"
        tree = self.quota.tree
        q = self.p.request.queue or tree.default_queue
        theirs = run.queue or tree.default_queue
        policy = self.preemption
        if theirs == q:
            rule = policy.within_queue
            if rule == "Never":
                return f"queue {q} sets spec.preemption.withinQueue: Never"
            if run.priority < mine or (
                rule == "LowerOrNewerEqualPriority"
                and run.priority == mine
                and _newer(run, self.p.request.submitted_at)
            ):
                return Victim(run, cost, "priority")
            return f"priority {run.priority} is not below {mine}"
        if product is None:
            return "its GPUs have no product to judge quota by"
        if theirs not in tree.nodes:
            return f"its queue {theirs} is not active: its jobs keep their GPUs until it is fixed"
        self._product[run.uid] = product
        above = self._borrowing(theirs, q, product)
        if above is not None:
            return f"priority never overrides another queue's nominal quota: {above}"
        if self._within(q, theirs, product):
            reclaim = policy.reclaim_within_parent if self.rules.reclaim else "Never"
            if reclaim == "Any" or (reclaim == "LowerPriority" and run.priority < mine):
                return Victim(run, cost, "reclaim")
            return f"queue {q} sets spec.preemption.reclaimWithinParent: {reclaim}" + (
                f" and priority {run.priority} is not below {mine}" if reclaim != "Never" else ""
            )
        b = policy.borrow_within_parent
        if b.policy == "Never":
            return (
                f"{self.p.request.job} must borrow and queue {q} sets "
                "spec.preemption.borrowWithinParent.policy: Never"
            )
        if run.priority >= mine:
            return f"priority {run.priority} is not below {mine} (borrowing preempts lower only)"
        if b.max_priority_threshold is not None and run.priority > b.max_priority_threshold:
            return (
                f"priority {run.priority} is above maxPriorityThreshold {b.max_priority_threshold}"
            )
        self._borrow.add(run.uid)
        return Victim(run, cost, "priority")

    def _view(self, product: str) -> KeyView:
        hit = self._views.get(product)
        if hit is None:
            assert self.quota is not None
            hit = self._views[product] = KeyView(self.quota.tree, self.quota.usage, product)
        return hit

    def _upto(self, queue: str, other: str) -> list[str]:
        """``queue`` and its ancestors below the first one it shares with ``other`` (the
        whole path to the root when they share none; ``queue`` alone when it is an ancestor
        of ``other``: its own usage is what is judged)."""
        assert self.quota is not None
        tree = self.quota.tree
        theirs = {n.name for n in tree.path(other)}
        out = []
        for n in tree.path(queue):
            if n.name in theirs:
                break
            out.append(n.name)
        return out or [queue]

    def _borrowing(self, theirs: str, mine: str, product: str) -> str | None:
        """None when ``theirs`` and each of its ancestors below the common one with ``mine``
        use more than their nominal of ``product`` (they borrow); else which one does not."""
        hit = self._above.get((theirs, product))
        if hit is None:
            view = self._view(product)
            hit = ""
            for name in self._upto(theirs, mine):
                if name not in view.tree.nodes:
                    continue
                used, nominal = view.used(name), view.guaranteed(name)
                if used <= nominal:
                    hit = f"queue {name} uses {used} of its nominal {nominal} {product}"
                    break
            self._above[(theirs, product)] = hit
        return hit or None

    def _within(self, mine: str, theirs: str, product: str) -> bool:
        """The preemptor's queue, and each ancestor below the common one with ``theirs``,
        stays within its nominal of ``product`` with the job (it reclaims, not borrows)."""
        hit = self._within_cache.get((theirs, product))
        if hit is None:
            view = self._view(product)
            gpus = demand_of(self.p.request, product).get(product, 0)
            hit = all(
                view.used(n) + gpus <= view.guaranteed(n)
                for n in self._upto(mine, theirs)
                if n in view.tree.nodes
            )
            self._within_cache[(theirs, product)] = hit
        return hit

    def allowed(self, victims: Sequence[Victim]) -> bool:
        """The set-level quota rule: removing these victims together leaves each other queue
        they come from (and each of its ancestors below the common one) above its nominal
        until its last victim goes (Kueue's "while it still borrows"), and at or above it
        when the preemptor borrows (so nobody can preempt back: no ping-pong)."""
        if self.quota is None:
            return True
        tree = self.quota.tree
        q = self.p.request.queue or tree.default_queue
        taken: dict[tuple[str, str], list[int]] = {}
        borrow: set[tuple[str, str]] = set()
        for v in victims:
            theirs = v.running.queue or tree.default_queue
            if theirs == q:
                continue
            product = self._product.get(v.running.uid)
            if product is None:
                continue
            for name in self._upto(theirs, q):
                taken.setdefault((name, product), []).append(v.running.gpu_count)
                if v.running.uid in self._borrow:
                    borrow.add((name, product))
        for (name, product), sizes in taken.items():
            view = self._view(product)
            if name not in view.tree.nodes:
                continue
            left = view.used(name) - sum(sizes)
            nominal = view.guaranteed(name)
            if (name, product) in borrow:
                if left < nominal:
                    return False
            elif left + max(sizes) <= nominal:
                return False
        return True

    # --- what-if ----------------------------------------------------------------------------
    def fits(self, cluster: str, victims: Sequence[Victim]) -> Decision | None:
        """``place()`` in ``cluster`` with ``victims`` gone (and the cycle's earlier plans
        applied); the decision when it places the job there."""
        if not self.allowed(victims):
            return None
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
    book: EstimateBook | None = None,
) -> PreemptionPlan | NoPreemption:
    """The cheapest preemption that lets ``preemptor`` be placed, or why there is none.

    ``running``: every running or placed job (victims-to-be; jobs of any priority, the rules
    choose): best a :class:`~gpufed.placement.runindex.RunningIndex` over ``snapshot`` that the
    caller keeps (a decision then reads only the blocks its job could use); an iterable, or
    jobs grouped by member, are indexed first, O(running jobs). ``now``: seconds, the clock of ``started_at`` and the events. ``hold``: the
    backfill holds of the pass (the job keeps off them in the what-if too). ``quota``: for
    reclaim and for admission once the victims are gone (None: no queues). ``gone``: the
    victims already chosen this cycle (taken off the fleet, never chosen again); ``placed``:
    the what-if decisions of earlier preemptors this cycle (their GPUs stay held). ``book``: the
    cycle's kept block estimates over ``running`` (a :class:`~.estimatebook.EstimateBook`:
    only the blocks the earlier plans changed are estimated again; the plan is the same). Call it for a job ``place()`` left
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
        entry = book.begin(s, skip) if book is not None and book.index is index else None
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
            found_here = (
                book.estimates(entry, s, c, skip, reasons, bound)
                if entry is not None and book is not None
                else estimates(s, c, index, skip, reasons, bound)
            )
            if not found_here and cluster not in bound.passed:
                members[cluster] = (
                    "no block of the job's GPUs frees enough with eligible victims"
                    + (f" ({len(reasons)} running jobs not eligible)" if reasons else "")
                )
                continue
            everywhere += found_here
            members[cluster] = "not searched: cheaper blocks elsewhere"
        # the cheapest blocks of the whole fleet by their estimate, at most max_blocks of them
        if entry is not None and book is not None:
            book.end(entry, s)
        tried = [
            (e.cluster, e.block(s, snapshot.cluster(e.cluster), skip, {}))
            for e in served(cheapest(everywhere, rules.max_blocks))
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
