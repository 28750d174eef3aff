"""Regression tests for every class of hostile input issue #15 names: each reader ends in a value of the
right type or in the project's own error naming the file, quickly, with bounded memory."""

from __future__ import annotations

import json
import pickle
import time
from pathlib import Path

import pytest

from rankscope.analytics import diagnose
from rankscope.datasets.domain.bounds import int_text, json_too_deep, load_json, to_float, to_int
from rankscope.datasets.loading.inputs import load_fr_inputs, load_inputs
from rankscope.datasets.readers.faulthandler import parse_traceback_text
from rankscope.datasets.readers.fr_files import load_raw, safe_loads
from rankscope.datasets.readers.pyspy_json import parse_pyspy_json
from rankscope.datasets.readers.pyspy_text import parse_pyspy_text
from rankscope.spine import InputError, LimitError, ParseError, RankscopeError

DEEP = 100_000


def _verdict_or_ours(path: Path, **kw: object) -> str:
    """The verdict of ``path``, or the project's error text: anything else fails the test."""
    try:
        return diagnose(load_inputs(path, **kw)).verdict  # type: ignore[arg-type]
    except RankscopeError as exc:
        return f"error: {exc}"


# -- the guards themselves --------------------------------------------------------------------------


def test_json_depth_is_checked_before_parsing_without_recursion() -> None:
    assert json_too_deep(b"[" * DEEP + b"]" * DEEP, 64)
    assert not json_too_deep(b'{"a": "[[[[[[[[[[[[", "b": [[1, 2], [3]]}', 3)  # brackets in strings do not count
    assert json_too_deep(b'{"a": [[[[1]]]]}', 4) and not json_too_deep(b'{"a": [[[[1]]]]}', 5)
    t = time.perf_counter()
    with pytest.raises(LimitError, match="nested deeper than 64 levels.*max_json_depth"):
        load_json(b'{"x": ' + b"[" * 2_000_000 + b"]" * 2_000_000 + b"}", "f.json")
    assert time.perf_counter() - t < 5


@pytest.mark.parametrize(
    "value", [float("inf"), float("nan"), 2**63, -(2**63) - 1, "9" * 5000, True, [1], {"a": 1}, "1e309", 1.5]
)
def test_numbers_from_dumps_are_coerced_or_refused_never_raised(value: object) -> None:
    assert to_int(value) is None
    assert to_float(value) is None or isinstance(to_float(value), float)


def test_integer_text_respects_its_bounds_and_never_hits_the_digit_limit() -> None:
    assert int_text("12") == 12 and int_text("0x1f") == 31 and int_text("-3", lo=0) is None
    assert int_text("9" * 5000) is None and int_text(str(2**63)) is None and int_text("1.5") is None


# -- stack readers -------------------------------------------------------------------------------------


def test_pyspy_text_with_huge_line_numbers_and_a_line_of_four_spaces() -> None:
    text = (
        'Process 12: python train.py\nPython v3.11.7\n\nThread 12 (idle): "MainThread"\n'
        f"    all_reduce (torch/distributed/c10d.py:{'9' * 5000})\n    \n    step (train.py:{2**63})\n"
        f"    main (train.py:3)\n{' ' * 4}\n"
    )
    (proc,) = parse_pyspy_text(text, "rank0.txt")
    frames = proc.threads[0].frames
    assert [f.function for f in frames] == ["all_reduce", "step", "main"]
    assert [f.line for f in frames] == [None, None, 3]


def test_pyspy_json_nested_deep_or_with_a_5000_digit_number_is_a_failed_dump() -> None:
    (deep,) = parse_pyspy_json("[" * DEEP + "]" * DEEP, "rank0.json")
    assert deep.status == "failed" and "nested deeper" in (deep.error or "")
    (big,) = parse_pyspy_json('[{"thread_id": ' + "9" * 5000 + ', "frames": []}]', "rank1.json")
    assert big.status == "failed"


