"""``gpufed version``: the client's version and agent protocol, and the hub's when one answers.

The hub's version comes from its HTTP endpoint ``GET /version`` (``hub/edge/http.py``: JSON
``version``, ``protocolVersion``, ``hubId``), the same listener as ``/metrics`` and
``/healthz`` (``gpufed hub --http-listen``, default port 8080). Which hub: ``--hub-url``, else
``$GPUFED_HUB_URL``, else the running local sandbox's hub (``gpufed local up``); with none the
hub line says how to name one. The CLI never needs the hub process otherwise (it talks to the
hub cluster's API server), so this is the one command that asks it directly.

Exit code 0; 1 when a hub was named (flag or variable) and did not answer.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from typing import Annotated, Any

import typer

from gpufed.api.version import gpufed_version, protocol_version

__all__ = ["HUB_URL_ENV", "hub_version", "version_command"]

HUB_URL_ENV = "GPUFED_HUB_URL"
_MAX_BODY = 64 * 1024


def hub_version(url: str, timeout_s: float = 3.0) -> dict[str, Any]:
    """``GET <url>/version`` of a hub: its JSON body (``version``, ``protocolVersion``,
    ``hubId``). Raises ``OSError`` (unreachable, timeout after ``timeout_s`` seconds, an HTTP
    error) or ``ValueError`` (not a gpufed hub's answer)."""
    target = url.rstrip("/") + "/version"
    if not target.startswith(("http://", "https://")):
        raise ValueError(f"--hub-url {url}: use http://HOST:PORT (the hub's --http-listen)")
    with urllib.request.urlopen(target, timeout=timeout_s) as resp:
        body = resp.read(_MAX_BODY + 1)
    if len(body) > _MAX_BODY:
        raise ValueError(f"{target}: the answer is larger than {_MAX_BODY} bytes")
    try:
        doc = json.loads(body)
    except ValueError as exc:
        raise ValueError(f"{target}: not a gpufed hub (the answer is not JSON)") from exc
    if not isinstance(doc, dict) or "version" not in doc:
        raise ValueError(f"{target}: not a gpufed hub (no version in the answer)")
    return doc


def _sandbox_hub_url() -> str | None:
    """The running local sandbox's hub HTTP address, or None."""
    try:
        from gpufed.sandbox.state import SandboxInfo, default_state_dir

        info = SandboxInfo.model_validate_json((default_state_dir() / "sandbox.json").read_text())
    except Exception:  # no sandbox, or one this build cannot read: there is just no default
        return None
    if info.phase != "running" or info.control_plane is None:
        return None
    return info.control_plane.hub_http


def version_command(
    hub_url: Annotated[
        str | None,
        typer.Option(
            "--hub-url",
            help=f"the hub's HTTP address, http://HOST:PORT (default: ${HUB_URL_ENV}, else the "
            "local sandbox's hub)",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
    timeout: Annotated[float, typer.Option(help="seconds to wait for the hub")] = 3.0,
) -> None:
    """Print the client's version and agent protocol, and the hub's (GET /version)."""
    named = hub_url or os.environ.get(HUB_URL_ENV) or None
    url = named or _sandbox_hub_url()
    client = {"version": gpufed_version(), "protocolVersion": protocol_version()}
    hub: dict[str, Any] | None = None
    problem: str | None = None
    if url is not None:
        try:
            hub = hub_version(url, timeout)
        except urllib.error.URLError as exc:
            problem = f"cannot reach the hub at {url}: {exc.reason}"
        except (OSError, ValueError) as exc:
            problem = f"cannot read the hub's version at {url}: {exc}"
    if as_json:
        typer.echo(json.dumps({"client": client, "hub": hub, "hubUrl": url, "hubError": problem}))
    else:
        typer.echo(f"client:   {client['version']}")
        typer.echo(f"protocol: {client['protocolVersion']}")
        if hub is not None:
            typer.echo(
                f"hub:      {hub.get('version')} (protocol {hub.get('protocolVersion')}, "
                f"replica {hub.get('hubId')}) at {url}"
            )
            if hub.get("protocolVersion") != client["protocolVersion"]:
                typer.echo(
                    "warning: the hub speaks another agent protocol: agents of this build "
                    "cannot join it (fix: install the hub's version)",
                    err=True,
                )
        elif problem is not None:
            typer.echo(f"hub:      unknown ({problem})")
        else:
            typer.echo(
                f"hub:      not asked (fix: --hub-url http://HUB:8080 or ${HUB_URL_ENV}; the "
                "hub's --http-listen)"
            )
    if problem is not None and named is not None:
        raise typer.Exit(1)
