"""``rankscope report SOURCE -o report.html [--png DIR]``: a verdict as a self-contained HTML page with figures."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from rankscope.cli.console import echo, fail, handle_errors
from rankscope.cli.options import (
    DEFAULT_ORDER,
    ConfigOpt,
    FollowSymlinksOpt,
    GpusPerNodeOpt,
    JobOpt,
    LayoutOpt,
    OrderOpt,
    not_applicable,
    store_topology_notes,
)

if TYPE_CHECKING:
    from rankscope.reports.evidence import ReportEvidence

EXAMPLES = """\b
Examples:
  rankscope report /shared/dumps/incident-42 --layout tp=8,pp=4,dp=32 -o incident-42.html
  rankscope report /data/rankscope --job llama70b-run3 -o run3.html --png run3-figures/
  rankscope diagnose DUMPS --format json > verdict.json && rankscope report verdict.json -o verdict.html
\b
The page needs no network (no scripts, no CDN): open it on an air-gapped cluster or attach it to a ticket.
Figures appear when their evidence exists: rank grid, call-prefix tree, fail-slow rounds, Flight Recorder
wavefront, metrics against peers, step times, crash time line.
"""


def register(app: typer.Typer) -> None:
    @app.command(epilog=EXAMPLES)
    @handle_errors
    def report(
        ctx: typer.Context,
        source: Path = typer.Argument(
            ...,
            metavar="SOURCE",
            help="A dump directory, a store (with --job when it holds several jobs), or a verdict JSON file "
            "(rankscope diagnose --format json).",
        ),
        output: Path = typer.Option(None, "-o", "--output", metavar="FILE", help="Where to write the HTML report."),
        png: Path = typer.Option(None, "--png", metavar="DIR", help="Also write each figure as DIR/<figure>.png."),
        layout: LayoutOpt = None,
        order: OrderOpt = DEFAULT_ORDER,
        gpus_per_node: GpusPerNodeOpt = None,
        job: JobOpt = None,
        saved: bool = typer.Option(
            False, "--saved", help="Store only: draw the job's latest saved verdict instead of diagnosing again."
        ),
        config: ConfigOpt = None,
        follow_symlinks: FollowSymlinksOpt = False,
    ) -> None:
        """Write a self-contained HTML report (and PNG figures) of a verdict.

        The verdict, its reasons, the machines to isolate and the likeliest culprit, with figures drawn from
        the evidence, each with a caption saying how to read it.
        """
        from rankscope.datasets.store import is_store

        if output is None and png is None:
            fail("nothing to write: give -o report.html and/or --png DIR")
        if not source.exists():
            fail(f"{source}: no such file or directory")
        evidence_opts = {
            "layout": "--layout",
            "order": "--order",
            "gpus_per_node": "--gpus-per-node",
            "job": "--job",
            "config": "--config",
            "saved": "--saved",
            "follow_symlinks": "--follow-symlinks",
        }
        if source.is_file():
            from rankscope.reports.evidence import load_verdict

            not_applicable(ctx, evidence_opts, "a verdict file (it holds no evidence to re-read)")
            verdict, evidence = load_verdict(source), None
        elif saved:
            if not is_store(source):
                fail(f"--saved needs a store SOURCE; {source} is not one")
            not_applicable(
                ctx, {k: v for k, v in evidence_opts.items() if k not in ("job", "saved")}, "a saved verdict"
            )
            verdict, evidence = _saved(source, job)
        else:
            store_topology_notes(ctx, source, job)
            verdict, evidence = _diagnosed(source, layout, order, gpus_per_node, job, config, follow_symlinks)
        from rankscope.reports.html import write_report

        files = write_report(verdict, evidence, html_path=output, png_dir=png)
        written = ([str(files.html)] if files.html else []) + ([f"{png}/ ({len(files.pngs)} PNG)"] if png else [])
        echo(f"{verdict['verdict']}: wrote {', '.join(written)}; figures: {', '.join(files.figures) or 'none'}")


def _diagnosed(
    source: Path,
    layout: str | None,
    order: str,
    gpus_per_node: int | None,
    job: str | None,
    config: Path | None,
    follow_symlinks: bool = False,
) -> tuple[dict[str, Any], ReportEvidence]:
    from rankscope.cli.diagnose import run_diagnosis
    from rankscope.reports.assemble import evidence_from_inputs

    v, inputs = run_diagnosis(
        source,
        layout=layout,
        order=order,
        gpus_per_node=gpus_per_node,
        job=job,
        config=config,
        follow_symlinks=follow_symlinks,
    )
    verdict = v.to_dict()
    return verdict, evidence_from_inputs(inputs, verdict)


def _saved(source: Path, job: str | None) -> tuple[dict[str, Any], ReportEvidence]:
    """The job's latest saved verdict (newest incident), with the evidence the store holds for it."""
    import json

    from rankscope.datasets.loading.inputs import load_inputs
    from rankscope.datasets.store.catalog import list_verdicts
    from rankscope.datasets.store.store import Store
    from rankscope.reports.assemble import evidence_from_inputs
    from rankscope.spine import InputError

    inputs = load_inputs(source, job=job)
    latest = next(iter(list_verdicts(Store(source), job=inputs.job)), None)
    if latest is None or not latest.verdict_json:
        raise InputError(f"{source}: no saved verdict for job {inputs.job!r} (rankscope diagnose STORE --save first)")
    verdict = json.loads(latest.verdict_json)
    return verdict, evidence_from_inputs(inputs, verdict)