def test_faulthandler_frame_pattern_is_linear_in_long_space_runs() -> None:
    head = 'Thread 0x00007f (most recent call first):\n  File "a.py", line 1 in f'
    t = time.perf_counter()
    (proc,) = parse_traceback_text(head + " " * 32_000 + "y\n" + " " * 2_000_000 + "\n", "fh.txt")
    assert proc.threads and proc.threads[0].frames[0].function.endswith("y")  # 32k spaces: still a frame
    (cut,) = parse_traceback_text(head + " " * 2_000_000 + "y\n", "fh.txt")  # 2 MB: no frame line is that long
    assert cut.status == "failed"
    assert time.perf_counter() - t < 2
    (p2,) = parse_traceback_text(f'Thread 0x1 (most recent call first):\n  File "a.py", line {"9" * 5000} in f\n', "x")
    assert p2.threads[0].frames[0].line is None


# -- Flight Recorder -------------------------------------------------------------------------------------


def _fr(entry: dict[str, object]) -> bytes:
    base = {
        "record_id": 0,
        "pg_id": 0,
        "process_group": ["0", "default"],
        "collective_seq_id": 1,
        "p2p_seq_id": 0,
        "op_id": 1,
        "profiling_name": "gloo:all_reduce",
        "time_created_ns": 1,
        "input_sizes": [[4]],
        "input_dtypes": ["Float"],
        "output_sizes": [[4]],
        "output_dtypes": ["Float"],
        "state": "completed",
        "time_discovered_started_ns": None,
        "time_discovered_completed_ns": None,
        "retired": True,
        "timeout_ms": 1000,
        "is_p2p": False,
    }
    return pickle.dumps({"version": "2.10", "entries": [{**base, **entry}], "pg_config": {}}, protocol=4)


@pytest.mark.parametrize(
    "entry",
    [
        {"collective_seq_id": 2**63},
        {"time_created_ns": float("inf")},
        {"timeout_ms": 10**30},
        {"record_id": "9" * 5000},
        {"input_sizes": [[[[[4]]]]]},
        {"input_sizes": [["x"]]},
        {"duration_ms": float("inf"), "collective_seq_id": -(2**64)},
    ],
)
def test_fr_entries_out_of_64_bits_or_nested_too_deep_are_a_parse_error(tmp_path: Path, entry: dict) -> None:
    from rankscope.datasets.readers.flight_recorder import read_fr_file

    p = tmp_path / "rank_0"
    p.write_bytes(_fr(entry))
    with pytest.raises(ParseError, match="rank_0: entry 0"):
        read_fr_file(p)


def test_fr_group_members_are_never_evaluated(tmp_path: Path) -> None:
    from rankscope.datasets.readers.flight_recorder import read_fr_file

    raw = pickle.loads(_fr({}))
    raw["pg_config"] = {"0": {"name": "0", "desc": "default", "ranks": "[" * 50_000 + "]" * 50_000}}
    (tmp_path / "rank_0").write_bytes(pickle.dumps(raw))
    with pytest.raises(ParseError, match="pg_config"):
        read_fr_file(tmp_path / "rank_0")
    raw["pg_config"] = {"0": {"name": "0", "desc": "default", "ranks": "(0, 1, 2)"}}
    (tmp_path / "rank_0").write_bytes(pickle.dumps(raw))
    assert read_fr_file(tmp_path / "rank_0").pg_config["0"].ranks == (0, 1, 2)


@pytest.mark.parametrize(
    "blob",
    [
        b"\x80\x04]r\x00\x00\x00@j\x00\x00\x00@.",  # LONG_BINPUT 2^30: the C memo sized by the index
        b"(lp0\np1073741824\n.",  # PUT with a decimal index
        b"\x80\x04\x8e" + (2**40).to_bytes(8, "little") + b"ab.",  # BINBYTES8 claiming a TiB
        b"\x80\x04X\xff\xff\xff\x7fabc.",
    ],
)
def test_pickle_bombs_are_refused_quickly_within_memory(blob: bytes, tmp_path: Path) -> None:
    p = tmp_path / "rank_0"
    p.write_bytes(blob)
    t = time.perf_counter()
    with pytest.raises(ParseError, match="rank_0: "):
        load_raw(p)
    assert time.perf_counter() - t < 2


