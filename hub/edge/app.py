"""The hub process: etcd, the hub API client, the agent gRPC server, HTTP, leader election.

``gpufed hub`` (cli/hub.py) builds a :class:`HubConfig` from its flags and runs
:meth:`Hub.run`; integration tests run hubs in-process the same way. Lifecycle:

1. connect etcd (``--etcd``) or start the embedded private etcd (:mod:`gpufed.hub.adapters.etcd`);
2. connect the hub cluster's API server (:mod:`gpufed.hub.adapters.kube`);
3. serve agents (gRPC, TLS) and ``/metrics``, ``/healthz``, ``/readyz``, ``/leaderz`` at once:
   a standby answers agents with UNAVAILABLE, ``/readyz`` with 200 while it reaches etcd
   (Ready, and ready to take over) and ``/leaderz`` with 503;
4. campaign; once elected, run a :class:`Controller` until leadership is lost (then back to
   standby) or the hub is asked to stop (then resign, so a standby takes over at once). With
   ``--pod-name`` the replica's Pod is labelled ``gpufed.io/hub-role`` ``leader`` or
   ``standby`` on each change (:mod:`gpufed.hub.edge.podrole`): the Service selects the leader.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import grpc
import structlog
from aiohttp import web

from gpufed.api.protocol import agent_pb2_grpc as pb_grpc
from gpufed.api.version import gpufed_version, protocol_version
from gpufed.hub.adapters.etcd import EmbeddedEtcd
from gpufed.hub.adapters.kube import KubeAPI
from gpufed.hub.adapters.store import Store
from gpufed.hub.components.config import HubConfig
from gpufed.hub.components.core import Controller
from gpufed.hub.components.metrics import HubMetrics
from gpufed.hub.edge.access import AccessCheck
from gpufed.hub.edge.certs import not_after
from gpufed.hub.edge.heap import HeapPolicy
from gpufed.hub.edge.http import make_app, serve
from gpufed.hub.edge.leader import LeaderElector
from gpufed.hub.edge.loopwatch import watch_loop
from gpufed.hub.edge.podrole import PodRole
from gpufed.hub.edge.service import AgentService, server_credentials
from gpufed.hub.rules.blocks import member_blocks

log = structlog.get_logger("gpufed.hub.edge.app")


def _split(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    if not port.isdigit():
        raise ValueError(f"address {addr!r} is not host:port")
    return host or "0.0.0.0", int(port)


class Hub:
    """One hub replica (see the module docstring).

    ``etcd_binary``: the etcd executable for the embedded etcd (needed only without
    ``config.etcd_endpoints``). After :meth:`start`, :attr:`grpc_port` and :attr:`http_port`
    hold the bound ports (useful with port 0).
    """

    def __init__(self, config: HubConfig, *, etcd_binary: Path | None = None) -> None:
        self.config = config
        self.etcd_binary = etcd_binary
        self.metrics = HubMetrics()
        self.controller: Controller | None = None
        self.grpc_port = 0
        self.http_port = 0
        self.store: Store | None = None
        self._etcd: EmbeddedEtcd | None = None
        self._kube: KubeAPI | None = None
        self._server: grpc.aio.Server | None = None
        self._http: web.AppRunner | None = None
        self._loop_watch: asyncio.Task[None] | None = None
        self._heap = HeapPolicy(self.metrics)
        self._elector: LeaderElector | None = None
        self._pod_role: PodRole | None = None

    # --- start / stop ------------------------------------------------------------------------

    async def start(self) -> None:
        """Connect etcd and the hub API server; start serving gRPC and HTTP."""
        cfg = self.config
        endpoints = list(cfg.etcd_endpoints)
        if not endpoints:
            if self.etcd_binary is None:
                raise ValueError("no --etcd endpoint and no etcd binary for the embedded etcd")
            self._etcd = EmbeddedEtcd(self.etcd_binary, cfg.data_dir)
            await self._etcd.start()
            endpoints = [self._etcd.endpoint]
        self.store = await Store.connect(endpoints, prefix=cfg.etcd_prefix, hub_id=cfg.hub_id)
        self._kube = await KubeAPI.connect(cfg.kubeconfig, cfg.context)
        self._elector = LeaderElector(
            self.store,
            ttl_s=cfg.leader_lease_s,
            on_missed=self.metrics.lease_renewals_missed.inc,
        )
        self._loop_watch = asyncio.create_task(watch_loop(self.metrics), name="hub:loop-watch")
        self._heap.install()
        if cfg.pod_name:
            self._pod_role = PodRole(self._kube, cfg.pod_namespace, cfg.pod_name)
            self._pod_role.start()

        options = [
            ("grpc.max_receive_message_length", cfg.max_message_bytes),
            ("grpc.max_send_message_length", 64 * 1024 * 1024),
            ("grpc.keepalive_time_ms", 20_000),
            ("grpc.keepalive_timeout_ms", 10_000),
            ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
            ("grpc.keepalive_permit_without_calls", 1),
        ]
        server = grpc.aio.server(options=options)
        pb_grpc.add_AgentServiceServicer_to_server(AgentService(lambda: self.controller), server)
        host, port = _split(cfg.listen)
        addr = f"{host}:{port}"
        if cfg.tls is not None:
            cert_pem = cfg.tls.cert_file.read_bytes()
            self.metrics.tls_cert_expiry.set(not_after(cert_pem))
            creds = server_credentials(
                cert_pem,
                cfg.tls.key_file.read_bytes(),
                cfg.tls.client_ca_file.read_bytes() if cfg.tls.client_ca_file else None,
            )
            self.grpc_port = server.add_secure_port(addr, creds)
        else:
            self.grpc_port = server.add_insecure_port(addr)
        await server.start()
        self._server = server

        hhost, hport = _split(cfg.http_listen)
        about = {
            "version": gpufed_version(),
            "protocolVersion": protocol_version(),
            "hubId": cfg.hub_id,
        }
        runner, self.http_port = await serve(
            make_app(
                self.metrics,
                self.readiness,
                about,
                leading=self.leading,
                blocks=self.member_blocks,
                access=AccessCheck(self._kube.review_access),
            ),
            hhost,
            hport,
        )
        self._http = runner
        log.info(
            "hub.started",
            hub=cfg.hub_id,
            grpc_port=self.grpc_port,
            http_port=self.http_port,
            tls=cfg.tls is not None,
            etcd=endpoints,
            prefix=cfg.etcd_prefix,
        )

    @property
    def embedded_etcd(self) -> EmbeddedEtcd | None:
        """The private etcd this hub started (None with ``--etcd``)."""
        return self._etcd

    def readiness(self) -> tuple[bool, str]:
        """(ready, reason) for ``/readyz``: the leader once its initial lists are done; a
        standby while its campaign reaches etcd (it can take over)."""
        ctrl = self.controller
        if ctrl is None:
            if self._elector is not None and self._elector.reachable:
                return True, "standby"
            return False, "standby: etcd not reached (yet)"
        if not ctrl.ready:
            return False, "leader: initial lists not done yet"
        return True, "leader"

    def member_blocks(self, name: str) -> dict[str, Any] | None:
        """One member's NVLink blocks from the leader's placement snapshot (``/fleet/members/
        <name>/blocks``); None on a standby or before the lists are done; ``KeyError`` for a
        member the snapshot does not hold."""
        ctrl = self.controller
        if ctrl is None or not ctrl.ready:
            return None
        return member_blocks(ctrl.snapshot, name, held=ctrl.held_gpus(name))

    def leading(self) -> tuple[bool, str]:
        """(leading, reason) for ``/leaderz``: 200 only on the leader with its lists done."""
        ready, reason = self.readiness()
        return ready and reason == "leader", reason

    async def run(self, stop: asyncio.Event) -> None:
        """Campaign and lead until ``stop`` is set (calls :meth:`start` first if needed)."""
        if self._server is None:
            await self.start()
        assert self._elector is not None
        assert self.store is not None
        assert self._kube is not None
        try:
            while not stop.is_set():
                if not await _first(self._elector.acquire(), stop.wait()):
                    break
                ctrl = Controller(
                    self.config,
                    self.store,
                    self._kube,
                    self.metrics,
                    leading=self._elector.holds,
                )
                try:
                    await ctrl.load()
                except Exception as exc:
                    log.warning("hub.state.load_failed", error=str(exc))
                    await self._elector.resign()
                    await asyncio.sleep(1)
                    continue
                self.controller = ctrl
                if self._pod_role is not None:
                    self._pod_role.set("leader")
                run = asyncio.create_task(ctrl.run())
                hold = asyncio.create_task(self._elector.hold())
                stopping = asyncio.create_task(stop.wait())
                done, _ = await asyncio.wait(
                    {run, hold, stopping}, return_when=asyncio.FIRST_COMPLETED
                )
                self.controller = None
                if self._pod_role is not None:
                    self._pod_role.set("standby")
                if run not in done:
                    ctrl.stop("stopping" if stopping in done else "leadership lost")
                for t in (hold, stopping):
                    t.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await run
                if stopping in done or run in done:
                    await self._elector.resign()
        finally:
            await self.close()

    async def close(self) -> None:
        """Stop serving and disconnect (idempotent)."""
        self._heap.uninstall()
        if self._loop_watch is not None:
            self._loop_watch.cancel()
            self._loop_watch = None
        if self._elector is not None:
            await self._elector.resign()
        if self._pod_role is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._pod_role.stop(), 5)
            self._pod_role = None
        if self._server is not None:
            await self._server.stop(grace=1)
            self._server = None
        if self._http is not None:
            await self._http.cleanup()
            self._http = None
        if self._kube is not None:
            await self._kube.close()
            self._kube = None
        if self.store is not None:
            with contextlib.suppress(Exception):
                await self.store.close()
            self.store = None
        if self._etcd is not None:
            await self._etcd.stop()
            self._etcd = None
        log.info("hub.stopped", hub=self.config.hub_id)


async def _first(acquire: Awaitable[None], stopped: Awaitable[bool]) -> bool:
    """True when ``acquire`` finished first (elected), False when ``stopped`` did; an error of
    ``acquire`` is raised (never taken for an election: a controller that is not the leader
    would start)."""
    a = asyncio.ensure_future(acquire)
    s = asyncio.ensure_future(stopped)
    done, pending = await asyncio.wait({a, s}, return_when=asyncio.FIRST_COMPLETED)
    for t in pending:
        t.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await t
    if a in done:
        a.result()
        return True
    return False
