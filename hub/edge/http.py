"""The hub's HTTP endpoints: ``/metrics`` (Prometheus), ``/healthz``, ``/readyz``, ``/leaderz``
and ``/version``.

Served by the hub process (:mod:`gpufed.hub.edge.app`) on ``--http-listen`` with aiohttp.
``/healthz`` answers 200 while the event loop runs (liveness). ``/readyz`` answers 200 on the
leader once its initial lists are done and on a standby that reaches etcd (every replica of a
healthy Deployment is Ready; the Service reaches the leader by its Pod label,
:mod:`gpufed.hub.edge.podrole`), 503 with the reason otherwise; the body is the role (``leader``,
``standby``). ``/leaderz`` answers 200 only on the leader with its lists done (what drills and
the sandbox wait for). ``/version``
answers JSON ``{"version": <gpufed distribution version>, "protocolVersion": <agent protocol
version>, "hubId": <replica id>}`` on every replica (``gpufed version --hub-url``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gpufed.hub.components.metrics import HubMetrics


def make_app(
    metrics: HubMetrics,
    readiness: Callable[[], tuple[bool, str]],
    version: Mapping[str, object] | None = None,
    *,
    leading: Callable[[], tuple[bool, str]] | None = None,
) -> web.Application:
    """The aiohttp application; ``readiness()`` and ``leading()`` return (ok, reason) for
    ``/readyz`` and ``/leaderz`` (``leading`` None: ``/leaderz`` answers as ``/readyz``);
    ``version``: the body of ``/version`` (``version``, ``protocolVersion``, ``hubId``)."""
    leader_check = leading or readiness
    version_body = dict(version or {})

    async def metrics_handler(_: web.Request) -> web.Response:
        body = generate_latest(metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(_: web.Request) -> web.Response:
        ready, reason = readiness()
        return web.Response(text=f"{reason}\n", status=200 if ready else 503)

    async def leaderz(_: web.Request) -> web.Response:
        ok, reason = leader_check()
        return web.Response(text=f"{reason}\n", status=200 if ok else 503)

    async def version_handler(_: web.Request) -> web.Response:
        return web.json_response(version_body)

    app = web.Application()
    app.router.add_get("/metrics", metrics_handler)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/leaderz", leaderz)
    app.router.add_get("/version", version_handler)
    return app


async def serve(app: web.Application, host: str, port: int) -> tuple[web.AppRunner, int]:
    """Start serving; returns the runner (``await runner.cleanup()`` stops) and the bound port."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = port
    for addr in runner.addresses:
        if isinstance(addr, tuple) and len(addr) >= 2:
            bound = int(addr[1])
            break
    return runner, bound
