"""Prometheus as operators export it: the text exposition format and HTTP API query results.

- **Text exposition** (a node_exporter or dcgm-exporter scrape; one file per scrape, per machine, or
  several scrapes with sample timestamps). ``# TYPE`` lines give counter/gauge. Sample timestamps (ms)
  are optional; without them a file is one scrape taken at the time in its file name (epoch seconds or
  milliseconds, or ``YYYYmmddTHHMMSS``), else at the file's modification time, and a note says which.
  The same series twice without timestamps (several scrapes appended) cannot be ordered: an error.
  Parsing is vectorised and linear: one regular expression splits every line into name, labels, value
  and timestamp; lines are grouped by their label *keys* (exporters print the same keys in the same
  order for a metric family), and each group's values are cut out with one expression, so there is no
  per-line Python work and no per-label explode.
- **Query results** (``/api/v1/query_range``: ``matrix``; ``/api/v1/query``: ``vector``). ``status:
  error`` is reported with its text; an expression without ``__name__`` becomes metric ``value``.

The machine is ``--node-label`` if given, else ``node``, ``Hostname`` (dcgm-exporter), ``hostname``,
``instance`` (port stripped). In a one-machine file, samples without that label (node_exporter lines
beside dcgm-exporter lines) belong to that machine; in a multi-machine file they are skipped with a
note. Without any machine label the file name is the machine (a note says so). Every other label is a
column. Output: the chunk layout of :mod:`.metric_files`.
"""

from __future__ import annotations

import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa

from rankscope.datasets.readers.metric_long import MACHINE_LABELS
from rankscope.spine import ParseError

PROM_TYPES = ("counter", "gauge", "histogram", "summary", "untyped", "gaugehistogram", "info", "stateset", "unknown")
SAMPLE = (  # one sample line: name, {labels}, value, optional timestamp (shared with prometheus_batch)
    r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})?[ \t]+(?P<value>[^ \t]+)"
    r"(?:[ \t]+(?P<ts>-?[0-9.eE+]+))?[ \t]*$"
)
SAMPLE_RE = re.compile(SAMPLE)
_QUOTED = r'"(?:[^"\\]|\\.)*"'
_KEY = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*""')
_NAME_TIME = re.compile(
    r"(?<![0-9])(\d{13}|\d{10})(?:\.\d+)?(?![0-9])|(\d{8}T\d{6}(?:\.\d+)?Z?)|(\d{4}-\d\d-\d\dT\d\d[:-]?\d\d[:-]?\d\d(?:\.\d+)?Z?)"
)


def looks_like_exposition(head: bytes) -> bool:
    """True when the first bytes read as Prometheus text exposition (``# HELP``/``# TYPE`` lines, or sample
    lines ``name{labels} value``)."""
    text = head.decode("utf-8", errors="replace")
    lines = [ln.strip() for ln in text.splitlines()[:40] if ln.strip()]
    if len(text) >= len(head) and lines and len(head) >= 4096:
        lines = lines[:-1]  # the last line may be cut
    if not lines:
        return False
    if any(ln.startswith(("# TYPE ", "# HELP ")) for ln in lines):
        return True
    samples = [ln for ln in lines if not ln.startswith("#")]
    good = [ln for ln in samples if SAMPLE_RE.match(ln) and _number(ln.split()[-1])]
    return bool(samples) and len(good) == len(samples) and ("{" in samples[0] or "," not in samples[0])


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _lines(path: Path) -> Any:
    import polars as pl

    try:
        raw = pl.read_csv(
            path,
            has_header=False,
            separator="\x1f",
            quote_char=None,
            new_columns=["line"],
            schema_overrides={"line": pl.Utf8},
            truncate_ragged_lines=True,
            comment_prefix=None,
        )
    except pl.exceptions.NoDataError:
        return None
    except (pl.exceptions.PolarsError, OSError) as exc:
        raise ParseError(path, f"unreadable text file ({str(exc).splitlines()[0][:200]})") from None
    return raw.select(pl.col("line").str.strip_chars()).filter(pl.col("line") != "")


