"""The agent process: wires the member API, inventory, work, status and the hub stream.

Owns start-up order and shutdown: connect to the member API, start the Node and Pod
informers and wait for their first list (the first snapshot must be complete), start the
status informers, serve ``/healthz``, then keep the hub stream up until cancelled. Also the
one-shot inventory read behind ``gpufed agent inventory --once`` and its JSON shape.

Called by :mod:`gpufed.cli.agent`; tests build :class:`Agent` directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Iterable
from typing import Any

import structlog

from gpufed.agent.config import AgentConfig
from gpufed.agent.dra import ClaimHandler, SliceHandler
from gpufed.agent.held import EpochGuard
from gpufed.agent.hub_stream import HubStream
from gpufed.agent.informer import Informer
from gpufed.agent.inventory import (
    InventoryState,
    NodeHandler,
    PodHandler,
)
from gpufed.agent.kube import MemberApi
from gpufed.agent.metrics import AgentMetrics, serve_health
from gpufed.agent.status import StatusReporter
from gpufed.agent.work import WorkManager
from gpufed.api.inventory import NodeInventory, TopologyLabels, summarize
from gpufed.api.labels import COMPUTE_DOMAIN_KIND, GPU_RESOURCE, is_mig_resource
from gpufed.api.resources import format_quantity
from gpufed.sync.manifests import WORKLOAD_KINDS
from gpufed.sync.retry import ForbiddenGrace

log = structlog.get_logger("gpufed.agent")

#: Pods that hold resources: the inventory watch skips finished pods at the server.
UNFINISHED_PODS = "status.phase!=Succeeded,status.phase!=Failed"
#: Where GPUs claimed through DRA are read (Kubernetes 1.34+).
RESOURCE_SLICES = "/apis/resource.k8s.io/v1/resourceslices"
RESOURCE_CLAIMS = "/apis/resource.k8s.io/v1/resourceclaims"


async def serves_dra(api: MemberApi) -> bool:
    """Whether the member serves ResourceSlices and ResourceClaims in ``resource.k8s.io/v1``;
    False (with a warning) when discovery fails, so a member without DRA is read as before."""
    try:
        resources = await api.resources_of("resource.k8s.io/v1")
    except Exception as exc:
        log.warning("agent.dra.discovery_failed", error=(str(exc).splitlines() or [repr(exc)])[0])
        return False
    return {"ResourceSlice", "ResourceClaim"} <= resources.keys()


def dra_informers(api: MemberApi, state: InventoryState, **kw: Any) -> list[Informer]:
    """List + watch of the member's ResourceSlices and ResourceClaims into ``state.dra``."""
    return [
        Informer(api, RESOURCE_SLICES, SliceHandler(state.dra), name="resourceslices", **kw),
        Informer(api, RESOURCE_CLAIMS, ClaimHandler(state.dra), name="resourceclaims", **kw),
    ]


def _log_degraded(node: str, reason: str) -> None:
    log.warning("inventory.node.degraded", node=node, reason=reason)


