"""The ``rankscope`` command. Each command is a few lines over one library call."""

from __future__ import annotations

import importlib

import typer

from .. import __version__

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


# Command modules register themselves; each owns its own file (cli/<name>.py with register(app)).
COMMAND_MODULES = ("diagnose", "demo", "store", "agent", "fr", "detect")
for _name in COMMAND_MODULES:
    try:
        _mod = importlib.import_module(f"{__package__}.{_name}")
    except ModuleNotFoundError as _exc:  # a command module not written yet
        if _exc.name != f"{__package__}.{_name}":
            raise
        continue
    _mod.register(app)
