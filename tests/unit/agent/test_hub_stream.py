"""The agent's hub stream (gpufed.agent.hub_stream) against the test hub over real gRPC on
loopback: Hello/Welcome, snapshot parts, coalesced deltas with consecutive seq, heartbeats,
acks, resync, reconnect with backoff, and token refusal. The member side is in memory."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gpufed.agent.config import AgentConfig
from gpufed.agent.hub_stream import HubStream, split_by_size
from gpufed.agent.inventory import InventoryState
from gpufed.agent.metrics import AgentMetrics
from gpufed.agent.status import StatusReporter
from gpufed.agent.work import WorkManager
from gpufed.api.inventory import MAX_NODES_PER_MEMBER, MAX_NODES_PER_PART, NodeInventory
from gpufed.api.protocol.codec import node_to_pb
from gpufed.api.work import WorkItem
from gpufed.hub.adapters.sessions import MAX_SNAPSHOT_PARTS
from tests.integration.agent.hub_peer import HubPeer

from .builders import gpu_job, gpu_pod, hgx_node
from .fakes import MemoryCluster


class ReconnectWaits:
    """The stream's reconnect sleep: counts each wait (an awaitable event for tests) and
    waits it out for real (the backoff is capped at 0.2 s in these tests)."""

    def __init__(self) -> None:
        self.count = 0
        self._changed = asyncio.Condition()

    async def __call__(self, seconds: float) -> None:
        async with self._changed:
            self.count += 1
            self._changed.notify_all()
        await asyncio.sleep(seconds)

    async def until(self, count: int, *, within: float = 10.0) -> None:
        """Return once the stream has waited to reconnect ``count`` times in all."""
        async with asyncio.timeout(within):
            async with self._changed:
                await self._changed.wait_for(lambda: self.count >= count)


class Rig:
    """One in-memory agent (inventory + work) wired to a HubStream."""

    def __init__(self, hub: str, token_file: Path, **config: Any) -> None:
        self.reconnect_waits = ReconnectWaits()
        self.config = AgentConfig(
            cluster="m1", hub=hub, token_file=token_file, reconnect_max_s=0.2, **config
        )
        self.changed = asyncio.Event()
        self.inventory = InventoryState(on_change=self.changed.set)
        self.member = MemoryCluster()
        self.status = StatusReporter(None, send=lambda _s: False)  # type: ignore[arg-type]
        self.work = WorkManager(self.member, ack=lambda _a: None, status=self.status)

        async def served() -> list[str]:
            return ["Job.batch"]

        async def cluster_uid() -> str:
            return "kube-system-uid-1"

        self.stream = HubStream(
            self.config,
            inventory=self.inventory,
            inventory_changed=self.changed,
            work=self.work,
            status=self.status,
            served_kinds=served,
            metrics=AgentMetrics(),
            cluster_uid=cluster_uid,
            reconnect_sleep=self.reconnect_waits,
        )
        self.work.set_ack(self.stream.send_ack)
        self.status.set_send(self.stream.send_status)


@pytest.fixture
async def peer() -> AsyncIterator[HubPeer]:
    hub = HubPeer({"secret": "m1"}, heartbeat_ms=100)
    await hub.start()
    yield hub
    await hub.stop()


@pytest.fixture
def token(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text("secret\n")
    return path


@pytest.fixture
async def running(peer: HubPeer, token: Path) -> AsyncIterator[Rig]:
    rig = Rig(peer.address, token)
    for i in range(3):
        rig.inventory.upsert_node(hgx_node(f"n{i}"))
    task = asyncio.create_task(rig.stream.run())
    yield rig
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def test_split_keeps_every_part_under_the_limit() -> None:
    nodes = [
        node_to_pb(
            NodeInventory(
                name=f"node-{i:04d}", nvlink_domain=f"node:node-{i:04d}", labels={"k": "v" * 200}
            )
        )
        for i in range(200)
    ]
    parts = split_by_size(nodes, 16 * 1024)
    assert len(parts) > 2
    assert [n for p in parts for n in p] == nodes
    assert all(sum(n.ByteSize() + 6 for n in p) <= 16 * 1024 for p in parts)
    assert split_by_size([], 1024) == [[]]


def test_split_keeps_every_part_within_the_nodes_one_message_may_carry() -> None:
    """A 15,000-node member under the hub's default 16 MiB messages: parts of at most
    MAX_NODES_PER_PART nodes (the hub refuses more), fewer than the hub's part limit."""
    nodes = [
        node_to_pb(NodeInventory(name=f"n{i:05d}", nvlink_domain=f"node:n{i:05d}"))
        for i in range(MAX_NODES_PER_MEMBER)
    ]
    parts = split_by_size(nodes, 16 * 1024 * 1024)
    assert [len(p) for p in parts[:-1]] == [MAX_NODES_PER_PART] * (len(parts) - 1)
    assert [n for p in parts for n in p] == nodes
    assert len(parts) <= MAX_SNAPSHOT_PARTS
    assert [len(p) for p in split_by_size(nodes[:5], 1 << 20, max_nodes=2)] == [2, 2, 1]


