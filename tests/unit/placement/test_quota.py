"""Quota rules: the queue tree and its validation, a job's queue, the ledger, admission with
borrowing, and the Quota filter inside place() and one scheduling pass."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from placement_builders import fleet, hgx_cluster, job
from quota_builders import A100, H100, gpu_queue, org_with_two_teams, quota

from gpufed.api.decision import Decision
from gpufed.api.queue import GPUQueueSpec
from gpufed.api.request import PlacementRequest
from gpufed.placement import Hold, Policy, hold_for, place, schedule_pass
from gpufed.placement.queue import queued_fit_key
from gpufed.placement.quota import (
    QUOTA_PLUGIN,
    QuotaGate,
    QuotaUsage,
    admit,
    build_tree,
    demand_of,
    queue_of,
)

# --- admission and borrowing, table-driven ------------------------------------------------------


def _usage(**by_queue: int) -> QuotaUsage:
    u = QuotaUsage()
    for q, n in by_queue.items():
        name = q.replace("_", "-")
        u.charge(f"running-{name}", name, H100, n)
    return u


ADMISSION = [
    # (what, tree, usage per queue, queue, gpus, ok, borrowed)
    ("within nominal", org_with_two_teams(64), {"team_a": 0}, "team-a", 64, True, 0),
    ("borrows a sibling's unused", org_with_two_teams(64), {}, "team-a", 96, True, 32),
    ("borrowing limit caps it", org_with_two_teams(64, borrowing=16), {}, "team-a", 81, False, 0),
    ("up to the borrowing limit", org_with_two_teams(64, borrowing=16), {}, "team-a", 80, True, 16),
    ("nothing left to borrow", org_with_two_teams(64), {"team_b": 64}, "team-a", 65, False, 0),
    (
        "sibling lends only part",
        org_with_two_teams(64, lending=16),
        {},
        "team-a",
        81,
        False,
        0,
    ),
    ("sibling lends its part", org_with_two_teams(64, lending=16), {}, "team-a", 80, True, 16),
    (
        "org cap binds even within nominal",
        org_with_two_teams(64, org_nominal=100),
        {"team_b": 50},
        "team-a",
        51,
        False,
        0,
    ),
    (
        "org cap leaves room",
        org_with_two_teams(64, org_nominal=100),
        {"team_b": 50},
        "team-a",
        50,
        True,
        0,
    ),
    ("the default queue has no limit", org_with_two_teams(8), {}, "default", 10_000, True, 0),
]


@pytest.mark.parametrize(
    ("tree", "by_queue", "queue", "gpus", "ok", "borrowed"),
    [row[1:] for row in ADMISSION],
    ids=[row[0] for row in ADMISSION],
)
def test_admission_and_borrowing(
    tree: object, by_queue: dict[str, int], queue: str, gpus: int, ok: bool, borrowed: int
) -> None:
    """Each row: a queue tree, the GPUs already charged, and whether a request fits."""
    from gpufed.placement.quota import QueueTree

    assert isinstance(tree, QueueTree)
    a = admit(tree, _usage(**by_queue), queue, H100, gpus)
    assert (a.ok, a.borrowed) == (ok, borrowed), a.reason
    assert bool(a.reason) != ok


def test_refusal_names_usage_need_and_lender() -> None:
    """The reason reads as in the issue: uses X of N key; K more needed; who lends nothing."""
    tree = org_with_two_teams(64, org_nominal=128)
    u = _usage(team_a=60, team_b=68)
    a = admit(tree, u, "team-a", H100, 8)
    assert not a.ok
    assert a.reason.startswith(
        "team-a uses 60 of 64 NVIDIA-H100-80GB-HBM3; 8 more needed; nothing to borrow: "
        "research lends 0"
    ), a.reason


def test_borrowing_limit_refusal_names_the_limit() -> None:
    """A queue at its own borrowing limit says so (not its parent)."""
    a = admit(org_with_two_teams(8, borrowing=2), _usage(team_a=10), "team-a", H100, 1)
    assert "borrowing limit 2 of team-a reached" in a.reason


def test_star_matches_products_not_listed_by_name() -> None:
    """``*`` covers every whole-GPU product the queue does not list; a listed product has
    its own entry; MIG keys never match ``*``."""
    tree = build_tree([gpu_queue("t", quota("*", 10), quota(A100, 2))])
    u = QuotaUsage()
    u.charge("x", "t", H100, 6)
    u.charge("y", "t", "NVIDIA-H200", 4)
    assert not admit(tree, u, "t", "NVIDIA-B200", 1).ok  # 6 + 4 of * used
    assert admit(tree, u, "t", A100, 2).ok
    assert not admit(tree, u, "t", A100, 3).ok
    assert not admit(tree, u, "t", "nvidia.com/mig-1g.10gb", 1).ok  # listed quotas: 0


def test_lowering_quota_below_usage_admits_nothing_new() -> None:
    """A quota lowered below current usage keeps running jobs and admits nothing more."""
    u = _usage(team_a=60)
    assert admit(org_with_two_teams(64, borrowing=0), u, "team-a", H100, 4).ok
    lowered = org_with_two_teams(32, borrowing=0)
    assert not admit(lowered, u, "team-a", H100, 1).ok
    u.release("running-team-a")
    assert admit(lowered, u, "team-a", H100, 32).ok


# --- validation ---------------------------------------------------------------------------------


def test_broken_queues_are_reported_per_queue_and_the_rest_works() -> None:
    """A cycle, an unknown parent, a namespace in two queues and a key listed twice each
    break their queue (and those under it), naming the field; the others admit."""
    queues = [
        gpu_queue("a", quota(nominal=1), parent="b"),
        gpu_queue("b", quota(nominal=1), parent="a"),
        gpu_queue("under-a", quota(nominal=1), parent="a"),
        gpu_queue("orphan", quota(nominal=1), parent="nowhere"),
        gpu_queue("x", quota(nominal=1), namespaces=("shared",)),
        gpu_queue("y", quota(nominal=1), namespaces=("shared",)),
        gpu_queue("dup", quota(nominal=1), quota(nominal=2)),
        gpu_queue("fine", quota(nominal=4)),
    ]
    tree = build_tree(queues, invalid={"bad": "spec.quotas[0].nominal: must be >= 0"})
    assert tree.broken["a"].startswith("spec.parent: cycle a -> b -> a")
    assert tree.broken["b"].startswith("spec.parent: cycle b -> a -> b")
    assert tree.broken["under-a"].startswith("spec.parent: parent queue a is not active")
    assert tree.broken["orphan"].startswith("spec.parent: queue nowhere does not exist")
    assert tree.broken["x"].startswith(
        "spec.namespaces: namespace shared is also listed by queue y"
    )
    assert tree.broken["y"].startswith(
        "spec.namespaces: namespace shared is also listed by queue x"
    )
    assert tree.broken["dup"].startswith(
        "spec.quotas[1].gpuProduct: NVIDIA-H100-80GB-HBM3 is listed twice"
    )
    assert tree.broken["bad"] == "spec.quotas[0].nominal: must be >= 0"
    assert set(tree.nodes) == {"fine", "default"}
    assert admit(tree, QuotaUsage(), "fine", H100, 4).ok
    refused = admit(tree, QuotaUsage(), "a", H100, 1)
    assert not refused.ok
    assert "spec.parent: cycle" in refused.reason
    # jobs of the shared namespace wait with the broken queue's message
    assert queue_of(tree, "shared").queue == "x"


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"quotas": [{"gpuProduct": H100, "nominal": -1}]}, "nominal"),
        ({"quotas": [{"gpuProduct": H100, "nominal": 10**9}]}, "nominal"),
        ({"quotas": [{"gpuProduct": "bad product!", "nominal": 1}]}, "gpuProduct"),
        ({"namespaces": ["Not_A_Namespace"]}, "namespaces"),
        ({"fairShare": {"weight": 0}}, "weight"),
        ({"quotas": [{"gpuProduct": f"P{i}", "nominal": 1} for i in range(65)]}, "quotas"),
    ],
)
def test_spec_bounds_name_the_field(spec: dict[str, object], field: str) -> None:
    """Negative, absurd or malformed values are refused by the model, naming the field."""
    with pytest.raises(ValueError, match=field):
        GPUQueueSpec.model_validate(spec)


# --- a job's queue ------------------------------------------------------------------------------


def test_queue_of_namespace_explicit_and_default() -> None:
    """The namespace's queue; an explicit queue must list the namespace; else the default."""
    tree = org_with_two_teams(8)
    assert queue_of(tree, "team-a").queue == "team-a"
    assert queue_of(tree, "team-a", "team-a").error is None
    assert queue_of(tree, "elsewhere").queue == "default"
    assert queue_of(tree, "elsewhere", "default").error is None
    wrong = queue_of(tree, "team-a", "team-b")
    assert wrong.error is not None
    assert "does not list namespace team-a" in wrong.error
    missing = queue_of(tree, "team-a", "nope")
    assert missing.error is not None
    assert "queue nope does not exist" in missing.error


