"""Entry point of the ``gpufed`` command: assembles the sub-commands of each component.

Each sub-command group lives in its own module of this package and registers a typer app here.
Errors that escape a command are reported as one line by :class:`gpufed.cli.errors.GpufedGroup`
(``GPUFED_DEBUG=1`` shows the traceback instead).
"""

from __future__ import annotations

import typer

from gpufed.cli import (
    agent,
    bench,
    console,
    demo,
    get,
    hub,
    jobs,
    local,
    simulate,
    submit,
    version,
)
from gpufed.cli.errors import GpufedGroup

app = typer.Typer(
    name="gpufed",
    help="Multi-cluster federation control plane for GPU Kubernetes clusters.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    cls=GpufedGroup,
)
app.add_typer(local.app, name="local")
app.command("demo")(demo.demo)
app.add_typer(bench.app, name="bench")
app.command("simulate")(simulate.simulate_command)
app.add_typer(hub.app, name="hub")
app.command("submit")(submit.submit)
app.add_typer(get.get_app, name="get")
app.command("explain")(jobs.explain)
app.command("delete")(jobs.delete)
app.command("console")(console.console_command)
app.add_typer(agent.app, name="agent")
app.command("version")(version.version_command)


def main() -> None:
    """Console-script entry point (``gpufed``)."""
    app()
