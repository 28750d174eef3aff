"""Stack readers: py-spy text, py-spy JSON, faulthandler/traceback text, dump directories."""

from __future__ import annotations

import json

import pytest

from rankscope.datasets.loading.inputs import load_inputs
from rankscope.datasets.readers.dumpdir import read_stack_file, scan_dump_dir
from rankscope.datasets.readers.faulthandler import parse_traceback_text
from rankscope.datasets.readers.pyspy_json import parse_pyspy_json
from rankscope.datasets.readers.pyspy_text import parse_pyspy_text
from rankscope.spine import InputError

PYSPY_TEXT = """Process 4242: python pretrain_gpt.py --tensor-model-parallel-size 8
Python v3.10.12 (/usr/bin/python3.10)

Thread 4242 (active+gil): "MainThread"
    all_reduce (torch/distributed/distributed_c10d.py:2050)
        Arguments:
            tensor: <Tensor at 0x7f>
    _reduce (megatron/core/tensor_parallel/mappings.py:24)
    <module> (pretrain_gpt.py:12)
Thread 0x7F3A2B1C (idle): "Thread-2 (_pin_memory_loop)"
    wait (threading.py:320)
    ncclKernel (libnccl.so.2)
Process 4300: python pretrain_gpt.py --tensor-model-parallel-size 8
Python v3.10.12 (/usr/bin/python3.10)

Thread 4300 (idle): "MainThread"
    select (selectors.py:416)
    _worker_loop (torch/utils/data/_utils/worker.py:308)
"""


def test_pyspy_text_processes_threads_markers_and_locals():
    procs = parse_pyspy_text(PYSPY_TEXT, "rank0.txt")
    assert [p.pid for p in procs] == [4242, 4300]
    main = procs[0].main_thread
    assert main.thread_name == "MainThread" and main.active is True
    assert [f.function for f in main.frames] == ["all_reduce", "_reduce", "<module>"]
    assert main.frames[0].file == "torch/distributed/distributed_c10d.py" and main.frames[0].line == 2050
    other = procs[0].threads[1]
    assert other.thread_id == 0x7F3A2B1C and other.active is False
    assert other.frames[1].function == "ncclKernel" and other.frames[1].line is None
    assert procs[1].main_thread.frames[-1].function == "_worker_loop"


def test_pyspy_text_truncated_and_errors():
    cut = PYSPY_TEXT[: PYSPY_TEXT.index("_reduce (mega") + 10]
    procs = parse_pyspy_text(cut, "r.txt")
    assert procs[0].status == "partial"
    assert [f.function for f in procs[0].main_thread.frames] == ["all_reduce"]
    (failed,) = parse_pyspy_text("Error: Failed to find python version from target process\n", "r.txt")
    assert failed.status == "failed" and "Failed to find python version" in failed.error
    (empty,) = parse_pyspy_text("", "r.txt")
    assert empty.status == "failed" and "empty" in empty.error


def test_real_probe_text_and_json_agree(probe_dir):
    for r in range(4):
        t = parse_pyspy_text((probe_dir / "pyspy/text" / f"rank{r}.txt").read_text(), "t")
        j = parse_pyspy_json((probe_dir / "pyspy/json" / f"rank{r}.json").read_text(), "j")
        assert t[0].pid == j[0].pid
        tf = [f.function for f in t[0].main_thread.frames]
        jf = [f.function for f in j[0].main_thread.frames]
        assert tf == jf
    j0 = parse_pyspy_json((probe_dir / "pyspy/json/rank0.json").read_text(), "j")[0]
    assert j0.main_thread.frames[0].function == "all_reduce"
    assert j0.main_thread.frames[0].file.endswith("site-packages/torch/distributed/distributed_c10d.py")
    assert len(j0.threads) == 2


def test_pyspy_json_truncated_salvages_complete_threads(probe_dir):
    text = (probe_dir / "pyspy/json/rank0.json").read_text()
    cut = text[: text.index('"MainThread"') + 40]
    (p,) = parse_pyspy_json(cut, "r.json")
    assert p.status == "partial" and len(p.threads) == 1
    (bad,) = parse_pyspy_json("Error: Permission denied (os error 13)\n", "r.json")
    assert bad.status == "failed" and "Permission denied" in bad.error


FAULTHANDLER = """Thread 0x00007f2a1c1fe640 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 320 in wait
  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap

Current thread 0x00007f2a2a3b4740 (most recent call first):
  File "/opt/conda/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 2050 in all_reduce
  File "/workspace/Megatron-LM/pretrain_gpt.py", line 33 in <module>
"""

TRACEBACK = """Stack (most recent call last):
  File "/opt/job/train.py", line 33, in <module>
    main()
  File "/opt/job/train.py", line 20, in main
    dist.all_reduce(t)
  File "/usr/lib/python3/dist-packages/torch/distributed/distributed_c10d.py", line 2050, in all_reduce
    work.wait()
"""


def test_faulthandler_innermost_first_and_main_thread():
    (p,) = parse_traceback_text(FAULTHANDLER, "f.txt")
    assert len(p.threads) == 2
    main = p.main_thread
    assert main.thread_id == 0x00007F2A2A3B4740
    assert [f.function for f in main.frames] == ["all_reduce", "<module>"]
    assert main.frames[0].line == 2050


