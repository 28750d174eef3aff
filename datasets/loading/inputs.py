"""Everything ``rankscope diagnose PATH`` needs, loaded from a dump directory or a store.

:func:`load_inputs` resolves PATH (a raw dump directory or a rankscope store), reads the stacks,
Flight Recorder dumps, metrics and timings it finds, and builds the topology from the layout, the
manifest or the store's ``topology`` table. The analysis then runs on the in-memory result.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from rankscope.config import InputsConfig, Limits
from rankscope.datasets.domain.bounds import reading_limits
from rankscope.datasets.domain.inputs import Inputs
from rankscope.datasets.domain.stacks import ProcStacks
from rankscope.datasets.domain.topology import DIMS, Layout, Topology, parse_order
from rankscope.datasets.loading.capture_times import file_capture_times, folder_capture_times, log_starts
from rankscope.datasets.loading.names import (
    check_ranks,
    infer_topology,
    inferred_nodes,
    inferred_note,
    pg_members,
    rank_sources,
)
from rankscope.datasets.readers.dumpdir import DumpDir, scan_dump_dir
from rankscope.datasets.readers.exits import exits_from_events
from rankscope.datasets.readers.identity import natural
from rankscope.datasets.readers.rundir_rounds import stack_rounds
from rankscope.datasets.store import is_store
from rankscope.spine import InputError, LayoutError, paused_gc

__all__ = ["infer_topology", "latest_series", "load_fr_inputs", "load_inputs"]


def _ranks_and_nodes(procs: Sequence[ProcStacks]) -> tuple[list[int], dict[int, str]]:
    """Every rank seen, and the node each trainer rank ran on."""
    nodes = {p.rank: p.node for p in procs if p.role == "trainer" and p.rank is not None and p.node}
    return sorted({p.rank for p in procs if p.rank is not None}), nodes


def _from_dir(
    root: Path,
    *,
    layout: Layout | None,
    gpus_per_node: int | None,
    job: str | None,
    config: InputsConfig,
    follow_symlinks: bool = False,
) -> Inputs:
    from rankscope.datasets.loading.sources import read_sources

    dd: DumpDir = scan_dump_dir(root, gpus_per_node=gpus_per_node, follow_symlinks=follow_symlinks)
    g = gpus_per_node or dd.host_width or 8
    src = read_sources(
        dd, gpus_per_node=gpus_per_node, node_label=config.node_label or None, metric_format=config.metric_format
    )
    round_notes: list[str] = []
    rounds = stack_rounds(src.procs, root, round_notes)  # the hook's run directory: every dump is a round
    procs = rounds.procs
    zone = src.logs.zone_offset_s if src.logs else 0.0
    latest = rounds.latest or folder_capture_times(procs, round_notes, zone, log_starts(dd, src.logs))
    if not latest and src.logs is not None and src.logs.steps:
        latest = file_capture_times(procs, str(root), round_notes, src.logs)
    names = src.names
    world_ranks = sorted(
        {p.rank for p in procs if p.rank is not None}
        | {d.rank for d in src.fr}
        | {e.rank for e in src.exits}
        | (set(src.logs.ranks) if src.logs is not None else set())
    )
    check_ranks(rank_sources(procs, src), layout=layout, where=str(root))  # before any list sized by a rank
    notes: list[str] = list(src.notes) + round_notes
    topo: Topology | None
    coords = _hook_coords(dd, world_ranks, notes) if layout is None else None
    world = layout.world_size if layout is not None else max(world_ranks, default=-1) + 1
    filled = names.fill_from_neighbours(world, g)
    if filled:
        notes.append(filled)
    nodes = names.nodes()
    if world_ranks or coords:
        topo, more = infer_topology(world_ranks, nodes, layout=layout, gpus_per_node=g, where=str(root), coords=coords)
        notes += more
    elif layout is not None:
        timing_ranks = range(layout.world_size)
        topo = Topology.from_table(
            list(timing_ranks), [nodes.get(r) or f"node-{r // g}" for r in timing_ranks], layout=layout
        )
    else:  # metrics/timings only: the timing analysis builds its topology from the timing columns
        topo = None
    inferred = inferred_nodes(topo, nodes) if (world_ranks or coords or layout is not None) else ()
    timings = src.timings
    if topo is None and gpus_per_node and timings is not None and "node" not in timings.columns:
        # timings that name no machine, and the user said how many ranks a machine holds: node-<rank // G>,
        # as --gpus-per-node promises (without it each rank stands alone, rank-<N>)
        import polars as pl  # here only: metric- and timing-free runs never load it

        timings = timings.with_columns(node=pl.format("node-{}", pl.col("rank") // gpus_per_node))
        inferred = tuple(sorted(set(timings["node"].unique().to_list()), key=natural))
    if inferred:
        notes.append(inferred_note(inferred, g))
    notes += names.notes()
    expected = dict(dd.expected_ranks)
    if layout is not None:
        for r in range(layout.world_size):
            expected.setdefault(r, "the --layout world size")
    for r, _ in pg_members(src.fr):
        expected.setdefault(r, "a Flight Recorder pg_config")
    if src.logs is not None:
        for r in src.logs.ranks:
            expected.setdefault(r, "the logs")
    if topo is not None:
        procs = _named_procs(procs, topo)
    return Inputs(
        job or root.name,
        topo,
        tuple(procs),
        tuple(src.fr),
        src.metrics,
        timings,
        tuple(notes),
        str(root),
        exits=tuple(src.exits),
        logs=src.logs,
        snapshot_times=rounds.times,
        snapshot_latest=latest,
        expected_ranks=expected,
        inferred_nodes=inferred,
        source_files=_source_files(dd, procs, src.fr),
        assumed_ranks=tuple(
            sorted(
                {
                    f.rank
                    for f in dd.files
                    if f.rank is not None and f.identity.sources.get("rank") in ("host-order", "pid-order")
                }
                | set(src.assumed_ranks)
            )
        ),
    )


def _source_files(dd: DumpDir, procs: Sequence[ProcStacks], fr: Sequence[Any]) -> tuple[tuple[str, str], ...]:
    """Every evidence file read, as the rows will name it, with its kind (the ingest ledger digests them)."""
    out: dict[str, str] = {}
    for p in procs:
        if p.source:
            out.setdefault(p.source, "stacks")
    for d in fr:
        out.setdefault(d.source_file, "flight_recorder")
    for _, rel in (*dd.log_files, *dd.elastic_files):
        out.setdefault(rel, "logs")
    for path in dd.exit_files:
        out.setdefault(str(path), "exits")
    for path in dd.metric_files:
        out.setdefault(str(path), "metrics")
    for path in (*dd.timing_files, *(Path(a) for a, _ in dd.step_files)):
        out.setdefault(str(path), "timings")
    return tuple(out.items())


def _named_procs(procs: Sequence[ProcStacks], topo: Topology) -> list[ProcStacks]:
    """Each process's node as the topology names its rank (one name per rank, whatever the source)."""
    out = []
    world = topo.world_size
    for p in procs:
        if p.rank is not None and 0 <= p.rank < world:
            node = topo.node_of(p.rank)
            if node != p.node:
                p = replace(p, node=node)
        out.append(p)
    return out