def test_memory_freed_before_a_memo_bomb_is_not_handed_to_it() -> None:
    """The budget counts from the address space measured at that very call: 4 GiB mapped while a good dump is
    decoded, then freed, must not become the next pickle's allowance (a 13-byte pickle asking a 2 GiB memo)."""
    import mmap
    import os

    from rankscope.datasets.readers import fr_files

    if fr_files._vm_bytes() is None:
        pytest.skip("no /proc/self/statm: no address-space budget on this platform")
    big = mmap.mmap(-1, 4 << 30)  # untouched: address space only
    assert safe_loads(pickle.dumps({"version": "2.10", "entries": []}))["entries"] == []
    big.close()
    bomb = b"\x80\x04]r" + (1 << 27).to_bytes(4, "little") + b"."
    t = time.perf_counter()
    with pytest.raises(MemoryError):
        safe_loads(bomb)
    assert time.perf_counter() - t < 2
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # a forked child measures its own address space, not its parent's
        try:
            extra = mmap.mmap(-1, 1 << 30)
            with open("/proc/self/statm", "rb") as fh:
                own = int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
            os.write(w, f"{fr_files._vm_bytes()} {own}".encode())
            extra.close()
        finally:
            os._exit(0)
    os.close(w)
    measured, own = map(int, os.read(r, 100).split())
    os.close(r)
    os.waitpid(pid, 0)
    assert abs(measured - own) < (256 << 20) and measured > fr_files._vm_bytes() + (512 << 20)


def test_code_running_pickles_never_run(tmp_path: Path, fr_dir: Path) -> None:
    import os

    marker = tmp_path / "ran"

    class Reduce:
        def __reduce__(self) -> object:
            return (os.system, (f"touch {marker}",))

    for proto in (0, 2, 4):
        blob = pickle.dumps({"version": "2.10", "entries": [Reduce()]}, protocol=proto)
        with pytest.raises(pickle.UnpicklingError):
            safe_loads(blob)
        (fr_dir / "rank_1").write_bytes(blob)
        if proto >= 2:  # recognised as a pickle: the whole input is refused, never skipped past
            with pytest.raises(ParseError, match="rank_1: refused pickle"):
                load_fr_inputs(fr_dir)
        else:  # a protocol-0 pickle is no Flight Recorder dump: never unpickled
            assert 1 not in [d.rank for d in load_fr_inputs(fr_dir).fr_dumps]
    assert not marker.exists()


def test_a_corrupt_fr_dump_beside_good_ones_is_skipped_with_a_note(fr_dir: Path) -> None:
    (fr_dir / "rank_3").write_bytes((fr_dir / "rank_3").read_bytes()[:50])
    inputs = load_fr_inputs(fr_dir)
    assert sorted(d.rank for d in inputs.fr_dumps) == [0, 1, 2]
    assert any("rank_3" in n and "skipped" in n for n in inputs.notes)


# -- ranks and the world size ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["rank2147483648.txt", "rank9223372036854775808.txt", "rank" + "1" * 60 + ".txt"])
def test_a_rank_far_beyond_the_files_is_one_error_naming_the_file(stack_dir: Path, name: str) -> None:
    (stack_dir / "manifest.csv").unlink()
    (stack_dir / name).write_text((stack_dir / "rank0.txt").read_text())
    t = time.perf_counter()
    with pytest.raises(InputError, match=name.removesuffix(".txt")) as exc:
        load_inputs(stack_dir)
    assert time.perf_counter() - t < 5 and "\n" not in str(exc.value)


def test_the_world_size_is_not_taken_from_the_largest_rank_alone(stack_dir: Path) -> None:
    (stack_dir / "manifest.csv").unlink()
    (stack_dir / "rank5000.txt").write_text((stack_dir / "rank0.txt").read_text())
    with pytest.raises(InputError, match=r"rank5000.txt: rank 5000 is far beyond the 17 rank\(s\) found.*--layout"):
        load_inputs(stack_dir)
    assert load_inputs(stack_dir, layout="tp=2,dp=2504").topology.world_size == 5008  # a layout says it


