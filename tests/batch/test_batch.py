"""``rankscope batch`` on real stores: each incident diagnosed once, idempotent reruns, the lock, SIGKILL
mid-run, a failing job among good ones, new evidence, --since, and the CLI's exit codes."""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rankscope.batch.run import run_batch
from rankscope.batch.state import BatchLock, LockHeld, Watermarks
from rankscope.cli.main import app
from rankscope.config import BatchConfig, Config
from rankscope.datasets.store.store import Store

from .conftest import ingest_probe, rankscope, verdict_rows

runner = CliRunner()


def _keys(rows: list[dict]) -> Counter:
    return Counter((r["job"], r["incident_id"], r["input_fingerprint"]) for r in rows)


def test_each_incident_is_diagnosed_once_and_a_rerun_adds_nothing(real_store: Path) -> None:
    import gc

    gc.unfreeze()
    rep = run_batch(real_store)
    assert rep.exit_code == 0 and not rep.failures
    assert gc.get_freeze_count() == 0  # a long-lived loop never freezes what it loads (it would never be collected)
    assert (rep.jobs_total, rep.jobs_new, rep.jobs_done) == (3, 3, 3)
    rows = verdict_rows(real_store)
    by_job = {r["job"]: r for r in rows}
    assert sorted(by_job) == ["field-hang", "llama-a", "llama-b"] and len(rows) == 3
    for job in ("llama-a", "llama-b"):  # the probe: rank 3 skipped the all_reduce, on the machine gpu-bad
        assert by_job[job]["verdict"] == "hang" and by_job[job]["culprit_nodes"] == ["gpu-bad"]
        assert by_job[job]["incident_time"] is not None and by_job[job]["incident_source"] == "ingest"
    ingests = Store(real_store).read("ingests")
    assert by_job["llama-a"]["incident_id"] in set(ingests["ingest_id"].to_list())
    assert all(r["input_fingerprint"].startswith("ingest:") for r in rows)

    again = run_batch(real_store)
    assert (again.jobs_new, again.incidents_diagnosed, again.verdicts_written) == (0, 0, 0)
    assert verdict_rows(real_store) == rows
    runs = Store(real_store).read("batch_runs").sort("started")
    assert runs["jobs_done"].to_list() == [3, 0] and runs["status"].to_list() == ["ok", "ok"]


def test_lost_watermarks_only_cost_time(real_store: Path) -> None:
    """The verdict keys, not the watermarks, make a rerun idempotent: without the watermarks every job is
    looked at again and nothing is written twice."""
    run_batch(real_store)
    rows = verdict_rows(real_store)
    for f in (real_store / "_batch").glob("watermarks.*"):
        f.unlink()
    rep = run_batch(real_store)
    assert rep.jobs_new == 3 and rep.verdicts_written == 0
    assert _keys(verdict_rows(real_store)) == _keys(rows)


def test_a_new_incident_of_a_job_is_diagnosed_and_the_old_one_is_not_again(
    real_store: Path, probe_dir: Path, tmp_path: Path
) -> None:
    run_batch(real_store)
    # the same job hangs again later, this time on other machines (rank 3 on gpu-other)
    ingest_probe(probe_dir, real_store, "llama-a", ["gpu-a0", "gpu-a1", "gpu-a2", "gpu-other"], tmp_path / "2")
    rep = run_batch(real_store)
    assert (rep.jobs_new, rep.incidents_diagnosed, rep.verdicts_written) == (1, 1, 1)
    a = sorted((r for r in verdict_rows(real_store) if r["job"] == "llama-a"), key=lambda r: r["incident_time"])
    assert [r["culprit_nodes"] for r in a] == [["gpu-bad"], ["gpu-other"]]
    assert len({r["incident_id"] for r in a}) == 2


def test_two_incidents_between_runs_are_both_diagnosed(probe_dir: Path, tmp_path: Path) -> None:
    root = tmp_path / "store"
    ingest_probe(probe_dir, root, "j", ["h0", "h1", "h2", "first-bad"], tmp_path / "1")
    ingest_probe(probe_dir, root, "j", ["h0", "h1", "h2", "second-bad"], tmp_path / "2")
    rep = run_batch(root)
    assert rep.incidents_diagnosed == 2 and rep.verdicts_written == 2
    assert sorted(r["culprit_nodes"][0] for r in verdict_rows(root)) == ["first-bad", "second-bad"]


def test_since_leaves_old_incidents_alone(real_store: Path) -> None:
    later = time.time() + 3 * 86400  # three days from now every incident here is older than a day
    rep = run_batch(real_store, Config(batch=BatchConfig(since_seconds=86400)), now=later)
    assert rep.jobs_older == 3 and rep.jobs_done == 0 and not verdict_rows(real_store)
    rep = run_batch(real_store, Config(batch=BatchConfig(since_seconds=86400)))  # now: all recent
    assert rep.jobs_done == 3


def test_a_failing_job_is_listed_and_the_others_are_done(real_store: Path) -> None:
    bad = next((real_store / "stacks" / "job=llama-b").glob("part-*.parquet"))
    bad.write_bytes(bad.read_bytes()[:100])  # a truncated part file (a disk that filled up under a writer)
    res = runner.invoke(app, ["batch", str(real_store)])
    assert res.exit_code == 1, res.output
    failed = [ln for ln in res.stdout.splitlines() if ln.startswith("batch: failed: ")]
    assert len(failed) == 1 and failed[0].startswith("batch: failed: llama-b: ") and "truncated" in failed[0]
    assert "Traceback" not in res.output
    assert sorted(r["job"] for r in verdict_rows(real_store)) == ["field-hang", "llama-a"]
    # the same broken evidence is not retried every run (exit 0, said once), unless asked
    res = runner.invoke(app, ["batch", str(real_store)])
    assert res.exit_code == 0 and "1 job(s) failed before at the same evidence" in res.stdout
    assert runner.invoke(app, ["batch", str(real_store), "--retry-failed"]).exit_code == 1
    runs = Store(real_store).read("batch_runs").sort("started")
    assert runs["jobs_failed"].to_list() == [1, 0, 1]
    assert runs["failures"].to_list()[0][0].startswith("llama-b: ")


