"""What a dump's path says about its machine: folders that hold evidence (``stacks/``, ``py-spy-1/``) name no
machine, the folder above them does."""

from __future__ import annotations

import pytest

from rankscope.datasets.readers.identity import path_facts


@pytest.mark.parametrize(
    "rel, host",
    [
        ("mixtral-pt-worker-1/py-spy-2/stack-7.txt", "mixtral-pt-worker-1"),
        ("gpu-node-a/dumps_3/rank5.txt", "gpu-node-a"),
        ("trn-a01/stacks/local_rank0.txt", "trn-a01"),
        ("trn-a01/pyspy-json-2/local_rank0.json", "trn-a01"),
        ("cn0418/rank5.txt", "cn0418"),
        ("round-2/trn-a02/rank5.txt", "trn-a02"),
    ],
)
def test_numbered_evidence_folders_name_no_machine(rel: str, host: str) -> None:
    assert path_facts(rel).host == host


def test_py_spy_json_tells_the_process_instance_from_its_main_thread() -> None:
    import json

    from rankscope.datasets.readers.pyspy_json import parse_pyspy_json

    def dump(pid: int, pthread: int) -> list[dict]:
        main = {
            "pid": pid,
            "thread_id": pthread,
            "thread_name": "MainThread",
            "os_thread_id": pid,
            "active": True,
            "owns_gil": False,
            "frames": [{"name": "f", "filename": "train.py", "line": 3}],
        }
        return [main, {**main, "thread_id": pthread + 4096, "thread_name": "pin", "os_thread_id": pid + 1}]

    (a,) = parse_pyspy_json(json.dumps(dump(9, 140460357215936)).encode(), "a.json")
    (b,) = parse_pyspy_json(json.dumps(dump(9, 139871232112320)).encode(), "b.json")
    assert a.pid == b.pid == 9 and a.instance == 140460357215936 and b.instance == 139871232112320
    (c,) = parse_pyspy_json(json.dumps(dump(9, 7)).encode(), "c.json")  # not an address: no instance
    assert c.instance is None


def test_a_machine_named_like_a_word_with_digits_stays_a_machine() -> None:
    assert path_facts("data01/rank3.txt").host == "data01"
    assert path_facts("h1/data/rank3.txt").host == "h1"


def test_a_console_gone_before_its_stacks_are_read_gives_no_stacks(tmp_path) -> None:
    """The console is read as a log either way; its stacks are an extra read that may fail on its own."""
    from rankscope.datasets.readers.consolestacks import console_found

    head = b"".join(f"{k % 2}: line {k}\n".encode() for k in range(8))
    assert console_found(str(tmp_path / "gone.out"), "gone.out", head) == []
