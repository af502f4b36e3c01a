"""A small hub for driving agents in tests: the agent protocol's server side over real gRPC.

Not product code (the hub lives in gpufed.hub): it checks the bearer token, answers Hello with
Welcome and a DesiredSet, assembles inventory snapshots and applies deltas (checking
``seq`` = previous + 1), records acks, statuses and heartbeats, and lets a test push work
items, drop a stream or refuse connections. Every received message wakes
:meth:`HubPeer.wait_for`, so tests await conditions instead of sleeping.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc

from gpufed.api.inventory import NodeInventory
from gpufed.api.protocol import agent_pb2 as pb
from gpufed.api.protocol import agent_pb2_grpc as pb_grpc
from gpufed.api.protocol.codec import (
    node_from_pb,
    work_ack_from_pb,
    work_item_to_pb,
    workload_status_from_pb,
)
from gpufed.api.protocol.packed import ShapeBook, unpack_nodes
from gpufed.api.work import WorkAck, WorkItem, WorkloadStatus

T = TypeVar("T")


@dataclass
class ClusterView:
    """What the peer knows about one member, from its agent's messages."""

    hello: pb.Hello | None = None
    nodes: dict[str, NodeInventory] = field(default_factory=dict)
    node_seen_at: dict[str, float] = field(default_factory=dict)  # monotonic receive time
    #: the last node versions received in deltas, oldest first
    history: deque[NodeInventory] = field(default_factory=lambda: deque(maxlen=10_000))
    served_kinds: list[str] = field(default_factory=list)
    seq: int = 0
    snapshots: int = 0
    deltas: int = 0
    seq_errors: int = 0
    heartbeats: int = 0
    acks: list[WorkAck] = field(default_factory=list)
    statuses: list[WorkloadStatus] = field(default_factory=list)
    sessions: int = 0
    connected: bool = False
    errors: list[str] = field(default_factory=list)  # messages the peer could not decode
    ended: list[str] = field(default_factory=list)  # why each session ended (peer side)
    _parts: list[pb.InventorySnapshot] = field(default_factory=list)
    #: the node shapes of the stream (packed nodes) and how many snapshot parts came packed
    shapes: ShapeBook = field(default_factory=ShapeBook)
    packed_parts: int = 0

    def latest_status(self, job_uid: str) -> WorkloadStatus | None:
        for s in reversed(self.statuses):
            if s.job_uid == job_uid:
                return s
        return None

    def acks_for(self, job_uid: str) -> list[WorkAck]:
        return [a for a in self.acks if a.job_uid == job_uid]


