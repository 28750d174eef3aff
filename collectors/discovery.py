"""Process discovery: find the launcher's tree in /proc and say what every process is.

A *launcher* is torchrun / ``torch.distributed.run`` / ``torch.distributed.launch``. A *trainer*
is a process with ``RANK`` in its environment that is not a child of another trainer (torchrun's
workers, or srun/mpirun-launched ranks when no launcher is found). Children of a trainer are
classified by name: torch names DataLoader workers ``pt_data_worker``; a ``checkpoint``/``ckpt``
name (or the hook's :func:`~rankscope.collectors.hook.set_role`, which sets ``rs_checkpoint``)
makes a checkpoint process; anything else is ``other``. A child carries its trainer's rank.
``proc_root`` is a parameter so tests can point discovery at a fake tree.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

LAUNCHER_MARKERS = ("torchrun", "torch.distributed.run", "torch.distributed.launch")
DATALOADER_NAMES = ("pt_data_worker", "rs_dataloader")
CHECKPOINT_MARKERS = ("checkpoint", "ckpt")
ENV_KEYS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR")


@dataclass(frozen=True)
class ProcInfo:
    """One discovered process. ``role`` is trainer, dataloader, checkpoint, launcher or other."""

    pid: int
    ppid: int
    comm: str
    cmdline: str
    start_ticks: int
    role: str = "other"
    rank: int | None = None
    local_rank: int | None = None
    world_size: int | None = None
    group_rank: int | None = None
    master_addr: str | None = None
    trainer_pid: int | None = None  # for children: the trainer they belong to

    def to_row(self, *, job: str, node: str, time: object) -> dict[str, object]:
        """A row of the ``processes`` table (a launcher is stored with role ``other``)."""
        return {
            "job": job,
            "time": time,
            "node": node,
            "pid": self.pid,
            "ppid": self.ppid,
            "role": self.role if self.role != "launcher" else "other",
            "rank": self.rank,
            "local_rank": self.local_rank,
            "world_size": self.world_size,
            "group_rank": self.group_rank,
            "master_addr": self.master_addr,
            "cmdline": self.cmdline[:1000],
            "comm": self.comm,
            "trainer_pid": self.trainer_pid,
            "is_launcher": self.role == "launcher",
        }


def read_stat(pid: int, proc_root: str = "/proc") -> tuple[str, int, int] | None:
    """(comm, ppid, start_ticks) of ``pid``, or None when it is gone or unreadable."""
    try:
        fd = os.open(f"{proc_root}/{pid}/stat", os.O_RDONLY)
    except OSError:
        return None
    try:
        data = os.read(fd, 4096).decode(errors="replace")
    except OSError:
        return None
    finally:
        os.close(fd)
    lpar, rpar = data.find("("), data.rfind(")")
    if lpar < 0 or rpar < 0:
        return None
    rest = data[rpar + 2 :].split()
    try:
        return data[lpar + 1 : rpar], int(rest[1]), int(rest[19])
    except (IndexError, ValueError):
        return None


def read_cmdline(pid: int, proc_root: str = "/proc") -> str:
    try:
        with open(f"{proc_root}/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def read_environ(pid: int, proc_root: str = "/proc", keys: Iterable[str] = ENV_KEYS) -> dict[str, str]:
    """The ``keys`` of ``pid``'s environment (empty when unreadable: another user, or gone)."""
    try:
        with open(f"{proc_root}/{pid}/environ", "rb") as fh:
            raw = fh.read()
    except OSError:
        return {}
    want = set(keys)
    out = {}
    for item in raw.split(b"\0"):
        k, sep, v = item.partition(b"=")
        if sep and k.decode(errors="replace") in want:
            out[k.decode()] = v.decode(errors="replace")
    return out


def alive(pid: int, start_ticks: int | None = None, proc_root: str = "/proc") -> bool:
    """True when ``pid`` still exists (and is the same process, when ``start_ticks`` is given)."""
    st = read_stat(pid, proc_root)
    return st is not None and (start_ticks is None or st[2] == start_ticks)


def _int(v: str | None) -> int | None:
    try:
        return int(v) if v is not None else None
    except ValueError:
        return None


def _is_launcher(cmdline: str) -> bool:
    head = cmdline.split(" -m rankscope")[0]  # a worker's own arguments do not count
    return any(m in head for m in LAUNCHER_MARKERS) and "RANK" not in head


def classify_child(comm: str, cmdline: str, declared: str | None = None) -> str:
    """Role of a trainer's descendant from its name (or the role the hook declared)."""
    if declared in ("dataloader", "checkpoint"):
        return declared
    name = comm.lower()
    if name in DATALOADER_NAMES or name.startswith("pt_data_worker"):
        return "dataloader"
    if any(m in name for m in CHECKPOINT_MARKERS) or any(m in cmdline.lower() for m in CHECKPOINT_MARKERS):
        return "checkpoint"
    return "other"