def _hook_coords(dd: DumpDir, ranks: Sequence[int], notes: list[str]) -> dict[str, list[int]] | None:
    """The parallel coordinates the hook recorded for every rank, when they describe a valid layout."""
    if not dd.coords or sorted(dd.coords) != list(range(max(ranks, default=-1) + 1)):
        return None
    world = len(dd.coords)
    coords = {d: [dd.coords[r].get(d, 0) for r in range(world)] for d in DIMS}
    try:
        Topology.from_table(list(range(world)), ["n"] * world, coords=coords)
    except LayoutError as exc:
        notes.append(f"the hook's recorded parallel coordinates were not used ({exc}); pass --layout")
        return None
    return coords


def _store_metrics(files: Sequence[Path], node_label: str | None) -> Any:
    """The store's metrics table as a MetricSet (streamed when analysed, never read whole here)."""
    if not files:
        return None
    from rankscope.datasets.domain.metrics import MetricSet

    return MetricSet(tuple((Path(f), "long") for f in files), node_label=node_label)


def _from_store(
    root: Path,
    *,
    layout: Layout | None,
    gpus_per_node: int,
    job: str | None,
    series_gap_seconds: float,
    node_label: str | None = None,
    incident: str | None = None,
) -> Inputs:
    from rankscope.datasets.store.stacks_table import from_table  # pyarrow: only a store needs it
    from rankscope.datasets.store.store import Store

    store = Store(root, skip_bad=True)  # a corrupt or foreign part file is left out, and said in the notes
    evidence = ("stacks", "collectives", "fr_dumps", "metrics", "timings")
    # a named job is looked up in its own partitions: listing every job of a 10,000-job store for each
    # diagnosis made a batch over it quadratic
    if job is not None and any(store.files(t, job=job) for t in evidence):
        jobs = [job]
    else:
        jobs = sorted({j for t in evidence for j in store.jobs(t)})
    if job is None:
        if not jobs:
            raise InputError(f"{root}: the store holds no stacks, collectives, metrics or timings")
        if len(jobs) > 1:
            raise InputError(f"{root}: the store holds several jobs ({', '.join(jobs)}); choose one with --job")
        job = jobs[0]
    elif job not in jobs:
        raise InputError(f"{root}: no job {job!r} in the store (jobs: {', '.join(jobs) or 'none'})")
    from rankscope.datasets.loading.incidents import choose, keep_fr_rows

    stacks_tbl = store.read_arrow("stacks", job=job)
    chosen = choose(
        store,
        job,
        stacks_tbl,
        from_table(stacks_tbl),
        _snapshot_times(stacks_tbl),
        lambda times: latest_series(times, series_gap_seconds),
        incident=incident,
        gap_s=series_gap_seconds,
    )
    procs, snapshot_times, notes = chosen.procs, chosen.snapshot_times, list(chosen.notes)
    topo_df = _own_topology(store.read("topology", job=job), chosen.ingest_id)
    from rankscope.datasets.readers.fr_store import read_fr_captures

    since = min(snapshot_times.values()) - series_gap_seconds if snapshot_times else None
    fr, fr_notes, fr_nodes = read_fr_captures(store, job, not_before=since)  # the agent's raw captures
    notes += fr_notes
    if not fr and store.files("collectives", job=job):  # ingested dump directories
        from rankscope.datasets.readers.fr_table import fr_from_table

        rows = store.read_arrow("collectives", job=job)
        if store.files("ingests", job=job):
            rows = keep_fr_rows(rows, store.read("ingests", job=job), chosen.fr_sources)
        fr = list(fr_from_table(rows))
    made_up: tuple[str, ...] = ()
    if topo_df.height and "node_inferred" in topo_df.columns:  # names ingest made up (node-<rank // N>)
        made_up = tuple(sorted(set(topo_df.filter(topo_df["node_inferred"].fill_null(False))["node"].to_list())))
    topo: Topology | None
    if topo_df.height and layout is None:
        check_ranks(((int(r), f"{root}/topology") for r in topo_df["rank"].drop_nulls()), layout=None, where=str(root))
        coords = {d: topo_df[d].to_list() for d in DIMS if topo_df[d].null_count() == 0}
        topo = Topology.from_table(topo_df["rank"].to_list(), topo_df["node"].to_list(), coords=coords or None)
    else:
        ranks, nodes = _ranks_and_nodes(procs)
        nodes = {**fr_nodes, **nodes}
        ranks = sorted(set(ranks) | {d.rank for d in fr if d.rank is not None})
        if ranks:
            topo, inferred = infer_topology(ranks, nodes, layout=layout, gpus_per_node=gpus_per_node, where=str(root))
            notes += inferred
        elif layout is not None:
            topo = Topology.from_layout(layout, gpus_per_node=gpus_per_node)
        else:
            topo = None
    metrics = _store_metrics(store.files("metrics", job=job), node_label)
    timings = store.read("timings", job=job) if store.files("timings", job=job) else None
    exits = exits_from_events(store.read("events", job=job)) if store.files("events", job=job) else []
    if store.skipped:  # corrupt or foreign files: left out, and said
        shown = list(store.skipped.values())
        notes.append(f"{len(shown)} store file(s) left out: {shown[0]}" + (" ..." if len(shown) > 1 else ""))
    return Inputs(
        job,
        topo,
        tuple(procs),
        tuple(fr),
        metrics,
        timings,
        tuple(notes),
        str(root),
        exits=tuple(exits),
        snapshot_times=snapshot_times,
        inferred_nodes=made_up,
    )