class HubPeer(pb_grpc.AgentServiceServicer):
    """Test hub. ``tokens``: bearer token -> cluster name. ``desired``: cluster -> the work
    items of the DesiredSet sent after each Welcome (split into parts of ``desired_part_size``)."""

    def __init__(
        self,
        tokens: dict[str, str],
        *,
        heartbeat_ms: int = 1000,
        max_message_bytes: int = 4 * 1024 * 1024,
        desired_part_size: int = 50,
        protocol_version: int = pb.PROTOCOL_VERSION_CURRENT,
        exact_version: bool = False,
    ) -> None:
        self.tokens = tokens
        #: what the Welcome says (2: the agent may send packed nodes); ``exact_version``:
        #: refuse any other version in the Hello, as hubs before version 2 did
        self.protocol_version = protocol_version
        self.exact_version = exact_version
        self.heartbeat_ms = heartbeat_ms
        self.max_message_bytes = max_message_bytes
        self.desired_part_size = desired_part_size
        self.desired: dict[str, list[WorkItem]] = {}
        self.views: dict[str, ClusterView] = {}
        self.refuse = False
        self._outbound: dict[str, asyncio.Queue[pb.HubMessage | None]] = {}
        self._changed = asyncio.Condition()
        self._server: grpc.aio.Server | None = None
        self.port = 0

    # --- lifecycle ------------------------------------------------------------------------------

    async def start(self, port: int = 0) -> str:
        """Listen on 127.0.0.1 (a fixed ``port`` lets a restarted peer keep its address)."""
        self._server = grpc.aio.server()
        pb_grpc.add_AgentServiceServicer_to_server(self, self._server)
        self.port = self._server.add_insecure_port(f"127.0.0.1:{port}")
        await self._server.start()
        return self.address

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def stop(self) -> None:
        """Stop serving (streams are cancelled): the hub is unreachable until :meth:`start`."""
        for q in self._outbound.values():
            q.put_nowait(None)
        if self._server is not None:
            await self._server.stop(grace=None)
            self._server = None
        for view in self.views.values():
            view.connected = False

    def view(self, cluster: str) -> ClusterView:
        return self.views.setdefault(cluster, ClusterView())

    # --- test controls --------------------------------------------------------------------------

    def send(self, cluster: str, item: WorkItem) -> None:
        """Send a work item on the cluster's current stream."""
        self._outbound[cluster].put_nowait(pb.HubMessage(work_item=work_item_to_pb(item)))

    def resync(self, cluster: str, reason: str = "test") -> None:
        self._outbound[cluster].put_nowait(
            pb.HubMessage(resync_request=pb.ResyncRequest(reason=reason))
        )

    def drop(self, cluster: str) -> None:
        """End the cluster's current stream (the agent reconnects)."""
        q = self._outbound.get(cluster)
        if q is not None:
            q.put_nowait(None)

    async def wait_for(
        self, probe: Callable[[], T | None], *, within: float = 30.0, what: str = ""
    ) -> T:
        """Wait until ``probe()`` returns something truthy (checked after every message)."""
        deadline = time.monotonic() + within
        async with self._changed:
            while True:
                result = probe()
                if result:
                    return result
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"hub peer: timed out waiting for {what or probe}")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), timeout=min(left, 1.0))

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    # --- the protocol ---------------------------------------------------------------------------

    async def Connect(  # noqa: N802 - generated servicer method name
        self, request_iterator: Any, context: grpc.aio.ServicerContext
    ) -> Any:
        if self.refuse:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "hub peer refuses connections")
        metadata = dict(context.invocation_metadata() or ())
        auth = str(metadata.get("authorization", ""))
        cluster = self.tokens.get(auth.removeprefix("Bearer "))
        if not auth.startswith("Bearer ") or cluster is None:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "unknown token")
        assert cluster is not None
        first = await context.read()
        if first is grpc.aio.EOF or not first.HasField("hello"):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "first message must be Hello")
        if first.hello.cluster != cluster:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, "token is for another cluster")
        if self.exact_version and first.hello.protocol_version != self.protocol_version:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"protocol version {first.hello.protocol_version} is not supported "
                f"(this hub speaks {self.protocol_version})",
            )
        view = self.view(cluster)
        view.hello = first.hello
        view.served_kinds = list(first.hello.served_kinds)
        view.sessions += 1
        view.connected = True
        queue: asyncio.Queue[pb.HubMessage | None] = asyncio.Queue()
        self._outbound[cluster] = queue
        await context.write(
            pb.HubMessage(
                welcome=pb.Welcome(
                    cluster=cluster,
                    hub_id="hub-peer",
                    protocol_version=min(self.protocol_version, first.hello.protocol_version),
                    heartbeat_interval_ms=self.heartbeat_ms,
                    max_message_bytes=self.max_message_bytes,
                )
            )
        )
        items = list(self.desired.get(cluster, []))
        chunks = [
            items[i : i + self.desired_part_size]
            for i in range(0, len(items), self.desired_part_size)
        ] or [[]]
        for i, chunk in enumerate(chunks):
            await context.write(
                pb.HubMessage(
                    desired_set=pb.DesiredSet(
                        items=[work_item_to_pb(w) for w in chunk],
                        part=i,
                        final=i == len(chunks) - 1,
                    )
                )
            )
        await self._notify()
        reader = asyncio.create_task(self._read(cluster, context))
        try:
            while True:
                getter = asyncio.create_task(queue.get())
                done, _ = await asyncio.wait({getter, reader}, return_when=asyncio.FIRST_COMPLETED)
                if reader in done:
                    getter.cancel()
                    view.ended.append(f"reader: {reader.exception()!r}")
                    break
                msg = getter.result()
                if msg is None:
                    view.ended.append("dropped")
                    break
                await context.write(msg)
        finally:
            reader.cancel()
            view.connected = False
            if self._outbound.get(cluster) is queue:
                del self._outbound[cluster]
            await self._notify()

    async def _read(self, cluster: str, context: grpc.aio.ServicerContext) -> None:
        view = self.view(cluster)
        while True:
            msg = await context.read()
            if msg is grpc.aio.EOF:
                return
            try:
                self._record(view, msg)
            except Exception as exc:  # a real hub closes the stream too; keep the reason
                view.errors.append(f"{type(exc).__name__}: {exc}")
                raise
            finally:
                await self._notify()

    def _record(self, view: ClusterView, msg: pb.AgentMessage) -> None:
        now = time.monotonic()
        body = msg.WhichOneof("body")
        if body == "inventory_snapshot":
            snap = msg.inventory_snapshot
            if snap.part == 0:
                view._parts = []
                view.shapes = ShapeBook()
            view._parts.append(snap)
            if snap.HasField("packed"):
                view.packed_parts += 1
            if snap.final:
                nodes = [node_from_pb(n) for p in view._parts for n in p.nodes]
                nodes += [n for p in view._parts for n in unpack_nodes(p.packed, view.shapes)]
                view.nodes = {n.name: n for n in nodes}
                view.node_seen_at = {n.name: now for n in nodes}
                view.served_kinds = list(snap.served_kinds)
                view.seq = snap.seq
                view.snapshots += 1
                view._parts = []
        elif body == "inventory_delta":
            delta = msg.inventory_delta
            if delta.seq != view.seq + 1:
                view.seq_errors += 1
            view.seq = delta.seq
            upserts = [node_from_pb(n) for n in delta.upserts]
            upserts += unpack_nodes(delta.packed, view.shapes)
            for node in upserts:
                view.nodes[node.name] = node
                view.node_seen_at[node.name] = now
                view.history.append(node)
            for name in delta.removed:
                view.nodes.pop(name, None)
            view.deltas += 1
        elif body == "heartbeat":
            view.heartbeats += 1
        elif body == "work_ack":
            view.acks.append(work_ack_from_pb(msg.work_ack))
        elif body == "workload_status":
            view.statuses.append(workload_status_from_pb(msg.workload_status))


def items_by_uid(items: Iterable[WorkItem]) -> dict[str, WorkItem]:
    return {i.job_uid: i for i in items}
