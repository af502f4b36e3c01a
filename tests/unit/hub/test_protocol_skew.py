"""A hub of protocol version 2 serves agents of version 1 (the release before) and of version 2:
the stream speaks the lower version (the Welcome says it), a version-1 agent's Node messages
are stored as before, packed nodes are taken only on a version-2 stream and refused whole
(nothing returned to apply) when bad, and the bounds are those of version 1.

The servicer test drives the real AgentService and Controller over the typed fakes; the
reference inventory is the version-1 decode of every node (node_from_pb)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from gpufed.api.protocol import agent_pb2 as pb
from gpufed.api.protocol.codec import node_from_pb, node_to_pb
from gpufed.api.protocol.packed import ShapeTable
from gpufed.api.stream import InventoryDelta, InventorySnapshot
from gpufed.hub.adapters import sessions
from gpufed.hub.adapters.sessions import (
    MAX_PACKED_NODES_PER_PART,
    PROTOCOL_VERSION,
    AgentSession,
    StreamClosedError,
)
from gpufed.hub.edge.service import AgentService
from tests.unit.api.test_protocol_packed import fleet_nodes, pack
from tests.unit.hub.builders import membercluster_obj
from tests.unit.hub.fakes import FakeHubAPI, token_secret
from tests.unit.hub.test_controller_robustness import FakeContext, controller, listed, stopped


def packed_snapshot(nodes: list, seq: int = 1, per_part: int = 100) -> list[pb.AgentMessage]:
    table = ShapeTable()
    parts = [nodes[i : i + per_part] for i in range(0, len(nodes), per_part)]
    return [
        pb.AgentMessage(
            inventory_snapshot=pb.InventorySnapshot(
                seq=seq, part=i, final=i == len(parts) - 1, packed=pack(p, table)
            )
        )
        for i, p in enumerate(parts)
    ]


def test_a_version_2_stream_takes_a_packed_snapshot_and_deltas() -> None:
    nodes = fleet_nodes("m1", 300)
    s = AgentSession(cluster="m1", protocol_version=PROTOCOL_VERSION)
    table = ShapeTable()
    msgs = []
    for i in range(0, 300, 100):
        msgs.append(
            pb.AgentMessage(
                inventory_snapshot=pb.InventorySnapshot(
                    seq=5, part=i // 100, final=i == 200, packed=pack(nodes[i : i + 100], table)
                )
            )
        )
    results = [s.receive(m) for m in msgs]
    assert results[:2] == [None, None]
    done = results[2]
    assert isinstance(done, InventorySnapshot)
    assert list(done.nodes) == [node_from_pb(node_to_pb(n)) for n in nodes]
    changed = [nodes[7].model_copy(update={"ready": False, "requested": {}})]
    d = s.receive(
        pb.AgentMessage(inventory_delta=pb.InventoryDelta(seq=6, packed=pack(changed, table)))
    )
    assert isinstance(d, InventoryDelta)
    assert list(d.upserts) == [node_from_pb(node_to_pb(n)) for n in changed]


def test_packed_nodes_on_a_version_1_stream_are_refused() -> None:
    s = AgentSession(cluster="m1", protocol_version=1)
    with pytest.raises(StreamClosedError, match="packed nodes need protocol version 2") as err:
        s.receive(packed_snapshot(fleet_nodes("m1", 10))[0])
    assert err.value.code == "INVALID_ARGUMENT"


def test_a_bad_packed_part_refuses_the_snapshot_whole() -> None:
    s = AgentSession(cluster="m1", protocol_version=2)
    msgs = packed_snapshot(fleet_nodes("m1", 300))
    assert s.receive(msgs[0]) is None
    msgs[1].inventory_snapshot.packed.names[0] = "Bad_Name"
    with pytest.raises(StreamClosedError, match="node 'Bad_Name': name must be"):
        s.receive(msgs[1])
    with pytest.raises(StreamClosedError, match="out of order"):
        s.receive(msgs[2])


def test_packed_parts_are_bounded_in_nodes_and_per_member(monkeypatch: pytest.MonkeyPatch) -> None:
    nodes = fleet_nodes("m1", MAX_PACKED_NODES_PER_PART + 1)
    s = AgentSession(cluster="m1", protocol_version=2)
    with pytest.raises(StreamClosedError, match=f"at most {MAX_PACKED_NODES_PER_PART} per message"):
        s.receive(packed_snapshot(nodes, per_part=len(nodes))[0])
    monkeypatch.setattr(sessions, "MAX_NODES_PER_MEMBER", 150)
    s = AgentSession(cluster="m1", protocol_version=2)
    msgs = packed_snapshot(nodes[:200])
    assert s.receive(msgs[0]) is None
    with pytest.raises(StreamClosedError, match="more than 150 nodes"):
        s.receive(msgs[1])


def test_a_message_with_both_forms_is_refused() -> None:
    s = AgentSession(cluster="m1", protocol_version=2)
    msg = packed_snapshot(fleet_nodes("m1", 3))[0]
    msg.inventory_snapshot.nodes.append(node_to_pb(fleet_nodes("m9", 1)[0]))
    with pytest.raises(StreamClosedError, match="either packed nodes or Node messages"):
        s.receive(msg)


@pytest.mark.parametrize(("agent", "stream"), [(1, 1), (2, 2), (3, 2)])
async def test_the_hub_serves_an_agent_of_the_release_before_in_its_own_version(
    agent: int, stream: int
) -> None:
    """A version-1 agent (Hello says 1, Node messages) gets a Welcome saying 1 and its
    inventory is stored; a newer agent is answered in the hub's version."""
    kube = FakeHubAPI(
        objects={"memberclusters": [membercluster_obj("m1", token_secret="t")], "gpujobs": []},
        secrets={"gpufed-system": [token_secret("t", "t1")]},
    )
    ctrl = controller(kube=kube)
    watch = await listed(ctrl, "memberclusters")
    nodes = fleet_nodes("m1", 40)
    done = asyncio.Event()

    async def old_agent() -> AsyncIterator[pb.AgentMessage]:
        yield pb.AgentMessage(hello=pb.Hello(cluster="m1", protocol_version=agent))
        yield pb.AgentMessage(
            inventory_snapshot=pb.InventorySnapshot(
                seq=1, part=0, final=False, nodes=[node_to_pb(n) for n in nodes[:30]]
            )
        )
        yield pb.AgentMessage(
            inventory_snapshot=pb.InventorySnapshot(
                seq=1, part=1, final=True, nodes=[node_to_pb(n) for n in nodes[30:]]
            )
        )
        await done.wait()

    service = AgentService(lambda: ctrl)
    welcome: list[pb.Welcome] = []

    async def drain() -> None:
        async for msg in service.Connect(old_agent(), FakeContext()):  # type: ignore[arg-type]
            if msg.WhichOneof("body") == "welcome":
                welcome.append(msg.welcome)

    task = asyncio.create_task(drain())
    for _ in range(200):
        if len(ctrl.state.members["m1"].nodes) == len(nodes):
            break
        await asyncio.sleep(0.01)
    assert welcome[0].protocol_version == stream
    stored = ctrl.state.members["m1"].nodes
    assert [stored[n.name] for n in nodes] == [node_from_pb(node_to_pb(n)) for n in nodes]
    done.set()
    task.cancel()
    await stopped(task, watch)
