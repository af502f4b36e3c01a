"""``gpufed demo``: the main job (``make demo``).

For now it brings up the local sandbox with ``manifests/fleets/example.yaml`` (hub + three
member clusters) and prints the GPU inventory read back from the member API servers' Nodes.
A running sandbox in the same state dir is reused. A later issue turns this into the full demo
(hub, agents, jobs placed across the fleet).
"""

from __future__ import annotations

from pathlib import Path

import typer

from gpufed.cli.local import configure_logging, console, fail_cleanly, print_summary
from gpufed.sandbox.runtime import Sandbox

_REPO_ROOT = Path(__file__).resolve().parent.parent
EXAMPLE_FLEET = _REPO_ROOT / "manifests" / "fleets" / "example.yaml"


def demo(
    fleet: Path = typer.Option(EXAMPLE_FLEET, "--fleet", "-f", help="Fleet spec to bring up."),
    state_dir: Path | None = typer.Option(
        None,
        "--state-dir",
        envvar="GPUFED_STATE_DIR",
        show_default=False,
        help="Sandbox state directory (default ~/.local/state/gpufed/sandbox).",
    ),
    down: bool = typer.Option(False, "--down", help="Stop the sandbox after printing."),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Bring up the sandbox with the example fleet and print its GPU inventory."""
    configure_logging(verbose)
    with fail_cleanly():
        sandbox = Sandbox(state_dir, progress=lambda m: console.print(m, soft_wrap=True))
        if sandbox.running_components():
            console.print(f"reusing the sandbox running in {sandbox.state_dir}")
            info = sandbox.info()
        else:
            info = sandbox.up(fleet)
            console.print(f"sandbox up in {info.up_seconds:.1f}s")
        inventory = sandbox.inventory()
        console.print("GPU inventory read from the member API servers' Nodes:")
        print_summary(info, inventory)
        if down:
            sandbox.down()
            console.print("sandbox stopped")