def test_bad_input_exits_2_with_one_line(tmp_path: Path) -> None:
    for args, fragment in (
        ([str(tmp_path)], "not a rankscope store"),
        ([str(tmp_path), "--since", "soon"], "--since='soon' is not a duration"),
        ([str(tmp_path), "--runner", "spark"], "batch.runner='spark' must be one of local, ray"),
        ([str(tmp_path), "--workers", "-1"], "batch.workers=-1"),
    ):
        res = runner.invoke(app, ["batch", *args])
        assert res.exit_code == 2, (args, res.output)
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("rankscope: error: ") and fragment in lines[0], lines
    assert not (tmp_path / "_batch").exists()  # nothing written into a directory that is no store


def test_a_second_run_finds_the_lock_held_and_exits_75(real_store: Path) -> None:
    with BatchLock(real_store):
        with pytest.raises(LockHeld, match=f"pid {os.getpid()}"):
            run_batch(real_store)
        res = runner.invoke(app, ["batch", str(real_store)])
        assert res.exit_code == 75 and res.stderr.startswith("rankscope: busy: another batch run holds")
    assert not verdict_rows(real_store)
    assert run_batch(real_store).jobs_done == 3  # the lock is free again


def _wait_for(pred, timeout: float = 120.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.02)
    return False


def _verdict_files(root: Path) -> int:
    return sum(1 for _ in (root / "verdicts").glob("job=*/part-*.parquet")) if (root / "verdicts").is_dir() else 0


@pytest.mark.slow
def test_overlapping_runs_one_works_the_other_exits(many_jobs: tuple[Path, list[str]]) -> None:
    root, jobs = many_jobs
    first = rankscope("batch", root)
    assert _wait_for(lambda: _verdict_files(root) >= 1 or first.poll() is not None)
    second = rankscope("batch", root)
    out2, err2 = second.communicate(timeout=120)
    overlapped = first.poll() is None
    out1, err1 = first.communicate(timeout=300)
    assert overlapped, "the first run finished before the second started: give it more jobs"
    assert first.returncode == 0, err1
    assert second.returncode == 75, (out2, err2)
    assert "another batch run holds" in err2 and f"pid {first.pid}" in err2 and not out2
    assert sorted(r["job"] for r in verdict_rows(root)) == jobs


@pytest.mark.slow
def test_sigkill_mid_run_leaves_no_partial_or_duplicate_rows_and_the_next_run_finishes(
    many_jobs: tuple[Path, list[str]],
) -> None:
    root, jobs = many_jobs
    proc = rankscope("batch", root)
    assert _wait_for(lambda: _verdict_files(root) >= 3 or proc.poll() is not None)
    alive = proc.poll() is None
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert alive, "the run finished before it could be killed: give it more jobs"
    done = _verdict_files(root)
    assert 3 <= done < len(jobs)
    # what a writer killed in the middle of a write leaves: its temp file (hidden, never read)
    stale = root / "verdicts" / f"job={jobs[-1]}" / ".tmp-999999-deadbeef-part-x.parquet"
    stale.parent.mkdir(parents=True, exist_ok=True)
    stale.write_bytes(b"PAR1 half a file")
    os.utime(stale, (time.time() - 3600, time.time() - 3600))
    rows = verdict_rows(root)  # every row readable: no partial file is visible
    assert len(rows) == len({r["job"] for r in rows}) == done
    rep = run_batch(root)
    # jobs finished after the last journal write are looked at again; only the missing verdicts are written
    assert rep.exit_code == 0 and rep.verdicts_written == len(jobs) - done
    rows = verdict_rows(root)
    assert sorted(r["job"] for r in rows) == jobs  # every job once: none missing, none twice
    assert all(v == 1 for v in _keys(rows).values())
    assert not stale.exists()
    assert run_batch(root).jobs_new == 0


@pytest.mark.slow
def test_every_runs_until_sigterm_and_stops_cleanly(real_store: Path, probe_dir: Path, tmp_path: Path) -> None:
    proc = rankscope("batch", real_store, "--every", "1s")
    assert _wait_for(lambda: len(verdict_rows(real_store)) == 3)
    ingest_probe(probe_dir, real_store, "llama-c", ["c0", "c1", "c2", "gpu-bad"], tmp_path)  # lands mid-loop
    assert _wait_for(lambda: len(verdict_rows(real_store)) == 4)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert out.count("batch: ") >= 2 and "1 verdict(s) written" in out


def test_watermark_journal_survives_a_torn_line(tmp_path: Path) -> None:
    (tmp_path / "rankscope-store.json").write_text('{"format": "rankscope-store", "version": 1}\n')
    marks = Watermarks(tmp_path)
    marks.load()
    marks.append([{"job": "a", "parts": "1", "status": "done"}])
    with open(marks.journal, "ab") as fh:
        fh.write(b'{"job": "b", "par')  # killed mid-write
    marks.append([{"job": "c", "parts": "3", "status": "done"}])
    again = Watermarks(tmp_path).load()
    assert sorted(again) == ["a", "c"]
    marks.compact()
    assert marks.journal.read_bytes() == b"" and sorted(json.loads(marks.snapshot.read_text())["jobs"]) == ["a", "c"]
