"""Process discovery: a fake /proc tree for the edge cases, and real child processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from rankscope.collectors import discovery


def fake_proc(
    root: Path, pid: int, ppid: int, comm: str, cmdline: str, env: dict[str, str] | None = None, start: int = 100
) -> None:
    d = root / str(pid)
    d.mkdir(parents=True)
    fields = ["S", str(ppid)] + ["0"] * 17 + [str(start)] + ["0"] * 5
    (d / "stat").write_text(f"{pid} ({comm}) {' '.join(fields)}\n")
    (d / "cmdline").write_bytes(cmdline.replace(" ", "\0").encode() + b"\0")
    if env is not None:
        (d / "environ").write_bytes(b"\0".join(f"{k}={v}".encode() for k, v in env.items()) + b"\0")


def rank_env(rank: int) -> dict[str, str]:
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(rank % 2),
        "WORLD_SIZE": "2",
        "GROUP_RANK": "0",
        "MASTER_ADDR": "10.0.0.1",
        "PATH": "/usr/bin",
    }


def test_fake_tree_roles_ranks_and_children(tmp_path: Path) -> None:
    fake_proc(tmp_path, 1, 0, "init", "/sbin/init")
    fake_proc(tmp_path, 100, 1, "torchrun", "/usr/bin/python /usr/bin/torchrun --nproc-per-node 2 train.py", {})
    fake_proc(tmp_path, 101, 100, "python", "/usr/bin/python -u train.py", rank_env(0))
    fake_proc(tmp_path, 102, 100, "python", "/usr/bin/python -u train.py", rank_env(1))
    # forked children inherit RANK: a DataLoader worker and a checkpoint writer
    fake_proc(tmp_path, 201, 101, "pt_data_worker", "/usr/bin/python -u train.py", rank_env(0))
    fake_proc(tmp_path, 202, 102, "rs_checkpoint", "/usr/bin/python -u train.py", rank_env(1))
    # a grandchild without RANK (spawned with a clean environment), and an unrelated process
    fake_proc(tmp_path, 301, 201, "sh", "/bin/sh -c true", {})
    fake_proc(tmp_path, 400, 1, "python", "/usr/bin/python other.py", {"PATH": "/usr/bin"})
    (tmp_path / "self").mkdir()

    procs = {p.pid: p for p in discovery.discover(str(tmp_path))}
    assert procs[100].role == "launcher"
    assert (procs[101].role, procs[101].rank, procs[101].master_addr) == ("trainer", 0, "10.0.0.1")
    assert (procs[102].role, procs[102].rank, procs[102].local_rank, procs[102].world_size) == ("trainer", 1, 1, 2)
    assert (procs[201].role, procs[201].rank, procs[201].trainer_pid) == ("dataloader", 0, 101)
    assert (procs[202].role, procs[202].rank) == ("checkpoint", 1)
    assert (procs[301].role, procs[301].rank) == ("other", 0)
    assert 400 not in procs and 1 not in procs
    row = procs[100].to_row(job="j", node="n", time=None)
    assert row["role"] == "other" and row["is_launcher"] is True


def test_unreadable_environ_vanished_pid_and_scope(tmp_path: Path) -> None:
    fake_proc(tmp_path, 10, 1, "python", "python train.py", None)  # environ unreadable (other user)
    fake_proc(tmp_path, 11, 1, "python", "python train.py", rank_env(0))
    fake_proc(tmp_path, 12, 11, "python", "python helper.py", {})
    (tmp_path / "13").mkdir()  # vanished between listdir and read
    (tmp_path / "14").mkdir()
    (tmp_path / "14" / "stat").write_text("garbage")
    procs = {p.pid: p for p in discovery.discover(str(tmp_path))}
    assert set(procs) == {11, 12}
    assert procs[12].role == "other" and procs[12].rank == 0
    assert [p.pid for p in discovery.discover(str(tmp_path), only_under=12)] == []  # no trainer at or above 12 in scope
    assert {p.pid for p in discovery.discover(str(tmp_path), only_under=11)} == {11, 12}
    assert discovery.alive(11, 100, str(tmp_path)) and not discovery.alive(11, 999, str(tmp_path))
    assert not discovery.alive(13, None, str(tmp_path))


def test_declared_role_wins_over_name(tmp_path: Path) -> None:
    fake_proc(tmp_path, 11, 1, "python", "python train.py", rank_env(0))
    fake_proc(tmp_path, 12, 11, "python", "python train.py", rank_env(0))
    procs = {p.pid: p for p in discovery.discover(str(tmp_path), declared_roles={12: "checkpoint"})}
    assert procs[12].role == "checkpoint"


CHILD = r"""
import os, sys, time
pid = os.fork()
if pid == 0:
    open("/proc/self/comm", "w").write("pt_data_worker")
    time.sleep(60)
    os._exit(0)
print("ready", flush=True)
time.sleep(60)
"""


def test_discovers_real_children() -> None:
    env = {
        **os.environ,
        "RANK": "3",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "4",
        "GROUP_RANK": "1",
        "MASTER_ADDR": "127.0.0.1",
    }
    proc = subprocess.Popen([sys.executable, "-c", CHILD], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        found: list[discovery.ProcInfo] = []
        for _ in range(50):
            found = discovery.discover(only_under=proc.pid)
            if any(p.comm == "pt_data_worker" for p in found):
                break
            time.sleep(0.05)
        by_role = {p.role: p for p in found}
        assert by_role["trainer"].pid == proc.pid
        assert (by_role["trainer"].rank, by_role["trainer"].world_size, by_role["trainer"].group_rank) == (3, 4, 1)
        assert by_role["dataloader"].rank == 3 and by_role["dataloader"].trainer_pid == proc.pid
        assert discovery.descendants(proc.pid) == [by_role["dataloader"].pid]
    finally:
        for p in discovery.discover(only_under=proc.pid):
            if p.pid != proc.pid:
                os.kill(p.pid, 9)
        proc.kill()
        proc.wait()
