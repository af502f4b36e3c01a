"""The agent's one long-lived gRPC stream to the hub (``AgentService.Connect``).

Owns the session protocol of ``api/protocol/agent.proto`` on the agent side:

1. dial the hub (TLS with ``--ca-file`` or system roots, or plaintext for sandboxes), with
   the bootstrap token as ``authorization: Bearer <token>`` call metadata;
2. send ``Hello`` (cluster, version, served workload kinds, instance id) and wait for
   ``Welcome`` (heartbeat interval, largest message the hub accepts);
3. send the full inventory snapshot, split into parts under that size and of at most ``MAX_NODES_PER_PART`` nodes, then coalesced
   deltas; packed by node shape (:mod:`gpufed.api.protocol.packed`, up to
   ``MAX_PACKED_NODES_PER_PART`` a part) when the Welcome says protocol version 2 or later,
   as Node messages to a hub of version 1 (at most one per ``coalesce_ms``; ``seq`` = previous + 1) and heartbeats;
4. hand ``DesiredSet`` parts and ``WorkItem`` s to the work manager, answer
   ``ResyncRequest`` with a fresh snapshot; acks and workload status flow back.

A broken or refused stream is retried forever with jittered exponential backoff (tenacity);
meanwhile nothing new is applied and running workloads are left alone. Protobuf stays in this
module: everything else sees pydantic models (:mod:`gpufed.api.protocol.codec`).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import structlog
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, wait_random_exponential

from gpufed.agent.config import AgentConfig
from gpufed.agent.inventory import InventoryState
from gpufed.agent.metrics import AgentMetrics
from gpufed.agent.status import StatusReporter
from gpufed.agent.work import WorkManager
from gpufed.api.errors import TransientError
from gpufed.api.inventory import MAX_NODES_PER_PART
from gpufed.api.protocol import agent_pb2 as pb
from gpufed.api.protocol import agent_pb2_grpc as pb_grpc
from gpufed.api.protocol.codec import (
    ProtocolError,
    held_job_to_pb,
    node_to_pb,
    work_ack_to_pb,
    work_item_from_pb,
    workload_status_to_pb,
)
from gpufed.api.protocol.packed import NODE_LABELS, ShapeTable, packed_parts
from gpufed.api.version import gpufed_version
from gpufed.api.work import WorkAck, WorkItem, WorkloadStatus

log = structlog.get_logger("gpufed.agent.hub")

#: Used when the hub's Welcome leaves a field at 0.
DEFAULT_HEARTBEAT_MS = 5_000
DEFAULT_MAX_MESSAGE_BYTES = 4 * 1024 * 1024
#: Room left in each message for the envelope (oneof tag, seq, part, served kinds).
_ENVELOPE_BYTES = 4 * 1024
#: A welcomed session shorter than this counts as a failed attempt (backoff keeps growing).
MIN_HEALTHY_SESSION_S = 10.0
WELCOME_TIMEOUT_S = 30.0


def agent_version() -> str:
    """This agent's version, as ``Hello.agent_version`` carries it."""
    return gpufed_version()


class HubUnavailableError(TransientError, ConnectionError):
    """The hub could not be reached, refused the stream, or ended it early."""


def split_by_size(
    nodes: list[pb.Node], limit: int, *, max_nodes: int = MAX_NODES_PER_PART
) -> list[list[pb.Node]]:
    """Group encoded nodes into parts whose encoded size stays under ``limit`` bytes and that
    hold at most ``max_nodes`` nodes (the hub refuses larger messages: it decodes one message
    in one turn of its event loop, :data:`gpufed.api.inventory.MAX_NODES_PER_PART`).

    Every part holds at least one node (a single node larger than the limit travels alone and
    the hub decides). An empty list gives one empty part (an empty cluster is a snapshot too).
    """
    budget = max(1024, limit - _ENVELOPE_BYTES)
    parts: list[list[pb.Node]] = [[]]
    size = 0
    for node in nodes:
        n = node.ByteSize() + 6  # field tag + length prefix
        if parts[-1] and (size + n > budget or len(parts[-1]) >= max_nodes):
            parts.append([])
            size = 0
        parts[-1].append(node)
        size += n
    return parts


