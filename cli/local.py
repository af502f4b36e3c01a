"""``gpufed local``: the local multi-cluster sandbox (build, up, status, down)."""

from __future__ import annotations

import typer

app = typer.Typer(
    help="Local sandbox: real control planes with kwok GPU nodes.", no_args_is_help=True
)


@app.command()
def build() -> None:
    """Build the pinned control-plane binaries (not implemented yet in this skeleton)."""
    typer.echo("gpufed local build: not implemented yet")
