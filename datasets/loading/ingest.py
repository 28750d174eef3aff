"""Put a raw dump directory into the store, so batch jobs and SQL can work on it.

Every ingest is one incident: it gets an id and a time, its rows carry the digest of the file they came
from and, when the content says, the time the evidence was captured, and its snapshot ids follow the
job's earlier ones (snapshots of two incidents never merge). Ingesting the same files again (same paths
inside the input, same bytes: the ``ingests`` ledger keeps them per job) adds nothing. ``diagnose STORE``
then diagnoses the latest incident: by capture time, else by ingest time.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rankscope.datasets.domain.bounds import open_regular
from rankscope.datasets.domain.inputs import Inputs
from rankscope.datasets.loading.inputs import load_inputs
from rankscope.datasets.store.stacks_table import to_table
from rankscope.datasets.store.store import Store
from rankscope.spine import InputError


@dataclass(frozen=True)
class IngestReport:
    job: str
    rows: dict[str, int]
    notes: tuple[str, ...]
    ingest_id: str = ""


def digest(path: str | os.PathLike[str]) -> str | None:
    """BLAKE2b-128 of a file's bytes (None when it cannot be read)."""
    h = hashlib.blake2b(digest_size=16)
    try:
        with open_regular(path, max_bytes=1 << 62) as fh:  # a FIFO or a device is never read (no end to it)
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    except (OSError, InputError):
        return None
    return h.hexdigest()


def _digests(inputs: Inputs) -> dict[str, str]:
    root = Path(inputs.source) if inputs.source else Path(".")
    out = {}
    for name, _kind in inputs.source_files:
        d = digest(name if os.path.isabs(name) else root / name)
        if d is not None:
            out[name] = d
    return out


def _key(name: str, source: str | None, digest: str) -> tuple[str, str]:
    """A file's identity across ingests: its path inside the input and its content (the same bytes under
    another name are other evidence; the same folder copied elsewhere is the same)."""
    if source and os.path.isabs(name):
        try:
            name = os.path.relpath(name, source)
        except ValueError:
            pass
    return name.replace(os.sep, "/"), digest


def _known(store: Store, job: str) -> dict[tuple[str, str], tuple[str, Any]]:
    """(path in the input, digest) -> (ingest id, ingest time) of the files already ingested for ``job``."""
    if not store.files("ingests", job=job):
        return {}
    t = store.read("ingests", job=job).sort("ingest_time")  # the latest ingest of a file wins
    return {
        _key(f, s, d): (i, w)
        for f, s, d, i, w in zip(t["source_file"], t["source"], t["source_digest"], t["ingest_id"], t["ingest_time"])
        if d is not None and f is not None
    }


def _next_snapshot(store: Store, job: str) -> int:
    if not store.files("stacks", job=job):
        return 0
    import polars as pl

    top = store.scan("stacks", job=job).select(pl.col("snapshot").max()).collect().item()
    return int(top) + 1 if top is not None else 0


def capture_time(inputs: Inputs) -> float | None:
    """When the evidence was captured, as far as its content says: the newest stack capture time, process
    exit or log line; None when nothing in it carries a time (plain py-spy dumps do not)."""
    times = [p.capture_time for p in inputs.procs if p.capture_time is not None]
    times += [e.time for e in inputs.exits]
    if inputs.logs is not None:
        times += list(inputs.logs.last_time.values())
    return max(times) if times else None


