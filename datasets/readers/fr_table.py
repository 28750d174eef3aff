"""Flight Recorder dumps to and from rows of the store's ``collectives`` table."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from rankscope.datasets.domain.flight_recorder import FRDump, FREntry, PGInfo, PGStatus
from rankscope.datasets.domain.stacks import Frame
from rankscope.datasets.readers.fr_entries import shapes, split_profiling_name
from rankscope.spine import InputError


# -- the collectives table ----------------------------------------------------------------------
def fr_to_rows(dumps: Iterable[FRDump], job: str, node_of: Mapping[int, str] | None = None) -> list[dict[str, Any]]:
    """Rows of the ``collectives`` table: one per entry, plus one metadata row per process group of a
    rank (``record_id`` null) carrying ``pg_config``/``pg_status``, so a store round-trip loses nothing
    the analysis needs (a rank with no group at all still gets one row, so its dump is not forgotten)."""
    from rankscope.datasets.store.schemas import COLLECTIVES

    empty_row = dict.fromkeys(COLLECTIVES.schema.names)  # every row has every key (pa.Table.from_pylist)
    rows: list[dict[str, Any]] = []
    for d in dumps:
        node = node_of.get(d.rank) if node_of is not None else None
        base = {
            **empty_row,
            "job": job,
            "rank": d.rank,
            "node": node,
            "source_file": d.source_file,
            "fr_version": d.version,
            "dump_time_ns": d.dump_time_ns,
        }
        pgs = dict.fromkeys([*d.pg_config, *d.pg_status, *(e.pg_name for e in d.entries)])
        pg_meta = {}
        for name in pgs:
            cfg, st = d.pg_config.get(name), d.pg_status.get(name)
            pg_meta[name] = {
                "pg_ranks": list(cfg.ranks) if cfg and cfg.ranks is not None else None,
                "pg_last_enqueued": st.last_enqueued if st else None,
                "pg_last_started": st.last_started if st else None,
                "pg_last_completed": st.last_completed if st else None,
            }
            pg_id = st.pg_id if st and st.pg_id else None
            rows.append(
                {**base, "pg_name": name, "pg_id": pg_id, "pg_desc": cfg.desc if cfg else None, **pg_meta[name]}
            )
        if not pgs:
            rows.append(dict(base))
        for e in d.entries:
            rows.append(
                {
                    **base,
                    "record_id": e.record_id,
                    "pg_id": e.pg_id,
                    "pg_name": e.pg_name,
                    "pg_desc": e.pg_desc,
                    "collective_seq_id": e.collective_seq_id,
                    "p2p_seq_id": e.p2p_seq_id,
                    "op_id": e.op_id,
                    "profiling_name": e.profiling_name,
                    "backend": e.backend,
                    "op": e.op,
                    "is_p2p": e.is_p2p,
                    "peer": (e.dst if e.op == "send" else e.src) if e.is_p2p else None,
                    "state": e.state,
                    "retired": e.retired,
                    "time_created_ns": e.time_created_ns,
                    "time_discovered_started_ns": e.time_discovered_started_ns,
                    "time_discovered_completed_ns": e.time_discovered_completed_ns,
                    "duration_ms": e.duration_ms,
                    "timeout_ms": e.timeout_ms,
                    "input_sizes": json.dumps([list(s) for s in e.input_sizes]),
                    "input_dtypes": list(e.input_dtypes),
                    "output_sizes": json.dumps([list(s) for s in e.output_sizes]),
                    "output_dtypes": list(e.output_dtypes),
                    "frames": [{"function": f.function, "file": f.file, "line": f.line} for f in e.frames],
                }
            )
    return rows


def fr_from_table(table: Any) -> list[FRDump]:
    """The dumps back from rows of the ``collectives`` table (a pyarrow Table or polars DataFrame).

    Rows are grouped by rank; when a rank has rows from several dumps (source file and dump time) the
    latest wins (recorded dump time, else the newest entry). Filter by job before calling.
    """
    if hasattr(table, "to_arrow"):
        table = table.to_arrow()
    if not hasattr(table, "to_pylist"):
        raise InputError(f"fr_from_table: expected a pyarrow Table or polars DataFrame, got {type(table).__name__}")
    if table.num_rows and "job" in table.column_names and len(set(table.column("job").to_pylist())) > 1:
        raise InputError("fr_from_table: rows of several jobs; filter by job first")
    by_file: dict[tuple[int, str, int], list[dict[str, Any]]] = defaultdict(list)
    for row in table.to_pylist():
        by_file[(int(row["rank"]), row.get("source_file") or "", row.get("dump_time_ns") or 0)].append(row)
    latest: dict[int, tuple[int, int, str]] = {}
    for (rank, src, when), rows in by_file.items():
        t = max((r.get("time_created_ns") or 0 for r in rows), default=0)
        if rank not in latest or (when, t, src) > latest[rank]:
            latest[rank] = (when, t, src)
    dumps = []
    for rank, (when, _, src) in sorted(latest.items()):
        rows = by_file[(rank, src, when)]
        pg_config: dict[str, PGInfo] = {}
        pg_status: dict[str, PGStatus] = {}
        entries = []
        version = ""
        for r in rows:
            version = version or (r.get("fr_version") or "")
            name = r.get("pg_name")
            if r.get("record_id") is None:
                if name is None:
                    continue
                if r.get("pg_ranks") is not None or r.get("pg_desc") is not None:
                    ranks = tuple(int(x) for x in r["pg_ranks"]) if r.get("pg_ranks") is not None else None
                    pg_config[name] = PGInfo(name, r.get("pg_desc") or "", ranks)
                if any(r.get(k) is not None for k in ("pg_last_enqueued", "pg_last_started", "pg_last_completed")):
                    pg_status[name] = PGStatus(
                        r.get("pg_last_enqueued"),
                        r.get("pg_last_started"),
                        r.get("pg_last_completed"),
                        r.get("pg_id") or "",
                    )
                continue
            pname = r.get("profiling_name") or ""
            backend, op, s, dd = split_profiling_name(pname)
            entries.append(
                FREntry(
                    record_id=int(r["record_id"]),
                    pg_id=r.get("pg_id") or name or "",
                    pg_name=name or "",
                    pg_desc=r.get("pg_desc") or "",
                    collective_seq_id=_int_or(r.get("collective_seq_id"), -1),
                    p2p_seq_id=_int_or(r.get("p2p_seq_id"), -1),
                    op_id=_int_or(r.get("op_id"), -1),
                    profiling_name=pname,
                    backend=r.get("backend") or backend,
                    op=r.get("op") or op,
                    is_p2p=bool(r.get("is_p2p")),
                    src=s,
                    dst=dd,
                    state=r.get("state") or "",
                    retired=bool(r.get("retired")),
                    time_created_ns=r.get("time_created_ns"),
                    time_discovered_started_ns=r.get("time_discovered_started_ns"),
                    time_discovered_completed_ns=r.get("time_discovered_completed_ns"),
                    duration_ms=r.get("duration_ms"),
                    timeout_ms=r.get("timeout_ms"),
                    input_sizes=shapes(json.loads(r.get("input_sizes") or "[]")),
                    input_dtypes=tuple(r.get("input_dtypes") or ()),
                    output_sizes=shapes(json.loads(r.get("output_sizes") or "[]")),
                    output_dtypes=tuple(r.get("output_dtypes") or ()),
                    frames=tuple(Frame(f["function"], f["file"], f["line"]) for f in (r.get("frames") or ())),
                )
            )
        entries.sort(key=lambda e: e.record_id)
        dumps.append(
            FRDump(
                rank=rank,
                entries=tuple(entries),
                version=version,
                pg_config=pg_config,
                pg_status=pg_status,
                source_file=src,
                source_format="store",
                dump_time_ns=when or None,
            )
        )
    return dumps


def _int_or(v: Any, default: int) -> int:
    return int(v) if v is not None else default
