"""Options shared by the commands, declared once so their names and help stay the same everywhere, and the
checks that say when an option does not apply to the input it was given."""

from __future__ import annotations

import sys
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from rankscope.config import Config


class Format(str, Enum):
    text = "text"
    json = "json"


LayoutOpt = Annotated[
    str | None,
    typer.Option(
        "--layout",
        metavar="LAYOUT",
        help="Parallel layout, e.g. tp=8,pp=4,dp=32 (optional cp=, ep=). Default: pure data parallel.",
    ),
]
OrderOpt = Annotated[
    str,
    typer.Option(
        "--order",
        metavar="ORDER",
        help="Rank order of the dimensions, fastest-varying first (Megatron default tp-cp-ep-dp-pp).",
    ),
]
GpusPerNodeOpt = Annotated[
    int | None,
    typer.Option(
        "--gpus-per-node",
        metavar="N",
        help="Ranks (GPUs) per node: maps local ranks to global ones and names unnamed machines node-<rank // N>. "
        "Default: what the evidence shows (each host's process count), else 8.",
    ),
]
JobOpt = Annotated[str | None, typer.Option("--job", metavar="NAME", help="Job name (selects one job of a store).")]
FormatOpt = Annotated[Format, typer.Option("--format", help="text for people, json for machines.")]
MaxFramesOpt = Annotated[
    int,
    typer.Option("--max-frames", metavar="N", help="Frames shown per cluster in text output (0 = all)."),
]
DEFAULT_ORDER = "tp-cp-ep-dp-pp"
FollowSymlinksOpt = Annotated[
    bool,
    typer.Option(
        "--follow-symlinks",
        help="Also read files that symbolic links inside PATH point to outside it (by default such links "
        "are listed in the notes and not followed: nothing from outside the input is read).",
    ),
]


class MetricFormat(str, Enum):
    """``rankscope.datasets.domain.metrics.METRIC_FORMATS`` (the CLI does not import the readers to list them)."""

    auto = "auto"
    long = "long"
    prometheus_text = "prometheus-text"
    prometheus_json = "prometheus-json"


NodeLabelOpt = Annotated[
    str | None,
    typer.Option(
        "--node-label",
        metavar="LABEL",
        help="The metric label (or column) that names the machine. Default: node, Hostname (dcgm-exporter), "
        "hostname, instance (node_exporter; the port is dropped).",
    ),
]
MetricFormatOpt = Annotated[
    MetricFormat | None,
    typer.Option(
        "--metric-format",
        show_default="auto",
        help="Format of the metric files: auto (each file from its content), long (CSV/Parquet ts,node,metric,value), "
        "prometheus-text (exposition format scrapes), prometheus-json (query_range/query results).",
    ),
]
DumpedOnTimeoutOpt = Annotated[
    bool,
    typer.Option(
        "--dumped-on-timeout",
        help="The Flight Recorder dumps were written by the watchdog on a collective timeout "
        "(TORCH_NCCL_DUMP_ON_TIMEOUT): each was taken at least one timeout after the oldest op in flight. "
        "Time evidence for dumps that carry no capture time (a watchdog timeout line in the input's logs says "
        "the same). Never set it for on-demand dumps of a running job.",
    ),
]


def metric_input_flags(node_label: str | None, metric_format: MetricFormat | None) -> dict[str, Any]:
    """The ``[inputs]`` flags of the metric options (None = not given)."""
    return {"node_label": node_label, "metric_format": metric_format.value if metric_format is not None else None}


def fr_flags(dumped_on_timeout: bool) -> dict[str, Any]:
    """The settings tree of ``--dumped-on-timeout`` (None: not given, the environment or file decides)."""
    return {"collectives": {"dumped_on_timeout": True if dumped_on_timeout else None}}


ConfigOpt = Annotated[
    Path | None,
    typer.Option(
        "--config",
        metavar="FILE",
        help="TOML or JSON settings file, one table per section ([stacks], [performance], ...); "
        "precedence: flags > RANKSCOPE_<SECTION>_<FIELD> environment > this file > defaults.",
    ),
]


def load_settings(config: Path | None, flags: dict[str, Any] | None = None) -> Config:
    """The configuration tree for a command: its flags over the environment over ``--config`` over defaults."""
    from rankscope.config import load_config

    return load_config(flags, config_file=config)


def given(ctx: typer.Context, name: str) -> bool:
    """True when option ``name`` (the parameter name) was set on the command line or from the environment."""
    from typer._click.core import ParameterSource

    return ctx.get_parameter_source(name) in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)


def note(message: str) -> None:
    """One ``rankscope: note: ...`` line on stderr (stdout stays the verdict, for pipes)."""
    print(f"rankscope: note: {message}", file=sys.stderr)


def not_applicable(ctx: typer.Context, names: dict[str, str], why: str) -> None:
    """A note for each option of ``names`` (parameter name -> flag) that was given but does not apply."""
    flags = [flag for name, flag in names.items() if given(ctx, name)]
    if flags:
        note(f"{', '.join(flags)} {'does' if len(flags) == 1 else 'do'} not apply to {why}; ignored")


def store_topology_notes(ctx: typer.Context, path: Path, job: str | None) -> None:
    """``--gpus-per-node`` on a store whose topology table names every rank's node: say it is not used."""
    if not given(ctx, "gpus_per_node"):
        return
    from rankscope.datasets.store import is_store

    if not is_store(path):
        return
    from rankscope.datasets.store.store import Store

    if Store(path).files("topology", job=job):
        not_applicable(ctx, {"gpus_per_node": "--gpus-per-node"}, "a store: its topology table names each rank's node")