def type_declarations(lines: Any) -> tuple[dict[str, str], Any]:
    """The ``# TYPE`` declarations of a frame of lines (later ones winning), and the malformed ones (a frame of
    ``n``, ``t``; None when there is none)."""
    import polars as pl

    tl = lines.filter(pl.col("line").str.starts_with("# TYPE "))
    if tl.height == 0:
        return {}, None
    parts = tl.select(
        pl.col("line").str.split(" ").list.get(2, null_on_oob=True).alias("n"),
        pl.col("line").str.split(" ").list.get(3, null_on_oob=True).str.to_lowercase().alias("t"),
    )
    bad = parts.filter(~pl.col("t").is_in(list(PROM_TYPES)) | pl.col("n").is_null())
    return dict(zip(parts["n"].to_list(), parts["t"].to_list())), bad if bad.height else None


def _types(path: Path, lines: Any) -> dict[str, str]:
    types, bad = type_declarations(lines)
    if bad is not None:
        raise ParseError(path, f"malformed '# TYPE' line for {bad['n'][0]!r} (type {bad['t'][0]!r})")
    return types


def label_columns(samples: Any) -> Any:
    """``labels`` text -> one column per label name (values unescaped), grouped by the label keys."""
    import polars as pl

    sig = pl.col("labels").fill_null("").str.replace_all(_QUOTED, '""')
    with_sig = samples.with_columns(sig.alias("_sig"))
    parts = []
    for (signature,), part in with_sig.group_by(["_sig"]):
        keys = _KEY.findall(str(signature))
        if keys:
            sep = r"[ \t]*,[ \t]*"
            pattern = "^" + sep.join(f"{k}[ \\t]*=[ \\t]*({_QUOTED})" for k in keys) + r"[ \t]*,?[ \t]*$"
            vals = part.select(pl.col("labels").str.extract_groups(pattern)).unnest("labels")
            vals.columns = keys
            vals = vals.select([pl.col(k).str.slice(1, pl.col(k).str.len_chars() - 2) for k in keys])  # unquote
            for k in keys:
                if vals[k].str.contains("\\", literal=True).any():
                    vals = vals.with_columns(
                        pl.col(k)
                        .str.replace_all(r"\\n", "\n")
                        .str.replace_all(r'\\"', '"')
                        .str.replace_all(r"\\\\", "\\")
                    )
            parts.append(pl.concat([part.drop("_sig", "labels"), vals], how="horizontal"))
        else:
            parts.append(part.drop("_sig", "labels"))
    return pl.concat(parts, how="diagonal_relaxed") if parts else samples.drop("labels")


def _parse_samples(path: Path, lines: Any) -> Any:
    import polars as pl

    samples = lines.filter(~pl.col("line").str.starts_with("#"))
    if samples.height == 0:
        return None
    parsed = samples.select(pl.col("line").str.extract_groups(SAMPLE).alias("g"), pl.col("line")).unnest("g")
    bad = parsed.filter(pl.col("name").is_null())
    if bad.height:
        raise ParseError(
            path,
            f"not Prometheus text exposition format: line {bad['line'][0][:80]!r} "
            f"(first of {bad.height} unparsable lines)",
        )
    value = pl.col("value").str.replace(r"^\+", "").cast(pl.Float64, strict=False)
    parsed = parsed.with_columns(value.alias("v"), (pl.col("ts").cast(pl.Float64, strict=False) / 1e3).alias("t"))
    badv = parsed.filter(pl.col("v").is_null())
    if badv.height:
        raise ParseError(path, f"sample value {badv['value'][0]!r} is not a number (metric {badv['name'][0]})")
    return parsed.select(
        pl.col("t").alias("ts"), pl.col("name").alias("metric"), pl.col("v").alias("value"), "labels"
    ).with_row_index("_row")


