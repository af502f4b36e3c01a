"""One agent stream: the hub's protobuf edge, its outbound queue, unacknowledged work, and the
inventory sequence rules.

Created by the leader (:meth:`gpufed.hub.components.core.Controller.open_session`) for each accepted
stream; the gRPC servicer (:mod:`gpufed.hub.edge.service`) drains :attr:`AgentSession.outbox` and
passes every incoming message through :meth:`AgentSession.receive`. Together with the servicer
this is the only hub code that touches protobuf (an import-linter contract): the hub's logic
sends :class:`gpufed.api.work.WorkItem` models through the ``send_*`` methods and receives
:data:`gpufed.api.stream.AgentEvent` models. No gRPC here: closing a stream is expressed with
:class:`StreamClosedError` codes that the servicer maps to gRPC status codes.

Inventory rules (api/protocol/agent.proto):

- a snapshot may come in parts sharing ``seq``, numbered from 0; a part out of order (another
  ``seq`` mid-way, a skipped or repeated number) closes the stream: the stored inventory is
  replaced only when a complete, valid snapshot arrived;
- a delta must carry exactly the previous ``seq + 1``; otherwise the hub sends a
  ``ResyncRequest`` and ignores deltas until the next complete snapshot;
- deltas before the first snapshot of a stream are ignored (the agent sends a snapshot first);
- bounded (docs/design.md §4): a snapshot has at most :data:`MAX_SNAPSHOT_PARTS` parts and
  :data:`MAX_SNAPSHOT_BYTES` bytes in all, a member at most
  :data:`gpufed.api.inventory.MAX_NODES_PER_MEMBER` nodes (counted over the snapshot and every
  delta), a snapshot part and a delta at most
  :data:`gpufed.api.inventory.MAX_NODES_PER_PART` nodes (so one message is decoded in a few
  ms), a delta at most ``MAX_NODES_PER_MEMBER`` removals; past a limit the stream closes with
  INVALID_ARGUMENT naming it, and the stored inventory stays the last good one;
- protocol version 2 (the Welcome says which a stream uses): nodes may come packed by shape
  (:mod:`gpufed.api.protocol.packed`), at most :data:`MAX_PACKED_NODES_PER_PART` a message; a
  snapshot's part 0 starts a new shape table, deltas add to it; the same bounds and refusals.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import structlog

from gpufed.api.errors import GpufedError
from gpufed.api.inventory import MAX_NODES_PER_MEMBER, MAX_NODES_PER_PART, NodeInventory
from gpufed.api.protocol import agent_pb2 as pb
from gpufed.api.protocol.codec import (
    ProtocolError,
    node_from_pb,
    work_ack_from_pb,
    work_item_to_pb,
    workload_status_from_pb,
)
from gpufed.api.protocol.packed import MAX_PACKED_NODES_PER_PART, ShapeBook, unpack_nodes
from gpufed.api.stream import (
    AgentEvent,
    Heartbeat,
    InventoryDelta,
    InventorySnapshot,
    ResyncRequest,
)
from gpufed.api.work import WorkItem

log = structlog.get_logger("gpufed.hub.adapters.sessions")

#: The newest protocol version this hub speaks (Hello and Welcome carry it), and the oldest it
#: still serves (docs/hub.md, "Version skew"): a stream uses the lower of the agent's and this.
PROTOCOL_VERSION: int = pb.PROTOCOL_VERSION_PACKED_NODES
MIN_PROTOCOL_VERSION: int = pb.PROTOCOL_VERSION_CURRENT
#: Budget of one DesiredSet part (agents' gRPC clients accept 4 MiB by default).
DESIRED_PART_BYTES = 1024 * 1024

#: Most parts of one inventory snapshot, and their total encoded size (bytes).
MAX_SNAPSHOT_PARTS = 1024
MAX_SNAPSHOT_BYTES = 256 * 1024 * 1024
#: Most served kinds one agent may name (each at most 253 characters).
MAX_SERVED_KINDS = 256
_PER_PART = (
    f"at most {MAX_NODES_PER_PART} nodes per message are allowed (split into more parts or "
    "deltas; agents older than this hub send larger ones: upgrade the agent)"
)

CloseCode = Literal["INVALID_ARGUMENT", "PERMISSION_DENIED", "UNAVAILABLE", "ABORTED"]


class StreamClosedError(GpufedError):
    """Close one agent stream with a gRPC status ``code`` and a ``reason`` for the agent."""

    def __init__(self, code: CloseCode, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


class RefusedError(StreamClosedError):
    """The agent reported about something that is not its own cluster's (PERMISSION_DENIED)."""

    def __init__(self, reason: str) -> None:
        super().__init__("PERMISSION_DENIED", reason)


