"""An agent stream is bounded: snapshot parts, total snapshot bytes, nodes per member (over the
snapshot and every delta), nodes per message; past a limit the stream closes with INVALID_ARGUMENT naming it and
nothing is returned to apply, so the stored inventory stays the last good one."""

from __future__ import annotations

import pytest

from gpufed.api.inventory import MAX_NODES_PER_PART
from gpufed.api.protocol import agent_pb2 as pb
from gpufed.api.stream import InventoryDelta, InventorySnapshot
from gpufed.hub.adapters import sessions
from gpufed.hub.adapters.sessions import MAX_SNAPSHOT_PARTS, AgentSession, StreamClosedError
from tests.unit.hub.test_health_and_sessions import nodes, snap


def delta(seq: int, *names: str, removed: tuple[str, ...] = ()) -> pb.AgentMessage:
    return pb.AgentMessage(
        inventory_delta=pb.InventoryDelta(seq=seq, upserts=nodes(*names), removed=removed)
    )


def test_a_snapshot_of_too_many_parts_closes_the_stream() -> None:
    s = AgentSession(cluster="m1")
    for part in range(MAX_SNAPSHOT_PARTS):
        assert s.receive(snap(1, part, False)) is None
    with pytest.raises(StreamClosedError) as err:
        s.receive(snap(1, MAX_SNAPSHOT_PARTS, True, "a"))
    assert err.value.code == "INVALID_ARGUMENT"
    assert f"at most {MAX_SNAPSHOT_PARTS} parts" in err.value.reason


def test_a_snapshot_past_the_byte_budget_closes_the_stream(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sessions, "MAX_SNAPSHOT_BYTES", 60)
    s = AgentSession(cluster="m1")
    assert s.receive(snap(1, 0, False, "a", "b")) is None
    with pytest.raises(StreamClosedError, match="more than 60 bytes"):
        s.receive(snap(1, 1, True, "c", "d", "e", "f"))


def test_nodes_per_member_are_capped_over_the_snapshot_and_every_delta(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sessions, "MAX_NODES_PER_MEMBER", 3)
    s = AgentSession(cluster="m1")
    with pytest.raises(StreamClosedError, match="more than 3 nodes"):
        s.receive(snap(1, 0, True, "a", "b", "c", "d"))
    s = AgentSession(cluster="m1")
    assert isinstance(s.receive(snap(1, 0, True, "a", "b")), InventorySnapshot)
    assert isinstance(s.receive(delta(2, "c")), InventoryDelta)
    assert isinstance(s.receive(delta(3, "d", removed=("a",))), InventoryDelta), "a left"
    with pytest.raises(StreamClosedError, match="would have 4 nodes; at most 3"):
        s.receive(delta(4, "e"))
    assert s.inventory_seq == 3, "the refused delta is not taken"
    assert isinstance(s.receive(delta(4, "b", "c")), InventoryDelta), "known nodes, at the cap"
    with pytest.raises(StreamClosedError, match="would have 4 nodes; at most 3"):
        s.receive(delta(5, "b", "e"))


def test_a_negative_gpu_report_closes_the_stream_and_returns_nothing_to_apply() -> None:
    s = AgentSession(cluster="m1")
    bad = nodes("hgx-0")[0]
    bad.allocatable["nvidia.com/gpu"] = 8
    bad.requested["nvidia.com/gpu"] = -1000
    msg = pb.AgentMessage(
        inventory_snapshot=pb.InventorySnapshot(seq=1, part=0, final=True, nodes=[bad])
    )
    with pytest.raises(StreamClosedError) as err:
        s.receive(msg)
    assert err.value.code == "INVALID_ARGUMENT"
    assert "node 'hgx-0': requested[nvidia.com/gpu]: -1000 is outside 0..4096" in err.value.reason
    assert s.inventory_seq is None


def test_a_part_or_a_delta_of_more_nodes_than_one_message_may_carry_closes_the_stream() -> None:
    """One message is decoded in one turn of the event loop, so it carries at most
    MAX_NODES_PER_PART nodes; the refusal names the limit and the fix."""
    names = [f"n{i}" for i in range(MAX_NODES_PER_PART + 1)]
    s = AgentSession(cluster="m1")
    assert s.receive(snap(1, 0, False, *names[:MAX_NODES_PER_PART])) is None
    with pytest.raises(StreamClosedError) as err:
        s.receive(snap(1, 1, True, *names))
    assert err.value.code == "INVALID_ARGUMENT"
    assert (
        f"part 1: {MAX_NODES_PER_PART + 1} nodes; at most {MAX_NODES_PER_PART} nodes per "
        "message are allowed" in err.value.reason
    )
    assert "upgrade the agent" in err.value.reason
    assert s.inventory_seq is None
    s = AgentSession(cluster="m1")
    assert isinstance(s.receive(snap(1, 0, True, "a")), InventorySnapshot)
    with pytest.raises(StreamClosedError, match=f"{MAX_NODES_PER_PART + 1} upserts; at most"):
        s.receive(delta(2, *names))
    assert s.inventory_seq == 1, "the refused delta is not taken"
    assert isinstance(s.receive(delta(2, *names[:MAX_NODES_PER_PART])), InventoryDelta)
