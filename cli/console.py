"""``gpufed console``: the read-only web console (:mod:`gpufed.console`), served locally with
the user's own kubeconfig, or (``--identity caller``) for many people, each read with the
caller's own token (the hub chart's ``console`` value runs it that way beside the hub).

Resolves credentials as every other command does (``cli/kube.py``: ``--kubeconfig``,
``$KUBECONFIG``, ``~/.kube/config``, in-cluster; ``--context``), then serves until Ctrl-C;
a page that cannot reach the API server says so. The pages show what that identity may read on the
hub cluster and nothing more (docs/console.md). Registered as ``gpufed console`` by
``cli/main.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Annotated

import typer

from gpufed.api.kubeconfig import KubeconfigError
from gpufed.cli import kube
from gpufed.cli.jobs import explain_text
from gpufed.cli.version import HUB_URL_ENV

__all__ = ["DEFAULT_LISTEN", "console_command", "parse_listen"]

DEFAULT_LISTEN = "127.0.0.1:8765"


def parse_listen(value: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6) -> (host, port); ``ValueError`` naming the flag
    and the fix for anything else (a port outside 0-65535, no port)."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(
            f"--listen {value!r}: expected HOST:PORT with a port 0-65535, e.g. {DEFAULT_LISTEN}"
        )
    return host.strip("[]"), int(port)


async def _serve(
    kubeconfig: Path | None,
    context: str | None,
    namespaces: list[str],
    host: str,
    port: int,
    refresh_s: float,
    hub_url: str | None,
    identity: str,
) -> None:
    from gpufed.console.callers import CallerReaders
    from gpufed.console.reader import HubReader
    from gpufed.console.server import make_app
    from gpufed.hub.edge.http import serve  # the hub's aiohttp start-and-report-the-port

    reader: HubReader | CallerReaders
    if identity == "caller":
        reader = await CallerReaders.connect(kubeconfig, context, namespaces, hub_url=hub_url)
        who = "each caller (their bearer token or the login page)"
    else:
        reader = await HubReader.connect(kubeconfig, context, namespaces, hub_url=hub_url)
        who = reader.source.describe()
    try:
        app = make_app(reader, explain=explain_text, refresh_s=refresh_s, listen_host=host)
        runner, bound = await serve(app, host, port)
        shown = f"[{host}]" if ":" in host else host
        typer.echo(
            f"gpufed console on http://{shown}:{bound}/ as {who} "
            f"(hub cluster {reader.server}); Ctrl-C stops it",
            err=True,
        )
        try:
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()
    finally:
        await reader.close()


def console_command(
    kubeconfig: kube.Kubeconfig = None,
    context: kube.Context = None,
    listen: Annotated[
        str,
        typer.Option(
            "--listen",
            help="HOST:PORT to serve on (a non-loopback host exposes your view of the hub "
            "cluster to whoever reaches it)",
        ),
    ] = DEFAULT_LISTEN,
    namespace: Annotated[
        list[str] | None,
        typer.Option(
            "--namespace",
            "-n",
            help="namespaces whose GPUJobs to show when you may not list them cluster-wide "
            "(repeat; the context's namespace and your queues' namespaces are always tried)",
        ),
    ] = None,
    refresh_s: Annotated[
        float, typer.Option("--refresh", help="seconds between live updates in the browser")
    ] = 5.0,
    hub_url: Annotated[
        str | None,
        typer.Option(
            "--hub-url",
            envvar=HUB_URL_ENV,
            help="the hub's HTTP endpoint (its --http-listen, e.g. through kubectl "
            "port-forward): the fleet page then draws each member's NVLink blocks, asked with "
            "your token; without it, totals only",
        ),
    ] = None,
    identity: Annotated[
        str,
        typer.Option(
            "--identity",
            help="whose identity reads the hub cluster: 'kubeconfig' (yours, resolved as "
            "kubectl does) or 'caller' (each request's own bearer token, from an "
            "authenticating proxy's Authorization header or the login page; the kubeconfig "
            "or the Pod then gives only the API server's address and CA)",
        ),
    ] = "kubeconfig",
) -> None:
    """A read-only web console of the fleet, its queues and jobs, as your identity sees them."""
    try:
        host, port = parse_listen(listen)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="'--listen'") from None
    if hub_url is not None and not hub_url.startswith(("http://", "https://")):
        raise typer.BadParameter(
            f"{hub_url}: use http://HOST:PORT or https://HOST:PORT (the hub's --http-listen)",
            param_hint="'--hub-url'",
        )
    if identity not in ("kubeconfig", "caller"):
        raise typer.BadParameter(
            f"{identity!r}: use 'kubeconfig' or 'caller'", param_hint="'--identity'"
        )
    if not 0.5 <= refresh_s <= 3600:
        raise typer.BadParameter(f"{refresh_s}: use 0.5 to 3600 seconds", param_hint="'--refresh'")
    try:
        kube.resolve(kubeconfig, context)
    except KubeconfigError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    with contextlib.suppress(KeyboardInterrupt):
        try:
            asyncio.run(
                _serve(
                    kubeconfig, context, namespace or [], host, port, refresh_s, hub_url, identity
                )
            )
        except OSError as exc:
            typer.echo(f"error: --listen {listen}: cannot serve there: {exc}", err=True)
            raise typer.Exit(1) from None
