"""``rankscope ingest`` (dump directory -> store) and ``rankscope sql`` (DuckDB over the store)."""

from __future__ import annotations

from pathlib import Path

import typer

from rankscope.cli.console import handle_errors, out
from rankscope.cli.options import DEFAULT_ORDER, GpusPerNodeOpt, LayoutOpt, OrderOpt


def register(app: typer.Typer) -> None:
    @app.command()
    @handle_errors
    def ingest(
        path: Path = typer.Argument(
            ..., help="A raw dump directory (stacks, manifest.csv, FR dumps, metrics, timings)."
        ),
        store: Path = typer.Option(..., "--store", help="Store root (created if absent)."),
        job: str = typer.Option(None, "--job", help="Job name (default: the directory name)."),
        layout: LayoutOpt = None,
        order: OrderOpt = DEFAULT_ORDER,
        gpus_per_node: GpusPerNodeOpt = None,
    ) -> None:
        """Append a dump directory to the store (atomic, append-only)."""
        from rankscope.datasets.loading.ingest import ingest_path

        rep = ingest_path(path, store, job=job, layout=layout, order=order, gpus_per_node=gpus_per_node)
        rows = ", ".join(f"{n} {t} rows" for t, n in rep.rows.items()) or "nothing new"
        out.print(f"ingested job {rep.job}: {rows} (ingest {rep.ingest_id})", markup=False)
        for note in rep.notes:
            if "already ingested" in note:
                out.print(note, markup=False)

    @app.command()
    @handle_errors
    def sql(
        store: Path = typer.Argument(..., help="Store root."),
        query: str = typer.Argument(..., help="DuckDB SQL; every table (stacks, topology, verdicts, ...) is a view."),
        fmt: str = typer.Option("text", "--format", help="text or csv or json."),
    ) -> None:
        """Run SQL over the store with DuckDB."""
        from rankscope.datasets.store.store import Store

        df = Store(store).sql(query)
        if fmt == "csv":
            out.print(df.write_csv(), end="", markup=False)
        elif fmt == "json":
            out.print(df.write_json(), markup=False)
        else:
            import polars as pl

            with pl.Config(tbl_rows=50, tbl_cols=20, fmt_str_lengths=80):
                out.print(str(df), markup=False)
