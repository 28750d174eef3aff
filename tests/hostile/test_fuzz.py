"""Property-based fuzzing of every reader (hypothesis, bounded for CI; ``benchmarks/fuzz_readers.py`` runs the
10,000-input version): valid seeds from the project's own generators, mutated with bit flips, cuts, inserted
hostile tokens (huge and non-finite numbers, deep brackets, space runs, NULs). The outcome is always a value
of the reader's type or the project's own error, within the deadline."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from rankscope.datasets.domain.bounds import load_json  # noqa: E402
from rankscope.datasets.domain.stacks import ProcessDump  # noqa: E402
from rankscope.datasets.readers.dumpdir import parse_stack_bytes  # noqa: E402
from rankscope.datasets.readers.flight_recorder import parse_dump  # noqa: E402
from rankscope.datasets.readers.fr_files import load_raw  # noqa: E402
from rankscope.datasets.readers.sniff import HEAD_BYTES, sniff  # noqa: E402
from rankscope.spine import RankscopeError  # noqa: E402

TOKENS = [
    b"9" * 5000,
    str(2**63).encode(),
    b"-1",
    b"inf",
    b"NaN",
    b"1e309",
    b"[" * 5000,
    b"{" * 300,
    b" " * 40_000,
    b"    \n",
    b"\x00\xff",
    b'"',
    b"\n",
    b"rank2147483648",
]

FAST = settings(
    max_examples=300,
    deadline=5000,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _seeds() -> dict[str, bytes]:
    from rankscope.harness.synthetic import generate_job
    from rankscope.harness.synthetic_fr import generate_fr

    job = generate_job("tp=2,dp=4", fault="compute-hang", seed=5, dataloader_workers=0)
    out: dict[str, bytes] = {}
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        for fmt in ("pyspy-text", "pyspy-json", "faulthandler"):
            root = job.write_dir(Path(d) / fmt, fmt=fmt)
            out[fmt] = next(p for p in sorted(root.iterdir()) if p.name.startswith("rank0")).read_bytes()
    fr = generate_fr("tp=2,dp=2", fault="missing", steps=1, seed=2)
    out["fr-pickle"] = pickle.dumps(fr.raw[0], protocol=4)
    out["fr-json"] = json.dumps(fr.raw[1], default=str).encode()
    return out


SEEDS = _seeds()

mutation = st.tuples(
    st.sampled_from(["flip", "cut", "insert", "delete", "truncate"]),
    st.floats(0, 1, allow_nan=False),
    st.integers(0, len(TOKENS) - 1),
    st.integers(1, 64),
)


def _mutate(data: bytes, muts: list[tuple[str, float, int, int]]) -> bytes:
    b = bytearray(data)
    for op, where, tok, n in muts:
        i = int(where * len(b)) if b else 0
        if op == "flip" and b:
            b[min(i, len(b) - 1)] ^= 1 << (n % 8)
        elif op == "cut":
            b = b[:i] + b[i + n :]
        elif op == "insert":
            b[i:i] = TOKENS[tok]
        elif op == "delete":
            del b[i : i + n * 16]
        elif op == "truncate":
            b = b[:i]
    return bytes(b)


def _stack_outcome(raw: bytes) -> None:
    try:
        procs = parse_stack_bytes(raw, "rank0.txt", sniff(raw[:HEAD_BYTES], "rank0.txt").kind)
    except RankscopeError:
        return
    assert isinstance(procs, list) and all(isinstance(p, ProcessDump) for p in procs)
    for p in procs:
        for t in p.threads:
            for f in t.frames:
                assert f.line is None or (isinstance(f.line, int) and 0 <= f.line < 2**31)
            assert t.thread_id is None or -(2**63) <= t.thread_id < 2**63


@pytest.mark.parametrize("kind", ["pyspy-text", "pyspy-json", "faulthandler"])
@FAST
@given(muts=st.lists(mutation, min_size=1, max_size=4))
def test_stack_readers_end_in_dumps_or_our_error(kind: str, muts: list[Any]) -> None:
    _stack_outcome(_mutate(SEEDS[kind], muts))


@pytest.mark.parametrize("kind", ["fr-pickle", "fr-json"])
@FAST
@given(muts=st.lists(mutation, min_size=1, max_size=4))
def test_fr_reader_ends_in_a_dump_or_our_error(kind: str, muts: list[Any], tmp_path_factory: Any) -> None:
    raw = _mutate(SEEDS[kind], muts)
    try:
        obj, fmt = load_raw("rank_0", raw)
        d = parse_dump(obj, path="rank_0", source_format=fmt)
    except RankscopeError:
        return
    assert d.rank >= 0
    for e in d.entries:
        assert all(isinstance(x, int) and -(2**63) <= x < 2**63 for x in (e.record_id, e.collective_seq_id, e.op_id))
        assert all(isinstance(x, int) for shape in e.input_sizes for x in shape)


@FAST
@given(muts=st.lists(mutation, min_size=1, max_size=4))
def test_json_guard_ends_in_a_value_or_our_error(muts: list[Any]) -> None:
    raw = _mutate(json.dumps({"pid": 1, "rank": 3, "coords": {"tp": 0, "dp": 1}, "groups": [[0, 1]]}).encode(), muts)
    try:
        load_json(raw, "pid1.json")
    except RankscopeError:
        pass


@settings(max_examples=60, deadline=20_000, derandomize=True, suppress_health_check=list(HealthCheck))
@given(muts=st.lists(mutation, min_size=1, max_size=3), which=st.integers(0, 3))
def test_a_dump_directory_with_one_mutated_file_is_a_verdict_or_our_error(
    muts: list[Any], which: int, tmp_path_factory: Any
) -> None:
    from rankscope.analytics import diagnose
    from rankscope.datasets.loading.inputs import load_inputs
    from rankscope.harness.synthetic import generate_job

    d = tmp_path_factory.mktemp("job")
    root = generate_job("tp=2,dp=4", fault="compute-hang", seed=5, dataloader_workers=0).write_dir(d / "j")
    target = sorted(root.iterdir())[which]
    target.write_bytes(_mutate(target.read_bytes(), muts))
    try:
        diagnose(load_inputs(root))
    except RankscopeError:
        pass
