"""``rankscope fr PATH``: Flight Recorder dumps alone -> who did not join which collective."""

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
    @app.command("fr")
    @handle_errors
    def fr(
        path: Path = typer.Argument(..., help="A directory of FR dumps (<prefix><rank>, pickle or JSON), or one file."),
        layout: LayoutOpt = None,
        order: OrderOpt = DEFAULT_ORDER,
        gpus_per_node: GpusPerNodeOpt = None,
        prefix: str = typer.Option(None, "--prefix", help="Only files whose name starts with this prefix."),
        job: JobOpt = None,
        fmt: FormatOpt = Format.text,
        config: ConfigOpt = None,
    ) -> None:
        """Analyze FR dumps like torchfrtrace (gloo-safe): missing ranks, mismatches, culprit machines."""
        from rankscope.analytics import diagnose
        from rankscope.datasets.loading.inputs import load_fr_inputs

        cfg = load_settings(config)
        inputs = load_fr_inputs(path, prefix=prefix, layout=layout, order=order, gpus_per_node=gpus_per_node, job=job)
        verdict = diagnose(inputs, cfg, sources=("flight_recorder",))
        out.print(verdict.to_json(indent=2) if fmt is Format.json else verdict.explain(), markup=False)
