"""The agent's Prometheus metrics, its JSON logs and its health endpoint.

Owns the metric names (``gpufed_agent_*``, Prometheus naming), the structlog configuration
(JSON lines, ISO timestamps, fixed event names with bound context) and the small HTTP server
that serves ``/healthz`` (the process and its event loop answer), ``/readyz`` (inventory
listed and the hub stream welcomed) and ``/metrics``.

Each :class:`AgentMetrics` has its own registry, so several agents can run in one process
(tests) without clashing.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable

import structlog
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from gpufed.sync.buildinfo import register_build_info


class AgentMetrics:
    """All metrics of one agent (see the ``documentation`` strings)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.build_info = register_build_info(r, "agent")
        self.hub_connected = Gauge(
            "gpufed_agent_hub_connected", "1 while a hub stream is welcomed, else 0", registry=r
        )
        self.hub_connects = Counter(
            "gpufed_agent_hub_connects_total",
            "Hub connection attempts by result (welcomed, failed)",
            ["result"],
            registry=r,
        )
        self.inventory_nodes = Gauge(
            "gpufed_agent_inventory_nodes", "Nodes in the agent's inventory", registry=r
        )
        self.inventory_pods = Gauge(
            "gpufed_agent_inventory_pods",
            "Bound, unfinished pods counted in requested",
            registry=r,
        )
        self.inventory_degraded_nodes = Gauge(
            "gpufed_agent_inventory_degraded_nodes",
            "Nodes reported degraded (bad labels or quantities)",
            registry=r,
        )
        self.inventory_messages = Counter(
            "gpufed_agent_inventory_messages_total",
            "Inventory messages sent to the hub by type (snapshot part, delta)",
            ["type"],
            registry=r,
        )
        self.inventory_delta_nodes = Counter(
            "gpufed_agent_inventory_delta_nodes_total",
            "Node upserts and removals carried by inventory deltas",
            registry=r,
        )
        self.watch_events = Counter(
            "gpufed_agent_watch_events_total",
            "Watch events and re-lists by resource and type",
            ["resource", "type"],
            registry=r,
        )
        self.work_items = Counter(
            "gpufed_agent_work_items_total",
            "Work items received from the hub by op (Apply, Delete)",
            ["op"],
            registry=r,
        )
        self.work_acks = Counter(
            "gpufed_agent_work_acks_total",
            "Work acks sent by result (Applied, Deleted, Failed)",
            ["result"],
            registry=r,
        )
        self.held_jobs = Gauge(
            "gpufed_agent_held_jobs",
            "Jobs whose objects the last desired set left out but that were applied under "
            "another hub state epoch: kept until claimed or the eviction grace period ends",
            registry=r,
        )
        self.apply_seconds = Histogram(
            "gpufed_agent_apply_duration_seconds",
            "Time to apply one work item revision in the member",
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=r,
        )
        self.status_sent = Counter(
            "gpufed_agent_workload_status_sent_total",
            "Workload status messages sent to the hub",
            registry=r,
        )

    def watch_event(self, resource: str, event_type: str) -> None:
        """Informer callback: count one watch event (or ``RELIST``)."""
        self.watch_events.labels(resource=resource, type=event_type).inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


def configure_logging(level: str = "info", *, stream: object = None) -> None:
    """JSON logs on stderr: ``{"event": "hub.connected", "level": "info", "timestamp": ...,
    "cluster": ...}``. Event names are fixed strings; context is bound, never formatted in."""
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ValueError(f"--log-level: {level!r} is not one of debug, info, warning, error")
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=stream or sys.stderr),  # type: ignore[arg-type]
        cache_logger_on_first_use=True,
    )


async def serve_health(
    metrics: AgentMetrics, ready: Callable[[], bool], *, host: str, port: int
) -> web.AppRunner:
    """Start the HTTP server for ``/healthz``, ``/readyz`` and ``/metrics``; returns the runner
    (call ``await runner.cleanup()`` to stop). ``port`` 0 picks a free port (see
    ``runner.addresses``)."""

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(_: web.Request) -> web.Response:
        ok = ready()
        return web.Response(text="ok\n" if ok else "not ready\n", status=200 if ok else 503)

    async def metrics_handler(_: web.Request) -> web.Response:
        return web.Response(
            body=metrics.exposition(), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    app = web.Application()
    app.add_routes(
        [
            web.get("/healthz", healthz),
            web.get("/readyz", readyz),
            web.get("/metrics", metrics_handler),
        ]
    )
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    return runner
