"""Local backend: simulated machines on this host, a warm standby pool, torchrun relaunched around them.

A *machine* is a named slot that runs one torchrun agent (``--nnodes=N --node-rank=i``, static rendezvous
on 127.0.0.1) with ``nproc_per_machine`` local ranks, so ranks ``i*P .. i*P+P-1`` live on machine ``i``,
as on a real cluster. Each agent runs in its own session (process group), so a machine's processes can be
killed together. Standby machines wait in a pool (ByteRobust keeps them self-checked and asleep at a
barrier; here they are names until a slot needs them).

Evicting a machine kills the job on every machine (a collective job cannot go on without a member),
quarantines the evicted machine, and puts the first usable standby into its slot, so its ranks move to
the standby. Restarting relaunches every slot with ``RANKSCOPE_RESUME_FROM`` pointing at the newest
complete checkpoint.

The checkpoint contract (what the training script does): checkpoints live in
``RANKSCOPE_CKPT_ROOT/step-<N>/``; a checkpoint is complete once the file ``COMPLETE`` exists in it,
written after every rank has finished writing (a barrier). The script resumes from
``RANKSCOPE_RESUME_FROM`` when it is set and not empty. It also gets ``RANKSCOPE_MACHINE`` (its machine's
name), ``RANKSCOPE_GENERATION`` (how many times the job was launched) and ``RANKSCOPE_NODE_RANK``.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from rankscope.spine import InputError, RecoveryError

from ..classify import LogLine
from ..guardrails import check_placement
from ..plan import Action, Plan
from .base import StepResult, check_nodes

COMPLETE_MARKER = "COMPLETE"
_STEP_DIR = re.compile(r"^step-(\d+)$")


def newest_complete_checkpoint(root: str | os.PathLike[str], *, before_step: int | None = None) -> Path | None:
    """The ``step-<N>`` directory with the highest N that has its ``COMPLETE`` marker (N < before_step)."""
    best: tuple[int, Path] | None = None
    try:
        entries = list(Path(root).iterdir())
    except FileNotFoundError:
        return None
    for d in entries:
        m = _STEP_DIR.match(d.name)
        if not m or not (d / COMPLETE_MARKER).is_file():
            continue
        step = int(m.group(1))
        if before_step is not None and step >= before_step:
            continue
        if best is None or step > best[0]:
            best = (step, d)
    return best[1] if best else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class _Running:
    machine: str
    node_rank: int
    proc: subprocess.Popen[bytes]
    log: Path


class LocalBackend:
    """Runs a torchrun job on named local machine slots and carries plans out on it."""

    name = "local"

    def __init__(
        self,
        *,
        command: Sequence[str],
        machines: Sequence[str],
        ckpt_root: str | os.PathLike[str],
        run_dir: str | os.PathLike[str],
        standby: Sequence[str] = (),
        nproc_per_machine: int = 1,
        quarantine: Sequence[str] = (),
        python: str = sys.executable,
        env: Mapping[str, str] | None = None,
        stop_grace_seconds: float = 10.0,
        launcher: Sequence[str] | None = None,
    ) -> None:
        if not command:
            raise InputError("local backend: the training command is empty")
        if not machines:
            raise InputError("local backend: at least one machine is needed")
        if nproc_per_machine < 1:
            raise InputError(f"local backend: nproc_per_machine={nproc_per_machine} must be >= 1")
        self.command = list(command)
        self.slots = list(check_nodes(list(machines)))
        self.standby = list(check_nodes(list(standby)))
        dup = sorted(set(self.slots) & set(self.standby))
        if dup or len(set(self.slots)) != len(self.slots):
            raise InputError(f"local backend: machine names must be unique (slots and standby share {dup})")
        self.nproc = nproc_per_machine
        self.ckpt_root = Path(ckpt_root)
        self.run_dir = Path(run_dir)
        self.quarantine = set(quarantine)
        self.python = python
        self.launcher = list(launcher) if launcher else [python, "-m", "torch.distributed.run"]
        self.env = dict(env if env is not None else os.environ)
        self.stop_grace_seconds = stop_grace_seconds
        self.generation = 0
        self.running: list[_Running] = []
        self.evicted: list[str] = []

    # -- the job -----------------------------------------------------------------------------------------

    def torchrun_argv(self, node_rank: int, port: int) -> list[str]:
        return [
            *self.launcher,
            f"--nnodes={len(self.slots)}",
            f"--nproc-per-node={self.nproc}",
            f"--node-rank={node_rank}",
            "--master-addr=127.0.0.1",
            f"--master-port={port}",
            "--max-restarts=0",
            *self.command,
        ]

    def launch(self, resume_from: str | os.PathLike[str] | None = None) -> list[StepResult]:
        """Start one torchrun agent per slot (generation += 1), resuming from ``resume_from`` if given."""
        check_placement(self.slots, frozenset(self.quarantine))
        self.stop()
        self.generation += 1
        port = free_port()
        gen_dir = self.run_dir / f"gen-{self.generation}"
        gen_dir.mkdir(parents=True, exist_ok=True)
        self.ckpt_root.mkdir(parents=True, exist_ok=True)
        out = []
        for i, machine in enumerate(self.slots):
            argv = self.torchrun_argv(i, port)
            env = {
                **self.env,
                "RANKSCOPE_MACHINE": machine,
                "RANKSCOPE_NODE_RANK": str(i),
                "RANKSCOPE_CKPT_ROOT": str(self.ckpt_root),
                "RANKSCOPE_RESUME_FROM": str(resume_from or ""),
                "RANKSCOPE_GENERATION": str(self.generation),
            }
            log = gen_dir / f"{machine}.log"
            with open(log, "wb") as fh:
                proc = subprocess.Popen(
                    argv,
                    env=env,
                    stdout=fh,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                    cwd=str(self.run_dir),
                )
            self.running.append(_Running(machine, i, proc, log))
            out.append(StepResult("restart", _describe(argv, machine, resume_from), "ok", f"pid {proc.pid}"))
        return out

    def poll(self) -> dict[str, int | None]:
        return {r.machine: r.proc.poll() for r in self.running}

    def wait(self, timeout_seconds: float) -> dict[str, int | None]:
        """Wait until every machine's agent has exited, or the timeout; their exit codes (None: running)."""
        deadline = time.monotonic() + timeout_seconds
        while time.monotonic() < deadline and any(r.proc.poll() is None for r in self.running):
            time.sleep(0.1)
        return self.poll()

    def wait_any_failure(self, timeout_seconds: float) -> dict[str, int | None]:
        """Wait until one machine's agent failed or all finished (or the timeout)."""
        deadline = time.monotonic() + timeout_seconds
        while time.monotonic() < deadline:
            codes = self.poll()
            if any(c not in (None, 0) for c in codes.values()) or all(c is not None for c in codes.values()):
                return codes
            time.sleep(0.1)
        return self.poll()

    def stop(self, machines: Sequence[str] | None = None) -> None:
        """SIGTERM the machines' process groups, SIGKILL what is left after the grace period."""
        targets = [r for r in self.running if machines is None or r.machine in machines]
        for r in targets:
            if r.proc.poll() is None:
                _signal_group(r.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + self.stop_grace_seconds
        for r in targets:
            try:
                r.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            _signal_group(r.proc.pid, signal.SIGKILL)  # the agent's workers too, if any outlived it
            r.proc.wait()
        self.running = [r for r in self.running if r not in targets]

    def logs(self, generation: int | None = None) -> list[LogLine]:
        """Every line the machines printed in one generation (default: the latest), tagged with the machine."""
        gen = self.generation if generation is None else generation
        out = []
        for log in sorted((self.run_dir / f"gen-{gen}").glob("*.log")):
            try:
                text = log.read_text(errors="replace")
            except OSError:
                continue
            t = log.stat().st_mtime
            out += [LogLine(line, node=log.stem, time=t, source=str(log)) for line in text.splitlines()]
        return out

    # -- plan actions ------------------------------------------------------------------------------------

    def _replacements(self, evict: Sequence[str], planned: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
        pool = [m for m in self.standby if m not in self.quarantine and m not in evict]
        chosen: list[tuple[str, str]] = []
        wanted = dict(planned)
        for node in evict:
            if node not in self.slots:
                continue
            sb = wanted.get(node)
            if sb not in pool:
                sb = pool[0] if pool else None
            if sb is None:
                raise RecoveryError(
                    f"no usable standby machine for {node} (pool {self.standby}, quarantined "
                    f"{sorted(self.quarantine)}): replenish the pool"
                )
            pool.remove(sb)
            chosen.append((node, sb))
        return chosen

    def evict(self, nodes: Sequence[str], planned: Sequence[tuple[str, str]] = (), *, apply: bool) -> list[StepResult]:
        nodes = check_nodes(list(nodes))
        unknown = [n for n in nodes if n not in self.slots]
        pairs = self._replacements(nodes, planned)
        steps = [
            StepResult(
                "evict",
                f"stop the job on every machine (SIGTERM, then SIGKILL after {self.stop_grace_seconds:g} s)",
                "dry-run",
            )
        ]
        for node, sb in pairs:
            i = self.slots.index(node)
            steps.append(
                StepResult(
                    "evict",
                    f"quarantine {node}; slot {i} (ranks {i * self.nproc}-"
                    f"{(i + 1) * self.nproc - 1}): {node} -> standby {sb}",
                    "dry-run",
                )
            )
        steps += [StepResult("evict", f"{n}", "noop", "not one of the job's machines") for n in unknown]
        if not apply:
            return steps
        self.stop()
        for node, sb in pairs:
            self.slots[self.slots.index(node)] = sb
            self.standby.remove(sb)
            self.quarantine.add(node)
            self.evicted.append(node)
        return [StepResult(s.action, s.command, "ok" if s.outcome == "dry-run" else s.outcome, s.detail) for s in steps]

    def carry_out(self, action: Action, plan: Plan, *, apply: bool) -> list[StepResult]:
        if action.kind == "evict":
            return self.evict(action.nodes, action.replacements, apply=apply)
        if action.kind in ("restart", "rollback"):
            if action.kind == "rollback" and action.code_version:
                return [
                    StepResult(
                        "rollback",
                        "(manual)",
                        "noop",
                        f"switch the training code to {action.code_version}; then restart",
                    )
                ]
            if action.kind == "rollback":
                ck = (
                    Path(action.checkpoint)
                    if action.checkpoint
                    else newest_complete_checkpoint(self.ckpt_root, before_step=action.step)
                )
            else:
                ck = newest_complete_checkpoint(self.ckpt_root)
            if not apply:  # show the slots as they will be once this plan's evictions are done
                moved = (
                    dict(self._replacements([n for n in plan.evicted if n in self.slots], action.replacements))
                    if plan.evicted and any(n in self.slots for n in plan.evicted)
                    else {}
                )
                return [
                    StepResult(
                        action.kind,
                        _describe(self.torchrun_argv(i, 0), moved.get(m, m), ck).replace(
                            "--master-port=0", "--master-port=<free port>"
                        ),
                        "dry-run",
                    )
                    for i, m in enumerate(self.slots)
                ]
            return self.launch(ck)
        if action.kind == "stop":
            if apply:
                self.stop()
            return [StepResult("stop", f"stop the job on {', '.join(self.slots)}", "ok" if apply else "dry-run")]
        return [StepResult(action.kind, "(none)", "noop", "recorded in the audit trail only")]


def _describe(argv: Sequence[str], machine: str, resume: object) -> str:
    return f"[{machine}] RANKSCOPE_MACHINE={machine} RANKSCOPE_RESUME_FROM={resume or ''} " + " ".join(argv)


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