@dataclass
class AgentSession:
    """State of one accepted agent stream for member ``cluster``.

    ``outbox``: hub -> agent messages; ``None`` ends the stream (then :attr:`closed` says
    why). ``unacked``: job uid -> revision sent and not yet acknowledged (the cap on work in
    flight counts these).
    """

    cluster: str
    agent_version: str = ""
    agent_instance: str = ""
    served_kinds: tuple[str, ...] = ()
    #: the agent's protocol version (its Hello); the stream uses the lower of it and the hub's
    protocol_version: int = MIN_PROTOCOL_VERSION
    outbox: asyncio.Queue[pb.HubMessage | None] = field(default_factory=asyncio.Queue)
    unacked: dict[str, int] = field(default_factory=dict)
    inventory_seq: int | None = None
    awaiting_snapshot: bool = True
    closed: StreamClosedError | None = None
    #: True while the hub sends Welcome and the desired set (no other work goes out then)
    syncing: bool = False
    _snap_seq: int | None = None
    _snap_next: int = 0
    _snap_nodes: list[NodeInventory] = field(default_factory=list)
    _snap_names: set[str] = field(default_factory=set)
    _snap_kinds: list[str] = field(default_factory=list)
    _snap_bytes: int = 0
    #: node names the hub holds for this stream (snapshot, then deltas): the per-member cap
    _node_names: set[str] = field(default_factory=set)
    #: the node shapes this stream defined (protocol version 2)
    _shapes: ShapeBook = field(default_factory=ShapeBook)

    def __post_init__(self) -> None:
        self.protocol_version = max(
            MIN_PROTOCOL_VERSION, min(self.protocol_version, PROTOCOL_VERSION)
        )

    def send(self, msg: pb.HubMessage) -> None:
        """Queue one message for the agent (dropped once the stream is closing)."""
        if self.closed is None:
            self.outbox.put_nowait(msg)

    def close(self, code: CloseCode, reason: str) -> None:
        """End the stream with ``code``/``reason`` (idempotent: the first reason wins)."""
        if self.closed is None:
            self.closed = StreamClosedError(code, reason)
            self.outbox.put_nowait(None)

    # --- hub -> agent ---------------------------------------------------------------------------

    def welcome(
        self,
        *,
        hub_id: str,
        heartbeat_interval_s: float,
        max_message_bytes: int,
        hub_epoch: str = "",
        degraded_node_conditions: Sequence[str] = (),
    ) -> None:
        """Queue the Welcome (the first message of every accepted stream); ``hub_epoch``: the
        identity of the hub's etcd state (docs/design.md §10, ``epoch``);
        ``degraded_node_conditions``: node condition types that degrade a node while True."""
        self.send(
            pb.HubMessage(
                welcome=pb.Welcome(
                    cluster=self.cluster,
                    hub_id=hub_id,
                    protocol_version=self.protocol_version,
                    heartbeat_interval_ms=int(heartbeat_interval_s * 1000),
                    max_message_bytes=max_message_bytes,
                    hub_epoch=hub_epoch,
                    degraded_node_conditions=list(degraded_node_conditions),
                )
            )
        )

    def send_desired_set(self, items: Sequence[WorkItem]) -> None:
        """Queue the full desired set, in parts below :data:`DESIRED_PART_BYTES` (at least one
        part, so an empty set still tells the agent that nothing is wanted)."""
        for part in _parts([work_item_to_pb(i) for i in items]):
            self.send(pb.HubMessage(desired_set=part))

    def send_work(self, item: WorkItem) -> None:
        """Queue one work item."""
        self.send(pb.HubMessage(work_item=work_item_to_pb(item)))

    def request_resync(self, reason: str) -> None:
        """Ask the agent for a full inventory snapshot; deltas are ignored until it arrives."""
        self.awaiting_snapshot = True
        self.send(pb.HubMessage(resync_request=pb.ResyncRequest(reason=reason)))
        log.info("agent.resync", cluster=self.cluster, reason=reason)

    # --- agent -> hub ---------------------------------------------------------------------------

    def receive(self, msg: pb.AgentMessage) -> AgentEvent | None:
        """Decode one message after the Hello into the model the hub's logic handles.

        A heartbeat naming an inventory seq the hub never received also asks for a resync.
        Returns None for what the stream handles itself: a snapshot part before the last, a
        delta ignored until the next snapshot or out of sequence (a resync is requested).
        Raises :class:`StreamClosedError` (INVALID_ARGUMENT) for a malformed or out-of-order
        message; nothing is applied then.
        """
        kind = msg.WhichOneof("body")
        if kind == "heartbeat":
            hb = msg.heartbeat
            if not self.awaiting_snapshot and hb.inventory_seq > (self.inventory_seq or 0):
                self.request_resync("heartbeat names an inventory seq the hub never received")
            return Heartbeat(
                inventory_seq=hb.inventory_seq, member_api_error=hb.member_api_error[:1024]
            )
        if kind == "inventory_snapshot":
            return self._snapshot_part(msg.inventory_snapshot)
        if kind == "inventory_delta":
            return self._delta(msg.inventory_delta)
        if kind == "work_ack":
            try:
                return work_ack_from_pb(msg.work_ack)
            except ProtocolError as exc:
                raise StreamClosedError("INVALID_ARGUMENT", str(exc)) from exc
        if kind == "workload_status":
            try:
                return workload_status_from_pb(msg.workload_status)
            except ProtocolError as exc:
                raise StreamClosedError("INVALID_ARGUMENT", str(exc)) from exc
        if kind == "resync_request":
            return ResyncRequest(reason=msg.resync_request.reason)
        if kind == "hello":
            raise StreamClosedError("INVALID_ARGUMENT", "Hello may only be the first message")
        raise StreamClosedError("INVALID_ARGUMENT", "empty message (no body set)")

    def _snapshot_part(self, msg: pb.InventorySnapshot) -> InventorySnapshot | None:
        """Take one snapshot part; returns the snapshot once it is complete (its served kinds
        default to the Hello's).

        Raises :class:`StreamClosedError` (INVALID_ARGUMENT) for a part out of order or a node that
        does not decode; nothing is applied then.
        """
        if msg.part == 0:
            self._snap_seq, self._snap_next = msg.seq, 0
            self._snap_nodes, self._snap_kinds, self._snap_bytes = [], [], 0
            self._snap_names = set()
            self._shapes.reset()
        elif msg.seq != self._snap_seq or msg.part != self._snap_next:
            expected = (
                "a part 0"
                if self._snap_seq is None
                else f"seq {self._snap_seq} part {self._snap_next}"
            )
            self._snap_seq = None
            raise StreamClosedError(
                "INVALID_ARGUMENT",
                f"inventory snapshot seq {msg.seq} part {msg.part} is out of order "
                f"(expected {expected})",
            )
        self._snap_bytes += msg.ByteSize()
        packed = msg.packed.names
        too_much = self._packed_problem(msg.HasField("packed"), len(msg.nodes)) or _snapshot_limit(
            part=msg.part,
            part_nodes=len(msg.nodes),
            packed_nodes=len(packed),
            size=self._snap_bytes,
            nodes=len(self._snap_nodes) + len(msg.nodes) + len(packed),
            kinds=msg.served_kinds,
            kinds_before=len(self._snap_kinds),
        )
        if too_much is not None:
            self._snap_seq = None
            raise StreamClosedError("INVALID_ARGUMENT", f"inventory snapshot: {too_much}")
        try:
            if msg.HasField("packed"):
                decoded = unpack_nodes(msg.packed, self._shapes)
            else:
                decoded = [node_from_pb(n) for n in msg.nodes]
        except ProtocolError as exc:
            self._snap_seq = None
            raise StreamClosedError("INVALID_ARGUMENT", f"inventory snapshot: {exc}") from exc
        # Names are checked part by part, so the final part costs what any other part costs.
        names = {n.name for n in decoded}
        if len(names) != len(decoded) or not names.isdisjoint(self._snap_names):
            self._snap_seq = None
            raise StreamClosedError("INVALID_ARGUMENT", "inventory snapshot names a node twice")
        self._snap_names |= names
        self._snap_nodes.extend(decoded)
        self._snap_kinds.extend(msg.served_kinds)
        self._snap_next += 1
        if not msg.final:
            return None
        nodes, kinds = self._snap_nodes, self._snap_kinds
        self._snap_seq, self._snap_nodes, self._snap_kinds = None, [], []
        self._node_names, self._snap_names = self._snap_names, set()
        self.inventory_seq = msg.seq
        self.awaiting_snapshot = False
        return InventorySnapshot(
            seq=msg.seq, nodes=tuple(nodes), served_kinds=tuple(kinds or self.served_kinds)
        )

    def _packed_problem(self, packed: bool, plain: int) -> str | None:
        """Why a message's form does not fit this stream (packed nodes need version 2 and
        come alone), or None."""
        if packed and self.protocol_version < pb.PROTOCOL_VERSION_PACKED_NODES:
            return (
                f"packed nodes need protocol version {pb.PROTOCOL_VERSION_PACKED_NODES}; this "
                f"stream uses {self.protocol_version} (send Node messages)"
            )
        if packed and plain:
            return "a message carries either packed nodes or Node messages, not both"
        return None

    def _delta(self, msg: pb.InventoryDelta) -> InventoryDelta | None:
        """Take one delta: the changes to apply, or None when deltas are ignored until the next
        snapshot (a delta out of sequence asks for one first).

        Raises :class:`StreamClosedError` (INVALID_ARGUMENT) for a node that does not decode.
        """
        if self.awaiting_snapshot:
            return None
        assert self.inventory_seq is not None
        if msg.seq != self.inventory_seq + 1:
            self.request_resync(
                f"inventory delta seq {msg.seq} does not follow {self.inventory_seq}; "
                "send a full snapshot"
            )
            return None
        too_much = self._packed_problem(msg.HasField("packed"), len(msg.upserts))
        if too_much is not None:
            raise StreamClosedError("INVALID_ARGUMENT", f"inventory delta: {too_much}")
        if len(msg.upserts) > MAX_NODES_PER_PART:
            raise StreamClosedError(
                "INVALID_ARGUMENT",
                f"inventory delta: {len(msg.upserts)} upserts; {_PER_PART}",
            )
        if len(msg.packed.names) > MAX_PACKED_NODES_PER_PART:
            raise StreamClosedError(
                "INVALID_ARGUMENT",
                f"inventory delta: {len(msg.packed.names)} packed upserts; at most "
                f"{MAX_PACKED_NODES_PER_PART} per message are allowed",
            )
        if len(msg.removed) > MAX_NODES_PER_MEMBER:
            raise StreamClosedError(
                "INVALID_ARGUMENT",
                f"inventory delta: more than {MAX_NODES_PER_MEMBER} removals",
            )
        try:
            if msg.HasField("packed"):
                upserts = tuple(unpack_nodes(msg.packed, self._shapes))
            else:
                upserts = tuple(node_from_pb(n) for n in msg.upserts)
        except ProtocolError as exc:
            raise StreamClosedError("INVALID_ARGUMENT", f"inventory delta: {exc}") from exc
        upserted = {n.name for n in upserts}
        # Most deltas change nodes the member already has: then the names stay as they are
        # (copying a 5,000-name set per delta cost the hub 12 s in 200 s of `bench scale`).
        if msg.removed or not upserted <= self._node_names:
            names = (self._node_names - set(msg.removed)) | upserted
            if len(names) > MAX_NODES_PER_MEMBER:
                raise StreamClosedError(
                    "INVALID_ARGUMENT",
                    f"inventory delta: the member would have {len(names)} nodes; at most "
                    f"{MAX_NODES_PER_MEMBER} are allowed",
                )
            self._node_names = names
        self.inventory_seq = msg.seq
        return InventoryDelta(seq=msg.seq, upserts=upserts, removed=tuple(msg.removed))


