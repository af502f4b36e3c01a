"""One agent stream: its outbound queue, unacknowledged work, and the inventory sequence rules.

Created by the leader (:mod:`gpufed.hub.core`) for each accepted stream; the gRPC servicer
(:mod:`gpufed.hub.service`) drains :attr:`AgentSession.outbox`. No gRPC here: closing a stream
is expressed with :class:`StreamClosedError` codes that the servicer maps to gRPC status codes.

Inventory rules (api/protocol/agent.proto):

- a snapshot may come in parts sharing ``seq``, numbered from 0; a part out of order (another
  ``seq`` mid-way, a skipped or repeated number) closes the stream: the stored inventory is
  replaced only when a complete, valid snapshot arrived;
- a delta must carry exactly the previous ``seq + 1``; otherwise the hub sends a
  ``ResyncRequest`` and ignores deltas until the next complete snapshot;
- deltas before the first snapshot of a stream are ignored (the agent sends a snapshot first).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Literal

from gpufed.api.inventory import NodeInventory
from gpufed.api.protocol import agent_pb2 as pb
from gpufed.api.protocol.codec import ProtocolError, node_from_pb

CloseCode = Literal["INVALID_ARGUMENT", "PERMISSION_DENIED", "UNAVAILABLE", "ABORTED"]


class StreamClosedError(Exception):
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
    _snap_kinds: list[str] = field(default_factory=list)

    def send(self, msg: pb.HubMessage) -> None:
        """Queue one message for the agent (dropped once the stream is closing)."""
        if self.closed is None:
            self.outbox.put_nowait(msg)

    def close(self, code: CloseCode, reason: str) -> None:
        """End the stream with ``code``/``reason`` (idempotent: the first reason wins)."""
        if self.closed is None:
            self.closed = StreamClosedError(code, reason)
            self.outbox.put_nowait(None)

    # --- inventory -----------------------------------------------------------------------------

    def snapshot_part(
        self, msg: pb.InventorySnapshot
    ) -> tuple[int, list[NodeInventory], list[str]] | None:
        """Take one snapshot part; returns ``(seq, nodes, served kinds)`` once it is complete.

        Raises :class:`StreamClosedError` (INVALID_ARGUMENT) for a part out of order or a node that
        does not decode; nothing is applied then.
        """
        if msg.part == 0:
            self._snap_seq, self._snap_next = msg.seq, 0
            self._snap_nodes, self._snap_kinds = [], []
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
        try:
            self._snap_nodes.extend(node_from_pb(n) for n in msg.nodes)
        except ProtocolError as exc:
            self._snap_seq = None
            raise StreamClosedError("INVALID_ARGUMENT", f"inventory snapshot: {exc}") from exc
        self._snap_kinds.extend(msg.served_kinds)
        self._snap_next += 1
        if not msg.final:
            return None
        nodes, kinds = self._snap_nodes, self._snap_kinds
        names = [n.name for n in nodes]
        if len(set(names)) != len(names):
            self._snap_seq = None
            raise StreamClosedError("INVALID_ARGUMENT", "inventory snapshot names a node twice")
        self._snap_seq, self._snap_nodes, self._snap_kinds = None, [], []
        self.inventory_seq = msg.seq
        self.awaiting_snapshot = False
        return msg.seq, nodes, kinds

    def delta(self, msg: pb.InventoryDelta) -> tuple[list[NodeInventory], list[str]] | str | None:
        """Take one delta: ``(upserts, removed)`` to apply, a resync reason (str) when a delta
        is missing, or None when deltas are ignored until the next snapshot.

        Raises :class:`StreamClosedError` (INVALID_ARGUMENT) for a node that does not decode.
        """
        if self.awaiting_snapshot:
            return None
        assert self.inventory_seq is not None
        if msg.seq != self.inventory_seq + 1:
            reason = (
                f"inventory delta seq {msg.seq} does not follow {self.inventory_seq}; "
                "send a full snapshot"
            )
            self.awaiting_snapshot = True
            return reason
        try:
            upserts = [node_from_pb(n) for n in msg.upserts]
        except ProtocolError as exc:
            raise StreamClosedError("INVALID_ARGUMENT", f"inventory delta: {exc}") from exc
        self.inventory_seq = msg.seq
        return upserts, list(msg.removed)