@pytest.mark.parametrize("rank", [-1, 2**63, "x", 1.5, [0]])
def test_hook_identities_with_impossible_ranks_or_coordinates_are_ignored(hook_dir: Path, rank: object) -> None:
    p = hook_dir / "pid16480.json"
    ident = json.loads(p.read_text())
    ident["rank"] = rank
    ident["coords"] = {"tp": -5, "dp": 2**63}
    p.write_text(json.dumps(ident))
    assert _verdict_or_ours(hook_dir) in ("fail-slow", "healthy", "inconclusive", "hang")  # the other ranks decide


def test_deeply_nested_hook_files_are_notes_not_recursion(hook_dir: Path) -> None:
    for name in ("pid16480.json", "pid16481.steps.jsonl"):
        (hook_dir / name).write_text('{"a": ' + "[" * DEEP + "]" * DEEP + "}\n")
    (hook_dir / "pid16482.exit.json").write_text("[" * DEEP + "]" * DEEP)
    assert _verdict_or_ours(hook_dir) in ("fail-slow", "healthy", "inconclusive", "hang")  # the others decide


def test_fr_json_named_like_a_pyspy_dump_beside_pyspy_dumps(stack_dir: Path, fr_dir: Path) -> None:
    from rankscope.harness.synthetic_fr import generate_fr

    generate_fr("tp=2,dp=2", fault="missing", steps=1).write(stack_dir / "x", prefix="rank", fmt="json")
    for p in (stack_dir / "x").iterdir():
        p.rename(stack_dir / p.name)  # rank0.json .. rank3.json beside rank0.txt ..
    verdict = _verdict_or_ours(stack_dir)  # the FR dumps are read as FR (by content), the stacks as stacks
    assert verdict in ("hang", "inconclusive"), verdict


# -- metrics and timings ------------------------------------------------------------------------------------


def _timings(path: Path, start: str) -> None:
    rows = ["rank,step,op,duration_s,start_s"] + [f"{r},{s},step,1.0,{start}" for r in range(4) for s in range(3)]
    path.write_text("\n".join(rows) + "\n")


@pytest.mark.parametrize("ts", ["0001-01-01 00:00:00", "9999-12-31 23:59:59", "1e18", "-5", "garbage"])
def test_metric_timestamps_outside_the_limits_are_refused_before_any_allocation(stack_dir: Path, ts: str) -> None:
    lines = ["ts,node,metric,value"] + [f"2026-01-01 00:00:{i:02d},node-0,gpu_util,50" for i in range(5)]
    lines.append(f"{ts},node-1,gpu_util,50")
    (stack_dir / "metrics.csv").write_text("\n".join(lines) + "\n")
    t = time.perf_counter()
    v = diagnose(load_inputs(stack_dir))  # the stacks still make a verdict; the metrics file is a note
    assert v.verdict == "hang" and time.perf_counter() - t < 10
    notes = " ".join(map(str, v.to_dict().get("details", {}).get("notes", [])))
    assert "metrics.csv" in notes and "'ts'" in notes, notes


def test_infinite_durations_and_bit_flipped_parquet_are_notes(stack_dir: Path) -> None:
    import polars as pl

    _timings(stack_dir / "timings.csv", "inf")
    df = pl.DataFrame({"rank": [0, 1], "step": [0, 0], "op": ["step", "step"], "duration_s": [1.0, 1.0]})
    df.write_parquet(stack_dir / "timings_b.parquet")
    data = bytearray((stack_dir / "timings_b.parquet").read_bytes())
    for i in range(8, len(data) - 8, 7):
        data[i] ^= 0x5A
    (stack_dir / "timings_b.parquet").write_bytes(bytes(data))
    inputs = load_inputs(stack_dir)
    notes = " ".join(inputs.notes)
    assert "timings.csv" in notes and "timings_b.parquet" in notes