def scrape_time(path: Path, n: int, notes: list[str]) -> float:
    """When a scrape without sample timestamps was taken: the last time-like part of its file name, else the
    file's modification time (each with a note in ``notes``)."""
    found = list(_NAME_TIME.finditer(path.name))
    if found:
        m = found[-1]  # the last time-like part of the name
        notes.append("scrape files without sample timestamps: time taken from the file name")
        if m.group(1):
            v = float(m.group(1))
            return v / 1e3 if len(m.group(1)) == 13 else v
        if m.group(2):
            return datetime.strptime(m.group(2)[:15], "%Y%m%dT%H%M%S").replace(tzinfo=timezone.utc).timestamp()
        digits = re.sub(r"[^0-9]", "", m.group(3))[:14]  # 2025-12-01T10:00:00Z, 2025-12-01T10-00-00
        return datetime.strptime(digits, "%Y%m%d%H%M%S").replace(tzinfo=timezone.utc).timestamp()
    notes.append(f"{path.name}: no sample timestamps and none in the file name: the scrape time is the file's mtime")
    return path.stat().st_mtime


def exposition_frame(path: Path) -> tuple[Any, dict[str, str], list[str]]:
    """One exposition-format file -> (polars frame ``ts, metric, value, <labels>``, declared types, notes)."""
    import polars as pl

    lines = _lines(path)
    if lines is None:
        return None, {}, [f"{path}: empty scrape file"]
    types = _types(path, lines)
    parsed = _parse_samples(path, lines)
    if parsed is None:
        return None, types, [f"{path}: no samples"]
    notes: list[str] = []
    missing_ts = parsed["ts"].null_count()
    if missing_ts == parsed.height:
        parsed = parsed.with_columns(pl.lit(scrape_time(path, parsed.height, notes)).alias("ts"))
    elif missing_ts:
        raise ParseError(path, f"{missing_ts} of {parsed.height} samples have no timestamp while others do")
    frame = label_columns(parsed).drop("_row")
    key = [c for c in frame.columns if c != "value"]
    if frame.select(key).is_duplicated().any():
        raise ParseError(
            path,
            "the same series appears twice with the same timestamp: several scrapes without timestamps in one "
            "file cannot be ordered; add sample timestamps or write one file per scrape",
        )
    return frame, types, notes


def read_exposition(path: Path, *, node_label: str | None = None) -> tuple[pa.Table, dict[str, str], list[str]]:
    """One exposition-format file -> (chunk, declared types by metric family, notes)."""
    frame, types, notes = exposition_frame(path)
    if frame is None:
        return _empty(), types, notes
    return assign_machine(path, frame, node_label, notes), types, notes


