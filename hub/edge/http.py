"""The hub's HTTP endpoints: ``/metrics`` (Prometheus), ``/healthz``, ``/readyz``, ``/leaderz``,
``/version`` and ``/fleet/members/<name>/blocks``.

Served by the hub process (:mod:`gpufed.hub.edge.app`) on ``--http-listen`` with aiohttp.
``/healthz`` answers 200 while the event loop runs (liveness). ``/readyz`` answers 200 on the
leader once its initial lists are done and on a standby that reaches etcd (every replica of a
healthy Deployment is Ready; the Service reaches the leader by its Pod label,
:mod:`gpufed.hub.edge.podrole`), 503 with the reason otherwise; the body is the role (``leader``,
``standby``). ``/leaderz`` answers 200 only on the leader with its lists done (what drills and
the sandbox wait for). ``/version``
answers JSON ``{"version": <gpufed distribution version>, "protocolVersion": <agent protocol
version>, "hubId": <replica id>}`` on every replica (``gpufed version --hub-url``).

``/fleet/members/<name>/blocks`` answers one member's NVLink blocks as the leader sees them now
(JSON of :func:`gpufed.hub.rules.blocks.member_blocks`: per block the GPUs used, reserved, free
and unavailable; what ``gpufed console`` draws). It is the one endpoint that shows fleet state,
so it asks for ``Authorization: Bearer <token>`` of the hub cluster and serves only a caller
whom the hub cluster's RBAC lets ``get`` that MemberCluster (:mod:`gpufed.hub.edge.access`):
401 without a valid token, 403 when denied, 404 for an unknown member, 503 on a standby or
before the leader's lists are done. Bounded: at most
:data:`gpufed.hub.rules.blocks.MAX_BLOCKS` blocks per answer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gpufed.hub.components.metrics import HubMetrics
from gpufed.hub.edge.access import AccessCheck

#: ``blocks(member)``: the body of ``/fleet/members/<member>/blocks``; None when this replica
#: cannot answer (a standby, lists not done); ``KeyError`` for an unknown member.
Blocks = Callable[[str], Mapping[str, object] | None]


def make_app(
    metrics: HubMetrics,
    readiness: Callable[[], tuple[bool, str]],
    version: Mapping[str, object] | None = None,
    *,
    leading: Callable[[], tuple[bool, str]] | None = None,
    blocks: Blocks | None = None,
    access: AccessCheck | None = None,
) -> web.Application:
    """The aiohttp application; ``readiness()`` and ``leading()`` return (ok, reason) for
    ``/readyz`` and ``/leaderz`` (``leading`` None: ``/leaderz`` answers as ``/readyz``);
    ``version``: the body of ``/version`` (``version``, ``protocolVersion``, ``hubId``);
    ``blocks`` and ``access``: ``/fleet/members/<name>/blocks`` and who may read it (served only
    when both are given)."""
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

    async def blocks_handler(request: web.Request) -> web.Response:
        assert blocks is not None
        assert access is not None
        name = request.match_info["name"]
        code, why = await access.check(request.headers.get("Authorization"), name)
        if code != 200:
            headers = {"WWW-Authenticate": 'Bearer realm="gpufed-hub"'} if code == 401 else {}
            return web.json_response({"error": why}, status=code, headers=headers)
        try:
            body = blocks(name)
        except KeyError:
            return web.json_response({"error": f"no member cluster {name!r}"}, status=404)
        if body is None:
            return web.json_response(
                {"error": "this hub replica is not the leader with its lists done"}, status=503
            )
        return web.json_response(dict(body))

    app = web.Application()
    app.router.add_get("/metrics", metrics_handler)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/leaderz", leaderz)
    app.router.add_get("/version", version_handler)
    if blocks is not None and access is not None:
        app.router.add_get("/fleet/members/{name}/blocks", blocks_handler)
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