class Agent:
    """One member agent (see module docstring). ``run()`` until cancelled."""

    def __init__(
        self, config: AgentConfig, api: MemberApi, *, metrics: AgentMetrics | None = None
    ) -> None:
        self.config = config
        self.api = api
        self.metrics = metrics or AgentMetrics()
        self.inventory_changed = asyncio.Event()
        self.inventory = InventoryState(
            TopologyLabels(
                rack=config.rack_label, block=config.block_label, clique=config.clique_label
            ),
            on_change=self.inventory_changed.set,
            log_degraded=_log_degraded,
            on_node=lambda node: self.status.node_changed(node),
        )
        on_event = self.metrics.watch_event
        self.node_informer = Informer(
            api, "/api/v1/nodes", NodeHandler(self.inventory), name="nodes", on_event=on_event
        )
        self.pod_informer = Informer(
            api,
            "/api/v1/pods",
            PodHandler(self.inventory),
            name="pods",
            field_selector=UNFINISHED_PODS,
            on_event=on_event,
        )
        self.status = StatusReporter(
            api,
            send=lambda _s: False,
            metrics=self.metrics,
            node_health=self.inventory.node_health,
            node_of_hostname=self.inventory.node_of_hostname,
        )
        self.work = WorkManager(
            api,
            ack=lambda _a: None,
            status=self.status,
            allowed_kinds=config.allowed_kinds,
            metrics=self.metrics,
            origin=config.origin,
            member=config.cluster,
            guard=EpochGuard(config.eviction_grace_s),
            forbidden=ForbiddenGrace(config.forbidden_retry_s),
            pods=api,
        )
        self.hub = HubStream(
            config,
            inventory=self.inventory,
            inventory_changed=self.inventory_changed,
            work=self.work,
            status=self.status,
            served_kinds=self.served_kinds,
            metrics=self.metrics,
            cluster_uid=self.cluster_uid,
            member_api_error=lambda: (
                self.node_informer.failing
                or self.pod_informer.failing
                or next((i.failing for i in self.dra_informers if i.failing), "")
            ),
        )
        self.work.set_ack(self.hub.send_ack)
        self.status.set_send(self.hub.send_status)
        #: ResourceSlice and ResourceClaim informers, started when the member serves DRA
        self.dra_informers: list[Informer] = []
        self.health_port: int | None = None
        self._served: list[str] = []
        self._cluster_uid = ""

    async def cluster_uid(self) -> str:
        """Which Kubernetes cluster this agent talks to: the UID of its ``kube-system``
        Namespace (as Karmada and OCM identify clusters). The hub records it at the first
        join and refuses an agent of the same member name talking to another cluster. ""
        when it cannot be read (the hub then cannot check)."""
        if not self._cluster_uid:
            try:
                ns = await self.api.get_namespace("kube-system")
            except Exception as exc:
                log.warning(
                    "agent.cluster_uid.failed", error=(str(exc).splitlines() or [repr(exc)])[0]
                )
                return ""
            self._cluster_uid = str(((ns or {}).get("metadata") or {}).get("uid") or "")
        return self._cluster_uid

    async def served_kinds(self) -> list[str]:
        """Workload kinds (``Kind.group``) the member serves, by API discovery; refreshed on
        every hub connect, which also starts status watches for newly served kinds."""
        # ComputeDomain: not a workload, but whether the member serves it decides placement
        # (gpufed.placement.computedomain), and its status is watched for the job's condition
        candidates = (WORKLOAD_KINDS & self.config.allowed_kinds) | {COMPUTE_DOMAIN_KIND}
        try:
            self._served = await self.api.served_kinds(candidates)
        except Exception as exc:
            log.warning(
                "agent.discovery.failed", error=str(exc).splitlines()[0] if str(exc) else ""
            )
            if not self._served:
                raise
        await self.status.watch_kinds(self._served)
        return self._served

    def ready(self) -> bool:
        return (
            self.node_informer.synced.is_set()
            and self.pod_informer.synced.is_set()
            and all(i.synced.is_set() for i in self.dra_informers)
            and self.hub.welcomed.is_set()
        )

    async def run(self) -> None:
        """Run until cancelled; cleans up every task it started."""
        tasks: list[asyncio.Task[Any]] = []
        runner = None
        try:
            if self.config.health_port >= 0:
                runner = await serve_health(
                    self.metrics,
                    self.ready,
                    host=self.config.health_host,
                    port=self.config.health_port,
                )
                addrs = runner.addresses
                self.health_port = int(addrs[0][1]) if addrs else None
            tasks.append(asyncio.create_task(self.node_informer.run(), name="informer:nodes"))
            tasks.append(asyncio.create_task(self.pod_informer.run(), name="informer:pods"))
            if await serves_dra(self.api):
                self.dra_informers = dra_informers(
                    self.api, self.inventory, on_event=self.metrics.watch_event
                )
                for informer in self.dra_informers:
                    tasks.append(
                        asyncio.create_task(informer.run(), name=f"informer:{informer.name}")
                    )
            log.info(
                "agent.started",
                cluster=self.config.cluster,
                member=self.api.server,
                hub=self.config.hub,
            )
            await asyncio.gather(
                self.node_informer.synced.wait(),
                self.pod_informer.synced.wait(),
                *(i.synced.wait() for i in self.dra_informers),
            )
            log.info(
                "inventory.synced",
                nodes=self.inventory.node_count,
                pods=self.inventory.pod_count,
                dra_nodes=len(self.inventory.dra.nodes()),
            )
            tasks.append(asyncio.create_task(self.status.run(), name="status"))
            tasks.append(asyncio.create_task(self.hub.run(), name="hub"))
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for t in done:
                t.result()  # re-raise a crashed component
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if runner is not None:
                await runner.cleanup()
            log.info("agent.stopped", cluster=self.config.cluster)


