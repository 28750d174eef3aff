"""``rankscope detect PATH``: metric outliers and timing stragglers only (no stacks), one verdict."""

from __future__ import annotations

from pathlib import Path

import typer

from rankscope.cli.console import fail, handle_errors, out
from rankscope.cli.options import (
    DEFAULT_ORDER,
    ConfigOpt,
    Format,
    FormatOpt,
    GpusPerNodeOpt,
    JobOpt,
    LayoutOpt,
    OrderOpt,
    load_settings,
)


def register(app: typer.Typer) -> None:
    @app.command("detect")
    @handle_errors
    def detect(
        path: Path = typer.Argument(
            ..., help="A store, or a directory with metrics*.csv|parquet / timings*.csv|parquet."
        ),
        layout: LayoutOpt = None,
        order: OrderOpt = DEFAULT_ORDER,
        gpus_per_node: GpusPerNodeOpt = None,
        job: JobOpt = None,
        continuity_seconds: float = typer.Option(
            None, "--continuity-seconds", show_default="240", help="How long a machine must stay unlike its peers."
        ),
        fmt: FormatOpt = Format.text,
        config: ConfigOpt = None,
    ) -> None:
        """Find the machine that behaves unlike its peers (metrics) or is slower than them (timings)."""
        from rankscope.analytics import diagnose
        from rankscope.datasets.loading.inputs import load_inputs
        from rankscope.reports.text import render_text

        cfg = load_settings(config, {"performance": {"continuity_seconds": continuity_seconds}})
        inputs = load_inputs(path, layout=layout, order=order, gpus_per_node=gpus_per_node, job=job, config=cfg.inputs)
        if inputs.metrics is None and inputs.timings is None:
            fail(f"{path}: no metrics or timings found (files named metrics*/timings*, or a store with those tables)")
        verdict = diagnose(inputs, cfg, sources=("metrics", "timings"))
        out.print(verdict.to_json(indent=2) if fmt is Format.json else render_text(verdict), markup=False)
