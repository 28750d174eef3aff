"""Stacks to and from the store's ``stacks`` table (one row per thread), built column by column."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

import pyarrow as pa

from rankscope.datasets.domain.stacks import Frame, ProcStacks, ThreadDump
from rankscope.spine import InputError, paused_gc


def from_table(tbl: pa.Table) -> list[ProcStacks]:
    """From rows of the ``stacks`` table (one row per thread; grouped back into processes).

    Frames are decoded once per distinct stack (rows are keyed by a hash of their frames list,
    computed columnar by polars), so a 100,000-rank hang decodes a handful of stacks.
    """
    with paused_gc():
        return _from_table(tbl)


def _from_table(tbl: pa.Table) -> list[ProcStacks]:
    import polars as pl

    names = (
        "snapshot",
        "rank",
        "node",
        "role",
        "pid",
        "status",
        "error",
        "thread_id",
        "thread_name",
        "is_main_thread",
        "active",
        "source_file",
        "source_format",
        "failure_kind",
        "time",
    )
    cols = {name: tbl.column(name).to_pylist() if name in tbl.column_names else [None] * tbl.num_rows for name in names}
    frames_col = tbl.column("frames")
    hashes = cast("pl.Series", pl.from_arrow(frames_col)).hash().to_list() if tbl.num_rows else []
    lengths = pa.compute.list_value_length(frames_col).to_pylist() if tbl.num_rows else []
    decoded: dict[tuple[int, int], tuple[Frame, ...]] = {}
    procs: dict[tuple[Any, ...], dict[str, Any]] = {}
    for i in range(tbl.num_rows):
        key = (cols["snapshot"][i], cols["rank"][i], cols["pid"][i], cols["source_file"][i], cols["role"][i])
        p = procs.get(key)
        if p is None:
            p = procs[key] = {"i": i, "main": None, "others": []}
        fkey = (hashes[i], lengths[i] or 0)
        frames = decoded.get(fkey)
        if frames is None:
            raw = frames_col[i].as_py() or ()
            frames = decoded[fkey] = tuple(Frame(f["function"], f["file"], f["line"]) for f in raw)
        if cols["status"][i] in ("failed", "cut") and not frames:
            continue
        t = ThreadDump(
            frames, cols["thread_id"][i], cols["thread_name"][i], cols["active"][i], bool(cols["is_main_thread"][i])
        )
        if t.is_main and p["main"] is None:
            p["main"] = t
        else:
            p["others"].append(t)
    out = []
    for p in procs.values():
        i = p["i"]
        main = p["main"] or (p["others"].pop(0) if p["others"] else None)
        out.append(
            ProcStacks(
                int(cols["snapshot"][i] or 0),
                cols["rank"][i],
                cols["node"][i],
                cols["role"][i] or "trainer",
                cols["pid"][i],
                cols["status"][i] or "ok",
                cols["error"][i],
                main,
                tuple(p["others"]),
                cols["source_file"][i] or "",
                cols["source_format"][i] or "",
                cols["failure_kind"][i],
                cols["time"][i].timestamp() if cols["time"][i] is not None else None,
            )
        )
    return out


def to_table(
    procs: Sequence[ProcStacks],
    job: str,
    *,
    ingest_id: str | None = None,
    digests: Mapping[str, str] | None = None,
    snapshot_offset: int = 0,
) -> pa.Table:
    """The ``stacks`` table for ``procs`` (one row per thread), built column by column.

    ``ingest_id``, ``digests`` (source file -> digest) and ``snapshot_offset`` (snapshot ids are namespaced
    per ingest) are for ingested dump directories. Each distinct frames tuple is converted to Arrow once and
    gathered with ``take``: a 100,000-rank job has a few hundred distinct stacks but millions of frames.
    """
    import datetime as dt

    utc = dt.timezone.utc
    digest_of = digests or {}
    from rankscope.datasets.store.schemas import FRAME, STACKS

    cols: dict[str, list[Any]] = {n: [] for n in STACKS.schema.names if n != "frames"}
    uniq: dict[int, int] = {}
    uniq_frames: list[tuple[Frame, ...]] = []
    idx: list[int] = []
    for p in procs:
        threads = ([p.main_thread] if p.main_thread is not None else []) + list(p.others)
        rows: list[ThreadDump | None] = list(threads) or [None]
        for t in rows:
            cols["job"].append(job)
            cols["snapshot"].append(p.snapshot + snapshot_offset)
            cols["time"].append(dt.datetime.fromtimestamp(p.capture_time, utc) if p.capture_time is not None else None)
            cols["node"].append(p.node)
            cols["rank"].append(p.rank)
            cols["pid"].append(p.pid)
            cols["role"].append(p.role)
            cols["status"].append(p.status)
            cols["error"].append(p.error)
            cols["source_file"].append(p.source)
            cols["source_format"].append(p.source_format or None)
            cols["thread_id"].append(t.thread_id if t is not None else None)
            cols["thread_name"].append(t.thread_name if t is not None else None)
            cols["is_main_thread"].append((t is p.main_thread) if t is not None else None)
            cols["active"].append(t.active if t is not None else None)
            cols["failure_kind"].append(p.failure_kind)
            cols["ingest_id"].append(ingest_id)
            cols["source_digest"].append(digest_of.get(p.source))
            frames = t.frames if t is not None else ()
            k = uniq.get(id(frames))
            if k is None:
                k = uniq[id(frames)] = len(uniq_frames)
                uniq_frames.append(frames)
            idx.append(k)
    try:
        distinct = pa.array(
            [[{"function": f.function, "file": f.file, "line": f.line} for f in fr] for fr in uniq_frames],
            type=pa.list_(FRAME),
        )
    except (OverflowError, pa.ArrowException) as exc:
        raise InputError(f"table stacks: a frame cannot be stored ({exc})") from None
    arrays = []
    for field in STACKS.schema:
        if field.name == "frames":
            arrays.append(distinct.take(pa.array(idx, type=pa.int64())) if idx else pa.array([], type=field.type))
        else:
            try:
                arrays.append(pa.array(cols[field.name], type=field.type))
            except (OverflowError, pa.ArrowException) as exc:  # a value the column cannot hold: one line
                raise InputError(f"table stacks: column {field.name!r} cannot hold a value read ({exc})") from None
    return pa.Table.from_arrays(arrays, schema=STACKS.schema)