def discover(
    proc_root: str = "/proc", *, declared_roles: Mapping[int, str] | None = None, only_under: int | None = None
) -> list[ProcInfo]:
    """Every launcher, trainer and trainer descendant visible in ``proc_root``, sorted by pid.

    ``declared_roles`` maps pid -> role announced by the hook; ``only_under`` restricts the search
    to the descendants of one pid (one job on a shared node).
    """
    declared = declared_roles or {}
    stats: dict[int, tuple[str, int, int]] = {}
    try:
        names = os.listdir(proc_root)
    except OSError:
        return []
    for name in names:
        if name.isdigit():
            st = read_stat(int(name), proc_root)
            if st is not None:
                stats[int(name)] = st
    children: dict[int, list[int]] = {}
    for pid, (_, ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    scope: set[int] = set()
    if only_under is not None:
        stack = [only_under]
        while stack:
            p = stack.pop()
            if p in stats and p not in scope:
                scope.add(p)
                stack.extend(children.get(p, ()))
    else:
        scope = set(stats)

    out: dict[int, ProcInfo] = {}
    cmdlines = {pid: read_cmdline(pid, proc_root) for pid in scope}
    trainers: list[int] = []
    for pid in sorted(scope):
        comm, ppid, start = stats[pid]
        cmd = cmdlines[pid]
        if _is_launcher(cmd):
            out[pid] = ProcInfo(pid, ppid, comm, cmd, start, role="launcher")
            continue
        if "python" not in cmd and "python" not in comm and not cmd.startswith("pt_"):
            continue
        env = read_environ(pid, proc_root)
        if "RANK" not in env:
            continue
        out[pid] = ProcInfo(
            pid,
            ppid,
            comm,
            cmd,
            start,
            role="trainer",
            rank=_int(env.get("RANK")),
            local_rank=_int(env.get("LOCAL_RANK")),
            world_size=_int(env.get("WORLD_SIZE")),
            group_rank=_int(env.get("GROUP_RANK")),
            master_addr=env.get("MASTER_ADDR"),
        )
        trainers.append(pid)
    # A "trainer" below another trainer is its child (fork inherits RANK): reclassify top-down.
    for pid in trainers:
        info = out[pid]
        anc = _trainer_ancestor(pid, stats, out)
        if anc is not None:
            out[pid] = replace(
                info,
                role=classify_child(info.comm, info.cmdline, declared.get(pid)),
                rank=out[anc].rank,
                trainer_pid=anc,
            )
    # Descendants of trainers that do not carry RANK (spawned with a clean environment).
    for pid in sorted(scope):
        if pid in out:
            continue
        anc = _trainer_ancestor(pid, stats, out)
        if anc is None:
            continue
        comm, ppid, start = stats[pid]
        out[pid] = ProcInfo(
            pid,
            ppid,
            comm,
            cmdlines[pid],
            start,
            role=classify_child(comm, cmdlines[pid], declared.get(pid)),
            rank=out[anc].rank,
            world_size=out[anc].world_size,
            trainer_pid=anc,
        )
    return [out[p] for p in sorted(out)]


def _trainer_ancestor(pid: int, stats: Mapping[int, tuple[str, int, int]], known: Mapping[int, ProcInfo]) -> int | None:
    seen = set()
    p = stats[pid][1] if pid in stats else 0
    while p > 1 and p not in seen:
        seen.add(p)
        info = known.get(p)
        if info is not None and info.role == "trainer" and info.trainer_pid is None:
            return p
        p = stats[p][1] if p in stats else 0
    return None


def descendants(pid: int, proc_root: str = "/proc") -> list[int]:
    """Every live process below ``pid`` whatever its session (torchrun starts each worker in its own)."""
    children: dict[int, list[int]] = {}
    for name in os.listdir(proc_root):
        if name.isdigit():
            st = read_stat(int(name), proc_root)
            if st is not None:
                children.setdefault(st[1], []).append(int(name))
    out, stack = [], list(children.get(pid, ()))
    while stack:
        p = stack.pop()
        out.append(p)
        stack.extend(children.get(p, ()))
    return out


def self_and_ancestors(pid: int | None = None, proc_root: str = "/proc") -> set[int]:
    """``pid`` and its ancestors (the agent never captures or classifies its own lineage)."""
    pid = os.getpid() if pid is None else pid
    out = set()
    while pid > 1 and pid not in out:
        out.add(pid)
        st = read_stat(pid, proc_root)
        if st is None:
            break
        pid = st[1]
    return out
