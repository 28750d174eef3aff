"""``rankscope fr PATH``: Flight Recorder dumps alone -> who did not join which collective."""

from __future__ import annotations

from pathlib import Path

import typer
from rankscope.cli.console import handle_errors, out
from rankscope.cli.options import (
    DEFAULT_ORDER,
    Format,
    FormatOpt,
    GpusPerNodeOpt,
    JobOpt,
    LayoutOpt,
    OrderOpt,
)


def register(app: typer.Typer) -> None:
    @app.command("fr")
    @handle_errors
    def fr(
        path: Path = typer.Argument(..., help="A directory of FR dumps (<prefix><rank>, pickle or JSON), or one file."),
        layout: LayoutOpt = None,
        order: OrderOpt = DEFAULT_ORDER,
        gpus_per_node: GpusPerNodeOpt = 8,
        prefix: str = typer.Option(None, "--prefix", help="Only files whose name starts with this prefix."),
        job: JobOpt = None,
        fmt: FormatOpt = Format.text,
    ) -> None:
        """Analyze FR dumps like torchfrtrace (gloo-safe): missing ranks, mismatches, culprit machines."""
        from rankscope.analytics.collectives import analyze_collectives, fr_verdict
        from rankscope.datasets.domain.topology import Layout
        from rankscope.datasets.loading.inputs import infer_topology
        from rankscope.datasets.readers.flight_recorder import read_fr_dir

        dumps = read_fr_dir(path, prefix=prefix)
        lay = Layout.parse(layout, order) if layout else None
        topo, notes = infer_topology([d.rank for d in dumps], {}, layout=lay, gpus_per_node=gpus_per_node,
                                     where=str(path))
        verdict = fr_verdict(analyze_collectives(dumps, topo), topo, job=job or "")
        if notes:
            verdict = verdict.with_updates(details={**verdict.details, "notes": notes})
        out.print(verdict.to_json(indent=2) if fmt is Format.json else verdict.explain(), markup=False)