# --- the ledger ---------------------------------------------------------------------------------


def test_ledger_is_idempotent_by_uid_and_sums_subtrees() -> None:
    """Charging a UID twice counts once; release forgets it; rebuild replaces everything."""
    tree = org_with_two_teams(8)
    u = QuotaUsage()
    u.charge("j1", "team-a", H100, 4)
    u.charge("j1", "team-a", H100, 4)
    u.charge("j2", "team-b", H100, 2)
    assert u.subtree(tree, "research") == {H100: 6}
    u.release("j1")
    u.release("j1")
    assert u.subtree(tree, "research") == {H100: 2}
    u.rebuild(
        [("j2", "team-b", {H100: 2}), ("j3", "team-a", {H100: 1}), ("j3", "team-a", {H100: 1})]
    )
    assert u.subtree(tree, "research") == {H100: 3}
    assert u.jobs() == 2


def test_demand_counts_whole_gpus_per_product_and_mig_by_resource() -> None:
    """Whole GPUs go to the pool's product; MIG slices to their resource name."""
    req = job("m", gpus=2, pods=3, requests={"nvidia.com/gpu": 2, "nvidia.com/mig-1g.10gb": 1})
    assert demand_of(req, H100) == {H100: 6, "nvidia.com/mig-1g.10gb": 3}


