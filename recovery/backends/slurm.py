"""Slurm: drain the machines with a reason where allowed, else requeue the job without them.

- ``drain`` (operators/admins): ``scontrol update NodeName=X State=DRAIN Reason=...`` per machine, then
  ``scontrol requeue JOBID``: the job goes back to the queue and the scheduler will not place it on a
  drained machine; the job script resumes from its newest complete checkpoint.
- ``requeue`` (any user, for their own job): ``scontrol requeuehold JOBID``, ``scontrol update
  JobId=JOBID ExcNodeList=<old list + X>``, ``scontrol release JOBID``.
- ``auto`` (default): drain, and fall back to requeue when Slurm refuses the drain (not an operator).
- a fresh submission: ``sbatch --exclude=X,... script`` (:meth:`SlurmBackend.submit`).

Every command is an argv list run with a timeout (never a shell); a dry run returns them unrun.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from rankscope.spine import InputError, RecoveryError

from ..plan import Action, Plan
from ..procs import CommandResult, run_argv
from .base import StepResult, check_nodes, one_line

MODES = ("auto", "drain", "requeue")
_DENIED = re.compile(
    r"access/permission denied|permission denied|not authorized|invalid user|"
    r"must be (?:root|an? (?:admin|operator))",
    re.I,
)
_JOBID = re.compile(r"^\d+(?:_\d+)?$")

Runner = Callable[..., CommandResult]


class SlurmBackend:
    name = "slurm"

    def __init__(
        self,
        job_id: str,
        *,
        mode: str = "auto",
        timeout_seconds: float = 30.0,
        runner: Runner = run_argv,
        scontrol: Sequence[str] = ("scontrol",),
        sbatch: Sequence[str] = ("sbatch",),
        env: dict[str, str] | None = None,
    ) -> None:
        if mode not in MODES:
            raise InputError(f"slurm backend: mode {mode!r} is not one of {MODES}")
        if not _JOBID.match(str(job_id)):
            raise InputError(
                f"slurm backend: job id {job_id!r} is not a Slurm job id (digits, or N_M for an array task)"
            )
        self.job_id = str(job_id)
        self.mode = mode
        self.timeout_seconds = timeout_seconds
        self.runner = runner
        self.scontrol = tuple(scontrol)
        self.sbatch = tuple(sbatch)
        self.env = env
        self._requeued_for: set[str] = set()  # incidents whose eviction already requeued the job

    # -- commands ----------------------------------------------------------------------------------------

    def drain_argv(self, node: str, reason: str) -> list[str]:
        return [*self.scontrol, "update", f"NodeName={node}", "State=DRAIN", f"Reason={one_line(reason)}"]

    def requeue_argv(self) -> list[str]:
        return [*self.scontrol, "requeue", self.job_id]

    def exclude_argvs(self, exclude: Sequence[str]) -> list[list[str]]:
        return [
            [*self.scontrol, "requeuehold", self.job_id],
            [*self.scontrol, "update", f"JobId={self.job_id}", f"ExcNodeList={','.join(exclude)}"],
            [*self.scontrol, "release", self.job_id],
        ]

    def submit_argv(self, script: str, exclude: Sequence[str] = (), extra: Sequence[str] = ()) -> list[str]:
        argv = [*self.sbatch, "--parsable"]
        if exclude:
            argv.append(f"--exclude={','.join(check_nodes(exclude))}")
        return argv + list(extra) + [script]

    # -- helpers -----------------------------------------------------------------------------------------

    def _run(self, argv: Sequence[str]) -> CommandResult:
        return self.runner(list(argv), timeout_seconds=self.timeout_seconds, env=self.env)

    def _step(self, kind: str, argv: Sequence[str], apply: bool, note: str = "") -> StepResult:
        cmd = " ".join(_quote(a) for a in argv)
        if not apply:
            return StepResult(kind, cmd, "dry-run", note)
        r = self._run(argv)
        if r.returncode != 0:
            return StepResult(kind, cmd, "failed", f"exit {r.returncode}: {(r.stderr or r.stdout).strip()[:300]}")
        return StepResult(kind, cmd, "ok", note)

    def excluded_now(self) -> tuple[str, ...]:
        """The job's current ExcNodeList (read-only query), so an exclusion adds to it rather than replaces it."""
        try:
            r = self._run([*self.scontrol, "show", "job", "-o", self.job_id])
        except RecoveryError:
            return ()
        m = re.search(r"\bExcNodeList=(\S+)", r.stdout) if r.returncode == 0 else None
        if not m or m.group(1) == "(null)":
            return ()
        return tuple(self._expand(m.group(1)))

    def _expand(self, hostlist: str) -> list[str]:
        if "[" not in hostlist:
            return [h for h in hostlist.split(",") if h]
        try:
            r = self._run([*self.scontrol, "show", "hostnames", hostlist])
        except RecoveryError:
            return [hostlist]
        return r.stdout.split() if r.returncode == 0 else [hostlist]

    # -- actions -----------------------------------------------------------------------------------------

    def evict(self, nodes: Sequence[str], reason: str, *, apply: bool) -> list[StepResult]:
        nodes = check_nodes(nodes)
        if not nodes:
            return []
        out: list[StepResult] = []
        if self.mode in ("auto", "drain"):
            drained = True
            for n in nodes:
                s = self._step("evict", self.drain_argv(n, reason), apply)
                if s.outcome == "failed" and self.mode == "auto" and _DENIED.search(s.detail):
                    out.append(
                        StepResult(
                            "evict",
                            s.command,
                            "noop",
                            "drain refused (not a Slurm operator): requeue the job without the machine instead",
                        )
                    )
                    drained = False
                    break
                out.append(s)
                if s.outcome == "failed":
                    return out
            if drained:
                out.append(
                    self._step(
                        "evict", self.requeue_argv(), apply, "back to the queue; drained machines are not used again"
                    )
                )
                if not apply and self.mode == "auto":
                    out += [
                        StepResult(
                            "evict",
                            " ".join(_quote(a) for a in argv),
                            "dry-run",
                            "only if the drain is refused (not an operator)",
                        )
                        for argv in self.exclude_argvs(nodes)
                    ]
                return out
        exclude = tuple(dict.fromkeys(self.excluded_now() + tuple(nodes)))
        for argv in self.exclude_argvs(exclude):
            s = self._step("evict", argv, apply)
            out.append(s)
            if s.outcome == "failed":
                break
        return out

    def carry_out(self, action: Action, plan: Plan, *, apply: bool) -> list[StepResult]:
        reason = f"rankscope {plan.incident} {plan.rule}: {action.reason}"
        if action.kind == "evict":
            out = self.evict(action.nodes, reason, apply=apply)
            if out and out[-1].outcome != "failed":
                self._requeued_for.add(plan.incident)
            return out
        if action.kind == "restart":
            if plan.incident in self._requeued_for or plan.evicted:
                return [
                    StepResult(
                        "restart",
                        "(none)",
                        "noop",
                        "the eviction requeued the job; its script resumes from the newest complete checkpoint",
                    )
                ]
            return [
                self._step(
                    "restart", self.requeue_argv(), apply, "the job script resumes from the newest complete checkpoint"
                )
            ]
        if action.kind == "stop":
            return [
                self._step(
                    "stop",
                    [*self.scontrol, "requeuehold", self.job_id],
                    apply,
                    f"held for a person: `scontrol release {self.job_id}` resumes it",
                )
            ]
        if action.kind == "rollback":
            if action.code_version:
                return [
                    self._step(
                        "rollback",
                        [*self.scontrol, "requeuehold", self.job_id],
                        apply,
                        f"held: switch the job's code to {action.code_version}, then `scontrol release {self.job_id}`",
                    )
                ]
            target = action.checkpoint or (f"step<{action.step}" if action.step is not None else "before-onset")
            comment = one_line(f"rankscope:resume={target}", 250)
            return [
                self._step(
                    "rollback",
                    [*self.scontrol, "update", f"JobId={self.job_id}", f"Comment={comment}"],
                    apply,
                    "the job script reads its resume point from the job comment (squeue -o %k)",
                ),
                self._step("rollback", self.requeue_argv(), apply),
            ]
        return [StepResult(action.kind, "(none)", "noop", "recorded in the audit trail only")]

    def submit(
        self, script: str, *, exclude: Sequence[str] = (), extra: Sequence[str] = (), apply: bool = False
    ) -> StepResult:
        """A fresh submission that avoids the excluded machines; the new job id is the step's ``detail``."""
        argv = self.submit_argv(script, exclude, extra)
        cmd = " ".join(_quote(a) for a in argv)
        if not apply:
            return StepResult("submit", cmd, "dry-run")
        r = self._run(argv)
        if r.returncode != 0:
            return StepResult("submit", cmd, "failed", f"exit {r.returncode}: {(r.stderr or r.stdout).strip()[:300]}")
        return StepResult("submit", cmd, "ok", r.stdout.strip().split(";")[0])


def _quote(arg: str) -> str:
    """Print an argv element so a person can paste it (the backend itself never uses a shell)."""
    return arg if re.fullmatch(r"[\w@%+=:,./\[\]-]+", arg) else "'" + arg.replace("'", "'\\''") + "'"