def test_fr_frames_and_dtypes_of_the_wrong_type_never_reach_the_analysis(fr_dir: Path) -> None:
    raw = pickle.loads((fr_dir / "rank_2").read_bytes())
    for e in raw["entries"]:
        e["input_dtypes"] = [["Float"]]
        e["frames"] = [{"name": ["f"], "filename": {"a": 1}, "line": 2**70}]
    (fr_dir / "rank_2").write_bytes(pickle.dumps(raw))
    inputs = load_fr_inputs(fr_dir)
    (dump,) = [d for d in inputs.fr_dumps if d.rank == 2]
    frames = [f for e in dump.entries for f in e.frames]
    assert frames and all(isinstance(f.function, str) and isinstance(f.file, str) and f.line is None for f in frames)
    assert all(isinstance(t, str) for e in dump.entries for t in e.input_dtypes)
    assert diagnose(inputs).verdict  # hashable signatures: no TypeError in the analysis


def test_a_node_name_with_thousands_of_digits_sorts_without_the_digit_limit(stack_dir: Path) -> None:
    rows = ["rank,step,op,duration_s,node"] + [
        f"{r},{s},step,1.0,{'1' + '0' * 5000 if r == 0 else 'n1'}" for r in range(4) for s in range(3)
    ]
    (stack_dir / "timings.csv").write_text("\n".join(rows) + "\n")
    assert diagnose(load_inputs(stack_dir)).verdict == "hang"


def test_metric_samples_far_apart_in_time_are_refused_before_the_cube_is_allocated(stack_dir: Path) -> None:
    rows = ["ts,node,metric,value"] + [f"{1_700_000_000 + i},node-0,gpu_util,50" for i in range(5)]
    rows.append("4000000000,node-1,gpu_util,50")  # year 2096: inside the limits, 73 years after the others
    (stack_dir / "metrics.csv").write_text("\n".join(rows) + "\n")
    v = diagnose(load_inputs(stack_dir))
    assert v.verdict == "hang"
    assert "time blocks" in " ".join(map(str, v.to_dict().get("details", {}).get("notes", [])))


_DEEP_FR = r"""
import pickle, sys
from rankscope.datasets.readers.flight_recorder import parse_dump
from rankscope.spine import ParseError
deep = pickle.loads(b"\x80\x02)" + b"\x85" * 1_000_000 + b".")  # what a pickle builds cheaply: no recursion
base = {"record_id": 0, "pg_id": 0, "process_group": ("0", "default_pg"), "collective_seq_id": 1, "p2p_seq_id": 0,
        "op_id": 1, "profiling_name": "nccl:all_reduce", "time_created_ns": 1, "input_sizes": [[4]],
        "input_dtypes": ["Float"], "output_sizes": [[4]], "output_dtypes": ["Float"], "state": "completed",
        "time_discovered_started_ns": None, "time_discovered_completed_ns": None, "retired": True,
        "timeout_ms": 1000, "is_p2p": False, "frames": [{"name": "f", "filename": "x.py", "line": 1}]}
odd = {"pg_id": deep, "process_group": ("0", deep), "input_sizes": [[deep]], "output_sizes": [[4], [deep]],
       "input_dtypes": [deep], "output_dtypes": ["Float", deep], "frames": [{"name": deep, "filename": "x", "line": 1}]}
for key, value in odd.items():
    try:
        parse_dump({"version": "2.10", "entries": [base, {**base, key: value}]}, rank=0)
        print(key, "read")
    except ParseError as exc:
        print(key, "refused", str(exc)[:60])
"""


def test_values_nested_a_million_deep_never_crash_the_reader() -> None:
    """A pickle builds a tuple nested a million deep in a few bytes; hashing one overflows the C stack (a
    segfault), so every value the FR reader interns is checked before it is hashed."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _DEEP_FR], capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert len(out.stdout.splitlines()) == 7, out.stdout
