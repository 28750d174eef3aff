"""Only regular files inside the input are read: FIFOs and devices are never opened (a reader would wait or
read forever), links that leave the input are not followed unless --follow-symlinks, and nothing from
outside the input reaches the output. Through the CLI: exit 0 or exit 2 with one line."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rankscope.analytics import diagnose
from rankscope.datasets.domain.bounds import NotRegularFile, open_regular, read_bounded
from rankscope.datasets.loading.inputs import load_fr_inputs, load_inputs
from rankscope.spine import LimitError

pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs (POSIX)")


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "RANKSCOPE_PROGRESS": "0"}
    env.pop("RANKSCOPE_DEBUG", None)
    return subprocess.run(
        [sys.executable, "-m", "rankscope", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env=env,
    )


def test_open_regular_refuses_fifos_and_devices_without_blocking(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    t = time.perf_counter()
    with pytest.raises(NotRegularFile, match="fifo: a FIFO, not a regular file"):
        open_regular(tmp_path / "fifo")  # no writer: a plain open() would wait forever
    with pytest.raises(NotRegularFile, match="a device"):
        read_bounded("/dev/zero")
    assert time.perf_counter() - t < 1
    (tmp_path / "big").write_bytes(b"x" * 100)
    with pytest.raises(LimitError, match="100 bytes is over the 10-byte limit.*MAX_FILE_BYTES"):
        read_bounded(tmp_path / "big", max_bytes=10)


def test_fifos_and_device_links_in_a_dump_directory_are_noted_never_opened(stack_dir: Path) -> None:
    os.mkfifo(stack_dir / "rank16.txt")
    os.mkfifo(stack_dir / "pid77.stack.txt")
    (stack_dir / "rank17.txt").symlink_to("/dev/zero")
    (stack_dir / "rank18.json").symlink_to("/dev/urandom")
    (stack_dir / "metrics.csv").symlink_to("/dev/zero")
    t = time.perf_counter()
    inputs = load_inputs(stack_dir)
    assert time.perf_counter() - t < 10
    notes = " ".join(inputs.notes)
    assert "FIFO(s), device(s) or socket(s) not read" in notes and "rank16.txt" in notes
    assert "pointing outside the input were not followed" in notes and "rank17.txt" in notes
    assert diagnose(inputs).verdict == "hang"


def test_a_fifo_inside_a_run_directory_and_an_fr_directory(hook_dir: Path, fr_dir: Path) -> None:
    os.mkfifo(hook_dir / "pid99.json")
    os.mkfifo(hook_dir / "pid16480.steps.jsonl.new")
    assert diagnose(load_inputs(hook_dir)).verdict
    os.mkfifo(fr_dir / "rank_9")
    (fr_dir / "rank_8").symlink_to("/dev/urandom")
    inputs = load_fr_inputs(fr_dir)
    assert sorted(d.rank for d in inputs.fr_dumps) == [0, 1, 2, 3]
    assert any("not read" in n for n in inputs.notes)


def test_links_that_leave_the_input_are_not_followed_and_never_shown(stack_dir: Path, outside: Path) -> None:
    (stack_dir / "manifest.csv").unlink()  # every rankN.txt is read (a manifest lists which)
    stack = outside.parent / "stack.txt"  # a real stack dump outside the input
    stack.write_text((stack_dir / "rank0.txt").read_text())
    (stack_dir / "rank16.txt").symlink_to(stack)
    (stack_dir / "rank17.txt").symlink_to(outside)
    (stack_dir / "notes").symlink_to(outside.parent, target_is_directory=True)
    inputs = load_inputs(stack_dir)
    assert not any("rank16.txt" in (p.source or "") for p in inputs.procs)
    v = diagnose(inputs)
    assert "SECRET-CANARY" not in v.to_json() and "rank16.txt" in " ".join(inputs.notes)
    run = _cli("diagnose", str(stack_dir), "--format", "json", cwd=stack_dir.parent)
    assert run.returncode == 0 and "SECRET-CANARY" not in run.stdout + run.stderr
    followed = load_inputs(stack_dir, follow_symlinks=True)  # the owner vouches for the links
    assert any((p.source or "").endswith("rank16.txt") for p in followed.procs)


def test_manifest_rows_that_leave_the_directory_are_never_opened(stack_dir: Path, outside: Path) -> None:
    with (stack_dir / "manifest.csv").open("a") as fh:
        fh.write(f"../outside/{outside.name},16,node-9\n{outside},17,node-9\n")
    v = diagnose(load_inputs(stack_dir))
    assert "SECRET-CANARY" not in v.to_json()


@pytest.mark.parametrize(
    "make",
    [
        lambda d: (d / "rank4000000000.txt").write_text((d / "rank0.txt").read_text()),
        lambda d: (d / "manifest.csv").write_text("file,rank,node\nrank0.txt," + "9" * 5000 + ",n\n"),
        lambda d: (d / "rank3.txt").write_text("Thread 1 (idle)\n    f (a.py:" + "9" * 5000 + ")\n"),
        lambda d: (d / "metrics.parquet").write_bytes(b"PAR1" + os.urandom(64) + b"PAR1"),
    ],
)
def test_cli_on_hostile_input_is_a_verdict_or_one_error_line(stack_dir: Path, make: object) -> None:
    make(stack_dir)  # type: ignore[operator]
    run = _cli("diagnose", str(stack_dir), cwd=stack_dir.parent)
    assert run.returncode in (0, 2), run.stderr
    assert "Traceback" not in run.stderr
    if run.returncode == 2:
        lines = run.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("rankscope: error: "), run.stderr
