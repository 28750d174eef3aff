"""``rankscope diagnose PATH``: the verdict for one job from its dumps or the store."""

from __future__ import annotations

from enum import Enum
from pathlib import Path

import typer

from .console import handle_errors, out


class Format(str, Enum):
    text = "text"
    json = "json"


LAYOUT_HELP = "Parallel layout, e.g. tp=8,pp=4,dp=32 (optional cp=, ep=). Default: pure data parallel."
ORDER_HELP = "Rank order of the dimensions, fastest-varying first (Megatron default tp-cp-ep-dp-pp)."


def register(app: typer.Typer) -> None:
    @app.command()
    @handle_errors
    def diagnose(
        path: Path = typer.Argument(..., help="A raw dump directory or a rankscope store."),
        layout: str = typer.Option(None, "--layout", help=LAYOUT_HELP),
        order: str = typer.Option("tp-cp-ep-dp-pp", "--order", help=ORDER_HELP),
        gpus_per_node: int = typer.Option(8, "--gpus-per-node", help="Ranks per node when no manifest names nodes."),
        job: str = typer.Option(None, "--job", help="Job to diagnose when the store holds several."),
        fmt: Format = typer.Option(Format.text, "--format", help="text for people, json for machines."),
        save: bool = typer.Option(False, "--save", help="Append the verdict to the store's verdicts table (store PATH only)."),
    ) -> None:
        """Name the machines to isolate (exit 0, healthy included); bad input exits 2 with one line."""
        from ..analytics.diagnose import diagnose as run
        from ..datasets.inputs import load_inputs
        from ..reports.text import render_text

        inputs = load_inputs(path, layout=layout, order=order, gpus_per_node=gpus_per_node, job=job)
        verdict = run(inputs.procs, inputs.topology, job=inputs.job, fr_dumps=inputs.fr_dumps,
                      metrics=inputs.metrics, timings=inputs.timings, memberships=inputs.memberships,
                      notes=inputs.notes)
        if save:
            from ..datasets.verdicts import save_verdict

            save_verdict(path, verdict)
        out.print(verdict.to_json(indent=2) if fmt is Format.json else render_text(verdict), markup=False)
