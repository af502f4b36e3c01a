"""Suspect nodes (gpufed.hub.components.reservations): marked for a cool-down, held off placement meanwhile,
bounded per member, and merged with the backfill's holds."""

from __future__ import annotations

import pytest

from gpufed.hub.components.reservations import MAX_SUSPECTS_PER_MEMBER, SuspectNodes, with_suspects
from gpufed.placement.queue import Hold


def test_a_mark_lasts_the_cool_down_then_expires() -> None:
    s = SuspectNodes(cooldown_s=60.0)
    assert s.mark("m1", ["n1", "n2"], "NodeLost under ns/j", mono=100.0, wall=1e9) == ["n1", "n2"]
    [hold] = s.holds(159.0).values()
    assert (hold.cluster, hold.nodes) == ("m1", frozenset({"n1", "n2"}))
    assert "n1, n2" in hold.reason
    assert [x.node for x in s.of_member("m1", 159.0)] == ["n1", "n2"]
    assert s.holds(160.0) == {}
    assert s.of_member("m1", 160.0) == []


def test_a_zero_cool_down_marks_nothing() -> None:
    s = SuspectNodes(cooldown_s=0.0)
    assert s.mark("m1", ["n1"], "x", mono=0.0, wall=0.0) == []
    assert s.holds(0.0) == {}
    with pytest.raises(ValueError, match="--suspect-node-cooldown"):
        SuspectNodes(cooldown_s=-1.0)


def test_marks_per_member_are_bounded_oldest_first() -> None:
    s = SuspectNodes(cooldown_s=1000.0)
    for i in range(MAX_SUSPECTS_PER_MEMBER + 5):
        s.mark("m1", [f"n{i:04d}"], "x", mono=float(i), wall=0.0)
    kept = s.of_member("m1", 0.0)
    assert len(kept) == MAX_SUSPECTS_PER_MEMBER
    assert "n0000" not in {x.node for x in kept}


def test_suspect_holds_merge_with_backfill_holds() -> None:
    backfill = {
        "m1": Hold("m1", frozenset({"a"}), "kept for big"),
        "m2": Hold("m2", frozenset(), "all"),
    }
    suspect = {
        "m1": Hold("m1", frozenset({"b"}), "suspect"),
        "m3": Hold("m3", frozenset({"c"}), "s"),
    }
    out = with_suspects(backfill, suspect)
    assert out["m1"].nodes == frozenset({"a", "b"})
    assert out["m2"].nodes == frozenset()  # the whole member stays held
    assert out["m3"].nodes == frozenset({"c"})


def test_expire_says_whether_the_fleet_changed() -> None:
    s = SuspectNodes(cooldown_s=10.0)
    s.mark("m1", ["n1"], "x", mono=0.0, wall=0.0)
    assert s.next_expiry() == 10.0
    assert not s.expire(9.0)
    assert s.expire(10.0)
    assert not s.expire(11.0)
    assert s.next_expiry() is None