def read_query_result(path: Path, *, node_label: str | None = None) -> tuple[pa.Table, dict[str, str], list[str]]:
    """A ``/api/v1/query_range`` (matrix) or ``/api/v1/query`` (vector) result -> (chunk, {}, notes)."""
    import polars as pl

    try:
        doc = pl.read_json(path, infer_schema_length=None)
    except (pl.exceptions.PolarsError, OSError, ValueError) as exc:
        raise ParseError(path, f"unreadable JSON ({str(exc).splitlines()[0][:200]})") from None
    if "status" in doc.columns and doc["status"][0] != "success":
        err = doc["error"][0] if "error" in doc.columns else "no error text"
        raise ParseError(path, f"Prometheus query result has status {doc['status'][0]!r}: {err}")
    if "data" not in doc.columns or not isinstance(doc.schema["data"], pl.Struct):
        raise ParseError(path, "not a Prometheus query result: no 'data' object")
    data = doc.select(pl.col("data")).unnest("data")
    rtype = data["resultType"][0] if "resultType" in data.columns else None
    if rtype not in ("matrix", "vector"):
        raise ParseError(
            path, f"resultType {rtype!r} is not 'matrix' or 'vector' (scalars and strings carry no series)"
        )
    res = data.select(pl.col("result")).explode("result")
    if res.height == 0 or res["result"].null_count() == res.height:
        return _empty(), {}, [f"{path.name}: query result holds no series"]
    res = res.unnest("result").with_row_index("sid")
    if "metric" not in res.columns:
        raise ParseError(path, "result entries have no 'metric' labels")
    field = "values" if rtype == "matrix" else "value"
    if field not in res.columns:
        raise ParseError(path, f"{rtype} result without {field!r}")
    pts = res.select("sid", field)
    if rtype == "matrix":
        pts = pts.explode(field)
    pts = pts.drop_nulls(field)
    if pts.height == 0 or not isinstance(pts.schema[field], pl.List):
        return _empty(), {}, [f"{path.name}: query result holds no samples"]
    pair = pl.col(field)
    bad_len = pts.filter(pair.list.len() != 2)
    if bad_len.height:
        raise ParseError(path, f'a sample is not a [timestamp, "value"] pair (series {bad_len["sid"][0]})')
    pts = pts.select(
        "sid",
        pair.list.get(0).cast(pl.Float64, strict=False).alias("ts"),
        pair.list.get(1).str.replace(r"^\+", "").cast(pl.Float64, strict=False).alias("value"),
        pair.list.get(1).alias("raw"),
    )
    bad = pts.filter(pl.col("ts").is_null() | (pl.col("value").is_null() & pl.col("raw").is_not_null()))
    if bad.height:
        raise ParseError(
            path, f"sample [{bad['ts'][0]}, {bad['raw'][0]!r}] is not a number pair (first of {bad.height})"
        )
    meta = res.select("sid", "metric")
    labels = meta.unnest("metric") if isinstance(meta.schema["metric"], pl.Struct) else meta.select("sid")
    notes: list[str] = []
    if "__name__" in labels.columns:
        labels = labels.rename({"__name__": "metric"})
    else:
        labels = labels.with_columns(pl.lit("value").alias("metric"))
        notes.append(f"{path.name}: series have no __name__ (an expression result): metric named 'value'")
    frame = pts.drop("raw").join(labels, on="sid", how="left").drop("sid")
    return assign_machine(path, frame, node_label, notes), {}, notes


def _empty() -> pa.Table:
    d = pa.DictionaryArray.from_arrays(pa.array([], pa.int32()), pa.array([], pa.string()))
    return pa.table(
        {"ts": pa.array([], pa.float64()), "value": pa.array([], pa.float64()), "node": d, "metric": d, "gpu": d}
    )


_GENERIC = frozenset(
    [
        "node",
        "nodes",
        "exporter",
        "exporters",
        "dcgm",
        "gpu",
        "gpus",
        "nvidia",
        "metric",
        "metrics",
        "prom",
        "prometheus",
        "scrape",
        "scrapes",
        "text",
        "textfile",
        "dump",
        "dumps",
        "telemetry",
        "job",
        "data",
        "out",
        "export",
        "exports",
        "host",
        "hosts",
    ]
)
"""Words of exporter, job and folder names (``node_exporter``, ``dcgm-exporter``, ``metrics``, ``scrapes``): a
name made only of them (and no digit) names no machine."""
_EXPORTER = r"(?:node[-_]?exporter|dcgm[-_]?exporter|dcgm|exporter|metrics|prom|prometheus|scrape|textfile)"
_AFFIX = re.compile(rf"^{_EXPORTER}[-_.]+|[-_.]+{_EXPORTER}$", re.IGNORECASE)


def _generic(name: str) -> bool:
    words = [w for w in re.split(r"[-_. ]+", name.lower()) if w]
    return not any(c.isdigit() for c in name) and all(w in _GENERIC for w in words)


def machine_from_name(path: Path) -> str:
    """A label-less scrape's machine: its file name without the scrape time and the exporter's name
    (``gpu-node-17.prom``, ``gpu-node-17-dcgm-1733000000.prom``), unless nothing else is left
    (``node-<time>.prom``, ``node_exporter.prom``, ``metrics.prom``): then the nearest folder that names
    more than an exporter or a job (``<host>/``)."""
    stem = _NAME_TIME.sub("", path.name.split(".")[0]).strip("-_. ")
    while _AFFIX.search(stem) and not _generic(stem):
        stem = _AFFIX.sub("", stem, count=1).strip("-_. ")
    if not _generic(stem):
        return stem
    for folder in path.parents:
        if folder.name and not _generic(folder.name):
            return folder.name
    return stem or path.parent.name