def test_traceback_text_is_reversed_to_innermost_first():
    (p,) = parse_traceback_text(TRACEBACK, "t.txt")
    assert [f.function for f in p.main_thread.frames] == ["all_reduce", "main", "<module>"]
    (bad,) = parse_traceback_text("hello\n", "t.txt")
    assert bad.status == "failed"


def test_read_stack_file_sniffs_the_format(tmp_path):
    (tmp_path / "a.txt").write_text(FAULTHANDLER)
    (tmp_path / "b.txt").write_text(PYSPY_TEXT)
    assert read_stack_file(tmp_path / "a.txt")[0].source_format == "faulthandler"
    assert read_stack_file(tmp_path / "b.txt")[0].source_format == "pyspy-text"


def test_dump_dir_manifest_snapshots_and_missing(tmp_path):
    for s in (0, 1):
        d = tmp_path / f"snapshot-{s}"
        d.mkdir()
        (d / "rank0.txt").write_text(PYSPY_TEXT)
        (d / "rank1.json").write_text(
            json.dumps(
                [
                    {
                        "pid": 9,
                        "thread_name": "MainThread",
                        "frames": [{"name": "<module>", "filename": "/x/train.py", "line": 3}],
                    }
                ]
            )
        )
    dd = scan_dump_dir(tmp_path, gpus_per_node=1)
    assert sorted((f.snapshot, f.rank, f.node) for f in dd.files if f.role == "trainer") == [  # nobody named them
        (0, 0, None),
        (0, 1, None),
        (1, 0, None),
        (1, 1, None),
    ]
    inputs = load_inputs(tmp_path, gpus_per_node=1)  # the loader invents names, and says so
    assert sorted((p.snapshot, p.rank, p.node) for p in inputs.procs if p.role == "trainer") == [
        (0, 0, "node-0"),
        (0, 1, "node-1"),
        (1, 0, "node-0"),
        (1, 1, "node-1"),
    ]
    assert inputs.inferred_nodes == ("node-0", "node-1")
    assert any("inferred as node-<rank // 1>" in n for n in inputs.notes)
    (tmp_path / "manifest.csv").write_text(
        "file,rank,node,role,snapshot\nsnapshot-0/rank0.txt,0,hostA,trainer,0\nsnapshot-0/rank1.json,1,hostB,,0\n"
        "snapshot-0/rank2.txt,2,hostB,trainer,0\n"
    )
    dd = scan_dump_dir(tmp_path)
    by_rank = {f.rank: f for f in dd.files if f.role == "trainer"}
    assert by_rank[0].node == "hostA" and by_rank[1].node == "hostB"
    assert by_rank[2].processes[0].status == "failed"  # listed, absent
    assert any("not in manifest" in n for n in dd.notes)


@pytest.mark.parametrize(
    "manifest, msg",
    [
        ("file,node\nrank0.txt,n\n", "missing rank"),
        ("file,rank,node\nrank0.txt,x,n\n", "not a non-negative integer"),
        ("file,rank,node,role\nrank0.txt,0,n,gpu\n", "role 'gpu'"),
    ],
)
def test_bad_manifest_is_one_clear_error(tmp_path, manifest, msg):
    (tmp_path / "rank0.txt").write_text(PYSPY_TEXT)
    (tmp_path / "manifest.csv").write_text(manifest)
    with pytest.raises(InputError, match=msg) as exc:
        scan_dump_dir(tmp_path)
    assert "manifest.csv" in str(exc.value)


def test_empty_or_missing_dir(tmp_path):
    with pytest.raises(InputError, match="no stack dumps"):
        scan_dump_dir(tmp_path)
    with pytest.raises(InputError, match="no such file"):
        scan_dump_dir(tmp_path / "nope")


def test_native_addresses_are_one_frame_in_every_process() -> None:
    # py-spy --native: unsymbolized frames are raw addresses, different in every process (ASLR); the stacks of
    # two ranks waiting in the same place must still compare equal (an outside tester's real --native dumps)
    def text(addr: str) -> str:
        return (
            "Process 17107: python3 -u train.py\nPython v3.11.7 (/usr/bin/python3.11)\n\n"
            'Thread 17107 (idle): "MainThread"\n'
            f"    {addr} (libc.so.6)\n    pthread_cond_wait (libc.so.6)\n"
            "    all_reduce (torch/distributed/distributed_c10d.py:3252)\n    main (train.py:62)\n"
        )

    a, b = (parse_pyspy_text(text(x), "r")[0].threads[0].frames for x in ("0x7f0911aa3f16", "0x7fe46bea3f16"))
    assert a == b and a[0].function == "0x?" and a[0].file == "libc.so.6"
    frames = [
        {"name": "0x7f0911aa3f16", "filename": "libc.so.6", "line": 0},
        {"name": "main", "filename": "t.py", "line": 3},
    ]
    j = parse_pyspy_json(json.dumps([{"pid": 1, "thread_name": "MainThread", "frames": frames}]), "r")
    assert j[0].threads[0].frames[0].function == "0x?"