# --- inside place() and one pass ----------------------------------------------------------------


POLICY = Policy()


def _in_queue(req: PlacementRequest, queue: str) -> PlacementRequest:
    return req.model_copy(update={"queue": queue})


def test_place_keeps_off_products_the_queue_cannot_admit() -> None:
    """A team with H100 quota only is placed on H100 even where A100 scores as well, and
    waits (Unschedulable, plugin Quota) once its H100 quota is used."""
    snap = fleet(hgx_cluster("a100s", 2, product=A100), hgx_cluster("h100s", 2))
    tree = build_tree([gpu_queue("t", quota(H100, 8, borrowing=0))])
    gate = QuotaGate(tree)
    req = _in_queue(job("j", gpus=8), "t")
    d = place(req, snap, POLICY, 0.0, quota=gate.for_request(req))
    assert d.placed
    assert d.gpu_product == H100
    gate.charge(req, d.gpu_product)
    req2 = _in_queue(job("k", gpus=1), "t")
    d2 = place(req2, snap, POLICY, 0.0, quota=gate.for_request(req2))
    assert not d2.placed
    assert d2.outcome.value == "Unschedulable"
    assert {r.plugin for r in d2.rejections} == {QUOTA_PLUGIN}
    by_member = {r.cluster: r.reason for r in d2.rejections}
    assert by_member["h100s"].startswith("t uses 8 of 8 NVIDIA-H100-80GB-HBM3; 1 more needed")
    assert by_member["a100s"].startswith("t uses 0 of 0 NVIDIA-A100-SXM4-80GB")


