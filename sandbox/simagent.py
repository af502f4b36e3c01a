"""Simulated member agents for ``gpufed bench scale``: many agents in one process, no member
API servers.

Each :class:`SimAgent` is one member cluster's agent as the hub sees it: one gRPC stream
(TLS, join token as ``authorization: Bearer``) speaking ``api/protocol/agent.proto`` through the
generated stubs and :mod:`gpufed.api.protocol.codec`, with the session order of the real agent
(``member-agent/hub_stream.py``):

1. ``Hello``, then wait for ``Welcome``;
2. the inventory snapshot of :func:`sim_nodes` (HGX and NVL72 pools of the fleet spec,
   expanded by :func:`gpufed.api.fleet.node_specs`): packed by node shape
   (:mod:`gpufed.api.protocol.packed`) when the Welcome says protocol version 2, else in parts
   of at most ``MAX_NODES_PER_PART`` Node messages. The first stream's packed snapshot is
   packed when the agent is built, before the benchmark's clock starts, and sent as built if
   no pod changed a node meanwhile: packing costs ~17 µs a node (more than the hub's decode,
   ~8 µs), CPU that a real agent spends on its member's machines, and at 100 x 5,000 it was
   ~8 s of the two cores the hub's registration needs;
3. work: an ``Apply`` is acknowledged ``APPLIED`` at once; its pods are then bound to the nodes
   the hub pinned them to (their effective requests, :func:`gpufed.api.resources.pod_requests`,
   added to ``requested`` and ``job_requests``), reported ``Running``, and after the pod
   template's ``gpufed.io/sim-duration`` (as kwok reads it in the sandbox) released and reported
   ``Succeeded``; a ``Delete`` releases the pods and is acknowledged ``DELETED``;
4. node changes go out as coalesced ``InventoryDelta`` s (``seq`` + 1 each, packed or at most
   ``MAX_NODES_PER_PART`` upserts), heartbeats every ``heartbeat_interval_ms``; a hub
   ``ResyncRequest`` gets a fresh snapshot.

Churn (:class:`Churn`): background pods (1 GPU each, no job label) start on random nodes of the
process's agents and finish ``CHURN_POD_LIFETIME_S`` later, so the hub sees inventory deltas
besides the benchmark's jobs.

Run as a worker process by :mod:`gpufed.sandbox.scale_bench`::

    python -m gpufed.sandbox.simagent CONFIG.json

``CONFIG.json``: ``{"hub", "ca_file", "nodes_per_member", "join_rate", "churn_per_s", "seed",
"agents": [{"name", "token", "index"}]}``, optionally ``"protocol_version"`` (default
:data:`PROTOCOL_VERSION`; 1 plays agents of the release before). The worker builds every agent's nodes, prints
``{"ev": "built"}``, reads one line ``{"t0": <time.monotonic()>}`` from stdin and starts agent
``index`` at ``t0 + index / join_rate``. It prints one JSON line per event, with
``time.monotonic()`` stamps (one clock for every process on the machine): ``first`` (the Hello
written: ``m``), ``ack`` (``job``, ``m``), ``running`` / ``done`` (the status report written:
``job``), ``closed`` (a stream ended: ``m``, ``code``, ``details``). It exits when stdin closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import sys
import time
import uuid
from collections import deque
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc

from gpufed.api.fleet import ClusterSpec, node_specs
from gpufed.api.inventory import MAX_NODES_PER_PART, node_from_labels
from gpufed.api.labels import SIM_DURATION_ANNOTATION
from gpufed.api.protocol import agent_pb2 as pb
from gpufed.api.protocol import agent_pb2_grpc as pb_grpc
from gpufed.api.protocol.codec import node_to_pb
from gpufed.api.protocol.packed import ShapeTable, packed_parts
from gpufed.api.resources import pod_requests, resource_list

GPU = "nvidia.com/gpu"
HGX_PRODUCT = "NVIDIA-H100-80GB-HBM3"
NVL72_PRODUCT = "NVIDIA-GB200"
#: Nodes of one NVL72 NVLink domain (18 trays of 4 GPUs).
NVL72_NODES = 18
#: Seconds a churn pod runs.
CHURN_POD_LIFETIME_S = 10.0
#: How often an agent sends its changed nodes (the real agent's coalescing), seconds.
COALESCE_S = 0.1
#: A job pod without ``gpufed.io/sim-duration`` runs this long, seconds.
DEFAULT_DURATION_S = 5.0
#: The protocol version simulated agents speak unless the config says (``protocol_version``),
#: and the byte budget of one packed inventory message.
PROTOCOL_VERSION = pb.PROTOCOL_VERSION_PACKED_NODES
PACKED_BYTES = 1024 * 1024
#: Seconds between binding a job's pods and acknowledging it (kube-scheduler's part).
BIND_DELAY_S = 0.05

Emit = Callable[[dict[str, Any]], None]


# --- synthetic nodes ---------------------------------------------------------------------------


def sim_cluster(member: str, nodes: int) -> ClusterSpec:
    """The fleet spec of one simulated member of ``nodes`` nodes: about a quarter GB200 NVL72
    (whole domains of 18 four-GPU nodes, one rack each, 4 racks per block), the rest 8-GPU
    HGX H100 nodes (racks of 32, blocks of 8 racks). Raises ``ValueError`` for ``nodes < 1``."""
    if nodes < 1:
        raise ValueError(f"nodes_per_member: {nodes}; use at least 1")
    nvl = (nodes // 4 // NVL72_NODES) * NVL72_NODES
    pools: list[dict[str, Any]] = []
    if nodes - nvl:
        pools.append(
            {
                "name": "hgx",
                "nodes": nodes - nvl,
                "gpu": {"product": HGX_PRODUCT, "count": 8},
                "nvlink": "node",
                "rackSize": 32,
                "racksPerBlock": 8,
            }
        )
    if nvl:
        pools.append(
            {
                "name": "nvl72",
                "nodes": nvl,
                "gpu": {"product": NVL72_PRODUCT, "count": 4},
                "nvlink": {"nodesPerDomain": NVL72_NODES},
                "racksPerBlock": 4,
            }
        )
    return ClusterSpec.model_validate({"name": member, "nodePools": pools})


def sim_nodes(member: str, nodes: int) -> list[pb.Node]:
    """The encoded nodes of :func:`sim_cluster`, idle, Ready (as an agent reports them: labels
    read by :func:`gpufed.api.inventory.node_from_labels`)."""
    out = []
    for spec in node_specs(sim_cluster(member, nodes)):
        inv = node_from_labels(
            spec.name,
            spec.labels,
            taints=spec.taints,
            allocatable=resource_list(spec.allocatable, field=f"{spec.name}.allocatable"),
        )
        out.append(node_to_pb(inv))
    return out


def parse_duration(text: str | None) -> float:
    """``"5s"`` / ``"2.5"`` / ``"1m"`` -> seconds; None or unreadable -> the default."""
    if not text:
        return DEFAULT_DURATION_S
    unit = {"s": 1.0, "m": 60.0, "h": 3600.0}.get(text[-1])
    try:
        return float(text[:-1]) * unit if unit else float(text)
    except ValueError:
        return DEFAULT_DURATION_S


def job_pods(
    manifests: list[dict[str, Any]],
) -> tuple[str, list[tuple[str, dict[str, int]]], float]:
    """The main workload's name, its pods as ``(node, requests)`` and its run time (s), from
    the prepared manifests of a work item (``batch/v1`` Jobs: ``parallelism`` pods, pinned by
    the required node affinity the hub adds: ``metadata.name`` or ``kubernetes.io/hostname``,
    which equals the node name here). A pod without a pinned node gets node ``""``."""
    name, pods, duration = "", [], DEFAULT_DURATION_S
    for obj in manifests:
        if obj.get("kind") != "Job":
            continue
        spec = obj.get("spec") or {}
        template = spec.get("template") or {}
        pod_spec = template.get("spec") or {}
        name = name or (obj.get("metadata") or {}).get("name", "")
        ann = (template.get("metadata") or {}).get("annotations") or {}
        duration = parse_duration(ann.get(SIM_DURATION_ANNOTATION))
        req = dict(pod_requests(pod_spec))
        req.setdefault("pods", 1)
        nodes = _pinned_nodes(pod_spec)
        for i in range(int(spec.get("parallelism") or 1)):
            pods.append((nodes[i % len(nodes)] if nodes else "", req))
    return name, pods, duration


def _pinned_nodes(pod_spec: dict[str, Any]) -> list[str]:
    aff = ((pod_spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    for term in aff.get("nodeSelectorTerms") or []:
        for expr in [*(term.get("matchFields") or []), *(term.get("matchExpressions") or [])]:
            if expr.get("key") in ("metadata.name", "kubernetes.io/hostname"):
                return list(expr.get("values") or [])
    return []


def _now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# --- one agent ---------------------------------------------------------------------------------


class SimAgent:
    """One simulated member agent (module docstring). ``emit`` receives the events."""

    def __init__(
        self,
        name: str,
        token: str,
        hub: str,
        ca: bytes,
        nodes: list[pb.Node],
        emit: Emit,
        *,
        protocol_version: int = pb.PROTOCOL_VERSION_PACKED_NODES,
    ) -> None:
        self.name, self.token, self.hub, self.ca = name, token, hub, ca
        #: the newest protocol version the Hello names (1: an agent of the release before)
        self.protocol_version = protocol_version
        self.nodes = {n.name: n for n in nodes}
        self.node_names = list(self.nodes)
        self.emit = emit
        self.seq = 0
        self.welcomed = asyncio.Event()
        self.heartbeat_s = 10.0
        self._out: asyncio.Queue[tuple[pb.AgentMessage, dict[str, Any] | None]] = asyncio.Queue()
        self._dirty: set[str] = set()
        self._jobs: dict[str, tuple[int, list[tuple[str, dict[str, int]]]]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        #: the node shapes sent on this stream (protocol version 2), None: Node messages
        self._shapes: ShapeTable | None = None
        #: the first packed snapshot's bodies and shape table, packed now (module docstring);
        #: dropped once used or once a pod changes a node
        self._prepacked: tuple[list[dict[str, Any]], ShapeTable] | None = None
        if protocol_version >= pb.PROTOCOL_VERSION_PACKED_NODES:
            table = ShapeTable()
            bodies = [{"packed": p} for p in packed_parts(nodes, table, PACKED_BYTES)]
            self._prepacked = (bodies, table)
        #: Set before the worker cancels the agent: streams ending then are not reported.
        self.stopping = False

    # node bookkeeping

    def bind(self, node: str, req: dict[str, int], job_uid: str | None) -> None:
        """Add ``req`` to ``node``'s requested (and to ``job_uid``'s part of it)."""
        n = self.nodes.get(node)
        if n is None:
            return
        self._prepacked = None
        for k, v in req.items():
            n.requested[k] = n.requested.get(k, 0) + v
            if job_uid:
                amounts = n.job_requests[job_uid].amounts
                amounts[k] = amounts.get(k, 0) + v
        self._dirty.add(node)

    def release(self, node: str, req: dict[str, int], job_uid: str | None) -> None:
        """Take ``req`` off ``node`` again (the pod finished)."""
        n = self.nodes.get(node)
        if n is None:
            return
        self._prepacked = None
        for k, v in req.items():
            left = n.requested.get(k, 0) - v
            if left > 0:
                n.requested[k] = left
            else:
                n.requested.pop(k, None)
        if job_uid and job_uid in n.job_requests:
            del n.job_requests[job_uid]
        self._dirty.add(node)

    def free_gpus(self, node: str) -> int:
        n = self.nodes[node]
        return n.allocatable.get(GPU, 0) - n.requested.get(GPU, 0)

    # the stream

    def _send(self, msg: pb.AgentMessage, event: dict[str, Any] | None = None) -> None:
        self._out.put_nowait((msg, event))

    def _bodies(self, nodes: list[pb.Node], field: str) -> list[dict[str, Any]]:
        """``nodes`` as message bodies: packed by shape on a version-2 stream, else Node
        messages under ``field``, at most the hub's nodes per message; at least one."""
        if self._shapes is not None:
            return [{"packed": p} for p in packed_parts(nodes, self._shapes, PACKED_BYTES)]
        parts = [
            nodes[i : i + MAX_NODES_PER_PART] for i in range(0, len(nodes), MAX_NODES_PER_PART)
        ]
        return [{field: p} for p in parts or [[]]]

    def _snapshot(self) -> None:
        self.seq += 1
        if self._shapes is not None and self._prepacked is not None:
            bodies, self._shapes = self._prepacked  # packed when built, nothing changed since
            self._prepacked = None
        else:
            if self._shapes is not None:
                self._shapes.reset()  # part 0 starts a new shape table at the hub
            bodies = self._bodies(list(self.nodes.values()), "nodes")
        for i, body in enumerate(bodies):
            self._send(
                pb.AgentMessage(
                    inventory_snapshot=pb.InventorySnapshot(
                        seq=self.seq,
                        part=i,
                        final=i == len(bodies) - 1,
                        served_kinds=["Job.batch"],
                        **body,
                    )
                )
            )
        self._dirty.clear()

    async def run(self, start_at: float) -> None:
        """Connect at ``start_at`` (monotonic) and serve until cancelled; a closed stream is
        reported (``closed``) and dialled again after a second."""
        await asyncio.sleep(max(0.0, start_at - time.monotonic()))
        creds = grpc.ssl_channel_credentials(root_certificates=self.ca)
        async with grpc.aio.secure_channel(self.hub, creds) as channel:
            stub = pb_grpc.AgentServiceStub(channel)
            first = True
            while True:
                call = stub.Connect(metadata=(("authorization", f"Bearer {self.token}"),))
                try:
                    await self._session(call, first)
                except grpc.aio.AioRpcError as exc:
                    if self.stopping:
                        raise
                    self.emit(
                        {
                            "ev": "closed",
                            "m": self.name,
                            "code": exc.code().name,
                            "details": (exc.details() or "")[:300],
                        }
                    )
                finally:
                    call.cancel()
                    for t in list(self._tasks):
                        t.cancel()
                first = False
                self.welcomed.clear()
                self._out = asyncio.Queue()
                await asyncio.sleep(1.0)

    async def _session(self, call: Any, first: bool) -> None:
        hello = pb.Hello(
            cluster=self.name,
            agent_version="sim",
            protocol_version=self.protocol_version,
            served_kinds=["Job.batch"],
            agent_instance=uuid.uuid4().hex[:8],
            cluster_uid=str(uuid.uuid5(uuid.NAMESPACE_URL, f"gpufed.io/sim/{self.name}")),
        )
        await call.write(pb.AgentMessage(hello=hello))
        if first:
            self.emit({"ev": "first", "m": self.name, "t": time.monotonic()})
        self._spawn(self._writer(call))
        async for msg in call:
            body = msg.WhichOneof("body")
            if body == "welcome":
                self.heartbeat_s = (msg.welcome.heartbeat_interval_ms or 10_000) / 1000
                packed = msg.welcome.protocol_version >= pb.PROTOCOL_VERSION_PACKED_NODES
                self._shapes = ShapeTable() if packed else None
                self._snapshot()
                self.welcomed.set()
                self._spawn(self._ticker())
            elif body == "work_item":
                self._work(msg.work_item)
            elif body == "desired_set":
                for item in msg.desired_set.items:
                    self._work(item)
            elif body == "resync_request":
                self._snapshot()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _writer(self, call: Any) -> None:
        out = self._out
        while True:
            msg, event = await out.get()
            await call.write(msg)
            if event is not None:
                event["t"] = time.monotonic()
                self.emit(event)

    async def _ticker(self) -> None:
        """Deltas every :data:`COALESCE_S`, heartbeats every ``heartbeat_s``."""
        last_beat = time.monotonic()
        while True:
            await asyncio.sleep(COALESCE_S)
            if self._dirty and self._shapes is not None and self._shapes.full:
                self._snapshot()  # a new shape table
            elif self._dirty:
                names = sorted(self._dirty)
                self._dirty.clear()
                for body in self._bodies([self.nodes[n] for n in names], "upserts"):
                    self.seq += 1
                    self._send(
                        pb.AgentMessage(inventory_delta=pb.InventoryDelta(seq=self.seq, **body))
                    )
            if time.monotonic() - last_beat >= self.heartbeat_s:
                last_beat = time.monotonic()
                self._send(pb.AgentMessage(heartbeat=pb.Heartbeat(inventory_seq=self.seq)))

    # work

    def _work(self, item: pb.WorkItem) -> None:
        held = self._jobs.get(item.job_uid)
        if item.op == pb.WorkItem.DELETE:
            if held is not None:
                for node, req in held[1]:
                    self.release(node, req, item.job_uid)
                del self._jobs[item.job_uid]
            self._ack(item, pb.WorkAck.DELETED)
            return
        if held is not None and held[0] >= item.revision:
            self._ack(item, pb.WorkAck.APPLIED)  # a resend or the desired set again
            return
        manifests = [json.loads(m) for m in item.manifests]
        name, pods, duration = job_pods(manifests)
        pods = [(node or random.choice(self.node_names), req) for node, req in pods]
        self._jobs[item.job_uid] = (item.revision, pods)
        self._ack(item, pb.WorkAck.APPLIED, {"ev": "ack", "m": self.name, "job": item.job})
        self._spawn(self._lifecycle(item, name or "job", pods, duration))

    def _ack(self, item: pb.WorkItem, result: int, event: dict[str, Any] | None = None) -> None:
        ack = pb.WorkAck(job_uid=item.job_uid, revision=item.revision, result=result)  # type: ignore[arg-type]
        self._send(pb.AgentMessage(work_ack=ack), event)

    async def _lifecycle(
        self, item: pb.WorkItem, name: str, pods: list[tuple[str, dict[str, int]]], duration: float
    ) -> None:
        """Bound, Running, then after ``duration`` released and Succeeded."""
        await asyncio.sleep(BIND_DELAY_S)
        for node, req in pods:
            self.bind(node, req, item.job_uid)
        nodes = sorted({n for n, _ in pods})
        started = _now_rfc3339()
        self._status(
            item,
            name,
            "Running",
            nodes,
            active=len(pods),
            ready=len(pods),
            start_time=started,
            event={"ev": "running", "m": self.name, "job": item.job},
        )
        await asyncio.sleep(duration)
        if self._jobs.get(item.job_uid, (None,))[0] != item.revision:
            return  # deleted or replaced meanwhile
        for node, req in pods:
            self.release(node, req, item.job_uid)
        self._status(
            item,
            name,
            "Succeeded",
            nodes,
            succeeded=len(pods),
            start_time=started,
            completion_time=_now_rfc3339(),
            conditions=[
                pb.Condition(
                    type="Complete",
                    status="True",
                    reason="Completed",
                    last_transition_time=_now_rfc3339(),
                )
            ],
            event={"ev": "done", "m": self.name, "job": item.job},
        )

    def _status(
        self,
        item: pb.WorkItem,
        name: str,
        phase: str,
        nodes: list[str],
        *,
        event: dict[str, Any] | None = None,
        **kw: Any,
    ) -> None:
        ws = pb.WorkloadStatus(
            job_uid=item.job_uid,
            revision=item.revision,
            kind="Job.batch",
            name=name,
            phase=phase,
            nodes=nodes,
            **kw,
        )
        self._send(pb.AgentMessage(workload_status=ws), event)


