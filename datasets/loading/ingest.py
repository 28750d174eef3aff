"""Put a raw dump directory into the store, so batch jobs and SQL can work on it."""

from __future__ import annotations

import os
from dataclasses import dataclass

from rankscope.datasets.domain.inputs import Inputs
from rankscope.datasets.loading.inputs import load_inputs
from rankscope.datasets.store.stacks_table import to_table
from rankscope.datasets.store.store import Store


@dataclass(frozen=True)
class IngestReport:
    job: str
    rows: dict[str, int]
    notes: tuple[str, ...]


def ingest_inputs(inputs: Inputs, store: Store, *, job: str | None = None) -> IngestReport:
    """Append one job's stacks, topology, Flight Recorder entries, metrics and timings to ``store``."""
    name = job or inputs.job
    counts: dict[str, int] = {}
    stacks = to_table(inputs.procs, name)
    if stacks.num_rows:
        store.write("stacks", stacks)
    counts["stacks"] = stacks.num_rows
    if inputs.topology is not None:
        topo_rows = inputs.topology.to_rows(name)
        store.write("topology", topo_rows)
        counts["topology"] = len(topo_rows)
    if inputs.fr_dumps:
        from rankscope.datasets.readers.fr_table import fr_to_rows

        topo = inputs.topology
        node_of = {int(r): topo.node_of(int(r)) for r in topo.ranks} if topo is not None else None
        fr_rows = fr_to_rows(list(inputs.fr_dumps), name, node_of=node_of)
        store.write("collectives", fr_rows)
        counts["collectives"] = len(fr_rows)
    for table, df in (("metrics", inputs.metrics), ("timings", inputs.timings)):
        if df is not None and df.height:
            import polars as pl

            df = df.with_columns(pl.lit(name).alias("job"))
            keep = [c for c in df.columns if c in _columns(table)]
            store.write(table, df.select(keep))
            counts[table] = df.height
    return IngestReport(name, counts, inputs.notes)


def _columns(table: str) -> list[str]:
    from rankscope.datasets.store.schemas import table as spec

    return spec(table).schema.names


def ingest_path(
    path: str | os.PathLike[str],
    store_root: str | os.PathLike[str],
    *,
    job: str | None = None,
    layout: str | None = None,
    order: str | None = None,
    gpus_per_node: int = 8,
) -> IngestReport:
    """Load a dump directory (see :func:`load_inputs`) and append it to the store at ``store_root``."""
    inputs = load_inputs(path, layout=layout, order=order, gpus_per_node=gpus_per_node, job=job)
    return ingest_inputs(inputs, Store(store_root, create=True), job=job)
