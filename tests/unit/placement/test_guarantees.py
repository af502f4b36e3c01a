"""Quota and preemption guarantees, one test per defect of issue 23 (each failed before the fix).

A team's nominal GPUs are its own (priority never overrides another queue's nominal), a queue
that borrows loses only what it borrowed, lending limits hold three levels deep, a broken
queue's running jobs stay charged to its parents, unqueued work (the default queue) can be
reclaimed from, nobody can preempt back (no ping-pong), and each queue's ``spec.preemption``
decides within the rules (docs/placement.md, "Who may preempt whom, when").
"""

from __future__ import annotations

from typing import Any

import pytest
from placement_builders import fleet, hgx_cluster, job
from preemption_builders import hgx_full_of_jobs
from pydantic import ValidationError
from quota_builders import H100, gpu_queue, org_with_two_teams, quota

from gpufed.api.queue import GPUQueue, QueuePreemption
from gpufed.placement import Policy, place
from gpufed.placement.preemption import (
    NoPreemption,
    PreemptionPlan,
    Preemptor,
    QuotaView,
    Running,
)
from gpufed.placement.quota import (
    QueueTree,
    QuotaGate,
    QuotaUsage,
    admit,
    build_tree,
    ceiling,
    usage_rows,
)
from gpufed.placement.victims import plan_preemption

NOW = 10_000.0


def _usage(runs: list[Running]) -> QuotaUsage:
    u = QuotaUsage()
    for r in runs:
        u.charge(r.uid, r.queue or "default", H100, r.gpu_count)
    return u


def _member_of(queue: str, priority: int = 0, **extra: Any) -> Any:
    def attrs(uid: str, i: int) -> dict[str, Any]:
        return {"priority": priority, "queue": queue, "started_at": 0.0, **extra}

    return attrs


def _plan(tree: QueueTree, runs: list[Running], state: Any, req: Any) -> Any:
    return plan_preemption(
        Preemptor(req), runs, fleet(state), Policy(), NOW, quota=QuotaView(tree, _usage(runs))
    )


def _req(queue: str, gpus: int = 8, priority: int = 0, name: str = "p") -> Any:
    r = job(name, gpus=gpus, nvlink="Required", priority=priority)
    return r.model_copy(update={"queue": queue, "submitted_at": NOW - 1})


# --- priority never overrides another queue's nominal ------------------------------------------


def test_higher_priority_does_not_preempt_a_team_within_its_nominal() -> None:
    # team-b runs 16 of its nominal 16 at priority 0; team-a (nominal 0) asks at priority 1000
    tree = build_tree(
        [
            gpu_queue("research", namespaces=()),
            gpu_queue("team-a", quota(H100, 0), parent="research"),
            gpu_queue("team-b", quota(H100, 16), parent="research"),
        ]
    )
    state, runs = hgx_full_of_jobs("a", nodes=2, per_node=2, attrs=_member_of("team-b"))
    out = _plan(tree, runs, state, _req("team-a", priority=1000))
    assert isinstance(out, NoPreemption), out


def test_a_queue_borrowing_4_loses_one_4_gpu_job_not_two() -> None:
    # team-b: nominal 12, runs four 4-GPU jobs (16): it borrows 4. team-a asks for 8 on one node.
    tree = org_with_two_teams(nominal=12)
    state, runs = hgx_full_of_jobs("a", nodes=2, per_node=2, attrs=_member_of("team-b", 900))
    assert isinstance(_plan(tree, runs, state, _req("team-a", gpus=8)), NoPreemption)
    out = _plan(tree, runs, state, _req("team-a", gpus=4))
    assert isinstance(out, PreemptionPlan), out
    assert [v.why for v in out.victims] == ["reclaim"]


def test_the_preempted_queue_cannot_preempt_back() -> None:
    tree = org_with_two_teams(nominal=8)
    state, runs = hgx_full_of_jobs("a", nodes=2, per_node=2, attrs=_member_of("team-b", 900))
    out = _plan(tree, runs, state, _req("team-a", gpus=8))
    assert isinstance(out, PreemptionPlan), out
    gone = set(out.victim_uids)
    # the state that results: the victims gone, team-a's job running on their node
    node = next(iter(out.nodes))
    winner = Running("p", "a", 0, {node: 8}, NOW, queue="team-a")
    after = [r for r in runs if r.uid not in gone] + [winner]
    state2, _ = hgx_full_of_jobs("a", nodes=2, per_node=2, attrs=_member_of("team-b", 900))
    # the rebuilt member shows every node busy, as the member reports it after the swap
    back = plan_preemption(
        Preemptor(_req("team-b", gpus=4, priority=900, name="b-again")),
        after,
        fleet(state2),
        Policy(),
        NOW,
        quota=QuotaView(tree, _usage(after)),
    )
    assert isinstance(back, NoPreemption), back
    assert "p" not in str(back.members)