# --- churn --------------------------------------------------------------------------------------


class Churn:
    """Background pods across ``agents``: ``per_s`` pod starts per second (1 GPU, 2 CPUs,
    8 GiB, ``pods: 1``, no job label) on random nodes with a free GPU, each finishing
    :data:`CHURN_POD_LIFETIME_S` later. Only welcomed agents take pods."""

    POD = {GPU: 1, "cpu": 2000, "memory": 8 * 2**30, "pods": 1}

    def __init__(self, agents: list[SimAgent], per_s: float, seed: int) -> None:
        self.agents, self.per_s = agents, per_s
        self.rng = random.Random(seed)
        self.live: deque[tuple[float, SimAgent, str]] = deque()
        self.started = 0

    def tick(self, now: float, dt: float, carry: float) -> float:
        """One step of ``dt`` seconds at ``now``; returns the fractional start carried over."""
        while self.live and self.live[0][0] <= now:
            _, agent, node = self.live.popleft()
            agent.release(node, self.POD, None)
        ready = [a for a in self.agents if a.welcomed.is_set()]
        want = carry + self.per_s * dt
        n = int(want)
        for _ in range(n if ready else 0):
            agent = self.rng.choice(ready)
            node = self.rng.choice(agent.node_names)
            if agent.free_gpus(node) >= 1:
                agent.bind(node, self.POD, None)
                self.live.append((now + CHURN_POD_LIFETIME_S, agent, node))
                self.started += 1
        return want - n

    async def run(self) -> None:
        carry, step = 0.0, COALESCE_S
        while True:
            await asyncio.sleep(step)
            carry = self.tick(time.monotonic(), step, carry)


