"""``rankscope diagnose PATH``: the verdict for one job from its dumps or the store."""

from __future__ import annotations

from pathlib import Path

import typer

from rankscope.cli.console import handle_errors, out
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
    @app.command()
    @handle_errors
    def diagnose(
        path: Path = typer.Argument(
            ...,
            help="A dump directory (stack, Flight Recorder, exit, metrics and timings "
            "files, or the hook's run directory) or a rankscope store.",
        ),
        layout: LayoutOpt = None,
        order: OrderOpt = DEFAULT_ORDER,
        gpus_per_node: GpusPerNodeOpt = None,
        job: JobOpt = None,
        fmt: FormatOpt = Format.text,
        save: bool = typer.Option(
            False, "--save", help="Append the verdict to the store's verdicts table (store PATH only)."
        ),
        config: ConfigOpt = None,
    ) -> None:
        """Name the machines to isolate (exit 0, healthy included); bad input exits 2 with one line."""
        from rankscope.analytics import diagnose as run
        from rankscope.datasets.loading.inputs import load_inputs
        from rankscope.reports.text import render_text

        cfg = load_settings(config)
        inputs = load_inputs(path, layout=layout, order=order, gpus_per_node=gpus_per_node, job=job, config=cfg.inputs)
        verdict = run(inputs, cfg)
        if save:
            from rankscope.datasets.store.store import Store

            Store(path).write("verdicts", [verdict.to_row()])
        out.print(verdict.to_json(indent=2) if fmt is Format.json else render_text(verdict), markup=False)
