"""``rankscope diagnose PATH``: the verdict for one job from its dumps or the store."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from rankscope.cli.console import echo, fail, handle_errors
from rankscope.cli.options import (
    DEFAULT_ORDER,
    ConfigOpt,
    DumpedOnTimeoutOpt,
    FollowSymlinksOpt,
    Format,
    FormatOpt,
    GpusPerNodeOpt,
    JobOpt,
    LayoutOpt,
    MaxFramesOpt,
    MetricFormatOpt,
    NodeLabelOpt,
    OrderOpt,
    fr_flags,
    load_settings,
    metric_input_flags,
    store_topology_notes,
)

if TYPE_CHECKING:
    from rankscope.analytics.verdict import Verdict
    from rankscope.datasets.domain.inputs import Inputs

EXAMPLES = """\b
Examples:
  rankscope diagnose /shared/dumps/incident-42 --layout tp=8,pp=4,dp=32
  rankscope diagnose /data/rankscope --job llama70b-run3 --format json --save
"""


def register(app: typer.Typer) -> None:
    @app.command(epilog=EXAMPLES)
    @handle_errors
    def diagnose(
        ctx: typer.Context,
        path: Path = typer.Argument(
            ...,
            metavar="PATH",
            help="A dump directory (stack, Flight Recorder, exit, metrics and timings "
            "files, or the hook's run directory) or a rankscope store.",
        ),
        layout: LayoutOpt = None,
        order: OrderOpt = DEFAULT_ORDER,
        gpus_per_node: GpusPerNodeOpt = None,
        job: JobOpt = None,
        fmt: FormatOpt = Format.text,
        max_frames: MaxFramesOpt = 8,
        save: bool = typer.Option(
            False, "--save", help="Append the verdict to the store's verdicts table (store PATH only)."
        ),
        node_label: NodeLabelOpt = None,
        metric_format: MetricFormatOpt = None,
        dumped_on_timeout: DumpedOnTimeoutOpt = False,
        config: ConfigOpt = None,
        follow_symlinks: FollowSymlinksOpt = False,
    ) -> None:
        """Name the machines to isolate from a job's dumps or its store.

        Exit 0 with a verdict (healthy included); bad input exits 2 with one line on stderr.
        """
        from rankscope.datasets.store import is_store

        if save and not is_store(path):
            fail(f"--save needs a store PATH (rankscope ingest {path} --store STORE first); {path} is not one")
        store_topology_notes(ctx, path, job)
        verdict, inputs = run_diagnosis(
            path,
            layout=layout,
            order=order,
            gpus_per_node=gpus_per_node,
            job=job,
            config=config,
            flags={**fr_flags(dumped_on_timeout), "inputs": metric_input_flags(node_label, metric_format)},
            follow_symlinks=follow_symlinks,
        )
        if save:
            from rankscope.datasets.store.catalog import verdict_row
            from rankscope.datasets.store.store import Store

            Store(path).write("verdicts", [verdict_row(verdict.to_row(), inputs)])
        echo(render(verdict, fmt, max_frames=max_frames))


def run_diagnosis(
    path: Path,
    *,
    layout: str | None,
    order: str,
    gpus_per_node: int | None,
    job: str | None,
    config: Path | None,
    sources: tuple[str, ...] | None = None,
    flags: dict[str, Any] | None = None,
    follow_symlinks: bool = False,
) -> tuple[Verdict, Inputs]:
    """Load PATH and diagnose it as ``rankscope diagnose`` does (``report`` and ``detect`` share it)."""
    from rankscope.analytics import diagnose as run
    from rankscope.datasets.loading.inputs import load_inputs

    cfg = load_settings(config, flags)
    inputs = load_inputs(
        path,
        layout=layout,
        order=order,
        gpus_per_node=gpus_per_node,
        job=job,
        config=cfg.inputs,
        limits=cfg.limits,
        follow_symlinks=follow_symlinks,
        freeze=True,  # a one-shot process: the analysis never rescans what was loaded
    )
    return run(inputs, cfg, sources=sources), inputs


def render(verdict: Verdict, fmt: Format, *, max_frames: int = 8) -> str:
    """The verdict as ``diagnose`` prints it: JSON, or text with ``max_frames`` frames per cluster (0 = all)."""
    from rankscope.reports.text import render_text

    if fmt is Format.json:
        return verdict.to_json(indent=2)
    return render_text(verdict, max_frames=max_frames if max_frames > 0 else 1 << 30)