# --- one-shot inventory (gpufed agent inventory --once) ----------------------------------------


async def read_inventory(
    api: MemberApi, topology: TopologyLabels | None = None
) -> list[NodeInventory]:
    """List Nodes, unfinished Pods and (where served) ResourceSlices and ResourceClaims once
    and build the inventory the agent would report."""
    state = InventoryState(topology, log_degraded=_log_degraded)
    informers = [
        Informer(api, "/api/v1/nodes", NodeHandler(state), name="nodes"),
        Informer(
            api, "/api/v1/pods", PodHandler(state), name="pods", field_selector=UNFINISHED_PODS
        ),
    ]
    if await serves_dra(api):
        informers += dra_informers(api, state)
    for informer in informers:
        await informer.relist()
    return state.snapshot()


def _amounts(resources: dict[str, int]) -> dict[str, int | str]:
    """Resource map for people: GPUs and MIG slices as integers, the rest as quantities."""
    return {
        name: amount
        if name == GPU_RESOURCE or is_mig_resource(name)
        else format_quantity(name, amount)
        for name, amount in sorted(resources.items())
    }


def inventory_report(cluster: str, nodes: Iterable[NodeInventory]) -> dict[str, Any]:
    """The JSON object of ``gpufed agent inventory --once --json``.

    ``{"cluster", "nodes": [{"name", "gpu_product", "nvlink_domain", "ready", "schedulable",
    "taints", "allocatable", "requested", "free", "gpus_via_dra"}], "summary": {"gpus_total",
    "gpus_free"}}`` (``gpus_via_dra``: the node's GPUs are published through DRA);
    per-node maps go from resource name to a Kubernetes quantity string, except
    ``nvidia.com/gpu`` and MIG resources as integers; ``free`` = max(0, allocatable -
    requested) per allocatable resource; the summary maps GPU product to whole GPUs on Ready,
    schedulable nodes, taints ignored (docs/design.md §3).
    """
    node_list = list(nodes)
    summary = summarize(node_list)
    return {
        "cluster": cluster,
        "nodes": [
            {
                "name": n.name,
                "gpu_product": n.gpu_product,
                "nvlink_domain": n.nvlink_domain,
                "ready": n.ready,
                "schedulable": not n.unschedulable,
                "taints": [t.model_dump() for t in n.taints],
                "allocatable": _amounts(n.allocatable),
                "requested": _amounts(n.requested),
                "free": _amounts({r: n.free(r) for r in n.allocatable}),
                "gpus_via_dra": n.gpus_via_dra,
            }
            for n in node_list
        ],
        "summary": {"gpus_total": summary.gpus_total, "gpus_free": summary.gpus_free},
    }


async def run_agent(config: AgentConfig) -> None:
    """Entry point of ``gpufed agent``: connect to the member and run until SIGTERM/SIGINT
    (then every task is cancelled and the streams are closed)."""
    api = await MemberApi.connect(
        kubeconfig=str(config.kubeconfig) if config.kubeconfig else None, context=config.context
    )
    task = asyncio.create_task(Agent(config, api).run(), name="agent")
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, task.cancel)
    try:
        await task
    except asyncio.CancelledError:
        log.info("agent.signalled", cluster=config.cluster)
    finally:
        with contextlib.suppress(Exception):
            await api.close()
