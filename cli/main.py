"""The ``rankscope`` command. Each command is a few lines over one library call."""

from __future__ import annotations

import typer

from rankscope import __version__
from rankscope.cli import agent, demo, detect, diagnose, fr, recovery, store

app = typer.Typer(
    name="rankscope",
    help="Find the faulty machine in a large distributed training job, and get training going again.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"rankscope {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    """Find the faulty machine in a large distributed training job."""


# Each command lives in its own module (cli/<name>.py) with register(app).
for _mod in (diagnose, demo, store, agent, fr, detect, recovery):
    _mod.register(app)
