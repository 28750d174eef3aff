"""Everything ``rankscope diagnose PATH`` needs, loaded from a dump directory or a store.

:func:`load_inputs` resolves PATH (a raw dump directory or a rankscope store), reads the stacks,
Flight Recorder dumps, metrics and timings it finds, and builds the topology from the layout, the
manifest or the store's ``topology`` table. The analysis then runs on the in-memory result.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rankscope.config import InputsConfig
from rankscope.datasets.domain.inputs import Inputs
from rankscope.datasets.domain.stacks import ProcStacks
from rankscope.datasets.domain.topology import DIMS, Layout, Topology, parse_order
from rankscope.datasets.readers.exits import exits_from_events, read_exit_records
from rankscope.datasets.store.marker import is_store
from rankscope.spine import InputError, LayoutError

if TYPE_CHECKING:
    from rankscope.datasets.readers.dumpdir import DumpDir

# the store (pyarrow, polars) is imported where a store is read: a directory of dumps never loads it


def infer_topology(
    ranks: Sequence[int], nodes: Mapping[int, str], *, layout: Layout | None, gpus_per_node: int, where: str
) -> tuple[Topology, list[str]]:
    """The topology from a layout and/or the nodes named per rank; notes say what was inferred."""
    notes: list[str] = []
    if gpus_per_node < 1:
        raise LayoutError(f"--gpus-per-node {gpus_per_node}: must be at least 1")
    max_rank = max(ranks) if ranks else -1
    if layout is not None:
        world = layout.world_size
        if max_rank >= world:
            raise LayoutError(f"{where}: rank {max_rank} is outside the layout {layout} (world size {world})")
    else:
        world = max_rank + 1
        if world <= 0:
            raise InputError(f"{where}: no ranks found")
        layout = Layout(dp=world)
        notes.append(
            f"no --layout given: treating ranks 0..{world - 1} as pure data parallel (pass --layout "
            "tp=..,pp=..,dp=.. to isolate parallel groups and to notice missing trailing ranks)"
        )
    if nodes and all(r in nodes for r in range(world)):
        return Topology.from_table(list(range(world)), [nodes[r] for r in range(world)], layout=layout), notes
    names = [nodes.get(r, f"node-{r // gpus_per_node}") for r in range(world)]
    if not nodes and world % gpus_per_node == 0:
        return Topology.from_layout(layout, gpus_per_node=gpus_per_node), notes
    return Topology.from_table(list(range(world)), names, layout=layout), notes


def _ranks_and_nodes(procs: Sequence[ProcStacks]) -> tuple[list[int], dict[int, str]]:
    """Every rank seen, and the node each trainer rank ran on."""
    nodes = {p.rank: p.node for p in procs if p.role == "trainer" and p.rank is not None and p.node}
    return sorted({p.rank for p in procs if p.rank is not None}), nodes


def _from_dir(root: Path, *, layout: Layout | None, gpus_per_node: int, job: str | None) -> Inputs:
    from rankscope.datasets.readers.dumpdir import from_dump_dir, scan_dump_dir

    dd = scan_dump_dir(root, gpus_per_node=gpus_per_node)
    procs = from_dump_dir(dd)
    ranks, nodes = _ranks_and_nodes(procs)
    fr_notes: list[str] = []
    fr = _read_fr(dd.fr_files, fr_notes) + _read_hook_fr(dd.hook_fr_files, fr_notes)
    ranks_fr = [d.rank for d in fr if getattr(d, "rank", None) is not None]
    metrics, timings = _read_tables(dd, nodes)
    exit_notes: list[str] = []
    exits = read_exit_records(dd.exit_files, nodes=nodes, notes=exit_notes)
    ranks_exit = [e.rank for e in exits]
    world = max([*ranks, *ranks_fr, *ranks_exit], default=-1) + 1
    topo = _topology_from_coords(dd, nodes, world, gpus_per_node, fr_notes) if layout is None else None
    notes: list[str] = []
    if topo is not None:
        pass  # the hook's recorded layout
    elif ranks or ranks_fr or ranks_exit:
        topo, notes = infer_topology(
            ranks + ranks_fr + ranks_exit,
            nodes if dd.has_manifest else {},
            layout=layout,
            gpus_per_node=gpus_per_node,
            where=str(root),
        )
    elif layout is not None:
        topo, notes = Topology.from_layout(layout, gpus_per_node=gpus_per_node), []
    else:  # metrics/timings only: the timing analysis builds its topology from the timing columns
        topo, notes = None, []
    return Inputs(
        job or root.name,
        topo,
        tuple(procs),
        tuple(fr),
        metrics,
        timings,
        tuple(dd.notes) + tuple(fr_notes) + tuple(exit_notes) + tuple(notes),
        str(root),
        exits=tuple(exits),
    )


def _topology_from_coords(
    dd: DumpDir, nodes: Mapping[int, str], world: int, gpus_per_node: int, notes: list[str]
) -> Topology | None:
    """The topology the hook recorded (every rank's parallel coordinates), or None (with a note when
    the coordinates do not describe a valid layout)."""
    if not dd.coords or sorted(dd.coords) != list(range(world)):
        return None
    try:
        return Topology.from_table(
            list(range(world)),
            [nodes.get(r, f"node-{r // gpus_per_node}") for r in range(world)],
            coords={d: [dd.coords[r].get(d, 0) for r in range(world)] for d in DIMS},
        )
    except LayoutError as exc:
        notes.append(f"the hook's recorded parallel coordinates were not used ({exc}); pass --layout")
        return None


def _read_fr(paths: Sequence[Path], notes: list[str]) -> list[Any]:
    """One Flight Recorder dump per rank: when a rank was dumped in several formats (pickle and JSON),
    the name family covering most ranks wins, pickles (which carry call stacks) on a tie."""
    if not paths:
        return []
    from rankscope.datasets.readers.flight_recorder import read_fr_files
    from rankscope.datasets.readers.fr_files import select_fr_files

    chosen = select_fr_files(paths)
    if len(chosen) < len(paths):
        notes.append(
            f"Flight Recorder: read {len(chosen)} of {len(paths)} dump files (one per rank; the other "
            "files are the same ranks in another format)"
        )
    return read_fr_files(chosen)


def _read_hook_fr(files: Sequence[tuple[Path, int]], notes: list[str]) -> list[Any]:
    """The hook's Flight Recorder dumps (the rank is known from the identity); a bad one is a note."""
    if not files:
        return []
    from rankscope.datasets.readers.flight_recorder import read_fr_file

    out, bad = [], []
    for path, rank in files:
        try:
            out.append(read_fr_file(path, rank=rank))
        except Exception as exc:
            bad.append(f"{path.name}: {exc}")
    if bad:
        notes.append(f"{len(bad)} Flight Recorder dump(s) of the run directory skipped: {bad[0]}"[:300])
    return out