def _own_topology(topo: Any, ingest_id: str | None) -> Any:
    """One row per rank: the chosen incident's own rows when the table says which ingest wrote them (a job
    re-run on other machines is ingested with another topology), else the last written."""
    if topo.height and "ingest_id" in topo.columns:
        ids = topo["ingest_id"]
        mine = topo.filter(ids == ingest_id) if ingest_id is not None else topo.filter(ids.is_null())
        if mine.height:
            topo = mine
    return topo.unique(subset=["rank"], keep="last").sort("rank")


def latest_series(snapshot_times: Mapping[int, float], gap_s: float = InputsConfig().series_gap_seconds) -> set[int]:
    """The snapshots of the latest capture series: back from the newest while consecutive snapshots
    are at most ``gap_s`` apart (a fail-slow series is 5 rounds 10 s apart)."""
    order = sorted(snapshot_times, key=lambda s: snapshot_times[s])
    if not order:
        return set()
    keep = [order[-1]]
    for s in reversed(order[:-1]):
        if snapshot_times[keep[-1]] - snapshot_times[s] > gap_s:
            break
        keep.append(s)
    return set(keep)


def _snapshot_times(tbl: Any) -> dict[int, float]:
    """The wall time of each snapshot (its earliest capture) where the ``time`` column is filled."""
    if tbl.num_rows == 0 or "time" not in tbl.column_names or tbl.column("time").null_count == tbl.num_rows:
        return {}
    out: dict[int, float] = {}
    for snap, t in zip(tbl.column("snapshot").to_pylist(), tbl.column("time").to_pylist()):
        if snap is not None and t is not None:
            ts = t.timestamp()
            if snap not in out or ts < out[snap]:
                out[snap] = ts
    return out