async def test_hello_then_snapshot_with_served_kinds(peer: HubPeer, running: Rig) -> None:
    view = peer.view("m1")
    await peer.wait_for(lambda: view.snapshots, what="snapshot")
    assert view.hello is not None
    assert (view.hello.cluster, view.hello.protocol_version) == ("m1", 2)
    assert view.hello.agent_instance == running.stream.instance
    assert view.hello.cluster_uid == "kube-system-uid-1", "which Kubernetes cluster it talks to"
    assert sorted(view.nodes) == ["n0", "n1", "n2"]
    assert view.served_kinds == ["Job.batch"]
    await peer.wait_for(lambda: view.heartbeats >= 2, what="heartbeats")


async def test_large_snapshot_comes_in_parts_under_the_hub_limit(token: Path) -> None:
    hub = HubPeer({"secret": "m1"}, max_message_bytes=8 * 1024)
    await hub.start()
    rig = Rig(hub.address, token)
    for i in range(120):
        rig.inventory.upsert_node(hgx_node(f"node-{i:03d}", labels={"pad": "x" * 60}))
    task = asyncio.create_task(rig.stream.run())
    try:
        view = hub.view("m1")
        await hub.wait_for(lambda: view.snapshots, what="snapshot")
        assert len(view.nodes) == 120
        assert rig.stream.metrics.inventory_messages.labels(type="snapshot_part")._value.get() > 3
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await hub.stop()


async def test_a_burst_of_pod_changes_becomes_few_deltas_with_consecutive_seq(
    peer: HubPeer, running: Rig
) -> None:
    view = peer.view("m1")
    await peer.wait_for(lambda: view.snapshots, what="snapshot")
    for i in range(200):
        running.inventory.upsert_pod(gpu_pod(f"p{i}", f"n{i % 2}", gpus=1))
        if i % 50 == 0:
            await asyncio.sleep(0)
    await peer.wait_for(
        lambda: view.nodes["n1"].requested.get("nvidia.com/gpu") == 100, what="requested 100"
    )
    assert view.nodes["n0"].requested["nvidia.com/gpu"] == 100
    assert view.deltas <= 3  # 400 pod events, at most one delta per 200 ms window
    assert view.seq_errors == 0
    await peer.wait_for(lambda: view.heartbeats, what="heartbeat")


async def test_work_item_is_applied_and_acked_over_the_stream(peer: HubPeer, running: Rig) -> None:
    view = peer.view("m1")
    await peer.wait_for(lambda: view.snapshots, what="snapshot")
    peer.send(
        "m1",
        WorkItem(
            job_uid="u1",
            job="team-a/j",
            revision=7,
            op="Apply",
            namespace="team-a",
            manifests=(gpu_job("u1", "j"),),
        ),
    )
    ack = await peer.wait_for(lambda: view.acks_for("u1"), what="ack")
    assert (ack[0].revision, ack[0].result) == (7, "Applied")
    assert any(r.name == "j" for r in running.member.objects)


