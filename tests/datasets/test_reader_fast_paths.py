"""The stack readers' fast paths read exactly what their general paths read.

A plain py-spy text dump and a plain faulthandler dump are matched thread block by thread block, and py-spy
JSON is decoded by orjson; anything else takes the line-by-line (or standard library) way. These tests feed
real captures (the torch/py-spy probe, the field captures kept under ``tests/data``), and the same captures
cut, re-broken and garbled, to both ways and require the same dumps.
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rankscope.datasets.readers import faulthandler, pyspy_json, pyspy_text

DATA = Path(__file__).resolve().parents[1] / "data"
PROBE = Path(__file__).resolve().parents[3] / "shared" / "data" / "torch_gloo_hang_probe"


def _captures(marker: str, suffixes: tuple[str, ...]) -> list[str]:
    out = []
    for root in (DATA, PROBE):
        if not root.is_dir():
            continue
        for p in sorted(root.rglob("*")):
            if p.is_file() and not p.is_symlink() and p.suffix in suffixes and p.stat().st_size < 200_000:
                text = p.read_text(encoding="utf-8", errors="replace")
                if marker in text:
                    out.append(text)
    return out


PYSPY_TEXTS = _captures("\nThread ", (".txt", ".log"))
FH_TEXTS = _captures("(most recent call first):", (".txt", ".log", ".err"))
JSON_TEXTS = _captures('"frames"', (".json",))


def _both_text(parse, slow_attr: str, module, text: str, monkeypatch: pytest.MonkeyPatch):
    fast = parse(text, "f")
    with monkeypatch.context() as m:
        m.setattr(module, slow_attr, lambda *a, **k: None)  # the fast path declines: the line way
        slow = parse(text, "f")
    return fast, slow


def _variants(text: str, cut: int) -> list[str]:
    k = cut % max(len(text), 1)
    return [
        text,
        text[:k],  # cut mid-dump
        text.rstrip("\n"),
        text.replace("\n", "\r\n"),
        text.replace("\n", "\n\n", 2),
        text.replace("    ", "     ", 1),
        text.replace("\n", "\n   \n", 1),
        text + "Thread 0x00007f0d78f68640 (most recent call first):\n",
        text + "Error: Failed to get stack traces\n",
        text.replace("(", "(\u00e9", 1),
    ]


def test_there_are_captures_to_compare() -> None:
    assert len(PYSPY_TEXTS) >= 5 and len(FH_TEXTS) >= 5 and len(JSON_TEXTS) >= 5


_TEXT_WAYS = {
    "py-spy text": (pyspy_text.parse_pyspy_text, "_fast", pyspy_text, PYSPY_TEXTS, lambda t: pyspy_text._fast(t, "f")),
    "faulthandler": (faulthandler.parse_traceback_text, "_blocks", faulthandler, FH_TEXTS, faulthandler._blocks),
}


@pytest.mark.parametrize("cut", [0, 37, 1001])
@pytest.mark.parametrize("way", sorted(_TEXT_WAYS))
def test_block_fast_path_reads_what_the_line_parser_reads(way: str, cut: int, monkeypatch: pytest.MonkeyPatch) -> None:
    parse, slow_attr, module, texts, taken = _TEXT_WAYS[way]
    hits = 0
    for text in texts:
        for v in _variants(text, cut):
            fast, slow = _both_text(parse, slow_attr, module, v, monkeypatch)
            assert fast == slow, v[:300]
            hits += taken(v) is not None
    assert hits >= 1  # the fast path is taken on plain captures, not only refused


class _NoOrjson:
    JSONDecodeError = orjson.JSONDecodeError

    @staticmethod
    def loads(_: bytes) -> None:
        raise orjson.JSONDecodeError("declined", "", 0)


def _json_variants(raw: bytes, cut: int) -> list[bytes]:
    return [
        raw,
        raw[: cut % max(len(raw), 1)],
        raw + raw,  # two dumps written one after the other
        raw.replace(b'"line": ', b'"line": 1000000000000000000000', 1),  # past 64 bits: orjson refuses
        raw.replace(b'"name": "', b'"name": "\\ud800', 1),  # a lone surrogate
        b"\xff" + raw,
        raw.replace(b'"name": "', b'"name": "0x7f0911aa3f16 (libc.so.6)', 1),
        b"Permission Denied: Try running again with elevated permissions\n",
    ]


@pytest.mark.parametrize("cut", [0, 41, 997])
def test_pyspy_json_orjson_reads_what_the_standard_library_reads(cut: int, monkeypatch: pytest.MonkeyPatch) -> None:
    for text in JSON_TEXTS:
        for v in _json_variants(text.encode("utf-8", "surrogatepass"), cut):
            fast = pyspy_json.parse_pyspy_json(v, "f")
            with monkeypatch.context() as m:
                m.setattr(pyspy_json, "orjson", _NoOrjson)
                slow = pyspy_json.parse_pyspy_json(v.decode("utf-8", errors="replace"), "f")
            assert fast == slow, v[:300]


_LINE = st.sampled_from(
    [
        "Process 4242: python train.py\n",
        "Python v3.11.7 (/usr/bin/python3.11)\n",
        "\n",
        'Thread 4242 (idle): "MainThread"\n',
        "Thread 0x7F3A2B1C (active+gil)\n",
        "    all_reduce (torch/distributed/distributed_c10d.py:2050)\n",
        "    <module> (train.py:12)\n",
        "        Arguments:\n",
        "    0x7f0911aa3f16 (libc.so.6)\n",
        "    \n",
        "Thread 0x00007f2a1c1fe640 (most recent call first):\n",
        "Current thread 0x00007f2a2a3b4740 (most recent call first):\n",
        '  File "/opt/job/train.py", line 33 in <module>\n',
        '  File "/usr/lib/python3.11/threading.py", line 320 in wait\n',
        "  ...\n",
        "Error: Failed to get stack traces\n",
    ]
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_LINE, max_size=14), st.integers(0, 40))
def test_any_mix_of_lines_reads_alike_both_ways(lines: list[str], cut: int) -> None:
    text = "".join(lines)
    for v in (text, text[: len(text) - cut] if cut < len(text) else text):
        if not v.strip():
            continue
        saved_p, saved_f = pyspy_text._fast, faulthandler._blocks
        fast_p, fast_f = pyspy_text.parse_pyspy_text(v, "f"), faulthandler.parse_traceback_text(v, "f")
        try:
            pyspy_text._fast = faulthandler._blocks = lambda *a, **k: None  # type: ignore[assignment]
            slow_p, slow_f = pyspy_text.parse_pyspy_text(v, "f"), faulthandler.parse_traceback_text(v, "f")
        finally:
            pyspy_text._fast, faulthandler._blocks = saved_p, saved_f  # type: ignore[method-assign]
        assert fast_p == slow_p, v
        assert fast_f == slow_f, v


def test_loading_freezes_only_when_asked() -> None:
    """The CLI (a one-shot process) moves a directory's evidence out of the cyclic collector's sight once
    loaded (it would rescan it all during the analysis); the library never freezes its caller's objects
    unless asked."""
    import gc
    from pathlib import Path

    from rankscope.datasets.loading.inputs import load_inputs

    case = Path(__file__).resolve().parents[1] / "data" / "stacks" / "hang_compute_mp8"
    gc.unfreeze()
    try:
        kept = load_inputs(case)
        assert gc.get_freeze_count() == 0 and kept.procs
        frozen = load_inputs(case, freeze=True)
        assert gc.get_freeze_count() > 0 and frozen.procs == kept.procs
    finally:
        gc.unfreeze()


# -- Flight Recorder records: field by field (columns) and one by one ---------------------------------------
def _fr_records() -> list[list[dict]]:
    from rankscope.datasets.readers.fr_files import is_fr_file, load_raw

    out = []
    for root in (DATA / "fr_gloo", DATA / "outside", PROBE / "fr"):
        for p in sorted(root.rglob("*")) if root.is_dir() else ():
            if p.is_file() and p.stat().st_size < 2_000_000 and is_fr_file(p):
                raw, _ = load_raw(p)
                if isinstance(raw, dict) and isinstance(raw.get("entries"), list) and raw["entries"]:
                    out.append(raw["entries"])
    return out


FR_RECORDS = _fr_records()
_ODD = [None, True, 1.5, -1, 2**63, 2**64, "7", "", [1], (1, 2), {"a": 1}, ["a", "b"], ("x", 3), b"x", 0]


def _one_by_one(records: list[dict]):
    from rankscope.datasets.readers.fr_entries import entry

    try:
        return [entry(e, {}) for e in records]
    except (ValueError, TypeError, OverflowError) as exc:
        return type(exc)


def _by_columns(records: list[dict]):
    from rankscope.datasets.readers.fr_columns import entries

    try:
        return entries(records, {})
    except (ValueError, TypeError, OverflowError) as exc:
        return type(exc)


def _same(a, b) -> bool:
    if not isinstance(a, list) or not isinstance(b, list):
        return a == b
    return a == b and all(type(u) is type(v) for x, y in zip(a, b) for u, v in zip(x, y))


def test_real_records_take_the_column_way_and_read_alike() -> None:
    assert len(FR_RECORDS) >= 10
    for records in FR_RECORDS:
        cols = _by_columns(records)
        assert cols is not None  # as PyTorch writes them: the column way takes them
        assert _same(cols, _one_by_one(records))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    which=st.integers(min_value=0),
    at=st.integers(min_value=0),
    key=st.sampled_from(sorted({k for rs in FR_RECORDS[:3] for r in rs for k in r} | {"duration_ms"})),
    value=st.sampled_from(_ODD + ["<drop>"]),
)
def test_an_odd_field_anywhere_reads_as_one_by_one(which: int, at: int, key: str, value) -> None:
    """One field of one record made odd (another type, out of 64 bits, missing): the column way declines
    (None) or reads exactly what the record-by-record way reads, and raises where it raises."""
    records = [dict(r) for r in FR_RECORDS[which % len(FR_RECORDS)]]
    r = records[at % len(records)]
    if value == "<drop>":
        r.pop(key, None)
    else:
        r[key] = value
    cols, one = _by_columns(records), _one_by_one(records)
    assert cols is None or _same(cols, one), (key, value)
