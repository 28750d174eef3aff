"""Options shared by the commands, declared once so their names and help stay the same everywhere."""

from __future__ import annotations

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
        "--layout", help="Parallel layout, e.g. tp=8,pp=4,dp=32 (optional cp=, ep=). Default: pure data parallel."
    ),
]
OrderOpt = Annotated[
    str,
    typer.Option(
        "--order", help="Rank order of the dimensions, fastest-varying first (Megatron default tp-cp-ep-dp-pp)."
    ),
]
GpusPerNodeOpt = Annotated[
    int | None,
    typer.Option(
        "--gpus-per-node",
        help="Ranks (GPUs) per node: maps local ranks to global ones and names unnamed machines node-<rank // N>. "
        "Default: what the evidence shows (each host's process count), else 8.",
    ),
]
JobOpt = Annotated[str | None, typer.Option("--job", help="Job name (selects one job of a store).")]
FormatOpt = Annotated[Format, typer.Option("--format", help="text for people, json for machines.")]
DEFAULT_ORDER = "tp-cp-ep-dp-pp"
ConfigOpt = Annotated[
    Path | None,
    typer.Option(
        "--config",
        help="TOML or JSON settings file, one table per section (\\[stacks], \\[performance], ...); "
        "precedence: flags > RANKSCOPE_<SECTION>_<FIELD> environment > this file > defaults.",
    ),
]


def load_settings(config: Path | None, flags: dict[str, Any] | None = None) -> Config:
    """The configuration tree for a command: its flags over the environment over ``--config`` over defaults."""
    from rankscope.config import load_config

    return load_config(flags, config_file=config)