# --- quota arithmetic -------------------------------------------------------------------------


def test_lending_limit_holds_three_levels_deep() -> None:
    # org (16) -> div (no entry) -> team-a (8, lendingLimit 0), team-b (8)
    tree = build_tree(
        [
            gpu_queue("org", quota(H100, 16), namespaces=()),
            gpu_queue("div", parent="org", namespaces=()),
            gpu_queue("team-a", quota(H100, 8, lending=0), parent="div"),
            gpu_queue("team-b", quota(H100, 8), parent="div"),
        ]
    )
    u = QuotaUsage()
    u.charge("b1", "team-b", H100, 8)
    refused = admit(tree, u, "team-b", H100, 1)
    assert not refused.ok
    assert "team-b uses 8 of 8" in refused.reason
    assert admit(tree, u, "team-a", H100, 8).ok


def test_a_broken_queue_stays_charged_to_its_parents() -> None:
    org = gpu_queue("org", quota(H100, 64), namespaces=())
    a = gpu_queue("team-a", quota(H100, 64), parent="org")
    b = gpu_queue("team-b", quota(H100, 64), parent="org")
    u = QuotaUsage()
    u.charge("a1", "team-a", H100, 64)
    assert not admit(build_tree([org, a, b]), u, "team-b", H100, 1).ok
    # a second queue lists team-a's namespace: team-a (and the thief) break
    thief = gpu_queue("thief", parent="org", namespaces=("team-a",))
    tree = build_tree([org, a, b, thief])
    assert "team-a" in tree.broken
    assert not admit(tree, u, "team-b", H100, 1).ok
    assert [(r.key, r.used) for r in usage_rows(tree, u, "org")] == [(H100, 64)]


def test_ceiling_names_what_a_queue_can_never_exceed() -> None:
    tree = org_with_two_teams(nominal=8, borrowing=4, lending=2)
    # team-a may borrow 4, and team-b keeps back 8 - 2 = 6 of the pooled 16
    assert ceiling(tree, "team-a", H100) == 10
    refused = admit(tree, QuotaUsage(), "team-a", H100, 12)
    assert not refused.ok
    assert "can never be admitted more than 10" in refused.reason
    assert ceiling(tree, "nope", H100) == 0


# --- unqueued work ----------------------------------------------------------------------------


def test_the_default_queue_can_be_reclaimed_from() -> None:
    tree = build_tree([gpu_queue("team-a", quota(H100, 8))])
    state, runs = hgx_full_of_jobs("a", nodes=2, per_node=2, attrs=_member_of("default", 1000))
    out = _plan(tree, runs, state, _req("team-a", gpus=8))
    assert isinstance(out, PreemptionPlan), out
    assert {v.why for v in out.victims} == {"reclaim"}


def test_the_default_queue_cannot_take_a_team_s_nominal_by_priority() -> None:
    tree = build_tree([gpu_queue("team-a", quota(H100, 16))])
    state, runs = hgx_full_of_jobs("a", nodes=2, per_node=2, attrs=_member_of("team-a", 0))
    out = _plan(tree, runs, state, _req("default", gpus=8, priority=1000))
    assert isinstance(out, NoPreemption), out


# --- spec.preemption --------------------------------------------------------------------------


def _tree_with(policy: dict[str, Any], *, on: str = "research") -> QueueTree:
    qs = [
        gpu_queue("research", namespaces=()),
        gpu_queue("team-a", quota(H100, 8), parent="research"),
        gpu_queue("team-b", quota(H100, 8), parent="research"),
    ]
    for q in qs:
        if q.metadata.name == on:
            q.spec.preemption = QueuePreemption.model_validate(policy)
    return build_tree(qs)


def test_a_queue_inherits_its_parents_preemption_policy() -> None:
    tree = _tree_with({"withinQueue": "Never"})
    assert tree.nodes["team-a"].preemption.within_queue == "Never"
    assert tree.nodes["default"].preemption.within_queue == "LowerPriority"


