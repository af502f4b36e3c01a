"""Helpers for hub integration tests: a hub in-process, a fake agent peer, hub API objects.

The fake agent is a test peer speaking the real protocol over real gRPC (TLS, token); it is
not product code. Builders are named after the shapes they make (``hgx_nodes``).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import grpc
from kubernetes_asyncio import client, config

from gpufed.api.inventory import NodeInventory
from gpufed.api.labels import JOIN_TOKEN_LABEL
from gpufed.api.protocol import agent_pb2 as pb
from gpufed.api.protocol import agent_pb2_grpc as pb_grpc
from gpufed.api.protocol.codec import node_to_pb
from gpufed.hub.components.config import HubConfig, TLSConfig
from gpufed.hub.edge import certs
from gpufed.hub.edge.app import Hub

T = TypeVar("T")
H100 = "NVIDIA-H100-80GB-HBM3"
#: Namespaces of the GPUJobs hub tests create (emptied after each test).
JOB_NAMESPACES = ("team-a", "team-b")
CLEANUP_S = 30.0  # how long HubAPI.cleanup waits for the GPUJobs to be gone
#: Where join-token Secrets go.
TOKEN_NAMESPACE = "gpufed-system"
#: How long a wait for something that must happen may take before the test fails. Generous:
#: on a loaded 2-core machine a hub, etcd and an API server can take well over the 20 s these
#: waits had (test_hub_flow and test_priorities failed so); every wait polls or is woken, so
#: only a failing test waits this long. Waits asserting that nothing happens keep short bounds.
BOUND_S = 90.0


def wait_until(check: Callable[[], bool], what: str, limit_s: float = BOUND_S) -> None:
    """Synchronous poll (fixtures outside the event loop)."""
    deadline = time.monotonic() + limit_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {limit_s:.0f} s waiting for {what}")
        time.sleep(0.2)


async def wait_for(
    check: Callable[[], Awaitable[T | None]], what: str, limit_s: float = BOUND_S
) -> T:
    """Poll ``check`` until it returns something truthy (external processes: no events)."""
    deadline = time.monotonic() + limit_s
    last: T | None = None
    while time.monotonic() < deadline:
        last = await check()
        if last:
            return last
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out after {limit_s:.0f} s waiting for {what} (last: {last!r})")


def hgx_nodes(prefix: str, n: int, *, gpus: int = 8, product: str = H100) -> list[NodeInventory]:
    """``n`` idle HGX nodes with ``gpus`` whole GPUs each (every node its own NVLink domain)."""
    return [
        NodeInventory(
            name=f"{prefix}-{i}",
            labels={"nvidia.com/gpu.product": product},
            gpu_product=product,
            nvlink_domain=f"node:{prefix}-{i}",
            allocatable={"nvidia.com/gpu": gpus, "cpu": 96000, "memory": 2**40, "pods": 110},
        )
        for i in range(n)
    ]


def gpu_job(gpus: int = 8, *, pods: int = 1, name: str = "train") -> dict[str, Any]:
    """A batch/v1 Job template: ``pods`` pods of ``gpus`` GPUs."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "parallelism": pods,
            "completions": pods,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {
                            "name": "main",
                            "image": "trainer:1.0",
                            "resources": {"limits": {"nvidia.com/gpu": gpus}},
                        }
                    ],
                }
            },
        },
    }


# --- hub API objects ---------------------------------------------------------------------------


