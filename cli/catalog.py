"""``rankscope jobs STORE`` and ``rankscope verdicts STORE``: what a store holds, newest first."""

from __future__ import annotations

from pathlib import Path

import typer

from rankscope.cli.console import echo, handle_errors
from rankscope.cli.options import JobOpt
from rankscope.cli.tables import TableFormat

JOBS_EXAMPLES = """\b
Examples:
  rankscope jobs /data/rankscope
  rankscope jobs /data/rankscope --format json
"""
VERDICTS_EXAMPLES = """\b
Examples:
  rankscope verdicts /data/rankscope
  rankscope verdicts /data/rankscope --job llama70b-run3 --format csv
"""
FormatOpt = typer.Option(TableFormat.text, "--format", help="text (aligned table), csv, json or markdown.")


def _when(value: str | None) -> str | None:
    return value.replace("T", " ").removesuffix("Z").split(".")[0] if value else None


def register(app: typer.Typer) -> None:
    @app.command(epilog=JOBS_EXAMPLES)
    @handle_errors
    def jobs(
        store: Path = typer.Argument(..., metavar="STORE", help="Store root."),
        fmt: TableFormat = FormatOpt,
    ) -> None:
        """List the jobs of a store, newest first.

        Each job with its first and last capture (UTC), the tables it has rows in, its latest saved verdict
        and the machines that verdict named (culprits, else the suspects to isolate).
        """
        from rankscope.cli.tables import render
        from rankscope.datasets.store.catalog import list_jobs
        from rankscope.datasets.store.store import Store

        items = [j.to_dict() for j in list_jobs(Store(store))]
        cols = ["job", "first_capture", "last_capture", "latest_verdict", "latest_incident", "machines", "tables"]
        if fmt is TableFormat.text:
            for i in items:
                for c in ("first_capture", "last_capture", "latest_incident"):
                    i[c] = _when(i[c])
                i["machines"] = ", ".join(i["machines"]) or None
                i["tables"] = ", ".join(i["tables"])
        echo(render(cols, [[i[c] for c in cols] for i in items], fmt, max_cell=80))

    @app.command(epilog=VERDICTS_EXAMPLES)
    @handle_errors
    def verdicts(
        store: Path = typer.Argument(..., metavar="STORE", help="Store root."),
        job: JobOpt = None,
        fmt: TableFormat = FormatOpt,
    ) -> None:
        """List the verdicts saved in a store, newest incident first.

        Save one with 'rankscope diagnose STORE --save'. The incident time is when the evidence was
        produced (the capture, the first failure, the metric onset, ...; its source is shown); 'analysed'
        is when the diagnosis ran.
        """
        from rankscope.cli.tables import render
        from rankscope.datasets.store.catalog import list_verdicts
        from rankscope.datasets.store.store import Store

        items = [v.to_dict() for v in list_verdicts(Store(store), job=job)]
        cols = ["job", "incident_time", "incident_source", "verdict", "confidence", "culprit_nodes", "suspect_nodes"]
        if fmt is TableFormat.text:
            for i in items:
                i["incident_time"], i["analysed"] = _when(i["incident_time"]), _when(i["analysed"])
                i["culprit_nodes"] = ", ".join(i["culprit_nodes"]) or None
                n = len(i["suspect_nodes"])
                i["suspect_nodes"] = f"{n} machine(s)" if n else None
            cols.insert(3, "analysed")
        else:
            cols += ["analysed", "summary"]
        echo(render(cols, [[i[c] for c in cols] for i in items], fmt, max_cell=80))
