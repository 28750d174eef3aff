"""``rankscope fr PATH``: Flight Recorder dumps alone -> who did not join which collective."""

from __future__ import annotations

from enum import Enum
from pathlib import Path

import typer

from .console import handle_errors, out


class Format(str, Enum):
    text = "text"
    json = "json"


def register(app: typer.Typer) -> None:
    @app.command("fr")
    @handle_errors
    def fr(
        path: Path = typer.Argument(..., help="A directory of FR dumps (<prefix><rank>, pickle or JSON), or one file."),
        layout: str = typer.Option(None, "--layout", help="Parallel layout, e.g. tp=8,pp=4,dp=32."),
        order: str = typer.Option("tp-cp-ep-dp-pp", "--order", help="Rank order of the dimensions, fastest first."),
        gpus_per_node: int = typer.Option(8, "--gpus-per-node", help="Ranks per node."),
        prefix: str = typer.Option(None, "--prefix", help="Only files whose name starts with this prefix."),
        job: str = typer.Option("", "--job", help="Job name to put in the verdict."),
        fmt: Format = typer.Option(Format.text, "--format", help="text for people, json for machines."),
    ) -> None:
        """Analyze FR dumps like torchfrtrace (gloo-safe): missing ranks, mismatches, culprit machines."""
        from ..analytics.collectives import analyze_collectives, fr_verdict
        from ..datasets.inputs import infer_topology
        from ..datasets.readers.flight_recorder import read_fr_dir
        from ..datasets.topology import Layout

        dumps = read_fr_dir(path, prefix=prefix)
        lay = Layout.parse(layout, order) if layout else None
        topo, notes = infer_topology([d.rank for d in dumps], {}, layout=lay, gpus_per_node=gpus_per_node,
                                     where=str(path))
        verdict = fr_verdict(analyze_collectives(dumps, topo), topo, job=job)
        if notes:
            verdict = verdict.with_updates(details={**verdict.details, "notes": notes})
        out.print(verdict.to_json(indent=2) if fmt is Format.json else verdict.explain(), markup=False)