def test_a_starving_job_holds_only_nodes_of_a_product_its_queue_admits() -> None:
    """Backfill holds (placement/queue.py) skip the pools its quota refuses: a team with H100
    quota only never holds A100 nodes, which it could not use once drained."""
    snap = fleet(hgx_cluster("a100s", 2, product=A100), hgx_cluster("h100s", 2))
    tree = build_tree([gpu_queue("t", quota(H100, 64, borrowing=0))])
    gate = QuotaGate(tree)
    req = _in_queue(job("big", gpus=8), "t")
    held = hold_for(req, snap, POLICY, gate.for_request(req))
    assert held is not None
    assert held.cluster == "h100s"
    only_a100 = build_tree([gpu_queue("t", quota(A100, 0, borrowing=0), quota(H100, 0))])
    gate = QuotaGate(only_a100)
    assert hold_for(req, snap, POLICY, gate.for_request(req)) is None
    assert hold_for(req, snap, POLICY) is not None  # without the quota it would hold


def test_charges_inside_one_pass_are_seen_by_the_next_job() -> None:
    """Two 8-GPU jobs of a team with 8 GPUs of quota in one pass: one is placed."""
    snap = fleet(hgx_cluster("h", 4))
    tree = build_tree([gpu_queue("t", quota(H100, 8, borrowing=0))])
    gate = QuotaGate(tree)

    def attempt(req: PlacementRequest, hold: Mapping[str, Hold]) -> Decision:
        d = place(req, snap, POLICY, 0.0, hold=hold, quota=gate.for_request(req))
        if d.placed:
            snap.reserve(d, now=0.0, ttl_s=10**9)
            gate.charge(req, d.gpu_product)
        return d

    jobs = [_in_queue(job(n, gpus=8, submitted_at=i), "t") for i, n in enumerate("xy")]
    result = schedule_pass(jobs, 0.0, attempt, lambda r: None, key_of=queued_fit_key)
    assert [r.job for r, _ in result.placed] == ["ns/x"]
    assert gate.usage.subtree(tree, "t") == {H100: 8}


def test_enforce_off_accounts_only() -> None:
    """With enforcement off the filter is absent, usage still counts."""
    gate = QuotaGate(build_tree([gpu_queue("t", quota(H100, 0))]), enforce=False)
    req = _in_queue(job("j", gpus=8), "t")
    assert gate.for_request(req) is None
    gate.charge(req, H100)
    assert gate.usage.own("t") == {H100: 8}


def test_gate_cache_answers_as_a_fresh_admission() -> None:
    """The gate's cached sums, kept across charges and releases, give the same answers as
    admission over the ledger from scratch."""
    tree = org_with_two_teams(16, org_nominal=24, borrowing=4)
    gate = QuotaGate(tree)
    teams = ["team-a", "team-b", "team-a", "team-b", "team-a"]
    placed: list[str] = []
    for i, team in enumerate(teams * 3):
        req = _in_queue(job(f"j{i}", gpus=1 + i % 5), team)
        jq = gate.for_request(req)
        assert jq is not None
        fresh = admit(tree, gate.usage, team, H100, req.gpus)
        assert jq.status(H100).ok == fresh.ok
        if fresh.ok:
            gate.charge(req, H100)
            placed.append(req.uid)
        if i % 4 == 3 and placed:
            gate.release(placed.pop(0))


def test_a_lifted_charge_does_not_count_against_its_job_and_comes_back() -> None:
    """A preemptor's hold is charged to its queue; its own placement attempt lifts it."""
    tree = build_tree([gpu_queue("t", quota(H100, 8, borrowing=0))])
    gate = QuotaGate(tree)
    req = _in_queue(job("p", gpus=8), "t")
    gate.charge(req, H100)  # the hold
    assert not admit(tree, gate.usage, "t", H100, 8).ok
    with gate.lifted(req.uid):
        assert admit(tree, gate.usage, "t", H100, 8).ok
    assert gate.usage.charged(req.uid) == ("t", {H100: 8}), "back when not placed"
    with gate.lifted(req.uid):
        gate.charge(req, H100)  # placed: charged for its placement
    assert gate.usage.charged(req.uid) == ("t", {H100: 8})
    with gate.lifted("nobody"):
        pass