def assign_machine(path: Path, frame: Any, node_label: str | None, notes: list[str]) -> pa.Table:
    """Pick the machine label (module docstring), keep the others as label columns, as a chunk."""
    import polars as pl

    from rankscope.datasets.readers.metric_long import machine_column

    cols = frame.columns
    mcol: str | None
    if node_label:
        mcol = machine_column(path, [c for c in cols if c not in ("ts", "value")], node_label)
    else:
        mcol = next((c for c in MACHINE_LABELS if c in cols), None)
    if mcol is None:
        name = machine_from_name(path)
        notes.append(path_named_note(path, name))
        frame = frame.with_columns(pl.lit(name).alias("node"))
    else:
        node = pl.col(mcol).cast(pl.Utf8)
        if mcol == "instance":
            node = instance_host(node)
        missing = frame.filter(pl.col(mcol).is_null())
        if missing.height:
            names = frame[mcol].drop_nulls().unique()
            if names.len() == 1:  # one machine's scrape: dcgm-exporter labels Hostname, node_exporter does not
                frame = frame.with_columns(pl.col(mcol).fill_null(names[0]))
                notes.append(
                    f"{path.name}: samples without the {mcol!r} label belong to the file's one machine {names[0]!r}"
                )
            else:  # several machines in one file: a sample without the label cannot be placed
                notes.append(
                    f"{path.name}: {missing.height} sample(s) without the {mcol!r} label skipped "
                    f"(e.g. {missing['metric'][0]})"
                )
                frame = frame.filter(pl.col(mcol).is_not_null())
        frame = frame.with_columns(node.alias("_node"))
        if mcol not in ("instance",):
            frame = frame.drop(mcol)
        if "node" in frame.columns:
            frame = frame.rename({"node": "node_column"})
        frame = frame.rename({"_node": "node"})
    return as_chunk(frame)


def as_chunk(frame: Any) -> pa.Table:
    """A frame with ``ts``, ``value``, ``node`` and labels as a chunk: floats, a ``gpu`` column (null where none),
    the labels dictionary-encoded."""
    import polars as pl

    from rankscope.datasets.readers.metric_long import as_dictionary

    if "gpu" not in frame.columns:
        frame = frame.with_columns(pl.lit(None, pl.Utf8).alias("gpu"))
    rest = [c for c in frame.columns if c not in ("ts", "value")]
    out = frame.select(
        pl.col("ts").cast(pl.Float64), pl.col("value").cast(pl.Float64), *[pl.col(c).cast(pl.Utf8) for c in rest]
    ).to_arrow()
    return pa.table(
        {c: (out.column(c) if c in ("ts", "value") else as_dictionary(out.column(c))) for c in out.column_names}
    )


def instance_host(node: Any) -> Any:
    """An ``instance`` label's host: ``10.0.0.7:9100`` -> ``10.0.0.7``, ``[::1]:9100`` -> ``::1``."""
    return node.str.replace(r"^\[(.*)\]:\d+$", "$1").str.replace(r"^([^:\[\]]+):\d+$", "$1")


def path_named_note(path: Path, name: str) -> str:
    """The note on a scrape file with no machine label, named from its path (:data:`PATH_NAMED` reads it back)."""
    return f"{path.name}: no node/Hostname/instance label: machine named {name!r} from its path"


PATH_NAMED = re.compile(
    r"^(?P<file>[^\s:]+): no node/Hostname/instance label: machine named (?P<name>'.*') from its path$"
)
"""One :func:`path_named_note`: thousands of them (one per scrape file) are said as one (``metric_cube``)."""
