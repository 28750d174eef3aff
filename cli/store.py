"""``rankscope ingest`` (dump directory -> store) and ``rankscope sql`` (DuckDB over the store)."""

from __future__ import annotations

from pathlib import Path

import typer

from rankscope.cli.console import echo, handle_errors
from rankscope.cli.options import DEFAULT_ORDER, FollowSymlinksOpt, GpusPerNodeOpt, LayoutOpt, OrderOpt
from rankscope.cli.tables import TableFormat

INGEST_EXAMPLES = """\b
Examples:
  rankscope ingest /shared/dumps/incident-42 --store /data/rankscope --job llama70b-run3 --layout tp=8,pp=4,dp=32
  rankscope ingest ./run-dir --store /data/rankscope
"""
SQL_EXAMPLES = """\b
Examples:
  rankscope sql /data/rankscope "SELECT node, count(*) AS threads FROM stacks GROUP BY node ORDER BY threads DESC"
  rankscope sql /data/rankscope "SELECT job, verdict, culprit_nodes FROM verdicts" --format csv > verdicts.csv
\b
Tables (each a view, empty ones too): stacks, topology, verdicts, collectives, processes, metrics,
events, timings, ingests, batch_runs.
"""


def register(app: typer.Typer) -> None:
    @app.command(epilog=INGEST_EXAMPLES)
    @handle_errors
    def ingest(
        path: Path = typer.Argument(
            ..., metavar="DUMPDIR", help="A raw dump directory (stacks, manifest.csv, FR dumps, metrics, timings)."
        ),
        store: Path = typer.Option(..., "--store", metavar="STORE", help="Store root (created if absent)."),
        job: str = typer.Option(None, "--job", metavar="NAME", help="Job name (default: the directory name)."),
        layout: LayoutOpt = None,
        order: OrderOpt = DEFAULT_ORDER,
        gpus_per_node: GpusPerNodeOpt = None,
        follow_symlinks: FollowSymlinksOpt = False,
    ) -> None:
        """Append a dump directory to a store (atomic, append-only)."""
        from rankscope.datasets.loading.ingest import ingest_path

        rep = ingest_path(
            path,
            store,
            job=job,
            layout=layout,
            order=order,
            gpus_per_node=gpus_per_node,
            follow_symlinks=follow_symlinks,
        )
        rows = ", ".join(f"{n} {t} rows" for t, n in rep.rows.items()) or "nothing new"
        echo(f"ingested job {rep.job}: {rows} (ingest {rep.ingest_id})")
        for note in rep.notes:
            if "already ingested" in note:
                echo(note)

    @app.command(epilog=SQL_EXAMPLES)
    @handle_errors
    def sql(
        store: Path = typer.Argument(..., metavar="STORE", help="Store root."),
        query: str = typer.Argument(..., metavar="QUERY", help="DuckDB SQL over the store's tables."),
        fmt: TableFormat = typer.Option(
            TableFormat.text, "--format", help="text (aligned table), csv, json or markdown."
        ),
        max_rows: int = typer.Option(
            40, "--max-rows", metavar="N", help="Rows shown by --format text (first and last half; 0 = all)."
        ),
    ) -> None:
        """Run SQL over a store with DuckDB; every table is a view."""
        from rankscope.cli.tables import render
        from rankscope.datasets.store.store import Store

        df = Store(store).sql(query)
        if df.width:
            echo(render(df.columns, df.rows(), fmt, max_rows=max_rows))