def ingest_inputs(inputs: Inputs, store: Store, *, job: str | None = None) -> IngestReport:
    """Append one job's stacks, topology, Flight Recorder entries, metrics and timings to ``store``, as one
    incident (files already in the store are skipped)."""
    name = job or inputs.job
    ingest_id = uuid.uuid4().hex[:16]
    now = dt.datetime.now(dt.timezone.utc)
    digests = _digests(inputs)
    known = _known(store, name)
    keys = {f: _key(f, inputs.source, d) for f, d in digests.items()}
    new = {f for f, k in keys.items() if k not in known}
    notes = list(inputs.notes)
    if digests and not new:
        first_id, first_time = known[next(iter(keys.values()))]
        notes.append(f"already ingested (ingest {first_id} at {first_time:%Y-%m-%d %H:%M:%S} UTC): nothing added")
        return IngestReport(name, {}, tuple(notes), first_id)
    if len(new) < len(digests):  # an incident is the whole set of files: the known ones belong to it too
        notes.append(
            f"{len(digests) - len(new)} of {len(digests)} file(s) were already in the store; all are ingested as "
            "one new incident"
        )
        new = set(digests)

    def fresh(source: str) -> bool:
        return source in new or source not in digests

    counts: dict[str, int] = {}
    procs = [p for p in inputs.procs if fresh(p.source)]
    stacks = to_table(procs, name, ingest_id=ingest_id, digests=digests, snapshot_offset=_next_snapshot(store, name))
    if stacks.num_rows:
        store.write("stacks", stacks)
    counts["stacks"] = stacks.num_rows
    if inputs.topology is not None:
        made_up = set(inputs.inferred_nodes)  # kept, so that a verdict from the store says so too
        topo_rows = [
            {**r, "node_inferred": r["node"] in made_up, "ingest_id": ingest_id} for r in inputs.topology.to_rows(name)
        ]
        store.write("topology", topo_rows)
        counts["topology"] = len(topo_rows)
    dumps = [d for d in inputs.fr_dumps if fresh(d.source_file)]
    if dumps:
        from rankscope.datasets.readers.fr_table import fr_to_rows

        topo = inputs.topology
        node_of = {int(r): topo.node_of(int(r)) for r in topo.ranks} if topo is not None else None
        fr_rows = fr_to_rows(dumps, name, node_of=node_of)
        store.write("collectives", fr_rows)
        counts["collectives"] = len(fr_rows)
    kinds = dict(inputs.source_files)
    from rankscope.datasets.readers.metric_files import store_frame

    for table, df in (
        ("metrics", store_frame(inputs.metrics) if inputs.metrics is not None else None),
        ("timings", inputs.timings),
    ):
        files = [f for f, k in kinds.items() if k == table]
        if df is not None and df.height and (not files or any(fresh(f) for f in files)):
            import polars as pl

            df = df.with_columns(pl.lit(name).alias("job"))
            keep = [c for c in df.columns if c in _columns(table)]
            store.write(table, df.select(keep))
            counts[table] = df.height
    _ledger(store, name, ingest_id, now, inputs, digests, new)
    return IngestReport(name, counts, tuple(notes), ingest_id)


def _ledger(
    store: Store, job: str, ingest_id: str, now: dt.datetime, inputs: Inputs, digests: dict[str, str], new: set[str]
) -> None:
    when = capture_time(inputs)
    captured = dt.datetime.fromtimestamp(when, dt.timezone.utc) if when is not None else None
    rows = [
        {
            "job": job,
            "ingest_id": ingest_id,
            "ingest_time": now,
            "source": inputs.source,
            "source_file": f,
            "source_digest": digests.get(f),
            "kind": k,
            "capture_time": captured,
        }
        for f, k in inputs.source_files
        if f in new or f not in digests
    ]
    if not rows:  # nothing file-backed (a store re-ingested): still one row, so the incident has a time
        rows = [
            {"job": job, "ingest_id": ingest_id, "ingest_time": now, "source": inputs.source, "capture_time": captured}
        ]
    store.write("ingests", rows)


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
    gpus_per_node: int | None = None,
    follow_symlinks: bool = False,
) -> IngestReport:
    """Load a dump directory (see :func:`load_inputs`) and append it to the store at ``store_root``."""
    inputs = load_inputs(
        path, layout=layout, order=order, gpus_per_node=gpus_per_node, job=job, follow_symlinks=follow_symlinks
    )
    return ingest_inputs(inputs, Store(store_root, create=True), job=job)
