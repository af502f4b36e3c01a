"""``gpufed agent``: run the member agent, or print what it would report.

``gpufed agent --cluster NAME --hub ADDR --token-file F [--ca-file F] [--kubeconfig F]
[--context C]`` runs the agent (member credentials as kubectl finds them: ``--kubeconfig``,
``$KUBECONFIG``, ``~/.kube/config``, else in-cluster; ``api/kubeconfig.py``);
``gpufed agent inventory --once --json --cluster NAME [--kubeconfig F] [--context C]`` prints
the inventory the agent would send, for people asking "what does the hub see".
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import typer
from pydantic import ValidationError

from gpufed.agent.agent import inventory_report, read_inventory, run_agent
from gpufed.agent.config import AgentConfig
from gpufed.agent.kube import MemberApi
from gpufed.agent.metrics import configure_logging
from gpufed.api.inventory import TopologyLabels
from gpufed.api.labels import (
    DEFAULT_BLOCK_LABEL,
    DEFAULT_ORIGIN,
    DEFAULT_RACK_LABEL,
    GPU_CLIQUE_LABEL,
)

app = typer.Typer(
    help="The member agent: reports GPU inventory to the hub and applies its work.",
    invoke_without_command=True,
)

_KUBECONFIG = typer.Option(
    None,
    "--kubeconfig",
    help="Member kubeconfig (default as kubectl: $KUBECONFIG, ~/.kube/config, in-cluster).",
)
_CONTEXT = typer.Option(None, "--context", help="Context in the kubeconfig.")
_RACK = typer.Option(DEFAULT_RACK_LABEL, "--rack-label", help="Node label naming the rack.")
_BLOCK = typer.Option(DEFAULT_BLOCK_LABEL, "--block-label", help="Node label naming the block.")
_CLIQUE = typer.Option(
    GPU_CLIQUE_LABEL, "--clique-label", help="Node label naming a multi-node NVLink domain."
)


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code=2)


@app.callback()
def agent(
    ctx: typer.Context,
    cluster: str = typer.Option(None, "--cluster", help="This member cluster's name."),
    hub: str = typer.Option(None, "--hub", help="Hub gRPC address, host:port."),
    token_file: Path = typer.Option(None, "--token-file", help="File holding the join token."),
    ca_file: Path = typer.Option(None, "--ca-file", help="CA bundle for the hub's TLS cert."),
    tls: bool = typer.Option(
        False, "--tls", help="TLS with the system roots (implied by --ca-file)."
    ),
    kubeconfig: Path = _KUBECONFIG,
    context: str = _CONTEXT,
    rack_label: str = _RACK,
    block_label: str = _BLOCK,
    clique_label: str = _CLIQUE,
    coalesce_ms: int = typer.Option(200, "--coalesce-ms", help="Min ms between node deltas."),
    health_port: int = typer.Option(
        8081, "--health-port", help="Port of /healthz, /readyz, /metrics (-1: off)."
    ),
    log_level: str = typer.Option("info", "--log-level", help="debug, info, warning, error."),
    origin: str = typer.Option(
        DEFAULT_ORIGIN,
        "--origin",
        help="The hub's --origin: only objects labelled with it are touched.",
    ),
    eviction_grace_s: float = typer.Option(
        3600.0,
        "--eviction-grace-period",
        help="Seconds to keep objects of another hub state epoch that the hub's desired set "
        "leaves out (the hub may claim them meanwhile) before deleting them.",
    ),
    forbidden_retry_s: float = typer.Option(
        60.0,
        "--forbidden-retry-period",
        help="Seconds a Forbidden (403) on one job's apply or delete is retried, from the first "
        "one, before the job is refused (a member API server that just restarted forbids "
        "everything for a while).",
    ),
) -> None:
    """Run the agent (unless a sub-command such as `inventory` is given)."""
    if ctx.invoked_subcommand is not None:
        return
    missing = [
        flag
        for flag, value in (("--cluster", cluster), ("--hub", hub), ("--token-file", token_file))
        if not value
    ]
    if missing:
        raise _fail(f"missing {', '.join(missing)} (see gpufed agent --help)")
    try:
        config = AgentConfig(
            cluster=cluster,
            hub=hub,
            token_file=token_file,
            ca_file=ca_file,
            tls=tls,
            kubeconfig=kubeconfig,
            context=context,
            rack_label=rack_label,
            block_label=block_label,
            clique_label=clique_label,
            coalesce_ms=coalesce_ms,
            health_port=health_port,
            log_level=log_level,
            origin=origin,
            eviction_grace_s=eviction_grace_s,
            forbidden_retry_s=forbidden_retry_s,
        )
        config.read_token()  # fail now, with the file's name, rather than on first connect
        configure_logging(log_level)
    except ValidationError as exc:
        raise _fail(
            "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in exc.errors())
        ) from exc
    except ValueError as exc:
        raise _fail(str(exc)) from exc
    try:
        asyncio.run(run_agent(config))
    except ValueError as exc:
        raise _fail(str(exc)) from exc
    except KeyboardInterrupt:
        pass


@app.command()
def inventory(
    cluster: str = typer.Option(..., "--cluster", help="Name to report the cluster under."),
    once: bool = typer.Option(False, "--once", help="Read the inventory once and exit."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    kubeconfig: Path = _KUBECONFIG,
    context: str = _CONTEXT,
    rack_label: str = _RACK,
    block_label: str = _BLOCK,
    clique_label: str = _CLIQUE,
) -> None:
    """Print the inventory the agent would report to the hub."""
    if not once:
        raise _fail("only --once is supported (the running agent streams; this reads once)")
    configure_logging("warning")
    topology = TopologyLabels(rack=rack_label, block=block_label, clique=clique_label)

    async def read() -> dict[str, object]:
        api = await MemberApi.connect(
            kubeconfig=str(kubeconfig) if kubeconfig else None, context=context
        )
        async with api:
            return inventory_report(cluster, await read_inventory(api, topology))

    try:
        report = asyncio.run(read())
    except ValueError as exc:
        raise _fail(str(exc)) from exc
    if as_json:
        typer.echo(json.dumps(report, indent=2, sort_keys=False))
        return
    _print_table(report)


def _print_table(report: dict[str, object]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"cluster {report['cluster']}")
    for col in ("node", "gpu product", "nvlink domain", "ready", "schedulable", "gpus free/alloc"):
        table.add_column(col)
    nodes = report["nodes"]
    assert isinstance(nodes, list)
    for n in nodes:
        alloc = n["allocatable"].get("nvidia.com/gpu", 0)
        free = n["free"].get("nvidia.com/gpu", 0)
        table.add_row(
            n["name"],
            n["gpu_product"] or "-",
            n["nvlink_domain"],
            str(n["ready"]),
            str(n["schedulable"]),
            f"{free}/{alloc}",
        )
    console = Console()
    console.print(table)
    console.print(f"summary: {json.dumps(report['summary'])}")
