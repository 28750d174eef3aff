"""The in-process hook never raises, works without torch, and leaves the files the agent reads."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from rankscope.collectors import hook, stacks
from rankscope.datasets.readers.rundir import (
    STACK_REQUEST,
    requested_at,
    split_faulthandler_dumps,
)

SCRIPT = r"""
import json, os, signal, sys, time
from rankscope.collectors import hook
run_dir = sys.argv[1]
hook.log_step(0, loss=1.0)                      # before install: a no-op, no error
assert hook.install(run_dir=run_dir) is True
assert hook.install(run_dir=run_dir) is True    # idempotent
hook.log_step(1, loss=2.5, grad_norm=float("nan"), tokens=4096)
hook.log_step(2, loss=object(), grad_norm="bad", weird=[1, 2])  # odd values are recorded, not raised
hook.record_groups({"tp": [0, 1], "dp": [1, 3]})
hook.record_groups()                            # no torch.distributed: nothing, no error
hook.set_role("trainer")
hook.dump_flight_recorder()                     # torch may be absent or uninitialized: no error
os.kill(os.getpid(), signal.SIGUSR2)            # faulthandler dump to the stack file
time.sleep(0.2)
print("ready", flush=True)
if sys.argv[2] == "crash":
    def inner():
        raise ValueError("boom")
    inner()
time.sleep(30)
"""


def start(tmp_path: Path, mode: str) -> subprocess.Popen:
    env = {**os.environ, "RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "RANKSCOPE_RANKS_PER_NODE": "2"}
    proc = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, str(tmp_path), mode],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    assert line == "ready", proc.stderr.read() if proc.stderr else ""
    return proc


def test_hook_files_steps_identity_stacks(tmp_path: Path) -> None:
    proc = start(tmp_path, "idle")
    try:
        ident = json.loads((tmp_path / f"pid{proc.pid}.json").read_text())
        assert (ident["rank"], ident["world_size"], ident["node"]) == (1, 4, "node-0")
        assert ident["groups"] == {"tp": [0, 1], "dp": [1, 3]} and ident["coords"] == {"tp": 1, "dp": 0}
        steps = [json.loads(line) for line in (tmp_path / f"pid{proc.pid}.steps.jsonl").read_text().splitlines()]
        assert [s["step"] for s in steps] == [1, 2]
        assert steps[0]["loss"] == 2.5 and steps[0]["grad_norm"] == "nan" and steps[0]["tokens"] == 4096
        assert steps[1]["step_time_seconds"] is not None
        assert "<module>" in (tmp_path / f"pid{proc.pid}.stack.txt").read_text()
        # the agent's fallback path: signal, then read what was appended
        dump = stacks.faulthandler_dump(proc.pid, tmp_path, timeout_seconds=2.0)
        assert dump.status == "ok" and any(f.function == "<module>" for t in dump.threads for f in t.frames)
        # FIFO control channel is alive (the request is delivered; without torch nothing is dumped)
        before = time.time()
        assert hook.request(tmp_path, proc.pid, "stack")
        time.sleep(0.3)
        text = (tmp_path / f"pid{proc.pid}.stack.txt").read_text()
        assert text.count("most recent call first") >= 3
        # a requested dump carries the time it was asked for, so a reader can tell it from a SIGTERM dump
        newest = split_faulthandler_dumps(text)[-1]
        t = requested_at(newest)
        assert t is not None and before - 1 <= t <= time.time() and "<module>" in newest
        # requests back to back all arrive: the hook holds its FIFO open read-write, so a sender never finds
        # it between two opens (the agent sends "stack" and then "fr" within milliseconds)
        assert all(hook.request(tmp_path, proc.pid, "stack") for _ in range(5))
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            text = (tmp_path / f"pid{proc.pid}.stack.txt").read_text()
            if sum(requested_at(c) is not None for c in split_faulthandler_dumps(text)) == 6:
                break
            time.sleep(0.05)
        assert sum(requested_at(c) is not None for c in split_faulthandler_dumps(text)) == 6
    finally:
        proc.kill()
        proc.wait()


def test_uncaught_exception_is_recorded_for_post_mortem(tmp_path: Path) -> None:
    proc = start(tmp_path, "crash")
    proc.wait(timeout=10)
    assert proc.returncode == 1 and "ValueError: boom" in (proc.stderr.read() if proc.stderr else "")
    dump, method = stacks.post_mortem(proc.pid, tmp_path)
    assert method == "exception" and dump.status == "ok"
    assert dump.threads[0].frames[0].function == "inner" and "ValueError: boom" in (dump.error or "")


def test_sigterm_leaves_a_last_stack(tmp_path: Path) -> None:
    proc = start(tmp_path, "idle")
    offset = (tmp_path / f"pid{proc.pid}.stack.txt").stat().st_size
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=10)
    assert proc.returncode == -signal.SIGTERM  # the default disposition still runs (chained)
    dump, method = stacks.post_mortem(proc.pid, tmp_path, offset=offset)
    assert method == "post-mortem" and any(f.function == "<module>" for t in dump.threads for f in t.frames)


def test_hook_api_is_safe_without_install_and_on_bad_input(tmp_path: Path) -> None:
    assert not hook.installed()
    hook.log_step(3, loss=1.0)
    hook.record_groups({"tp": [0]})
    hook.set_role("checkpoint")
    result = hook.dump_flight_recorder(tmp_path / "x" / "y.json")
    assert result is None or isinstance(result, str)
    assert hook.request(tmp_path, 999999, "fr") is False
    assert hook.node_name(None)  # hostname fallback
    if not os.environ.get("RANKSCOPE_HOOK"):
        assert hook.maybe_install_from_env() is False


def test_normal_exit_is_not_a_crash(tmp_path: Path) -> None:
    code = "from rankscope.collectors import hook; hook.install(run_dir=__import__('sys').argv[1]); hook.log_step(0)"
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], check=True, env={**os.environ, "RANK": "0"})
    [path] = tmp_path.glob("pid*.exit.json")
    assert json.loads(path.read_text())["type"] == "exit"
    pid = int(path.name[3:].split(".")[0])
    dump, method = stacks.post_mortem(pid, tmp_path)
    assert method == "none" and dump.error == "process exited normally"


def test_the_hook_writes_the_request_line_the_reader_expects() -> None:
    assert hook.STACK_REQUEST == STACK_REQUEST  # the hook keeps no import of the reader


DEEP = r"""
import sys, threading, time
from rankscope.collectors import hook
hook.install(run_dir=sys.argv[1])
for _ in range(4):
    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
