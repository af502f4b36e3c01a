"""``gpufed simulate``: replay a job trace against a fleet spec through ``place()``."""

from __future__ import annotations

import json
import time
from pathlib import Path

import typer

from gpufed.api.fleet import FleetError
from gpufed.placement.simulate import (
    HORIZON_AFTER_LAST_ARRIVAL_S,
    POLICIES,
    TraceError,
    load_fleet,
    read_trace,
    simulate,
)


def simulate_command(
    fleet: Path = typer.Option(..., "--fleet", help="Fleet spec YAML (docs/design.md §5)."),
    trace: Path = typer.Option(..., "--trace", help="Trace CSV (docs/design.md §6)."),
    policy: str = typer.Option(
        "gpufed", "--policy", help=f"Placement policy: {', '.join(POLICIES)}."
    ),
    horizon: float = typer.Option(
        HORIZON_AFTER_LAST_ARRIVAL_S,
        "--horizon",
        min=0,
        help="Stop this many simulated seconds after the last arrival (default: 30 days).",
    ),
    member_fit: str = typer.Option(
        "spread",
        "--member-fit",
        help="Baselines only: how pods pick nodes inside a member, spread (kube-scheduler "
        "default LeastAllocated) or pack.",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print exactly one JSON line."),
) -> None:
    """Replay TRACE on FLEET in simulated time until every job has finished."""
    if policy not in POLICIES:
        raise typer.BadParameter(
            f"{policy!r} is not one of {', '.join(POLICIES)}", param_hint="--policy"
        )
    if member_fit not in ("spread", "pack"):
        raise typer.BadParameter("use spread or pack", param_hint="--member-fit")
    try:
        members = load_fleet(fleet)
        jobs = read_trace(trace)
    except (FleetError, TraceError, OSError) as exc:
        typer.echo(f"gpufed simulate: {exc}", err=True)
        raise typer.Exit(2) from None
    t0 = time.perf_counter()
    result = simulate(members, jobs, policy, horizon_s=horizon, member_fit=member_fit)  # type: ignore[arg-type]
    result.runtime_s = time.perf_counter() - t0
    if as_json:
        typer.echo(json.dumps(result.as_json()))
        return
    for key, value in result.as_json().items():
        typer.echo(f"{key:>30}: {value}")