class HubStream:
    """Keeps one agent connected to its hub (see module docstring)."""

    def __init__(
        self,
        config: AgentConfig,
        *,
        inventory: InventoryState,
        inventory_changed: asyncio.Event,
        work: WorkManager,
        status: StatusReporter,
        served_kinds: Callable[[], Awaitable[list[str]]],
        metrics: AgentMetrics,
        instance: str | None = None,
        cluster_uid: Callable[[], Awaitable[str]] | None = None,
        reconnect_sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        member_api_error: Callable[[], str] = lambda: "",
    ) -> None:
        self.config = config
        self.inventory = inventory
        self.inventory_changed = inventory_changed
        self.work = work
        self.status = status
        self._served_kinds = served_kinds
        self._cluster_uid = cluster_uid
        self.metrics = metrics
        self.instance = instance or uuid.uuid4().hex
        self.log = log.bind(cluster=config.cluster)
        self.seq = 0
        self.welcomed = asyncio.Event()
        self.hub_id = ""
        self._outbox: asyncio.Queue[pb.AgentMessage] | None = None
        #: the node shapes sent on this stream (protocol version 2), None: Node messages
        self._shapes: ShapeTable | None = None
        #: the version the Hello names: the newest, or 1 once a hub of version 1 refused it
        #: (a hub rolled back: docs/hub.md, "Version skew")
        self._hello_version: int = pb.PROTOCOL_VERSION_PACKED_NODES
        self._node_labels = NODE_LABELS | {
            config.rack_label,
            config.block_label,
            config.clique_label,
        }
        self._resync = asyncio.Event()
        self.sessions = 0
        self._reconnect_sleep = reconnect_sleep  # waits out the backoff before a reconnect
        #: why the member's API server cannot be read now ("" while it can); each heartbeat
        #: carries it, so the hub shows the member NotReady instead of retrying work there
        self._member_api_error = member_api_error

    # --- outbound helpers (used as callbacks by work manager and status reporter) ---------------

    def _put(self, msg: pb.AgentMessage) -> bool:
        if self._outbox is None:
            return False
        self._outbox.put_nowait(msg)
        return True

    def send_ack(self, ack: WorkAck) -> None:
        if not self._put(pb.AgentMessage(work_ack=work_ack_to_pb(ack))):
            self.log.info(
                "work.ack.dropped",
                job_uid=ack.job_uid,
                revision=ack.revision,
                reason="hub disconnected",
            )

    def send_status(self, status: WorkloadStatus) -> bool:
        return self._put(pb.AgentMessage(workload_status=workload_status_to_pb(status)))

    # --- connection loop --------------------------------------------------------------------

    async def run(self) -> None:
        """Stay connected until cancelled."""
        while True:
            retrying = AsyncRetrying(
                wait=wait_random_exponential(multiplier=0.5, max=self.config.reconnect_max_s),
                retry=retry_if_exception(lambda e: isinstance(e, Exception)),
                before_sleep=self._before_sleep,
                sleep=self._reconnect_sleep,
            )
            async for attempt in retrying:
                with attempt:
                    await self._session()

    def _before_sleep(self, state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        self.log.warning(
            "hub.retry",
            attempt=state.attempt_number,
            retry_in_s=round(state.next_action.sleep, 2) if state.next_action else None,
            error=_describe(exc),
        )

    def _channel(self) -> grpc.aio.Channel:
        options = [
            ("grpc.keepalive_time_ms", 30_000),
            ("grpc.keepalive_timeout_ms", 10_000),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.max_receive_message_length", 256 * 1024 * 1024),
            ("grpc.max_send_message_length", 256 * 1024 * 1024),
        ]
        if self.config.ca_file is not None:
            creds = grpc.ssl_channel_credentials(root_certificates=self.config.ca_file.read_bytes())
            return grpc.aio.secure_channel(self.config.hub, creds, options=options)
        if self.config.tls:
            return grpc.aio.secure_channel(
                self.config.hub, grpc.ssl_channel_credentials(), options=options
            )
        return grpc.aio.insecure_channel(self.config.hub, options=options)

    async def _session(self) -> None:
        """One stream: returns after a healthy welcomed session ended; raises otherwise."""
        token = self.config.read_token()
        served = await self._served_kinds()
        cluster_uid = await self._cluster_uid() if self._cluster_uid is not None else ""
        held = await self.work.held_jobs()
        started = time.monotonic()
        welcomed = False
        channel = self._channel()
        tasks: list[asyncio.Task[Any]] = []
        call: Any = None
        try:
            stub = pb_grpc.AgentServiceStub(channel)
            call = stub.Connect(metadata=(("authorization", f"Bearer {token}"),))
            await call.write(
                pb.AgentMessage(
                    hello=pb.Hello(
                        cluster=self.config.cluster,
                        agent_version=agent_version(),
                        protocol_version=self._hello_version,
                        served_kinds=served,
                        agent_instance=self.instance,
                        cluster_uid=cluster_uid,
                        held_jobs=[held_job_to_pb(h) for h in held],
                    )
                )
            )
            first = await asyncio.wait_for(call.read(), WELCOME_TIMEOUT_S)
            if first is grpc.aio.EOF or not first.HasField("welcome"):
                raise HubUnavailableError("the hub did not answer Hello with Welcome")
            welcome = first.welcome
            if welcome.cluster and welcome.cluster != self.config.cluster:
                raise HubUnavailableError(
                    f"the hub bound this stream to cluster {welcome.cluster!r}, not "
                    f"{self.config.cluster!r}; check --cluster and the token"
                )
            welcomed = True
            self.sessions += 1
            self.hub_id = welcome.hub_id
            heartbeat_s = (welcome.heartbeat_interval_ms or DEFAULT_HEARTBEAT_MS) / 1000
            max_bytes = welcome.max_message_bytes or DEFAULT_MAX_MESSAGE_BYTES
            # Packed nodes only when the hub said so (a hub of version 1 answers 1).
            self._shapes = (
                ShapeTable()
                if welcome.protocol_version >= pb.PROTOCOL_VERSION_PACKED_NODES
                else None
            )
            self._outbox = asyncio.Queue()
            self.work.connected(welcome.hub_epoch)
            self.inventory.set_degraded_conditions(welcome.degraded_node_conditions)
            self.metrics.hub_connected.set(1)
            self.metrics.hub_connects.labels(result="welcomed").inc()
            self.welcomed.set()
            self.log.info(
                "hub.connected",
                hub=self.config.hub,
                hub_id=welcome.hub_id,
                hub_epoch=welcome.hub_epoch,
                held_jobs=len(held),
                protocol_version=welcome.protocol_version,
                heartbeat_s=heartbeat_s,
                max_message_bytes=max_bytes,
                served_kinds=served,
            )
            tasks = [
                asyncio.create_task(self._writer(call), name="hub:writer"),
                asyncio.create_task(self._reader(call), name="hub:reader"),
                asyncio.create_task(self._heartbeats(heartbeat_s), name="hub:heartbeat"),
                asyncio.create_task(self._inventory(max_bytes, served), name="hub:inventory"),
            ]
            self.status.resend_all()
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                exc = t.exception()
                if exc is not None:
                    raise exc
            raise HubUnavailableError("the hub ended the stream")
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if not welcomed:
                self.metrics.hub_connects.labels(result="failed").inc()
                if _refused_version(exc) and self._hello_version > pb.PROTOCOL_VERSION_CURRENT:
                    self._hello_version = pb.PROTOCOL_VERSION_CURRENT
                    self.log.warning("hub.protocol.older", hello_version=self._hello_version)
                raise
            lasted = time.monotonic() - started
            self.log.warning("hub.disconnected", error=_describe(exc), session_s=round(lasted, 1))
            if lasted < MIN_HEALTHY_SESSION_S:
                raise HubUnavailableError(
                    f"session ended after {lasted:.1f}s: {_describe(exc)}"
                ) from exc
        finally:
            self._outbox = None
            self.welcomed.clear()
            self.metrics.hub_connected.set(0)
            if welcomed:
                self.work.disconnected()
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if call is not None:
                call.cancel()
            await channel.close(grace=None)

    # --- session tasks -----------------------------------------------------------------------

    async def _writer(self, call: Any) -> None:
        outbox = self._outbox
        assert outbox is not None
        while True:
            msg = await outbox.get()
            await call.write(msg)

    async def _reader(self, call: Any) -> None:
        desired_parts = 0
        while True:
            msg = await call.read()
            if msg is grpc.aio.EOF:
                raise HubUnavailableError("the hub closed the stream")
            body = msg.WhichOneof("body")
            if body == "work_item":
                item = self._decode_item(msg.work_item)
                if item is not None:
                    self.metrics.work_items.labels(op=item.op).inc()
                    self.log.info(
                        "work.item.received",
                        job_uid=item.job_uid,
                        revision=item.revision,
                        op=item.op,
                    )
                    self.work.submit(item)
            elif body == "desired_set":
                ds = msg.desired_set
                items = [i for i in (self._decode_item(w) for w in ds.items) if i is not None]
                desired_parts += 1
                self.work.desired_part(items, final=ds.final)
                if ds.final:
                    self.log.info("hub.desired_set.received", parts=desired_parts)
                    desired_parts = 0
            elif body == "resync_request":
                self.log.info("hub.resync_requested", reason=msg.resync_request.reason)
                self._resync.set()
            elif body == "welcome":
                self.log.info("hub.welcome.repeated")

    def _decode_item(self, msg: pb.WorkItem) -> WorkItem | None:
        try:
            return work_item_from_pb(msg)
        except ProtocolError as exc:
            self.log.warning(
                "work.item.undecodable", job_uid=msg.job_uid, revision=msg.revision, reason=str(exc)
            )
            if msg.job_uid and msg.revision:
                self.send_ack(
                    WorkAck(
                        job_uid=msg.job_uid,
                        revision=msg.revision,
                        result="Failed",
                        message=str(exc),
                        retryable=False,
                    )
                )
            return None

    async def _heartbeats(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            self._put(
                pb.AgentMessage(
                    heartbeat=pb.Heartbeat(
                        inventory_seq=self.seq, member_api_error=self._member_api_error()
                    )
                )
            )

    async def _inventory(self, max_bytes: int, served: list[str]) -> None:
        """Snapshot, then coalesced deltas; a resync request sends a fresh snapshot."""
        coalesce_s = self.config.coalesce_ms / 1000
        self._send_snapshot(max_bytes, served)
        last_flush = time.monotonic()
        while True:
            changed = asyncio.ensure_future(self.inventory_changed.wait())
            resync = asyncio.ensure_future(self._resync.wait())
            try:
                await asyncio.wait({changed, resync}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                changed.cancel()
                resync.cancel()
            # Coalesce: at most one delta per window, so a burst (a 1,000-pod job starting)
            # becomes one message per node, not one per pod.
            delay = last_flush + coalesce_s - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            self.inventory_changed.clear()
            if self._resync.is_set():
                self._resync.clear()
                self._send_snapshot(max_bytes, served)
            else:
                self._send_delta(max_bytes, served)
            last_flush = time.monotonic()

    def _packed(self, nodes: list[pb.Node], max_bytes: int) -> list[pb.PackedNodes]:
        assert self._shapes is not None
        budget = max(1024, max_bytes - _ENVELOPE_BYTES)
        return packed_parts(nodes, self._shapes, budget, node_labels=self._node_labels)

    def _send_snapshot(self, max_bytes: int, served: list[str]) -> None:
        self.seq += 1
        nodes = [node_to_pb(n) for n in self.inventory.snapshot()]
        bodies: list[dict[str, Any]]
        if self._shapes is not None:
            self._shapes.reset()  # part 0 starts a new table at the hub
            bodies = [{"packed": p} for p in self._packed(nodes, max_bytes)]
        else:
            bodies = [{"nodes": chunk} for chunk in split_by_size(nodes, max_bytes)]
        parts = bodies
        for i, body in enumerate(bodies):
            self._put(
                pb.AgentMessage(
                    inventory_snapshot=pb.InventorySnapshot(
                        seq=self.seq,
                        part=i,
                        final=i == len(bodies) - 1,
                        served_kinds=served if i == 0 else [],  # the hub counts every part's
                        **body,
                    )
                )
            )
            self.metrics.inventory_messages.labels(type="snapshot_part").inc()
        self._update_gauges()
        self.log.info("inventory.snapshot.sent", seq=self.seq, nodes=len(nodes), parts=len(parts))

    def _send_delta(self, max_bytes: int, served: list[str]) -> None:
        upserts, removed = self.inventory.take_changes()
        if not upserts and not removed:
            return
        encoded = [node_to_pb(n) for n in upserts]
        bodies: list[dict[str, Any]]
        if self._shapes is not None:
            if self._shapes.full:  # a new snapshot starts a new shape table
                self.inventory.take_changes()
                self._send_snapshot(max_bytes, served)
                return
            bodies = [{"packed": p} for p in self._packed(encoded, max_bytes)]
        else:
            bodies = [{"upserts": chunk} for chunk in split_by_size(encoded, max_bytes)]
        for i, body in enumerate(bodies):
            self.seq += 1
            self._put(
                pb.AgentMessage(
                    inventory_delta=pb.InventoryDelta(
                        seq=self.seq, removed=removed if i == 0 else [], **body
                    )
                )
            )
            self.metrics.inventory_messages.labels(type="delta").inc()
        self.metrics.inventory_delta_nodes.inc(len(upserts) + len(removed))
        self._update_gauges()
        self.log.debug(
            "inventory.delta.sent", seq=self.seq, upserts=len(upserts), removed=len(removed)
        )

    def _update_gauges(self) -> None:
        self.metrics.inventory_nodes.set(self.inventory.node_count)
        self.metrics.inventory_pods.set(self.inventory.pod_count)
        self.metrics.inventory_degraded_nodes.set(self.inventory.degraded_count)


def _refused_version(exc: BaseException) -> bool:
    """Whether the hub refused the Hello's protocol version (a hub older than this agent)."""
    return (
        isinstance(exc, grpc.aio.AioRpcError)
        and exc.code() == grpc.StatusCode.FAILED_PRECONDITION
        and "protocol version" in (exc.details() or "")
    )


def _describe(exc: BaseException | None) -> str:
    if exc is None:
        return ""
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"{exc.code().name}: {exc.details()}"
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