@pytest.mark.parametrize(
    ("policy", "victim_priority", "newer", "expected"),
    [
        ({}, 0, False, True),
        ({}, 5, True, False),
        ({"withinQueue": "Never"}, 0, False, False),
        ({"withinQueue": "LowerOrNewerEqualPriority"}, 5, True, True),
        ({"withinQueue": "LowerOrNewerEqualPriority"}, 5, False, False),
    ],
    ids=["lower", "equal", "never", "equal-newer", "equal-older"],
)
def test_within_queue_priority_decides(
    policy: dict[str, Any], victim_priority: int, newer: bool, expected: bool
) -> None:
    tree = _tree_with(policy)
    submitted = NOW + 5 if newer else 0.0
    state, runs = hgx_full_of_jobs(
        "a",
        nodes=1,
        per_node=1,
        attrs=_member_of("team-a", victim_priority, submitted_at=submitted),
    )
    out = _plan(tree, runs, state, _req("team-a", gpus=8, priority=5))
    assert isinstance(out, PreemptionPlan) is expected, out


@pytest.mark.parametrize(
    ("policy", "victim_priority", "expected"),
    [
        ({}, 900, True),  # Any: whatever their priority
        ({"reclaimWithinParent": "LowerPriority"}, 900, False),
        ({"reclaimWithinParent": "LowerPriority"}, 1, True),
        ({"reclaimWithinParent": "Never"}, 1, False),
    ],
)
def test_reclaim_within_parent(
    policy: dict[str, Any], victim_priority: int, expected: bool
) -> None:
    tree = _tree_with(policy)
    state, runs = hgx_full_of_jobs(
        "a", nodes=2, per_node=1, attrs=_member_of("team-b", victim_priority)
    )
    out = _plan(tree, runs, state, _req("team-a", gpus=8, priority=5))
    assert isinstance(out, PreemptionPlan) is expected, out


@pytest.mark.parametrize(
    ("policy", "victim_priority", "expected"),
    [
        ({}, 1, False),  # Never by default: a borrowing job preempts no other queue
        ({"borrowWithinParent": {"policy": "LowerPriority"}}, 1, True),
        ({"borrowWithinParent": {"policy": "LowerPriority"}}, 5, False),
        ({"borrowWithinParent": {"policy": "LowerPriority", "maxPriorityThreshold": 0}}, 1, False),
    ],
)
def test_borrow_within_parent(policy: dict[str, Any], victim_priority: int, expected: bool) -> None:
    # team-a already runs 8 (its nominal) on one node; team-b borrows on the other three;
    # team-a's next 8 must borrow: only borrowWithinParent may let it preempt team-b
    qs = [
        gpu_queue("research", quota(H100, 32), namespaces=()),
        gpu_queue("team-a", quota(H100, 8), parent="research"),
        gpu_queue("team-b", quota(H100, 8), parent="research"),
    ]
    if policy:
        qs[1].spec.preemption = QueuePreemption.model_validate(policy)
    tree = build_tree(qs)

    def attrs(uid: str, i: int) -> dict[str, Any]:
        queue = "team-a" if i == 0 else "team-b"
        # team-a's own job outranks the preemptor: it is no victim within the queue
        priority = victim_priority if i else 10
        return {"priority": priority, "queue": queue, "started_at": 0.0}

    state, runs = hgx_full_of_jobs("a", nodes=4, per_node=1, attrs=attrs)
    # team-b at 24 of 8 can lose one job and stay at or above its nominal
    out = _plan(tree, runs, state, _req("team-a", gpus=8, priority=5))
    assert isinstance(out, PreemptionPlan) is expected, out
    if expected:
        assert all(v.running.queue == "team-b" for v in out.victims)


def test_bad_policy_values_name_the_field() -> None:
    with pytest.raises(ValidationError, match=r"spec\.preemption\.withinQueue"):
        GPUQueue.model_validate({"spec": {"preemption": {"withinQueue": "Sometimes"}}})
    with pytest.raises(ValidationError, match="maxPriorityThreshold"):
        GPUQueue.model_validate(
            {"spec": {"preemption": {"borrowWithinParent": {"maxPriorityThreshold": 2**31}}}}
        )


def test_a_job_above_its_queues_ceiling_says_so_in_its_decision() -> None:
    """On an empty fleet: the decision names the ceiling at once, not a silent wait."""
    tree = org_with_two_teams(nominal=8, borrowing=4)
    gate = QuotaGate(tree)
    req = job("big", gpus=16, pods=2).model_copy(update={"queue": "team-a"})
    d = place(req, fleet(hgx_cluster("a", 4)), Policy(), 0.0, quota=gate.for_request(req))
    assert not d.placed
    assert "team-a can never be admitted more than 12 (its ceiling)" in d.message
