"""``rankscope detect PATH``: metric outliers and timing stragglers only (no stacks), one verdict."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import typer

from ..analytics.perf import PerfConfig, diagnose_perf
from ..datasets.readers.tables import find_metric_files, find_timing_files, read_metrics, read_timings
from ..datasets.store import Store
from ..datasets.topology import DIMS, Layout, Topology
from ..errors import InputError
from .console import fail, handle_errors, out


def load_perf_inputs(path: Path, *, job: str | None = None) -> tuple[pl.DataFrame | None, pl.DataFrame | None, Topology | None]:
    """Metrics, timings and (from a store) the topology found at ``path``: a store or a directory of files."""
    if Store.is_store(path):
        store = Store(path)
        metrics, timings, topo_rows = (store.read(t, job=job) for t in ("metrics", "timings", "topology"))
        topo = None
        if topo_rows.height:
            topo = Topology.from_table(topo_rows["rank"].to_list(), topo_rows["node"].to_list(),
                                       coords={d: topo_rows[d].to_list() for d in DIMS if topo_rows[d].null_count() == 0})
        return metrics if metrics.height else None, timings if timings.height else None, topo
    if not path.is_dir():
        raise InputError(f"{path}: not a directory or a rankscope store")
    m, t = find_metric_files(path), find_timing_files(path)
    return (read_metrics(m) if m else None), (read_timings(t) if t else None), None


def register(app: typer.Typer) -> None:
    @app.command("detect")
    @handle_errors
    def detect(
        path: Path = typer.Argument(..., help="A store, or a directory with metrics*.csv|parquet / timings*.csv|parquet."),
        layout: str = typer.Option("", help="Parallel layout for the timings, e.g. tp=2,pp=4,dp=8."),
        gpus_per_node: int = typer.Option(8, help="Ranks per node when --layout is given."),
        job: str = typer.Option("", help="Job name (selects the job in a store)."),
        continuity_seconds: float = typer.Option(240.0, help="How long a machine must stay unlike its peers."),
        json_out: bool = typer.Option(False, "--json", help="Print the verdict as JSON."),
    ) -> None:
        """Find the machine that behaves unlike its peers (metrics) or is slower than them (timings)."""
        metrics, timings, topo = load_perf_inputs(path, job=job or None)
        if layout:
            topo = Topology.from_layout(Layout.parse(layout), gpus_per_node=gpus_per_node)
        verdict = diagnose_perf(metrics, timings, topo, job=job, config=PerfConfig(continuity_seconds=continuity_seconds))
        if verdict is None:
            fail(f"{path}: no metrics or timings found (files named metrics*/timings*, or a store with those tables)")
        out.print(verdict.to_json(indent=2) if json_out else verdict.explain())  # type: ignore[union-attr]