def deep(n):
    if n == 0:
        print("ready", flush=True)
        time.sleep(60)
    deep(n - 1)
deep(40)
"""


def test_a_second_sigterm_mid_dump_never_yields_a_wrong_main_thread(tmp_path: Path) -> None:
    # the launcher's and the scheduler's SIGTERMs: faulthandler's chained handler lets the second kill
    # the process while the first one writes. Whatever is left must be either the right stack or no evidence.
    from rankscope.datasets.readers.rundir import (
        HookProcess,
        main_thread_id,
        process_dump,
    )

    outcomes = []
    for i in range(16):
        run = tmp_path / f"r{i}"
        run.mkdir()
        proc = subprocess.Popen([sys.executable, "-c", DEEP, str(run)], stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        os.kill(proc.pid, signal.SIGTERM)
        time.sleep((i % 8) * 0.0002)
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
        ident = json.loads((run / f"pid{proc.pid}.json").read_text())
        stack = run / f"pid{proc.pid}.stack.txt"
        dump = process_dump(
            HookProcess(proc.pid, {"stack.txt": str(stack)}, {"stack.txt": stack.name}),
            main_thread_id=main_thread_id(ident),
        )
        outcomes.append(dump.status)
        if dump.status != "cut":
            assert dump.main_thread is not None and dump.main_thread.frames[0].function == "deep", stack.read_text()
    assert "ok" in outcomes, outcomes


def test_post_mortem_of_a_dump_cut_before_the_main_thread_is_no_evidence(tmp_path: Path) -> None:
    (tmp_path / "pid5.json").write_text(json.dumps({"pid": 5, "rank": 0, "main_thread_id": 0x7F01}))
    (tmp_path / "pid5.stack.txt").write_text(
        "# rankscope: stack requested at 100.0\nThread 0x00007f01 (most recent call first):\n"
        '  File "/job/train.py", line 9 in step\n'  # the agent's request: not what it wrote as it died
        'Thread 0x00007f02 (most recent call first):\n  File "/usr/lib/python3.11/threading.py", line '
    )
    dump, method = stacks.post_mortem(5, tmp_path)
    assert (dump.status, method) == ("cut", "post-mortem") and "no evidence" in (dump.error or "")


def test_flight_recorder_dumps_carry_their_dump_time() -> None:
    """FR records no dump time; the hook adds one (first key, no re-parse of a large dump) under the key the
    reader knows."""
    from rankscope.datasets.domain.flight_recorder import DUMP_TIME_KEY
    from rankscope.datasets.readers import runfiles as rf
    from rankscope.datasets.readers.flight_recorder import parse_dump

    assert rf.FR_DUMP_TIME_KEY == DUMP_TIME_KEY
    text = hook._with_dump_time('  {"version": "2.10", "entries": []}', 1_796_000_000_123_456_789)
    assert json.loads(text) == {DUMP_TIME_KEY: 1_796_000_000_123_456_789, "version": "2.10", "entries": []}
    assert json.loads(hook._with_dump_time("{}", 5)) == {DUMP_TIME_KEY: 5}
    assert hook._with_dump_time("[1]", 5) == "[1]"  # not an FR object: left alone
    assert parse_dump(json.loads(text), path="fr_rank0.json").dump_time_ns == 1_796_000_000_123_456_789
