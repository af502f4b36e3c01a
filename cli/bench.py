"""``gpufed bench``: benchmarks that print one JSON line (``gpufed bench placement``)."""

from __future__ import annotations

import json

import typer

from gpufed.placement.bench import run_placement_bench

app = typer.Typer(help="Benchmarks that print one JSON line.", no_args_is_help=True)


@app.command("placement")
def placement(
    clusters: int = typer.Option(10, "--clusters", min=1, help="Member clusters in the fleet."),
    nodes_per_cluster: int = typer.Option(
        500, "--nodes-per-cluster", min=1, help="Nodes in each member."
    ),
    decisions: int = typer.Option(2000, "--decisions", min=1, help="Jobs to place."),
    seed: int = typer.Option(1, "--seed", help="Seed of the synthetic fleet and job mix."),
    window: int | None = typer.Option(
        None,
        "--window",
        min=1,
        help="Live reservations before the oldest is released (default: ~5% of the GPUs).",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print exactly one JSON line."),
) -> None:
    """Time place() over a seeded synthetic fleet (mixed HGX / NVL72, 50-80% occupied)."""
    result = run_placement_bench(clusters, nodes_per_cluster, decisions, seed, window=window)
    if as_json:
        typer.echo(json.dumps(result))
        return
    for key, value in result.items():
        typer.echo(f"{key:>18}: {value}")
