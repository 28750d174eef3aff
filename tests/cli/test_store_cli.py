"""The store like the tools people know (issue 13, section 4): ``sql`` tables in four formats, every table a
view, ``jobs`` and ``verdicts`` newest first, and a verdict that records when its incident happened."""

from __future__ import annotations

import csv
import io
import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rankscope.cli.main import app
from rankscope.datasets.store.schemas import TABLES
from rankscope.datasets.store.store import Store

runner = CliRunner()
T0 = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)


def _run(*args: object):
    return runner.invoke(app, [str(a) for a in args])


def _stack_rows(job: str, t: datetime, n: int = 3, stuck: int | None = None) -> list[dict]:
    frame = {"function": "all_reduce", "file": "torch/distributed/distributed_c10d.py", "line": 3252}
    odd = {"function": "forward", "file": "model.py", "line": 7}
    return [
        {
            "job": job,
            "snapshot": 0,
            "time": t,
            "node": f"node-{r}",
            "rank": r,
            "role": "trainer",
            "is_main_thread": True,
            "status": "ok",
            "frames": [odd if r == stuck else frame, {"function": "<module>", "file": "train.py", "line": 1}],
        }
        for r in range(n)
    ]


@pytest.fixture
def store(tmp_path: Path) -> Path:
    """Two jobs captured an hour apart, the newer one with a rank stuck in compute."""
    st = Store(tmp_path / "store", create=True)
    st.write("stacks", _stack_rows("older", T0, n=4))
    st.write("stacks", _stack_rows("newer", T0 + timedelta(hours=1), n=4, stuck=2))
    return st.root


def test_sql_prints_an_aligned_table_by_default(store: Path) -> None:
    res = _run("sql", store, "SELECT job, count(*) AS threads FROM stacks GROUP BY job ORDER BY job")
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert lines[0].split() == ["job", "threads"] and set(lines[1]) <= {"-", " "}
    assert lines[2].split() == ["newer", "4"] and lines[3].split() == ["older", "4"]
    assert lines[2].index("4") == lines[0].index("threads") + len("threads") - 1  # numbers right-aligned
    assert lines[-1] == "(2 rows)"


def test_sql_formats_and_nested_columns(store: Path) -> None:
    q = "SELECT rank, time, frames FROM stacks WHERE job = 'newer' ORDER BY rank"
    c = _run("sql", store, q, "--format", "csv")
    rows = list(csv.DictReader(io.StringIO(c.stdout)))
    assert [r["rank"] for r in rows] == ["0", "1", "2", "3"]
    assert json.loads(rows[2]["frames"])[0]["function"] == "forward"  # nested: JSON-encoded
    assert rows[0]["time"].startswith("2026-03-01")
    j = json.loads(_run("sql", store, q, "--format", "json").stdout)
    assert j[2]["frames"][0] == {"function": "forward", "file": "model.py", "line": 7}  # nested: native JSON
    assert j[0]["time"].startswith("2026-03-01T13:00:00")
    md = _run("sql", store, q, "--format", "markdown").stdout.splitlines()
    assert md[0] == "| rank | time | frames |" and md[1].startswith("|---:|")
    assert len(md) == 6 and "\\|" not in md[0]
    text = _run("sql", store, q).stdout
    assert '[{"function": "all_reduce"' in text


def test_sql_text_output_cuts_long_results(store: Path) -> None:
    res = _run("sql", store, "SELECT * FROM range(100) t(i)", "--max-rows", "10")
    lines = res.stdout.splitlines()
    assert "... 90 more row(s) ..." in res.stdout and lines[-1] == "(100 rows)"
    assert len(_run("sql", store, "SELECT * FROM range(100) t(i)", "--max-rows", "0").stdout.splitlines()) == 103


def test_every_table_is_a_view_even_when_empty(store: Path) -> None:
    for name, spec in TABLES.items():
        res = _run("sql", store, f"SELECT * FROM {name} LIMIT 0", "--format", "csv")
        assert res.exit_code == 0, (name, res.output)
        assert res.stdout.strip().split(",") == spec.schema.names, name
    assert _run("sql", store, "SELECT count(*) AS n FROM events", "--format", "csv").stdout.split() == ["n", "0"]


def test_sql_errors_are_one_line(store: Path) -> None:
    res = _run("sql", store, "SELECT nope FROM stacks")
    assert res.exit_code == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"rankscope: error: SQL over {store}: ")
    assert "nope" in lines[0] and "Traceback" not in res.output
    res = _run("sql", store.parent, "SELECT 1")
    assert res.exit_code == 2 and "not a rankscope store" in res.stderr


def test_jobs_newest_first_with_captures_verdict_and_machines(store: Path) -> None:
    assert _run("diagnose", store, "--job", "newer", "--save", "--gpus-per-node", "1").exit_code == 0
    js = json.loads(_run("jobs", store, "--format", "json").stdout)
    assert [j["job"] for j in js] == ["newer", "older"]
    newer = js[0]
    assert newer["first_capture"] == newer["last_capture"] == "2026-03-01T13:00:00Z"
    assert newer["latest_verdict"] == "hang" and newer["machines"] == ["node-2"]
    assert newer["latest_incident"] == "2026-03-01T13:00:00Z"  # the capture, not when it was analysed
    assert js[1]["latest_verdict"] is None and js[1]["tables"] == ["stacks"]
    text = _run("jobs", store).stdout.splitlines()
    assert text[0].split()[:3] == ["job", "first_capture", "last_capture"]
    assert text[2].startswith("newer") and "node-2" in text[2] and "2026-03-01 13:00:00" in text[2]


def test_verdicts_record_the_incident_time_newest_incident_first(store: Path) -> None:
    for job in ("newer", "older"):
        assert _run("diagnose", store, "--job", job, "--save", "--gpus-per-node", "1").exit_code == 0
    vs = json.loads(_run("verdicts", store, "--format", "json").stdout)
    assert [v["job"] for v in vs] == ["newer", "older"]
    assert [v["incident_time"] for v in vs] == ["2026-03-01T13:00:00Z", "2026-03-01T12:00:00Z"]
    assert {v["incident_source"] for v in vs} == {"capture"}
    assert all(v["analysed"] > v["incident_time"] for v in vs)  # diagnosed now, about an incident of March
    assert vs[0]["verdict"] == "hang" and vs[0]["culprit_nodes"] == ["node-2"]
    only = json.loads(_run("verdicts", store, "--job", "older", "--format", "json").stdout)
    assert [v["job"] for v in only] == ["older"]
    rows = Store(store).sql("SELECT job, incident_time, incident_source FROM verdicts ORDER BY incident_time")
    assert rows["job"].to_list() == ["older", "newer"]
    csv_out = _run("verdicts", store, "--format", "csv").stdout.splitlines()
    assert csv_out[0].startswith("job,incident_time,incident_source,verdict")


def test_a_dump_directory_verdict_time_comes_from_its_files(tmp_path: Path, probe_dir: Path) -> None:
    from rankscope.datasets.loading.inputs import load_inputs
    from rankscope.datasets.store.catalog import incident_time

    when, source = incident_time(load_inputs(probe_dir / "pyspy" / "text", gpus_per_node=1))
    newest = max(p.stat().st_mtime for p in (probe_dir / "pyspy" / "text").iterdir())
    assert source == "dump-files" and when is not None and abs(when.timestamp() - newest) < 1
    fr_when, fr_source = incident_time(load_inputs(probe_dir / "fr", gpus_per_node=1))
    assert fr_source == "flight-recorder" and fr_when is not None and fr_when.year >= 2025
