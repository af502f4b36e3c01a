"""Fair share: decayed usage with fake time, and the queue order it gives (ties by name)."""

from __future__ import annotations

import math

import pytest
from placement_builders import job
from quota_builders import gpu_queue, org_with_two_teams, quota

from gpufed.placement.fairshare import DecayedUsage, fair_sorted
from gpufed.placement.quota import build_tree

DAY = 86_400.0


def test_usage_halves_every_half_life() -> None:
    """8 GPUs for one hour, then nothing: the GPU-seconds halve each half-life."""
    d = DecayedUsage(half_life_s=DAY)
    d.observe(0.0, {"a": 8})
    d.observe(3600.0, {})
    first = d.value("a")
    lam = math.log(2) / DAY
    assert first == pytest.approx(8 * (1 - math.exp(-lam * 3600)) / lam)
    assert first == pytest.approx(8 * 3600, rel=0.02)
    d.observe(3600.0 + DAY, {})
    assert d.value("a") == pytest.approx(first / 2)


def test_bad_half_life_is_refused() -> None:
    """A half-life of zero or less names the field."""
    with pytest.raises(ValueError, match="half_life_s"):
        DecayedUsage(half_life_s=0)


def test_lower_share_goes_first_then_priority_then_arrival() -> None:
    """team-b used less lately, so its jobs go first; within team-a, priority then arrival."""
    tree = org_with_two_teams(8)
    d = DecayedUsage()
    d.observe(0.0, {"team-a": 8, "team-b": 1})
    d.observe(3600.0, {})
    jobs = [
        job("a-old", submitted_at=1).model_copy(update={"queue": "team-a"}),
        job("a-new-urgent", submitted_at=5, priority=10).model_copy(update={"queue": "team-a"}),
        job("b-late", submitted_at=9).model_copy(update={"queue": "team-b"}),
    ]
    order = [r.job for r in fair_sorted(jobs, tree, d.shares(tree))]
    assert order == ["ns/b-late", "ns/a-new-urgent", "ns/a-old"]


def test_weight_divides_usage_and_ties_go_by_name() -> None:
    """Twice the weight, twice the usage: equal shares, and the name breaks the tie."""
    tree = build_tree(
        [
            gpu_queue("zeta", quota(nominal=8), weight=2),
            gpu_queue("alpha", quota(nominal=8), weight=1),
        ]
    )
    d = DecayedUsage()
    d.observe(0.0, {"zeta": 8, "alpha": 4})
    d.observe(600.0, {})
    shares = d.shares(tree)
    assert shares["zeta"] == pytest.approx(shares["alpha"])
    jobs = [
        job("z", submitted_at=0).model_copy(update={"queue": "zeta"}),
        job("a", submitted_at=1).model_copy(update={"queue": "alpha"}),
    ]
    assert [r.job for r in fair_sorted(jobs, tree, shares)] == ["ns/a", "ns/z"]


def test_subtree_usage_counts_for_the_parent() -> None:
    """An organisation's share includes its teams' usage, so a quiet org goes first."""
    tree = build_tree(
        [
            gpu_queue("org-1", namespaces=()),
            gpu_queue("busy", quota(nominal=8), parent="org-1"),
            gpu_queue("org-2", namespaces=()),
            gpu_queue("quiet", quota(nominal=8), parent="org-2"),
        ]
    )
    d = DecayedUsage()
    d.observe(0.0, {"busy": 8})
    d.observe(60.0, {})
    jobs = [
        job("b", submitted_at=0).model_copy(update={"queue": "busy"}),
        job("q", submitted_at=1).model_copy(update={"queue": "quiet"}),
    ]
    assert [r.job for r in fair_sorted(jobs, tree, d.shares(tree))] == ["ns/q", "ns/b"]