def _read_tables(dd: DumpDir, nodes: Mapping[int, str]) -> tuple[Any, Any]:
    if not dd.metric_files and not dd.timing_files and not dd.step_files:
        return None, None
    from rankscope.datasets.readers import tables

    metrics = tables.read_metrics(list(dd.metric_files)) if dd.metric_files else None
    timings = tables.read_timings(list(dd.timing_files)) if dd.timing_files else None
    if dd.step_files:  # the hook's log_step records: per-rank step times
        import polars as pl

        from rankscope.datasets.readers.rundir import read_steps

        steps = read_steps(list(dd.step_files), nodes)
        if steps is not None:
            timings = steps if timings is None else pl.concat([timings, steps], how="diagonal_relaxed")
    return metrics, timings


def _from_store(
    root: Path, *, layout: Layout | None, gpus_per_node: int, job: str | None, series_gap_seconds: float
) -> Inputs:
    from rankscope.datasets.store.stacks_table import from_table
    from rankscope.datasets.store.store import Store

    store = Store(root)
    jobs = sorted(
        set(store.jobs("stacks"))
        | set(store.jobs("collectives"))
        | set(store.jobs("fr_dumps"))
        | set(store.jobs("metrics"))
        | set(store.jobs("timings"))
    )
    if job is None:
        if not jobs:
            raise InputError(f"{root}: the store holds no stacks, collectives, metrics or timings")
        if len(jobs) > 1:
            raise InputError(f"{root}: the store holds several jobs ({', '.join(jobs)}); choose one with --job")
        job = jobs[0]
    elif job not in jobs:
        raise InputError(f"{root}: no job {job!r} in the store (jobs: {', '.join(jobs) or 'none'})")
    stacks_tbl = store.read_arrow("stacks", job=job)
    procs = from_table(stacks_tbl)
    snapshot_times = _snapshot_times(stacks_tbl)
    notes: list[str] = []
    latest = latest_series(snapshot_times, series_gap_seconds)
    if len(latest) < len(snapshot_times):  # the agent's store keeps every capture: diagnose the latest
        older = len(snapshot_times) - len(latest)
        procs = [p for p in procs if p.snapshot in latest or p.snapshot not in snapshot_times]
        snapshot_times = {s: t for s, t in snapshot_times.items() if s in latest}
        notes.append(
            f"{older} snapshot(s) of earlier captures ignored: the latest capture (from "
            f"{_utc(min(snapshot_times.values()))}) is diagnosed"
        )
    topo_df = store.read("topology", job=job).unique(subset=["rank"], keep="last").sort("rank")
    from rankscope.datasets.readers.fr_store import read_fr_captures

    since = min(snapshot_times.values()) - series_gap_seconds if snapshot_times else None
    fr, fr_notes, fr_nodes = read_fr_captures(store, job, not_before=since)  # the agent's raw captures
    notes += fr_notes
    if not fr and store.files("collectives", job=job):  # ingested dump directories
        from rankscope.datasets.readers.fr_table import fr_from_table

        fr = list(fr_from_table(store.read_arrow("collectives", job=job)))
    topo: Topology | None
    if topo_df.height and layout is None:
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
    metrics = store.read("metrics", job=job) if store.files("metrics", job=job) else None
    timings = store.read("timings", job=job) if store.files("timings", job=job) else None
    exits = exits_from_events(store.read("events", job=job)) if store.files("events", job=job) else []
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
    )


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


