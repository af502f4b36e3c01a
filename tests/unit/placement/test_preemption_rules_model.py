"""Who may preempt whom, checked against the independent quota reference (Hypothesis).

Random queue trees (2-4 levels, random limits), a full HGX member whose nodes run one or two
jobs of random queues and priorities, and a random 8-GPU preemptor. Every plan must keep the
rules of docs/placement.md ("Who may preempt whom, when"), judged by :mod:`quota_reference`
(its own arithmetic, never the product's):

- a victim of the preemptor's own queue has a lower priority;
- a victim of another queue comes from a queue that, with each ancestor below the common one,
  uses more than its nominal, and the preemptor's queue stays within its nominal with the job
  (default ``reclaimWithinParent: Any``, ``borrowWithinParent: Never``);
- the victims together leave each such queue above its nominal until its last victim;
- the state after the plan admits the preemptor (no load raised above its cap);
- no ping-pong: afterwards the preemptor's queue is not above its nominal towards any victim's
  queue, so none of them may reclaim from it;
- completeness: when one whole-node victim satisfies all of this, a plan is found.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from placement_builders import fleet, job, member
from preemption_builders import busy_node, running
from quota_builders import H100
from quota_reference import Job, Reference
from test_quota_model import PRODUCTS, _gpu_queues, trees

from gpufed.placement import Policy
from gpufed.placement.preemption import PreemptionPlan, Preemptor, QuotaView
from gpufed.placement.quota import QuotaUsage, build_tree
from gpufed.placement.victims import plan_preemption

NOW = 10_000.0


def _upto(ref: Reference, queue: str, other: str) -> list[str]:
    theirs = set(ref.path(other))
    out = []
    for n in ref.path(queue):
        if n in theirs:
            break
        out.append(n)
    return out or [queue]  # an ancestor of the other: its own usage is judged


@st.composite
def scenarios(draw: Any) -> dict[str, Any]:
    specs = draw(trees())
    queues = [*sorted(specs), "default"]
    nodes = draw(st.integers(1, 3))
    per_node = draw(st.sampled_from((1, 2)))
    jobs = [
        (f"n{i}-j{k}", f"n{i}", draw(st.sampled_from(queues)), draw(st.integers(0, 3)))
        for i in range(nodes)
        for k in range(per_node)
    ]
    return {
        "specs": specs,
        "jobs": jobs,
        "per_node": per_node,
        "queue": draw(st.sampled_from(queues)),
        "priority": draw(st.integers(0, 3)),
    }


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_plans_keep_who_may_preempt_whom(sc: dict[str, Any]) -> None:
    specs, per_node = sc["specs"], sc["per_node"]
    g = 8 // per_node
    tree = build_tree(_gpu_queues(specs))
    by_node: dict[str, list[tuple[str, int]]] = {}
    runs = []
    usage = QuotaUsage()
    for uid, node, queue, prio in sc["jobs"]:
        by_node.setdefault(node, []).append((uid, g))
        runs.append(running(uid, "m", {node: g}, priority=prio, queue=queue))
        usage.charge(uid, queue, H100, g)
    state = member("m", [busy_node(n, js) for n, js in sorted(by_node.items())])
    q, prio = sc["queue"], sc["priority"]
    req = job("p", gpus=8, nvlink="Required", priority=prio).model_copy(update={"queue": q})
    out = plan_preemption(
        Preemptor(req), runs, fleet(state), Policy(), NOW, quota=QuotaView(tree, usage)
    )
    ref_jobs = [Job(uid, queue, H100, g) for uid, _, queue, _ in sc["jobs"]]
    ref = Reference(specs, ref_jobs)
    meta = {uid: (queue, p) for uid, _, queue, p in sc["jobs"]}

    if isinstance(out, PreemptionPlan):
        victims = set(out.victim_uids)
        taken: dict[str, list[int]] = {}
        for uid in victims:
            w, vp = meta[uid]
            if w == q:
                assert vp < prio, f"{uid} of {q} at {vp} is not below {prio}"
                continue
            for n in _upto(ref, w, q):
                assert ref.used(n, H100) > ref.guaranteed(n, H100), (
                    f"{uid}: queue {n} is within its nominal: priority overrode quota"
                )
                taken.setdefault(n, []).append(g)
            for n in _upto(ref, q, w):
                assert ref.used(n, H100) + 8 <= ref.guaranteed(n, H100), (
                    f"{q} must borrow, and borrowWithinParent is Never"
                )
        for n, sizes in taken.items():
            assert ref.used(n, H100) - sum(sizes) + max(sizes) > ref.guaranteed(n, H100), (
                f"queue {n} loses more than it borrowed"
            )
        left = [j for j in ref_jobs if j.uid not in victims]
        before = Reference(specs, left)
        after = Reference(specs, [*left, Job("p", q, H100, 8)])
        for n in after.accepted():
            for k in PRODUCTS:  # A100: a product no queue lists (its "*" pools)
                assert after.load(n, k) <= max(before.load(n, k), after.cap(n, k)), (n, k)
        for uid in victims:
            w = meta[uid][0]
            if w != q:  # no ping-pong: the preemptor's queue does not borrow towards w
                assert any(
                    after.used(n, H100) <= after.guaranteed(n, H100) for n in _upto(after, q, w)
                ), f"{w} could reclaim from {q} at once"
        return

    if per_node != 1 or q in ref.broken:
        return
    # completeness: one whole-node victim that every rule allows means a plan exists
    for uid, _, w, vp in sc["jobs"]:
        if w in ref.broken:
            continue
        if w == q:
            ok = vp < prio
        else:
            ok = all(ref.used(n, H100) > ref.guaranteed(n, H100) for n in _upto(ref, w, q)) and all(
                ref.used(n, H100) + 8 <= ref.guaranteed(n, H100) for n in _upto(ref, q, w)
            )
        left = [j for j in ref_jobs if j.uid != uid]
        before = Reference(specs, left)
        after = Reference(specs, [*left, Job("p", q, H100, 8)])
        if ok and not before.violations(PRODUCTS) and not after.violations(PRODUCTS):
            raise AssertionError(f"no plan, but {uid} of {w} (priority {vp}) may go: {out}")
