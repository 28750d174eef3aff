"""Flight Recorder reader: real gloo dumps, untrusted pickles, version tolerance, store round-trip."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import polars as pl
import pytest

from rankscope.datasets.domain.flight_recorder import FRDump
from rankscope.datasets.readers.flight_recorder import (
    parse_dump,
    read_fr_dir,
    read_fr_file,
    read_fr_files,
)
from rankscope.datasets.readers.fr_entries import split_profiling_name
from rankscope.datasets.readers.fr_files import is_fr_file, rank_from_name
from rankscope.datasets.readers.fr_table import fr_from_table, fr_to_rows
from rankscope.datasets.store.store import Store
from rankscope.harness.synthetic_fr import generate_fr
from rankscope.spine import InputError, ParseError


def test_reads_the_real_gloo_probe_pickles_and_json(probe_dir: Path) -> None:
    dumps = read_fr_dir(probe_dir / "fr")
    assert [d.rank for d in dumps] == [0, 1, 2, 3]
    assert all(d.source_format == "fr-pickle" for d in dumps)  # pickles (with frames) win the tie
    d0 = dumps[0]
    assert d0.version == "2.10" and d0.backend == "gloo"
    assert d0.pg_config == {}  # gloo's placeholder {'': {...}} names no group
    assert d0.pg_status["0"].last_enqueued == 6 and d0.pg_status["0"].last_completed == 5
    last = d0.entries[-1]
    assert (last.pg_name, last.pg_desc, last.collective_seq_id, last.op) == ("0", "default_pg", 6, "all_reduce")
    assert last.retired is False and last.frames and last.frames[0].function == "all_reduce"
    assert dumps[3].entries[-1].collective_seq_id == 5
    js = read_fr_file(probe_dir / "fr" / "fr_hang_rank0.json")
    assert js.rank == 0 and js.source_format == "fr-json"
    assert js.pg_status["0"].last_enqueued == 6  # JSON writes the seq ids as strings

    def key(e):  # the two files are separate dumps: compare what they record, not when
        return (e.pg_name, e.collective_seq_id, e.profiling_name, e.input_sizes, e.input_dtypes, e.retired)

    assert [key(e) for e in js.entries] == [key(e) for e in d0.entries]


class _Evil:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (os.system, (f"touch {self.marker}",))


class _EvilEval:
    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (eval, ("__import__('pathlib').Path(__import__('os').environ['FR_MARKER']).touch()",))


@pytest.mark.parametrize("payload", ["system", "eval", "nested"])
def test_malicious_pickle_is_refused_and_runs_nothing(
    tmp_path: Path, payload: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "pwned"
    monkeypatch.setenv("FR_MARKER", str(marker))
    evil = {"system": _Evil(str(marker)), "eval": _EvilEval(), "nested": [{"x": _Evil(str(marker))}]}[payload]
    dump = {
        "version": "2.10",
        "pg_config": {},
        "pg_status": {},
        "entries": [{"record_id": 0, "profiling_name": "nccl:all_reduce", "frames": evil}],
    }
    path = tmp_path / "nccl_trace_rank_0"
    path.write_bytes(pickle.dumps(dump, protocol=2))
    with pytest.raises(ParseError) as err:
        read_fr_file(path)
    assert str(path) in str(err.value) and "refused pickle" in str(err.value)
    assert not marker.exists()


def test_plain_containers_in_pickles_are_allowed(tmp_path: Path) -> None:
    dump = {
        "version": "2.4",
        "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}},
        "pg_status": {},
        "entries": [
            {
                "record_id": 0,
                "pg_id": 0,
                "process_group": ("0", "default_pg"),
                "collective_seq_id": 1,
                "profiling_name": "nccl:all_reduce",
                "input_sizes": [[4]],
                "state": "completed",
                "tags": {1, 2},
                "b": b"bytes",
                "f": frozenset([3]),
            }
        ],
    }
    path = tmp_path / "rank_1.pkl"
    path.write_bytes(pickle.dumps(dump, protocol=2))  # protocol 2 pickles sets via builtins.set
    d = read_fr_file(path)
    assert d.rank == 1 and d.pg_config["0"].ranks == (0, 1) and d.entries[0].input_sizes == ((4,),)


@pytest.mark.parametrize(
    "content, what",
    [
        (b"\x80\x04\x95", "corrupt or truncated pickle"),
        (b"{not json", "neither a pickle nor valid JSON"),
        (b"[1, 2]", "not a Flight Recorder dict"),
        (b'{"foo": 1}', "not a Flight Recorder dump"),
        (b'{"entries": 5}', "'entries' is a int"),
        (b'{"entries": [3]}', "entry 0 is a int"),
        (b'{"entries": [], "pg_config": {"0": {"ranks": "[0, 1"}}}', "bad pg_config"),
    ],
)
def test_bad_files_raise_parse_error_naming_the_file(tmp_path: Path, content: bytes, what: str) -> None:
    path = tmp_path / "trace_3"
    path.write_bytes(content)
    with pytest.raises(ParseError) as err:
        read_fr_file(path)
    assert err.value.path == str(path) and what in err.value.what


def test_rank_comes_from_argument_dump_or_name(tmp_path: Path) -> None:
    assert rank_from_name("nccl_trace_rank_12") == 12
    assert rank_from_name("fr_hang_rank3.json") == 3
    assert rank_from_name("_dump_7.pkl") == 7
    assert rank_from_name("pid.fr.json") is None
    path = tmp_path / "pid.fr.json"
    path.write_text(json.dumps({"entries": []}))
    with pytest.raises(ParseError, match="cannot tell the rank"):
        read_fr_file(path)
    assert read_fr_file(path, rank=5).rank == 5
    path.write_text(json.dumps({"entries": [], "rank": 9}))
    assert read_fr_file(path).rank == 9


def test_old_and_odd_versions_are_tolerated(tmp_path: Path) -> None:
    old = {
        "version": "1.5",
        "entries": [{"seq_id": 4, "pg_id": 2, "profiling_name": "all_reduce", "state": "scheduled"}],
    }
    path = tmp_path / "old_0.json"
    path.write_text(json.dumps(old))
    e = read_fr_file(path).entries[0]
    assert (e.collective_seq_id, e.pg_name, e.op, e.backend, e.is_p2p) == (4, "2", "all_reduce", "", False)
    assert split_profiling_name("xccl:send 1->2") == ("xccl", "send", 1, 2)
    assert split_profiling_name("nccl:recv 3<-0") == ("nccl", "recv", 0, 3)
    assert split_profiling_name("gloo:barrier") == ("gloo", "barrier", None, None)


def test_sniffing_and_directory_families(tmp_path: Path, probe_dir: Path) -> None:
    assert is_fr_file(probe_dir / "fr" / "rank_0") and is_fr_file(probe_dir / "fr" / "fr_hang_rank0.json")
    assert not is_fr_file(probe_dir / "README.md") and not is_fr_file(tmp_path / "absent")
    (tmp_path / "stack.json").write_text('[{"pid": 1, "frames": []}]')  # a py-spy dump is a list
    assert not is_fr_file(tmp_path / "stack.json")
    syn = generate_fr("tp=2,dp=2", fault="clean", steps=1)
    syn.write(tmp_path / "d", prefix="trace_")
    syn.write(tmp_path / "d", prefix="trace_", fmt="json")
    (tmp_path / "d" / "notes_1.txt").write_text("not a dump")
    dumps = read_fr_dir(tmp_path / "d")
    assert [d.rank for d in dumps] == [0, 1, 2, 3] and all(d.source_format == "fr-pickle" for d in dumps)
    json_files = sorted((tmp_path / "d").glob("trace_*.json"))
    assert [d.source_format for d in read_fr_files(json_files)] == ["fr-json"] * 4
    (tmp_path / "e").mkdir()
    for r, name in ((0, "a_0"), (0, "a_00")):
        (tmp_path / "e" / name).write_bytes(pickle.dumps(syn.raw[r]))
    with pytest.raises(InputError, match="rank 0 has two"):
        read_fr_dir(tmp_path / "e")
    with pytest.raises(InputError, match="no Flight Recorder dumps"):
        read_fr_dir(probe_dir / "pyspy")  # py-spy JSON dumps are lists, not FR dicts


def test_store_round_trip_keeps_what_the_analysis_needs(tmp_path: Path, probe_dir: Path) -> None:
    dumps = read_fr_dir(probe_dir / "fr")
    store = Store(tmp_path / "store", create=True)
    store.write("collectives", fr_to_rows(dumps, "probe", node_of={r: f"n{r}" for r in range(4)}))
    back = fr_from_table(store.read_arrow("collectives", job="probe"))
    assert [(d.rank, d.entries, d.pg_config, d.pg_status) for d in back] == [
        (d.rank, d.entries, d.pg_config, d.pg_status) for d in dumps
    ]
    back_pl = fr_from_table(store.read("collectives", job="probe"))
    assert [d.entries for d in back_pl] == [d.entries for d in dumps]
    syn = generate_fr("tp=2,pp=2,dp=2", fault="p2p_behind", steps=1).dumps()
    rows = pl.DataFrame(fr_to_rows(syn, "syn"))
    again = fr_from_table(rows.to_arrow())
    assert [d.pg_config for d in again] == [d.pg_config for d in syn]
    assert [d.entries for d in again] == [d.entries for d in syn]
    with pytest.raises(InputError, match="several jobs"):
        fr_from_table(pl.DataFrame(fr_to_rows(syn[:1], "a") + fr_to_rows(syn[:1], "b")))


def test_dump_is_frozen() -> None:
    d = generate_fr("dp=2", fault="clean", steps=1).dumps()[0]
    assert isinstance(d, FRDump)
    with pytest.raises(AttributeError):
        d.rank = 3  # type: ignore[misc]


def test_pg_status_is_keyed_by_pg_id_and_filed_under_the_group_name(fr_gloo: Path) -> None:
    """PyTorch's getPgStatusJson keys pg_status by pg_id. In the real 8-rank gloo dumps every TP group is pg_id 1
    on its members but has its own name; an id no entry names is dropped, with a note when it counted ops."""
    d = read_fr_file(fr_gloo / "mp8_hang" / "rank_2.json")
    names = {e.pg_id: e.pg_name for e in d.entries}
    assert names == {"1": "2", "2": "5"}
    assert set(d.pg_status) == {"2", "5"} and d.pg_status["2"].pg_id == "1"
    assert d.pg_status["2"].last_enqueued == 28 and d.pg_status["5"].last_enqueued == 27
    raw = json.loads((fr_gloo / "mp8_hang" / "rank_2.json").read_text())
    raw["pg_status"]["9"] = {
        "last_enqueued_collective": 4,
        "last_started_collective": -1,
        "last_completed_collective": 4,
    }
    raw["pg_status"]["8"] = {
        "last_enqueued_collective": -1,
        "last_started_collective": -1,
        "last_completed_collective": -1,
    }
    from rankscope.datasets.readers.flight_recorder import parse_dump

    d2 = parse_dump(raw, path="rank_2.json")
    assert set(d2.pg_status) == {"2", "5"} and len(d2.notes) == 1 and "pg_id 9" in d2.notes[0]
    assert d2.dump_time_ns == raw["rankscope_dump_time_ns"]


def test_frames_of_repeated_ops_are_shared_and_never_confused() -> None:
    """Frames are memoised per dump by op name (the last plain stack under that name, compared by value):
    repeated call sites share one tuple, another call site of the same op gets its own frames, and odd frames
    after a plain stack take the careful way without deep comparison."""

    def frames(*lines: int) -> list[dict[str, object]]:
        return [{"name": f"f{line}", "filename": "train.py", "line": line} for line in lines]

    def nested() -> list[object]:
        out: list[object] = []
        for _ in range(5000):
            out = [out]
        return out

    deep = nested()
    extra = [{"name": "g", "filename": "x", "line": 1, "locals": deep}]  # a key torch never writes, nested deep

    def row(i: int, name: str, stack: list[dict[str, object]]) -> dict[str, object]:  # every field torch writes
        return {
            "record_id": i, "pg_id": 0, "process_group": ("0", "default_pg"), "collective_seq_id": i + 1,
            "p2p_seq_id": 0, "op_id": i + 1, "profiling_name": name, "time_created_ns": 10**18 + i,
            "input_sizes": [[4]], "input_dtypes": ["Float"], "output_sizes": [[4]], "output_dtypes": ["Float"],
            "state": "completed", "time_discovered_started_ns": None, "time_discovered_completed_ns": None,
            "retired": True, "timeout_ms": 600000, "is_p2p": False, "frames": stack,
        }  # fmt: skip

    rows = [
        row(0, "nccl:all_reduce", frames(10, 20)),
        row(1, "nccl:all_reduce", frames(10, 20)),
        row(2, "nccl:all_reduce", frames(10, 30)),
        row(3, "nccl:all_reduce", [{"name": deep, "filename": "x", "line": 1}]),
        row(4, "nccl:all_reduce", frames(10, 30)),
        row(5, "nccl:broadcast", frames(10, 20)),
        row(6, "nccl:broadcast", extra),
        row(7, "nccl:broadcast", [{**extra[0], "locals": nested()}]),
    ]
    raw = {"version": "2.10", "entries": rows}
    with pytest.raises(ParseError, match="entry 3"):  # a name that cannot be printed: the careful way refuses it
        parse_dump(raw, rank=0)
    rows[3]["frames"] = [{"name": ["f"], "filename": "x", "line": 1}]  # odd but printable: the careful way
    entries = parse_dump(raw, rank=0).entries
    got = [[f.line for f in e.frames] for e in entries]
    assert got == [[10, 20], [10, 20], [10, 30], [1], [10, 30], [10, 20], [1], [1]]
    assert entries[0].frames is entries[1].frames is entries[5].frames and entries[2].frames is entries[4].frames
    assert entries[3].frames[0].function == "['f']"


def test_sizes_dtypes_and_stacks_repeated_across_records_and_dumps_are_read_as_written() -> None:
    """A record whose sizes, dtypes and stack equal one of the last few of its op name's is not converted again
    (compared in C with the raw values already checked, across dumps): what comes out is still what each record
    says, with more distinct sizes than are remembered, and a value that only looks like a remembered one (a
    nested list, a dtype that is no string) still goes the careful way."""
    from rankscope.datasets.readers.flight_recorder import parse_dump

    def row(i: int, sizes: object, dtypes: object = ("Float",), line: int = 10) -> dict[str, object]:
        return {
            "record_id": i, "pg_id": 0, "process_group": ("0", "default_pg"), "collective_seq_id": i + 1,
            "p2p_seq_id": 0, "op_id": i + 1, "profiling_name": "nccl:all_reduce", "time_created_ns": 10**18 + i,
            "input_sizes": sizes, "input_dtypes": list(dtypes), "output_sizes": sizes, "output_dtypes": list(dtypes),
            "state": "completed", "time_discovered_started_ns": None, "time_discovered_completed_ns": None,
            "retired": True, "timeout_ms": 600000, "is_p2p": False,
            "frames": [{"name": "step", "filename": "train.py", "line": line}],
        }  # fmt: skip

    sizes = [[[n, 4096]] for n in (1, 2, 3, 4, 5, 6)]  # more distinct sizes than an op name remembers
    for rank in (0, 1):
        rows = [row(i, sizes[i % 6], line=10 + i % 3) for i in range(24)]
        rows.append(row(24, [[7, 4096]], dtypes=("Float", "BFloat16")))
        got = parse_dump({"version": "2.10", "entries": rows}, rank=rank).entries
        assert [e.input_sizes for e in got[:24]] == [((i % 6 + 1, 4096),) for i in range(24)]
        assert [e.output_sizes for e in got[:24]] == [e.input_sizes for e in got[:24]]
        assert [e.frames[0].line for e in got[:24]] == [10 + i % 3 for i in range(24)]
        assert got[24].input_dtypes == ("Float", "BFloat16") and got[24].input_sizes == ((7, 4096),)
    odd = parse_dump({"version": "2.10", "entries": [row(0, [[1, 4096]], dtypes=(7,))]}, rank=2).entries[0]
    assert odd.input_dtypes == ("7",) and odd.input_sizes == ((1, 4096),)
    deep: list[object] = [4096]
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(ParseError, match="entry 0"):
        parse_dump({"version": "2.10", "entries": [row(0, [[1, deep]])]}, rank=3)


def test_group_members_are_listed_once_per_group_not_once_per_dump(tmp_path: Path) -> None:
    """Every dump lists the world's group in its pg_config: checking ranks once per dump and member made loading
    1,024 ranks' dumps a million steps (0.8 s). Each group's members count once, each with the file listing it."""
    from rankscope.datasets.loading.names import pg_members
    from rankscope.datasets.readers.flight_recorder import read_fr_dir

    generate_fr("tp=2,pp=2,dp=4", fault="clean").write(tmp_path / "fr")
    dumps = read_fr_dir(tmp_path / "fr")
    groups = {(n, cfg.ranks) for d in dumps for n, cfg in d.pg_config.items() if cfg.ranks}
    listed = list(pg_members(dumps))
    assert len(dumps) == 16 and len(listed) == sum(len(r) for _, r in groups) < 16 * 16
    assert {r for r, _ in listed} == set(range(16)) and all(w.endswith("(pg_config)") for _, w in listed)