async def test_resync_request_sends_a_fresh_snapshot(peer: HubPeer, running: Rig) -> None:
    view = peer.view("m1")
    await peer.wait_for(lambda: view.snapshots, what="snapshot")
    peer.resync("m1", "seq gap")
    await peer.wait_for(lambda: view.snapshots >= 2, what="second snapshot")
    assert view.seq_errors == 0


async def test_dropped_stream_reconnects_and_resends_a_snapshot(
    peer: HubPeer, running: Rig
) -> None:
    view = peer.view("m1")
    await peer.wait_for(lambda: view.snapshots, what="snapshot")
    peer.drop("m1")
    await peer.wait_for(lambda: view.sessions >= 2 and view.snapshots >= 2, what="reconnect")
    assert running.stream.sessions == 2


async def test_refused_token_is_retried_until_it_is_fixed(peer: HubPeer, tmp_path: Path) -> None:
    bad = tmp_path / "bad-token"
    bad.write_text("wrong\n")
    rig = Rig(peer.address, bad)
    task = asyncio.create_task(rig.stream.run())
    try:
        await rig.reconnect_waits.until(2)  # refused twice, waiting to try again
        assert peer.view("m1").sessions == 0
        assert rig.stream.metrics.hub_connects.labels(result="failed")._value.get() >= 2
        bad.write_text("secret\n")  # rotated token: read again on the next attempt
        await peer.wait_for(lambda: peer.view("m1").snapshots, what="snapshot", within=10)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_hub_down_then_back_reconnects(peer: HubPeer, running: Rig) -> None:
    view = peer.view("m1")
    await peer.wait_for(lambda: view.snapshots, what="snapshot")
    port = peer.port
    waits = running.reconnect_waits.count
    await peer.stop()
    await running.reconnect_waits.until(waits + 1)  # the session ended; waiting to reconnect
    assert not running.stream.welcomed.is_set()
    await peer.start(port)
    await peer.wait_for(
        lambda: view.sessions >= 2 and view.snapshots >= 2, what="reconnect", within=15
    )


@pytest.mark.parametrize("version", [1, 2])
async def test_a_hub_of_version_2_gets_packed_nodes_and_one_of_version_1_node_messages(
    token: Path, version: int
) -> None:
    """The agent says version 2 in its Hello and packs nodes only when the Welcome says 2; both
    forms give the hub the same nodes (the reference: the agent's own inventory)."""
    hub = HubPeer({"secret": "m1"}, protocol_version=version)
    await hub.start()
    rig = Rig(hub.address, token)
    for i in range(40):
        rig.inventory.upsert_node(hgx_node(f"node-{i:03d}"))
    task = asyncio.create_task(rig.stream.run())
    try:
        view = hub.view("m1")
        await hub.wait_for(lambda: view.snapshots, what="snapshot")
        assert view.hello is not None
        assert view.hello.protocol_version == 2
        assert view.packed_parts == (1 if version == 2 else 0)
        assert view.nodes == {n.name: n for n in rig.inventory.snapshot()}
        rig.inventory.upsert_pod(gpu_pod("p1", "node-007", gpus=3))
        await hub.wait_for(
            lambda: view.nodes["node-007"].requested.get("nvidia.com/gpu") == 3,
            what="the delta",
        )
        assert view.nodes == {n.name: n for n in rig.inventory.snapshot()}
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await hub.stop()


async def test_a_hub_of_version_1_that_refuses_version_2_is_spoken_to_in_version_1(
    token: Path,
) -> None:
    """A hub of the release before refused any Hello but its own version: the agent says 1
    after that refusal and then sends Node messages (a hub rolled back keeps its agents)."""
    hub = HubPeer({"secret": "m1"}, protocol_version=1, exact_version=True)
    await hub.start()
    rig = Rig(hub.address, token)
    rig.inventory.upsert_node(hgx_node("node-0"))
    task = asyncio.create_task(rig.stream.run())
    try:
        view = hub.view("m1")
        await hub.wait_for(lambda: view.snapshots, what="snapshot")
        assert view.hello is not None
        assert view.hello.protocol_version == 1
        assert view.packed_parts == 0
        assert list(view.nodes) == ["node-0"]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await hub.stop()