def load_inputs(
    path: str | os.PathLike[str],
    *,
    layout: str | Layout | None = None,
    order: str | None = None,
    gpus_per_node: int | None = None,
    job: str | None = None,
    config: InputsConfig | None = None,
    incident: str | None = None,
    limits: Limits | None = None,
    follow_symlinks: bool = False,
    freeze: bool = False,
) -> Inputs:
    """Load a dump directory or a store into :class:`Inputs` (InputError on bad input).

    From a store, the latest incident of the job is loaded, or ``incident`` (a key of
    :func:`rankscope.datasets.loading.incidents.incidents_of`: an ingest id or ``capture-<snapshot>``).

    ``gpus_per_node`` None means "not given": sibling trainers and local ranks are numbered with the
    count each host holds, and unnamed machines are ``node-<rank // 8>``. Symbolic links that leave the
    directory are not followed (nothing from outside the input is read) unless ``follow_symlinks``.

    ``freeze``: move what the process holds after loading a directory (millions of small acyclic objects at
    scale, alive for the whole analysis) out of the cyclic collector's sight with ``gc.freeze()``, which would
    otherwise scan it all again during the analysis (a third of the stack analysis at 100,000 ranks);
    refcounting still frees it. ``gc.freeze()`` freezes every object of the process, the caller's too, so
    cyclic garbage alive at that moment is never collected: for one-shot processes only (the CLI passes
    True; a notebook, a Ray task or a batch loop keeps the default)."""
    with reading_limits(limits):  # every reader below keeps to these (file size, JSON depth, ranks, times)
        return _load(
            Path(path),
            layout=layout,
            order=order,
            gpus_per_node=gpus_per_node,
            job=job,
            config=config,
            incident=incident,
            follow_symlinks=follow_symlinks,
            freeze=freeze,
        )


def _load(
    root: Path,
    *,
    layout: str | Layout | None,
    order: str | None,
    gpus_per_node: int | None,
    job: str | None,
    config: InputsConfig | None,
    incident: str | None,
    follow_symlinks: bool,
    freeze: bool,
) -> Inputs:
    lay: Layout | None
    if order:
        parse_order(order)  # validate even without a layout
    if isinstance(layout, str):
        lay = Layout.parse(layout, order or "tp-cp-ep-dp-pp")
    else:
        lay = layout
        if lay is not None and order:
            lay = Layout(**{d: lay.size(d) for d in DIMS}, order=parse_order(order))
    if not root.exists():
        raise InputError(f"{root}: no such file or directory")
    if is_store(root):
        return _from_store(
            root,
            layout=lay,
            gpus_per_node=gpus_per_node or 8,
            job=job,
            series_gap_seconds=(config or InputsConfig()).series_gap_seconds,
            node_label=(config or InputsConfig()).node_label or None,
            incident=incident,
        )
    with paused_gc():  # millions of small acyclic objects: full collections would make loading superlinear
        inputs = _from_dir(
            root,
            layout=lay,
            gpus_per_node=gpus_per_node,
            job=job,
            config=config or InputsConfig(),
            follow_symlinks=follow_symlinks,
        )
        if freeze:
            gc.freeze()
        return inputs


def load_fr_inputs(
    path: str | os.PathLike[str],
    *,
    prefix: str | None = None,
    layout: str | None = None,
    order: str | None = None,
    gpus_per_node: int | None = None,
    job: str | None = None,
) -> Inputs:
    """A directory of Flight Recorder dumps alone (or one file), with the topology their ranks imply."""
    from rankscope.datasets.readers.flight_recorder import read_fr_dir_noted

    with reading_limits(None):
        dumps, read_notes = read_fr_dir_noted(path, prefix=prefix)
    lay = Layout.parse(layout, order or "tp-cp-ep-dp-pp") if layout else None
    check_ranks(((d.rank, d.source_file) for d in dumps), layout=lay, where=str(path))
    topo, notes = infer_topology(
        [d.rank for d in dumps], {}, layout=lay, gpus_per_node=gpus_per_node or 8, where=str(path)
    )
    return Inputs(job or "", topo, (), tuple(dumps), notes=tuple(read_notes + notes), source=str(path))
