"""The spine: atomic writes that leave nothing behind, stale temp files, paused GC, validators, the error edge."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rankscope.spine import (
    TEMP_PREFIX,
    ConfigError,
    InputError,
    LimitError,
    RankscopeError,
    atomic_write,
    atomic_write_with,
    check_fraction,
    check_int,
    check_positive,
    paused_gc,
    remove_stale_temps,
)


def test_atomic_write_text_and_bytes(tmp_path: Path) -> None:
    atomic_write(tmp_path / "a.txt", "héllo\n")
    atomic_write(tmp_path / "b.bin", b"\x00\x01", durable=False)
    assert (tmp_path / "a.txt").read_text(encoding="utf-8") == "héllo\n"
    assert (tmp_path / "b.bin").read_bytes() == b"\x00\x01"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "b.bin"]


def test_a_failed_writer_leaves_neither_a_partial_file_nor_its_temp_file(tmp_path: Path) -> None:
    target = tmp_path / "part.parquet"
    atomic_write(target, "old")

    def broken(fh: object) -> None:
        fh.write(b"half")  # type: ignore[attr-defined]
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_write_with(target, broken)
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["part.parquet"]


def test_stale_temp_files_are_removed_and_fresh_ones_kept(tmp_path: Path) -> None:
    stale, fresh, other = tmp_path / f"{TEMP_PREFIX}1-x-a", tmp_path / f"{TEMP_PREFIX}2-y-b", tmp_path / "keep"
    for p in (stale, fresh, other):
        p.write_text("x")
    old = time.time() - 7200
    os.utime(stale, (old, old))
    assert remove_stale_temps(tmp_path, older_than_seconds=3600) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([fresh.name, other.name])
    assert remove_stale_temps(tmp_path / "missing") == 0


def test_paused_gc_restores_the_previous_state() -> None:
    assert gc.isenabled()
    with paused_gc():
        assert not gc.isenabled()
        with paused_gc():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()


def test_validators_name_the_field_the_value_and_what_is_expected() -> None:
    assert check_positive("a.b", 2) == 2.0
    with pytest.raises(InputError, match=r"a\.b=0 must be a positive number"):
        check_positive("a.b", 0)
    with pytest.raises(ConfigError, match=r"x=1\.5 must be in \(0, 1\]"):
        check_fraction("x", 1.5, error=ConfigError)
    with pytest.raises(InputError, match="n=True must be an integer >= 1"):
        check_int("n", True, minimum=1)
    assert issubclass(LimitError, InputError) and issubclass(ConfigError, RankscopeError)


EDGE = """
import sys
from rankscope.spine import InputError, error_edge
kind = sys.argv[1]
with error_edge():
    if kind == "input":
        raise InputError("trace.json: bad thing")
    if kind == "os":
        open("/nonexistent/file")
    if kind == "bug":
        raise KeyError("oops")
    if kind == "ctrl-c":
        raise KeyboardInterrupt
"""


@pytest.mark.parametrize(
    ("kind", "code", "line"),
    [
        ("input", 2, "rankscope: error: trace.json: bad thing"),
        ("os", 2, "rankscope: error: /nonexistent/file: No such file or directory"),
        ("bug", 1, "rankscope: error: internal error: KeyError: 'oops'"),
        ("ctrl-c", 130, "rankscope: interrupted"),
    ],
)
def test_the_error_edge_is_one_line_and_an_exit_code(kind: str, code: int, line: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "RANKSCOPE_DEBUG"}
    r = subprocess.run([sys.executable, "-c", EDGE, kind], check=False, capture_output=True, text=True, env=env)
    assert r.returncode == code
    assert r.stderr.count("\n") == 1 and r.stderr.startswith(line), r.stderr


def test_rankscope_debug_shows_the_traceback() -> None:
    env = {**os.environ, "RANKSCOPE_DEBUG": "1"}
    r = subprocess.run([sys.executable, "-c", EDGE, "bug"], check=False, capture_output=True, text=True, env=env)
    assert r.returncode == 1 and "Traceback" in r.stderr and "KeyError" in r.stderr
