"""The ``rankscope`` command. Each command is a few lines over one library call.

Commands live in their own modules (``cli/<name>.py`` with ``register(app)``) and load on first use:
:data:`COMMANDS` names each one's module and the line ``rankscope --help`` shows for it, so the help
and a diagnosis import only what they need (:mod:`rankscope.cli.group`). To add a command, add its
line here (a module registered eagerly with ``register(app)`` below the table works too).
"""

from __future__ import annotations

import typer

from rankscope import __version__
from rankscope.cli.group import RankscopeGroup

COMMANDS: dict[str, tuple[str, str]] = {
    "diagnose": ("rankscope.cli.diagnose", "Name the machines to isolate from a job's dumps or its store."),
    "report": ("rankscope.cli.report", "Write a self-contained HTML report (and PNG figures) of a verdict."),
    "fr": ("rankscope.cli.fr", "Analyze Flight Recorder dumps alone, like torchfrtrace (gloo-safe)."),
    "detect": ("rankscope.cli.detect", "Find the machine unlike its peers from metrics or step timings only."),
    "demo": ("rankscope.cli.demo", "Generate a synthetic job with an injected fault, diagnose it, check the answer."),
    "ingest": ("rankscope.cli.store", "Append a dump directory to a store (atomic, append-only)."),
    "sql": ("rankscope.cli.store", "Run SQL over a store with DuckDB; every table is a view."),
    "jobs": ("rankscope.cli.catalog", "List the jobs of a store, newest first."),
    "verdicts": ("rankscope.cli.catalog", "List the verdicts saved in a store, newest incident first."),
    "plan": ("rankscope.cli.recovery", "Decide what to do about an incident: evict, restart, roll back, stop."),
    "recover": (
        "rankscope.cli.recovery",
        "Carry a plan out: local torchrun, Slurm or Kubernetes (dry run by default).",
    ),
    "standby": ("rankscope.cli.recovery", "Size the warm standby pool for a job (machines to keep ready)."),
    "agent": ("rankscope.cli.agent", "Run the node agent: metrics, health events, stacks on demand and on a stall."),
    "batch": (
        "rankscope.cli.batch",
        "Diagnose every job of a store with new evidence, once per incident, and keep the verdicts.",
    ),
    "fleet": (
        "rankscope.cli.batch",
        "Machines blamed across jobs: how often, in which verdicts, a risk score, and the quarantine list.",
    ),
    "export": (
        "rankscope.cli.batch",
        "Write the store's verdicts, fleet and batch health for Prometheus (node_exporter textfile).",
    ),
}
"""command -> (module with ``register(app)``, one line for ``rankscope --help``)."""


class _Group(RankscopeGroup):
    lazy_commands = COMMANDS


app = typer.Typer(
    name="rankscope",
    cls=_Group,
    epilog="""\b
Examples:
  rankscope diagnose /shared/dumps/incident-42 --layout tp=8,pp=4,dp=32
  rankscope report /shared/dumps/incident-42 -o incident-42.html
\b
Run 'rankscope COMMAND --help' for a command's options and examples.
""",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"rankscope {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    """Find the faulty machine in a large distributed training job, and get training going again."""
