"""Member health timers, agent stream sequence rules, bearer tokens, config checks."""

from __future__ import annotations

import pytest

from gpufed.api.inventory import NodeInventory
from gpufed.api.protocol import agent_pb2 as pb
from gpufed.api.protocol.codec import node_to_pb
from gpufed.api.stream import InventoryDelta, InventorySnapshot
from gpufed.hub.adapters.sessions import AgentSession, StreamClosedError
from gpufed.hub.components.config import HubConfig
from gpufed.hub.edge.service import bearer_token
from gpufed.hub.rules.health import health_at

LEASE, LOST = 40.0, 600.0


def health(now: float, last: float | None, start: float = 0.0, marked: bool = False) -> str:
    return health_at(
        now=now, last_heard=last, hub_start=start, lease_s=LEASE, lost_s=LOST, marked_lost=marked
    )


def test_a_member_turns_not_ready_after_its_lease_and_lost_after_the_timeout() -> None:
    assert health(now=139.0, last=100.0) == "Ready"
    assert health(now=141.0, last=100.0) == "NotReady"
    assert health(now=701.0, last=100.0) == "Lost"


def test_a_hub_that_was_down_restarts_every_timer_from_its_own_start() -> None:
    # The member was last heard long before this hub started (the hub was down 1 hour).
    assert health(now=3605.0, last=None, start=3600.0) == "Ready"
    assert health(now=3641.0, last=None, start=3600.0) == "NotReady"
    assert health(now=4201.0, last=None, start=3600.0) == "Lost"


def test_a_member_declared_lost_before_a_restart_stays_lost_until_it_reconnects() -> None:
    assert health(now=1.0, last=None, marked=True) == "Lost"
    assert health(now=5.0, last=4.0, marked=True) == "Ready"


def nodes(*names: str) -> list[pb.Node]:
    return [node_to_pb(NodeInventory(name=n, nvlink_domain=f"node:{n}")) for n in names]


def snap(seq: int, part: int, final: bool, *names: str) -> pb.AgentMessage:
    return pb.AgentMessage(
        inventory_snapshot=pb.InventorySnapshot(
            seq=seq, part=part, final=final, nodes=nodes(*names)
        )
    )


def delta(
    seq: int, upserts: list[pb.Node] | None = None, removed: list[str] | None = None
) -> pb.AgentMessage:
    return pb.AgentMessage(
        inventory_delta=pb.InventoryDelta(seq=seq, upserts=upserts or [], removed=removed or [])
    )


def resync_requests(s: AgentSession) -> list[str]:
    """The ResyncRequest reasons queued on the session's outbox so far."""
    reasons = []
    while not s.outbox.empty():
        msg = s.outbox.get_nowait()
        if msg is not None and msg.WhichOneof("body") == "resync_request":
            reasons.append(msg.resync_request.reason)
    return reasons


def test_a_snapshot_in_parts_is_applied_only_when_complete() -> None:
    s = AgentSession(cluster="m1")
    assert s.receive(snap(7, 0, False, "a")) is None
    assert s.receive(snap(7, 1, False, "b")) is None
    done = s.receive(snap(7, 2, True, "c"))
    assert isinstance(done, InventorySnapshot)
    assert done.seq == 7
    assert [n.name for n in done.nodes] == ["a", "b", "c"]
    assert s.inventory_seq == 7


@pytest.mark.parametrize(
    "second", [snap(7, 2, True, "x"), snap(8, 1, True, "x"), snap(7, 0, False, "x")]
)
def test_a_snapshot_part_out_of_order_closes_the_stream(second: pb.AgentMessage) -> None:
    s = AgentSession(cluster="m1")
    s.receive(snap(7, 0, False, "a"))
    if second.inventory_snapshot.part == 0:
        # A new part 0 restarts the snapshot: allowed.
        assert s.receive(second) is None
        return
    with pytest.raises(StreamClosedError, match="out of order") as err:
        s.receive(second)
    assert err.value.code == "INVALID_ARGUMENT"


def test_a_snapshot_naming_a_node_twice_is_refused() -> None:
    s = AgentSession(cluster="m1")
    with pytest.raises(StreamClosedError, match="twice"):
        s.receive(snap(1, 0, True, "a", "a"))


def test_a_node_that_does_not_decode_closes_the_stream_with_the_field() -> None:
    bad = pb.Node(name="n1", mig_strategy="weird")
    s = AgentSession(cluster="m1")
    with pytest.raises(StreamClosedError, match="n1"):
        s.receive(
            pb.AgentMessage(
                inventory_snapshot=pb.InventorySnapshot(seq=1, part=0, final=True, nodes=[bad])
            )
        )


def test_deltas_must_follow_the_previous_seq_else_a_resync_is_asked() -> None:
    s = AgentSession(cluster="m1")
    assert s.receive(delta(1)) is None, "deltas before a snapshot are ignored"
    s.receive(snap(10, 0, True, "a"))
    got = s.receive(delta(11, upserts=nodes("b"), removed=["a"]))
    assert isinstance(got, InventoryDelta)
    assert [n.name for n in got.upserts] == ["b"]
    assert got.removed == ("a",)
    assert resync_requests(s) == []
    assert s.receive(delta(13)) is None
    [reason] = resync_requests(s)
    assert "does not follow 11" in reason
    assert s.receive(delta(14)) is None, "ignored until the next snapshot"
    assert resync_requests(s) == [], "asked once"
    s.receive(snap(20, 0, True, "a"))
    got = s.receive(delta(21))
    assert isinstance(got, InventoryDelta)
    assert (got.upserts, got.removed) == ((), ())


def test_closing_a_session_ends_its_outbox_once() -> None:
    s = AgentSession(cluster="m1")
    s.close("PERMISSION_DENIED", "first")
    s.close("ABORTED", "second")
    s.send(pb.HubMessage())
    assert s.closed is not None
    assert s.closed.reason == "first"
    assert s.outbox.get_nowait() is None
    assert s.outbox.empty()


@pytest.mark.parametrize(
    ("metadata", "token"),
    [
        ((("authorization", "Bearer abc"),), "abc"),
        ((("Authorization", b"bearer  xyz "),), "xyz"),
        ((("authorization", "Basic abc"),), None),
        ((("x-other", "Bearer abc"),), None),
        (None, None),
    ],
)
def test_bearer_token(
    metadata: tuple[tuple[str, str | bytes], ...] | None, token: str | None
) -> None:
    assert bearer_token(metadata) == token


def test_config_refuses_plaintext_unless_asked_and_a_lost_timeout_below_the_lease() -> None:
    with pytest.raises(ValueError, match="tls"):
        HubConfig()
    with pytest.raises(ValueError, match="member_lost_s"):
        HubConfig(insecure=True, member_lease_s=40, member_lost_s=10)
    with pytest.raises(ValueError, match="etcd_prefix"):
        HubConfig(insecure=True, etcd_prefix="gpufed")
    assert HubConfig(insecure=True).origin == "gpufed-hub"