def _snapshot_limit(
    *,
    part: int,
    part_nodes: int,
    packed_nodes: int = 0,
    size: int,
    nodes: int,
    kinds: Sequence[str],
    kinds_before: int,
) -> str | None:
    """Which snapshot bound (module docstring) a part crosses, or None."""
    if part >= MAX_SNAPSHOT_PARTS:
        return f"part {part}: at most {MAX_SNAPSHOT_PARTS} parts are allowed"
    if part_nodes > MAX_NODES_PER_PART:
        return f"part {part}: {part_nodes} nodes; {_PER_PART}"
    if packed_nodes > MAX_PACKED_NODES_PER_PART:
        return (
            f"part {part}: {packed_nodes} packed nodes; at most {MAX_PACKED_NODES_PER_PART} "
            "per message are allowed"
        )
    if size > MAX_SNAPSHOT_BYTES:
        return f"more than {MAX_SNAPSHOT_BYTES} bytes in all parts"
    if nodes > MAX_NODES_PER_MEMBER:
        return f"more than {MAX_NODES_PER_MEMBER} nodes (the most one member may report)"
    if kinds_before + len(kinds) > MAX_SERVED_KINDS or any(len(k) > 253 for k in kinds):
        return f"more than {MAX_SERVED_KINDS} served kinds, or one longer than 253 characters"
    return None


def _parts(items: list[pb.WorkItem]) -> list[pb.DesiredSet]:
    """Split a desired set into parts below the per-message budget (at least one part)."""
    parts: list[pb.DesiredSet] = []
    current: list[pb.WorkItem] = []
    size = 0
    for item in items:
        n = item.ByteSize()
        if current and size + n > DESIRED_PART_BYTES:
            parts.append(pb.DesiredSet(items=current, part=len(parts), final=False))
            current, size = [], 0
        current.append(item)
        size += n
    parts.append(pb.DesiredSet(items=current, part=len(parts), final=True))
    return parts