class HubAPI:
    """Test-side access to the hub API server (kubernetes_asyncio)."""

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        self.custom = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)
        self.members: list[str] = []
        self.queues: list[str] = []

    @classmethod
    async def connect(cls, kubeconfig: Path) -> HubAPI:
        cfg = client.Configuration()
        await config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
        return cls(client.ApiClient(configuration=cfg))

    async def close(self) -> None:
        await self.api.close()

    async def cleanup(self) -> None:
        """Remove the GPUJobs of the test namespaces (finalizers stripped) and the members and
        join Secrets this object registered.

        Waits until the API server lists no GPUJob in those namespaces (stripping finalizers
        again if something re-added one), up to ``CLEANUP_S`` seconds; raises ``AssertionError``
        when jobs remain, so that a leftover fails the test that left it and not the next one.
        """
        deadline = time.monotonic() + CLEANUP_S
        while left := await self._remove_jobs():
            if time.monotonic() > deadline:
                raise AssertionError(f"GPUJobs left after the test: {sorted(left)}")
            await asyncio.sleep(0.2)
        await self._remove_registered()

    async def _remove_jobs(self) -> list[str]:
        """One pass of stripping finalizers and deleting; returns the jobs that were listed."""
        listed: list[str] = []
        for ns in JOB_NAMESPACES:
            jobs = await self.custom.list_namespaced_custom_object(
                "gpufed.io", "v1alpha1", ns, "gpujobs"
            )
            for obj in jobs["items"]:
                listed.append(f"{ns}/{obj['metadata']['name']}")
                name = obj["metadata"]["name"]
                with contextlib.suppress(client.ApiException):
                    await self.custom.patch_namespaced_custom_object(
                        "gpufed.io",
                        "v1alpha1",
                        ns,
                        "gpujobs",
                        name,
                        {"metadata": {"finalizers": None}},
                        _content_type="application/merge-patch+json",
                    )
                with contextlib.suppress(client.ApiException):
                    await self.delete_job(name, ns)
        return listed

    async def _remove_registered(self) -> None:
        for name in self.queues:
            with contextlib.suppress(client.ApiException):
                await self.custom.delete_cluster_custom_object(
                    "gpufed.io", "v1alpha1", "gpuqueues", name
                )
        for name in self.members:
            with contextlib.suppress(client.ApiException):
                await self.custom.delete_cluster_custom_object(
                    "gpufed.io", "v1alpha1", "memberclusters", name
                )
            for secret in (f"{name}-join", f"gpufed-join-{name}"):
                with contextlib.suppress(client.ApiException):
                    await self.core.delete_namespaced_secret(secret, TOKEN_NAMESPACE)

    async def register_member(
        self, name: str, *, labels: dict[str, str] | None = None, token: str | None = None
    ) -> str:
        """A Secret with a join token and a MemberCluster referencing it; returns the token."""
        token = token or uuid.uuid4().hex
        self.members.append(name)
        await self.core.create_namespaced_secret(
            TOKEN_NAMESPACE,
            {
                "metadata": {"name": f"{name}-join", "labels": {JOIN_TOKEN_LABEL: "true"}},
                "data": {"token": base64.b64encode(token.encode()).decode()},
            },
        )
        await self.custom.create_cluster_custom_object(
            "gpufed.io",
            "v1alpha1",
            "memberclusters",
            {
                "apiVersion": "gpufed.io/v1alpha1",
                "kind": "MemberCluster",
                "metadata": {"name": name},
                "spec": {"labels": labels or {}, "joinTokenRef": {"name": f"{name}-join"}},
            },
        )
        return token

    async def put_queue(self, name: str, spec: dict[str, Any]) -> dict[str, Any]:
        """Create GPUQueue ``name`` with ``spec``, or replace the spec of the one there
        (deleted after the test)."""
        if name not in self.queues:
            self.queues.append(name)
            obj: dict[str, Any] = await self.custom.create_cluster_custom_object(
                "gpufed.io",
                "v1alpha1",
                "gpuqueues",
                {
                    "apiVersion": "gpufed.io/v1alpha1",
                    "kind": "GPUQueue",
                    "metadata": {"name": name},
                    "spec": spec,
                },
            )
            return obj
        obj = await self.custom.patch_cluster_custom_object(
            "gpufed.io",
            "v1alpha1",
            "gpuqueues",
            name,
            [{"op": "replace", "path": "/spec", "value": spec}],
            _content_type="application/json-patch+json",
        )
        return obj

    async def queue(self, name: str) -> dict[str, Any]:
        obj: dict[str, Any] = await self.custom.get_cluster_custom_object(
            "gpufed.io", "v1alpha1", "gpuqueues", name
        )
        return obj

    async def rotate_token(self, name: str, token: str | None = None) -> str:
        """Write a new token into member ``name``'s join Secret; returns it."""
        token = token or uuid.uuid4().hex
        await self.core.patch_namespaced_secret(
            f"{name}-join",
            TOKEN_NAMESPACE,
            {"data": {"token": base64.b64encode(token.encode()).decode()}},
        )
        return token

    async def create_job(
        self,
        name: str,
        template: dict[str, Any],
        *,
        namespace: str = "team-a",
        placement: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        obj: dict[str, Any] = await self.custom.create_namespaced_custom_object(
            "gpufed.io",
            "v1alpha1",
            namespace,
            "gpujobs",
            {
                "apiVersion": "gpufed.io/v1alpha1",
                "kind": "GPUJob",
                "metadata": {"name": name},
                "spec": {"template": template, "placement": placement or {}},
            },
        )
        return obj

    async def job(self, name: str, namespace: str = "team-a") -> dict[str, Any] | None:
        try:
            obj: dict[str, Any] = await self.custom.get_namespaced_custom_object(
                "gpufed.io", "v1alpha1", namespace, "gpujobs", name
            )
        except client.ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return obj

    async def delete_job(self, name: str, namespace: str = "team-a") -> None:
        await self.custom.delete_namespaced_custom_object(
            "gpufed.io", "v1alpha1", namespace, "gpujobs", name
        )

    def track_member(self, name: str) -> None:
        """Remove this member (and its join Secret) after the test."""
        self.members.append(name)

    async def member(self, name: str) -> dict[str, Any]:
        obj: dict[str, Any] = await self.custom.get_cluster_custom_object(
            "gpufed.io", "v1alpha1", "memberclusters", name
        )
        return obj

    async def phase(self, name: str, namespace: str = "team-a") -> str | None:
        obj = await self.job(name, namespace)
        return ((obj or {}).get("status") or {}).get("phase")

    async def events(self, name: str, namespace: str = "team-a") -> list[Any]:
        evs = await self.core.list_namespaced_event(
            namespace, field_selector=f"involvedObject.name={name}"
        )
        return list(evs.items)


# --- a hub in-process --------------------------------------------------------------------------


def hub_config(
    tmp: Path, kubeconfig: Path, etcd_endpoint: str, prefix: str, **overrides: Any
) -> HubConfig:
    """A hub config for tests: free ports, sandbox TLS, short timers."""
    files = certs.generate(tmp / "tls")
    values: dict[str, Any] = {
        "listen": "127.0.0.1:0",
        "http_listen": "127.0.0.1:0",
        "kubeconfig": kubeconfig,
        "etcd_endpoints": (etcd_endpoint,),
        "etcd_prefix": prefix,
        "data_dir": tmp / "data",
        "tls": TLSConfig(cert_file=files.server_cert, key_file=files.server_key),
        "leader_lease_s": 3,
        "heartbeat_interval_s": 1.0,
        "inventory_flush_s": 0.5,
        "status_interval_s": 0.5,
    }
    values.update(overrides)
    return HubConfig(**values)


@contextlib.asynccontextmanager
async def running_hub(cfg: HubConfig, *, etcd_binary: Path | None = None) -> AsyncIterator[Hub]:
    """Run a hub until the block ends; yields it once it leads and listed everything."""
    hub = Hub(cfg, etcd_binary=etcd_binary)
    stop = asyncio.Event()
    task = asyncio.create_task(hub.run(stop))

    async def leading() -> bool:
        if task.done():
            task.result()
        return hub.controller is not None and hub.controller.ready

    try:
        await wait_for(leading, "the hub to lead")
        yield hub
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)


