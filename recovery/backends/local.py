"""Local backend: simulated machines on this host, a warm standby pool, torchrun relaunched around them.

A *machine* is a named slot that runs one torchrun agent (``--nnodes=N --node-rank=i``, static rendezvous
on 127.0.0.1) with ``nproc_per_machine`` local ranks, so ranks ``i*P .. i*P+P-1`` live on machine ``i``,
as on a real cluster. Each slot runs under a small supervisor (:mod:`.slot`) in its own session that
records the agent's exit status. Standby machines wait in a pool (ByteRobust keeps them self-checked
and asleep at a barrier; here they are names until a slot needs them).

Evicting a machine stops the job on every machine (a collective job cannot go on without a member),
quarantines the evicted machine, and puts the first usable standby into its slot, so its ranks move to
the standby. Restarting relaunches every slot with ``RANKSCOPE_RESUME_FROM`` pointing at the newest
complete checkpoint.

The backend's state (slots, standby pool, quarantine, the running supervisors' pids and start times)
lives in ``RUN_DIR/local-cluster.json``, written atomically after every change, so another process (the
node agent's ``rankscope recover RUN_DIR --backend local --local-run-dir RUN_DIR``) loads it
(:meth:`LocalBackend.load`), acts, and the job it relaunched outlives it.

The checkpoint contract (what the training script does): checkpoints live in
``RANKSCOPE_CKPT_ROOT/step-<N>/``; a checkpoint is complete once the file ``COMPLETE`` exists in it,
written after every rank has finished writing (a barrier). The script resumes from
``RANKSCOPE_RESUME_FROM`` when it is set and not empty. It also gets ``RANKSCOPE_MACHINE`` and
``RANKSCOPE_NODE`` (its machine's name; the in-process hook reports it as the rank's node),
``RANKSCOPE_MACHINES`` (every slot's machine, in node-rank order), ``RANKSCOPE_GENERATION`` (how many
times the job was launched) and ``RANKSCOPE_NODE_RANK``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rankscope.spine import InputError, RecoveryError, atomic_write

from ..classify import LogLine
from ..guardrails import check_placement
from ..plan import Action, Plan
from ..procs import descendants, proc_start_time, signal_tree
from .base import StepResult, check_nodes
from .checkpoints import COMPLETE_MARKER, checkpoints, newest_complete_checkpoint

__all__ = ["COMPLETE_MARKER", "STATE_FILE", "LocalBackend", "checkpoints", "newest_complete_checkpoint"]

STATE_FILE = "local-cluster.json"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Running:
    """One slot's supervisor as the state file keeps it."""

    machine: str
    node_rank: int
    pid: int
    start: str  # /proc start time: (pid, start) names one process
    log: str
    exit_file: str


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
        self.env = dict(env or {})  # on top of the launching process's environment
        self.stop_grace_seconds = stop_grace_seconds
        self.generation = 0
        self.running: list[Running] = []
        self.evicted: list[str] = []
        self._procs: dict[int, subprocess.Popen[bytes]] = {}  # the supervisors this process started (reaped here)
        self.controller: dict[str, Any] = {}  # {"pid", "start"} of the controller that launches the slots, if any

    # -- state shared between processes -------------------------------------------------------------------

    @property
    def state_path(self) -> Path:
        return self.run_dir / STATE_FILE

    def save(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        state = {
            "version": 1,
            "command": self.command,
            "machines": self.slots,
            "standby": self.standby,
            "quarantine": sorted(self.quarantine),
            "evicted": self.evicted,
            "nproc_per_machine": self.nproc,
            "ckpt_root": str(self.ckpt_root),
            "python": self.python,
            "launcher": self.launcher,
            "env": self.env,
            "stop_grace_seconds": self.stop_grace_seconds,
            "generation": self.generation,
            "running": [asdict(r) for r in self.running],
            "controller": self.controller,
        }
        atomic_write(self.state_path, json.dumps(state, indent=1, sort_keys=True))

    @classmethod
    def load(cls, run_dir: str | os.PathLike[str]) -> LocalBackend:
        """The backend a launch left in ``run_dir`` (its ``local-cluster.json``)."""
        path = Path(run_dir) / STATE_FILE
        try:
            state: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise InputError(
                f"{path}: no local cluster here ({exc.strerror}); launch the job with the local backend first"
            ) from None
        except ValueError as exc:
            raise InputError(f"{path}: not valid JSON ({exc})") from None
        try:
            be = cls(
                command=state["command"],
                machines=state["machines"],
                ckpt_root=state["ckpt_root"],
                run_dir=run_dir,
                standby=state.get("standby", []),
                nproc_per_machine=int(state["nproc_per_machine"]),
                quarantine=state.get("quarantine", []),
                python=state.get("python", sys.executable),
                env=state.get("env") or {},
                stop_grace_seconds=float(state.get("stop_grace_seconds", 10.0)),
                launcher=state.get("launcher"),
            )
            be.generation = int(state.get("generation", 0))
            be.evicted = list(state.get("evicted", []))
            be.running = [Running(**r) for r in state.get("running", [])]
            be.controller = dict(state.get("controller") or {})
        except (KeyError, TypeError, ValueError) as exc:
            raise InputError(f"{path}: not a local cluster state ({type(exc).__name__}: {exc})") from None
        return be

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

    def _remote_controller(self) -> bool:
        """True when another live process is this cluster's controller (it launches the slots)."""
        pid = int(self.controller.get("pid", 0) or 0)
        if not pid or pid == os.getpid():
            return False
        return proc_start_time(pid) == self.controller.get("start")

    def launch(self, resume_from: str | os.PathLike[str] | None = None) -> list[StepResult]:
        """Start one torchrun agent per slot (generation += 1), resuming from ``resume_from`` if given.

        With a controller running (:mod:`.local_control`), the controller starts them, so every process
        of the job stays below one long-lived parent whichever process asked for the launch."""
        check_placement(self.slots, frozenset(self.quarantine))
        if self._remote_controller():
            from .local_control import request

            self.save()
            reply = request(self.run_dir, "launch", resume_from=str(resume_from or ""))
            fresh = LocalBackend.load(self.run_dir)
            self.generation, self.running = fresh.generation, fresh.running
            return [StepResult(**s) for s in reply["steps"]]
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
                **os.environ,
                **self.env,
                "RANKSCOPE_MACHINE": machine,
                "RANKSCOPE_NODE": machine,
                "RANKSCOPE_MACHINES": ",".join(self.slots),
                "RANKSCOPE_NODE_RANK": str(i),
                "RANKSCOPE_CKPT_ROOT": str(self.ckpt_root),
                "RANKSCOPE_RESUME_FROM": str(resume_from or ""),
                "RANKSCOPE_GENERATION": str(self.generation),
            }
            log, exit_file = gen_dir / f"{machine}.log", gen_dir / f"{machine}.exit.json"
            slot = [self.python, "-m", "rankscope.recovery.backends.slot", str(exit_file), "--", *argv]
            with open(log, "wb") as fh:
                proc = subprocess.Popen(
                    slot,
                    env=env,
                    stdout=fh,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                    cwd=str(self.run_dir),
                )
            self._procs[proc.pid] = proc
            start = proc_start_time(proc.pid) or ""
            self.running.append(Running(machine, i, proc.pid, start, str(log), str(exit_file)))
            out.append(StepResult("restart", _describe(argv, machine, resume_from), "ok", f"pid {proc.pid}"))
        self.save()
        return out

    def _alive(self, r: Running) -> bool:
        proc = self._procs.get(r.pid)
        if proc is not None and proc.poll() is not None:
            return False  # reaped here
        start = proc_start_time(r.pid)
        return start is not None and (not r.start or start == r.start)

    def _exit_code(self, r: Running) -> int | None:
        if self._alive(r):
            return None
        try:
            return int(json.loads(Path(r.exit_file).read_text())["exit_code"])
        except (OSError, ValueError, KeyError, TypeError):
            return -int(signal.SIGKILL)  # the supervisor itself was killed: no record

    def poll(self) -> dict[str, int | None]:
        """Each running machine's agent exit code (None: still running)."""
        return {r.machine: self._exit_code(r) for r in self.running}

    def wait(self, timeout_seconds: float) -> dict[str, int | None]:
        """Wait until every machine's agent has exited, or the timeout; their exit codes (None: running)."""
        deadline = time.monotonic() + timeout_seconds
        while time.monotonic() < deadline and any(c is None for c in self.poll().values()):
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
        """SIGTERM every process of the machines' slots (torchrun's workers run in sessions of their own, so
        the whole tree, found once, not the process group), SIGKILL what is left after the grace period."""
        targets = [r for r in self.running if machines is None or r.machine in machines]
        tree: list[int] = []
        for r in targets:
            if self._alive(r):
                tree += [r.pid, *descendants(r.pid)]
        if tree:
            signal_tree(tree, signal.SIGTERM)
            deadline = time.monotonic() + self.stop_grace_seconds
            while time.monotonic() < deadline and any(proc_start_time(p) is not None for p in tree):
                time.sleep(0.05)
                for r in targets:
                    self._alive(r)  # reap the supervisors this process started
            signal_tree([p for p in tree if proc_start_time(p) is not None], signal.SIGKILL)
            deadline = time.monotonic() + 5.0
            while time.monotonic() < deadline and any(self._alive(r) for r in targets):
                time.sleep(0.05)
        self.running = [r for r in self.running if r not in targets]
        self.save()

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

    def situation(self) -> dict[str, Any]:
        """What the ladder needs to know about this job: its machines, the standby pool, the quarantine and
        the checkpoints (for ``Situation.from_dict``)."""
        return {
            "machines": list(self.slots),
            "standby": list(self.standby),
            "quarantine": sorted(self.quarantine),
            "checkpoints": [
                {"step": s, "path": str(p), "complete": c, "time": _mtime(p / COMPLETE_MARKER) if c else None}
                for s, p, c in checkpoints(self.ckpt_root)
            ],
        }

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
            ranks = f"{i * self.nproc}-{(i + 1) * self.nproc - 1}"
            steps.append(
                StepResult("evict", f"quarantine {node}; slot {i} (ranks {ranks}): {node} -> standby {sb}", "dry-run")
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
        self.save()
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
                evicting = [n for n in plan.evicted if n in self.slots]
                moved = dict(self._replacements(evicting, action.replacements)) if evicting else {}
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


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


def _describe(argv: Sequence[str], machine: str, resume: object) -> str:
    return f"[{machine}] RANKSCOPE_MACHINE={machine} RANKSCOPE_RESUME_FROM={resume or ''} " + " ".join(argv)
