"""Reading metrics/timings CSV and Parquet files: discovery, types, and one clear error per bad file."""

from __future__ import annotations

import json

import polars as pl
import pytest

from rankscope.datasets.readers.tables import (
    find_metric_files,
    find_timing_files,
    read_metrics,
    read_timings,
)
from rankscope.spine import InputError, ParseError


def _metrics(n=4):
    return pl.DataFrame(
        {
            "ts": [float(i) for i in range(n)],
            "node": ["a", "b"] * (n // 2),
            "metric": ["gpu_power_watts"] * n,
            "value": [1.0 * i for i in range(n)],
        }
    )


def test_finds_files_by_prefix(tmp_path):
    _metrics().write_csv(tmp_path / "metrics.csv")
    _metrics().write_parquet(tmp_path / "metrics-node2.parquet")
    (tmp_path / "sub").mkdir()
    pl.DataFrame({"rank": [0], "step": [1], "op": ["fwd"], "duration_s": [0.1]}).write_csv(
        tmp_path / "sub" / "timings_0.csv"
    )
    (tmp_path / "notes.txt").write_text("x")
    (tmp_path / "metrics.json").write_text("{}")
    assert [p.name for p in find_metric_files(tmp_path)] == ["metrics-node2.parquet", "metrics.csv"]
    assert [p.name for p in find_timing_files(tmp_path)] == ["timings_0.csv"]
    with pytest.raises(InputError, match="not a directory"):
        find_metric_files(tmp_path / "nope")


def test_reads_metrics_with_numeric_or_iso_timestamps(tmp_path):
    _metrics().write_csv(tmp_path / "metrics_a.csv")
    iso = _metrics().with_columns(pl.lit("2026-01-01T00:00:05Z").alias("ts"), pl.lit(2).alias("gpu"))
    iso.write_csv(tmp_path / "metrics_b.csv")
    df = read_metrics(find_metric_files(tmp_path))
    assert df.height == 8
    assert df["ts"].dtype == pl.Datetime("us", "UTC")
    assert df["gpu"].null_count() == 4
    assert df["ts"].dt.epoch("s").min() == 0


def test_reads_timings_with_optional_columns(tmp_path):
    pl.DataFrame(
        {
            "rank": [0, 1],
            "step": [1, 1],
            "op": ["fwd", "fwd"],
            "duration_s": [0.1, 0.2],
            "pp": [0, 1],
            "node": ["n0", "n1"],
        }
    ).write_parquet(tmp_path / "timings.parquet")
    df = read_timings(find_timing_files(tmp_path))
    assert df.columns == ["rank", "step", "op", "duration_s", "node", "pp"]
    assert df["rank"].dtype == pl.Int32


@pytest.mark.parametrize(
    "content, what",
    [
        ("ts,node,value\n1,a,2\n", "missing column"),
        ("ts,node,metric,value\n1,a,m,abc\n", "column 'value'"),
        ("ts,node,metric,value\nyesterday,a,m,1\n", "ts"),
        ("ts,node,metric,value\n1,,m,1\n", "empty"),
    ],
)
def test_bad_metric_file_names_file_and_problem(tmp_path, content, what):
    path = tmp_path / "metrics.csv"
    path.write_text(content)
    with pytest.raises(ParseError, match=what) as info:
        read_metrics([path])
    assert str(path) in str(info.value)


def test_bad_timing_files(tmp_path):
    path = tmp_path / "timings.csv"
    path.write_text("rank,step,op,duration_s\n0,1,fwd,-0.5\n")
    with pytest.raises(ParseError, match="negative"):
        read_timings([path])
    bad = tmp_path / "timings.parquet"
    bad.write_bytes(b"PAR1 not really parquet")
    with pytest.raises(ParseError, match="unreadable") as info:
        read_timings([bad])
    assert info.value.path == str(bad)


def test_no_files_gives_empty_frames():
    assert read_metrics([]).height == 0
    assert read_timings([]).height == 0


def test_timings_with_whole_seconds_first_read_on(tmp_path):
    """`duration_s` whole for the first 10,000 rows, fractional after: read, not refused."""
    rows = ["rank,step,op,duration_s"] + [f"{i % 8},{i // 8},fwd,{1 + i % 2}" for i in range(12_000)]
    rows += [f"{i % 8},{1500 + i // 8},fwd,1.25" for i in range(80)]
    (tmp_path / "timings.csv").write_text("\n".join(rows) + "\n")
    df = read_timings([tmp_path / "timings.csv"])
    assert df.height == 12_080 and df["duration_s"].dtype == pl.Float64 and df["duration_s"].max() == 2.0


def test_timings_as_json_lines_are_read_and_a_broken_line_named(tmp_path):
    """An outside tester's ``timings.jsonl`` (one record per line) was skipped as "a large JSON object with no
    Flight Recorder keys", and the run refused."""
    rows = [
        {"rank": r, "step": s, "op": "fwd", "duration_s": 1 if s < 3 else 1.25, "node": f"h{r // 2}"}
        for s in range(1, 5)
        for r in range(4)
    ]  # whole seconds first, decimals later
    (tmp_path / "timings.jsonl").write_text("\n".join(json.dumps(x) for x in rows) + "\n")
    assert find_timing_files(tmp_path) == [tmp_path / "timings.jsonl"]
    df = read_timings([tmp_path / "timings.jsonl"])
    assert df.height == 16 and df["duration_s"].dtype == pl.Float64 and df["duration_s"].max() == 1.25
    cut = '{"rank": 0, "step": 1, "op": "fwd", "duration_s": 1.0}\n{"rank": 1, "st\n'  # killed while writing
    (tmp_path / "timings.jsonl").write_text(cut)
    assert read_timings([tmp_path / "timings.jsonl"]).height == 1
    (tmp_path / "timings.jsonl").write_text('{"rank": 1, "st\n' + cut)  # a bad line inside: refused, named
    with pytest.raises(ParseError, match=r"timings\.jsonl.*unreadable JSON Lines"):
        read_timings([tmp_path / "timings.jsonl"])