# --- a fake agent ------------------------------------------------------------------------------


class FakeAgent:
    """One agent stream over real gRPC with TLS and a join token (a test peer)."""

    def __init__(self, port: int, cluster: str, token: str, ca: Path) -> None:
        self.port = port
        self.cluster = cluster
        self.token = token
        self.ca = ca
        self.received: asyncio.Queue[pb.HubMessage] = asyncio.Queue()
        self.code: grpc.StatusCode | None = None
        self.details = ""
        self._done = asyncio.Event()
        self._channel: grpc.aio.Channel | None = None
        self._call: Any = None
        self._reader: asyncio.Task[None] | None = None

    async def connect(
        self,
        *,
        hello: pb.Hello | None = None,
        nodes: list[NodeInventory] | None = None,
        seq: int = 1,
        first: pb.AgentMessage | None = None,
        silent: bool = False,
    ) -> None:
        """Open the stream, send Hello (and a one-part snapshot when ``nodes`` is given);
        ``first`` replaces the Hello with any other first message; ``silent``: send nothing
        (a hub that refuses at once: a write racing its abort can make gRPC's client report
        "Internal error from Core" instead of the hub's status)."""
        creds = grpc.ssl_channel_credentials(root_certificates=self.ca.read_bytes())
        self._channel = grpc.aio.secure_channel(f"localhost:{self.port}", creds)
        stub = pb_grpc.AgentServiceStub(self._channel)
        self._call = stub.Connect(metadata=(("authorization", f"Bearer {self.token}"),))
        self._reader = asyncio.create_task(self._read())
        if silent:
            return
        if first is not None:
            await self.send(first)
            return
        await self.send(
            pb.AgentMessage(
                hello=hello
                or pb.Hello(
                    cluster=self.cluster,
                    agent_version="test",
                    protocol_version=1,
                    served_kinds=["Job.batch"],
                    agent_instance=uuid.uuid4().hex[:8],
                )
            )
        )
        if nodes is not None:
            await self.snapshot(nodes, seq=seq)

    async def _read(self) -> None:
        try:
            while True:
                msg = await self._call.read()
                if msg is grpc.aio.EOF:
                    break
                self.received.put_nowait(msg)
        except (grpc.aio.AioRpcError, asyncio.CancelledError):
            pass  # the hub closed the stream, or close() cancelled the call
        finally:
            with contextlib.suppress(Exception):
                self.code = await self._call.code()
                self.details = await self._call.details()
            self._done.set()

    async def send(self, msg: pb.AgentMessage) -> None:
        """Write one message; a stream the hub already ended is left to :meth:`closed`."""
        try:
            await self._call.write(msg)
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
            if not self._done.is_set():
                await asyncio.wait_for(self._done.wait(), 10)

    async def snapshot(self, nodes: list[NodeInventory], *, seq: int = 1) -> None:
        await self.send(
            pb.AgentMessage(
                inventory_snapshot=pb.InventorySnapshot(
                    seq=seq,
                    part=0,
                    final=True,
                    nodes=[node_to_pb(n) for n in nodes],
                    served_kinds=["Job.batch"],
                )
            )
        )

    async def next(self, kind: str, limit_s: float = BOUND_S) -> Any:
        """The next received message with body ``kind`` (others are skipped)."""
        deadline = time.monotonic() + limit_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"{self.cluster}: no {kind} within {limit_s:.0f} s")
            try:
                msg = await asyncio.wait_for(self.received.get(), left)
            except TimeoutError:
                continue
            if msg.WhichOneof("body") == kind:
                return getattr(msg, kind)

    async def ack(self, item: pb.WorkItem, result: int = pb.WorkAck.APPLIED, **kw: Any) -> None:
        await self.send(
            pb.AgentMessage(
                work_ack=pb.WorkAck(
                    job_uid=item.job_uid, revision=item.revision, result=result, **kw
                )
            )
        )

    async def report(self, item: pb.WorkItem, phase: str, **kw: Any) -> None:
        await self.send(
            pb.AgentMessage(
                workload_status=pb.WorkloadStatus(
                    job_uid=item.job_uid,
                    revision=item.revision,
                    kind="Job.batch",
                    name="train",
                    phase=phase,
                    **kw,
                )
            )
        )

    async def closed(self, limit_s: float = BOUND_S) -> tuple[grpc.StatusCode | None, str]:
        """Wait until the hub ends the stream; returns its status code and details."""
        await asyncio.wait_for(self._done.wait(), limit_s)
        return self.code, self.details

    async def close(self) -> None:
        if self._call is not None:
            self._call.cancel()
        if self._reader is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._reader, 5)
        if self._channel is not None:
            await self._channel.close()