# --- the worker process --------------------------------------------------------------------------


def _emit(event: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


async def _worker(config: dict[str, Any], ca: bytes) -> None:
    n = int(config["nodes_per_member"])
    agents = [
        (
            a["index"],
            SimAgent(
                a["name"],
                a["token"],
                config["hub"],
                ca,
                sim_nodes(a["name"], n),
                _emit,
                protocol_version=int(config.get("protocol_version", PROTOCOL_VERSION)),
            ),
        )
        for a in config["agents"]
    ]
    _emit({"ev": "built", "agents": len(agents)})
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    go = json.loads(await reader.readline())
    rate = float(config["join_rate"])
    tasks = [asyncio.create_task(a.run(go["t0"] + i / rate)) for i, a in agents]
    churn = Churn([a for _, a in agents], float(config["churn_per_s"]), int(config["seed"]))
    tasks.append(asyncio.create_task(churn.run()))
    await reader.read()  # until the parent closes stdin
    _emit({"ev": "churn", "started": churn.started})
    for _, a in agents:
        a.stopping = True
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        sys.stderr.write("usage: python -m gpufed.sandbox.simagent CONFIG.json\n")
        return 2
    config = json.loads(Path(args[0]).read_text())
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_worker(config, Path(config["ca_file"]).read_bytes()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
