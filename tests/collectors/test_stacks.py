"""Stack capture (py-spy, faulthandler fallback), the stall detector, the trigger and step tailing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from rankscope.collectors import stacks
from rankscope.collectors.stall import StallDetector
from rankscope.collectors.steps import (
    NanWatch,
    StepTailer,
    nan_events,
    to_metric_rows,
    to_timing_rows,
)
from rankscope.collectors.trigger import Trigger, request_capture
from rankscope.config import default_pyspy

SLEEPER = r"""
import sys, time
from rankscope.collectors import hook
hook.install(run_dir=sys.argv[1])
def waiting_here():
    print("ready", flush=True)
    time.sleep(60)
waiting_here()
"""


@pytest.fixture
def sleepers(tmp_path: Path):
    procs = [
        subprocess.Popen([sys.executable, "-c", SLEEPER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    for p in procs:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    yield procs
    for p in procs:
        p.kill()
        p.wait()


def test_pyspy_captures_processes_in_parallel(sleepers, tmp_path: Path) -> None:
    targets = [stacks.Target(p.pid, i, "trainer", f"node-{i}") for i, p in enumerate(sleepers)]
    caps = stacks.capture_all(targets, run_dir=str(tmp_path), pyspy=default_pyspy(), timeout_seconds=10)
    for c in caps:
        assert c.dump.status == "ok", c.dump.error
        assert c.method == "py-spy" and c.dump.pid == c.target.pid
        assert c.dump.main_thread is not None
        assert any(f.function == "waiting_here" for f in c.dump.main_thread.frames)
    rows = stacks.capture_rows(caps, job="j", snapshot=7)
    assert {r["rank"] for r in rows} == {0, 1, 2} and all(r["snapshot"] == 7 for r in rows)
    assert {r["node"] for r in rows if r["rank"] == 2} == {"node-2"}


def test_fallback_to_faulthandler_when_pyspy_fails(sleepers, tmp_path: Path) -> None:
    target = stacks.Target(sleepers[0].pid, 0, "trainer", "n")
    [cap] = stacks.capture_all([target], run_dir=str(tmp_path), pyspy=str(tmp_path / "no-py-spy"))
    assert cap.method == "faulthandler" and cap.dump.status == "ok"
    assert "py-spy could not run" in (cap.dump.error or "") and "faulthandler" in (cap.dump.error or "")
    assert any(f.function == "waiting_here" for t in cap.dump.threads for f in t.frames)


def test_failure_recorded_when_nothing_works(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        [cap] = stacks.capture_all(
            [stacks.Target(proc.pid, 0, "trainer", "n")], run_dir=str(tmp_path), pyspy=str(tmp_path / "no-py-spy")
        )
        assert cap.dump.status == "failed" and cap.method == "none"
        assert "no hook stack file" in (cap.dump.error or "")
    finally:
        proc.kill()
        proc.wait()
    dump, method = stacks.post_mortem(123456789, tmp_path)
    assert method == "none" and dump.status == "failed"


def test_stall_detector_fires_repeats_and_rearms() -> None:
    d = StallDetector(stall_seconds=10, rounds=3, round_interval_seconds=10)
    assert d.check(0.0) is None  # no step yet: never fires
    for step in range(5):
        d.progress(step, float(step))
    assert d.check(13.0) is None
    f1 = d.check(14.0)
    assert f1 is not None and (f1.reason, f1.round, f1.rounds) == ("stall", 1, 3) and "last step 4" in f1.detail
    assert d.check(20.0) is None and d.busy
    assert d.check(24.0).round == 2  # type: ignore[union-attr]
    assert d.check(34.0).round == 3  # type: ignore[union-attr]
    assert d.check(100.0) is None  # no re-fire without progress
    d.progress(5, 101.0)
    assert d.check(111.5) is not None  # re-armed by progress


def test_fail_slow_detector() -> None:
    d = StallDetector(stall_seconds=600, slow_factor=3, baseline_steps=5)
    t = 0.0
    for step in range(8):
        t += 1.0
        d.progress(step, t)
        assert d.check(t) is None
    t += 5.0
    d.progress(8, t)
    f = d.check(t)
    assert f is not None and f.reason == "fail-slow" and "5.0x" in f.detail


def test_trigger_signal_and_file(tmp_path: Path) -> None:
    trig = Trigger(tmp_path / "trigger")
    try:
        assert trig.poll() is None
        os.kill(os.getpid(), signal.SIGUSR1)
        assert trig.poll() == {"source": "signal"}
        request_capture(tmp_path, rounds=5)
        assert trig.poll() == {"source": "file", "rounds": "5"}
        assert not (tmp_path / "trigger").exists() and trig.poll() is None
    finally:
        trig.close()


def test_step_tailer_partial_lines_metrics_and_nan(tmp_path: Path) -> None:
    path = tmp_path / "pid42.steps.jsonl"
    lines = [
        {"t": 100.0, "step": 1, "rank": 3, "loss": 2.0, "grad_norm": 1.0, "step_time_seconds": 0.5},
        {"t": 101.0, "step": 2, "rank": 3, "loss": "nan", "grad_norm": 1.0, "step_time_seconds": 0.5},
    ]
    text = "".join(json.dumps(x) + "\n" for x in lines)
    path.write_text(text[:-20])  # second line incomplete
    tail = StepTailer(tmp_path)
    assert [r.step for r in tail.poll()] == [1]
    with open(path, "a") as fh:
        fh.write(text[-20:] + "not json\n")
    recs = tail.poll([42])
    assert [r.step for r in recs] == [2] and tail.bad_lines == 1
    assert tail.last_step == {3: 2}
    rows = to_metric_rows(recs, job="j", node_of=lambda rank, pid: f"node-{rank // 2}")
    assert {r["metric"] for r in rows} == {"train_loss", "train_grad_norm", "train_step_time_seconds"}
    assert all(r["node"] == "node-1" for r in rows)
    assert to_timing_rows(recs, job="j", node_of=lambda r, p: "n")[0]["duration_s"] == 0.5
    [ev] = nan_events(recs, node_of=lambda r, p: "node-1")
    assert (ev.kind, ev.rank, ev.severity, ev.node) == ("nan", 3, "critical", "node-1")


def test_nan_reported_once_until_finite_again() -> None:
    from rankscope.collectors.steps import StepRecord

    def rec(step: int, loss: object) -> StepRecord:
        return StepRecord(float(step), step, 0, 1, {"loss": loss})

    watch = NanWatch()
    node = lambda r, p: "n"  # noqa: E731
    assert len(watch.events([rec(1, "nan"), rec(2, "nan")], node_of=node)) == 1
    assert watch.events([rec(3, "inf")], node_of=node) == []
    assert watch.events([rec(4, 1.0)], node_of=node) == []
    assert len(watch.events([rec(5, "nan")], node_of=node)) == 1