def _utc(t: float) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(t, tz=dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


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
    gpus_per_node: int = 8,
    job: str | None = None,
    config: InputsConfig | None = None,
) -> Inputs:
    """Load a dump directory or a store into :class:`Inputs` (InputError on bad input)."""
    root = Path(path)
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
            gpus_per_node=gpus_per_node,
            job=job,
            series_gap_seconds=(config or InputsConfig()).series_gap_seconds,
        )
    return _from_dir(root, layout=lay, gpus_per_node=gpus_per_node, job=job)


def load_fr_inputs(
    path: str | os.PathLike[str],
    *,
    prefix: str | None = None,
    layout: str | None = None,
    order: str | None = None,
    gpus_per_node: int = 8,
    job: str | None = None,
) -> Inputs:
    """A directory of Flight Recorder dumps alone (or one file), with the topology their ranks imply."""
    from rankscope.datasets.readers.flight_recorder import read_fr_dir

    dumps = read_fr_dir(path, prefix=prefix)
    lay = Layout.parse(layout, order or "tp-cp-ep-dp-pp") if layout else None
    topo, notes = infer_topology([d.rank for d in dumps], {}, layout=lay, gpus_per_node=gpus_per_node, where=str(path))
    return Inputs(job or "", topo, (), tuple(dumps), notes=tuple(notes), source=str(path))
