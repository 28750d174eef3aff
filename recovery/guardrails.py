"""Guardrails between a plan and the cluster.

Pure part (:func:`apply`): the eviction caps (one parallel group per incident, never more than
``max_evict_fraction`` of the job, per incident and per hour), the cool-down between disruptive actions,
the idempotency check (an incident already acted on is not acted on again), the warm-standby pool (never
left empty without saying so) and the quarantine list (no restart or standby placed on a quarantined
machine). Each guardrail adds its decision to the plan, whether it passed or changed something.

Side-effect part: :class:`JobLock` (one executor per job, stale locks taken over), :func:`run_argv`
(argv-only subprocesses with a timeout: never a shell string), and the append-only audit trail
(:class:`AuditLog`, with :class:`JsonlAuditLog` as the file-backed implementation).
"""

from __future__ import annotations

import errno
import fcntl
import getpass
import json
import math
import os
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from ._compat import InputError, RecoveryError
from .ladder import Situation
from .plan import DISRUPTIVE, Action, GuardrailDecision, Plan
from .records import ActionRecord


@dataclass(frozen=True, kw_only=True)
class GuardrailConfig:
    max_evict_fraction: float = 1 / 8
    min_evict_machines: int = 1  # a job of fewer than 8 machines may still lose one
    hourly_window_seconds: float = 3600.0
    cooldown_seconds: float = 300.0

    def __post_init__(self) -> None:
        if not 0.0 < self.max_evict_fraction <= 1.0:
            raise InputError(f"guardrails: max_evict_fraction={self.max_evict_fraction} is outside (0, 1]")
        if self.min_evict_machines < 0 or self.cooldown_seconds < 0 or self.hourly_window_seconds <= 0:
            raise InputError("guardrails: min_evict_machines and cooldown_seconds must be >= 0, "
                             "hourly_window_seconds > 0")


def _job_size(s: Situation, plan: Plan) -> tuple[int, str]:
    if s.machines:
        return len(s.machines), "the job's machine list"
    seen = set(plan.suspect_nodes) | {e.node for e in s.events if e.node} | {x.node for x in s.exits if x.node}
    if s.verdict is not None:
        seen |= set(s.verdict.isolate_nodes)
    return len(seen), "a lower bound: the machines named in the inputs (pass the job's machine list)"


def _cap(s: Situation, plan: Plan, cfg: GuardrailConfig) -> tuple[int, str]:
    n, source = _job_size(s, plan)
    frac = max(cfg.min_evict_machines, math.floor(n * cfg.max_evict_fraction))
    text = f"{frac} = max({cfg.min_evict_machines}, floor({n} x {cfg.max_evict_fraction:.3g})) of {n} machines " \
           f"({source})"
    v = s.verdict
    if plan.rule.startswith(("verdict-machine", "escalate")) and v is not None and v.group_count > 1 \
            and v.group_kind not in ("", "node"):
        one_group = math.ceil(len(v.group_nodes) / v.group_count)
        if one_group < frac:
            return one_group, f"one {v.group_kind.upper()} group ({one_group} machines; the verdict names " \
                              f"{v.group_count}), within {text}"
    return frac, text


def _recent(s: Situation, now: float, window: float, kinds: frozenset[str] | set[str], incident: str) \
        -> list[ActionRecord]:
    return [h for h in s.history if h.executed and h.kind in kinds and h.incident != incident
            and now - window <= h.time <= now]


def apply(plan: Plan, s: Situation, cfg: GuardrailConfig = GuardrailConfig()) -> Plan:
    """The plan after every guardrail, each decision recorded in ``plan.guardrails``. Pure."""
    now = plan.time or 0.0
    decisions: list[GuardrailDecision] = []
    actions = list(plan.actions)

    # idempotency: an incident already acted on is done
    done = [h for h in s.history if h.incident == plan.incident and h.executed]
    if done:
        last = max(done, key=lambda h: h.time)
        decisions.append(GuardrailDecision("idempotency", "skipped", (
            f"incident {plan.incident} was already acted on ({len(done)} action(s), last {last.kind} at "
            f"{last.time:.0f}): re-running changes nothing")))
        return plan.with_actions((), *decisions)
    decisions.append(GuardrailDecision("idempotency", "pass", f"incident {plan.incident} not acted on before"))

    # cool-down: no disruptive action within cooldown_seconds of the last one (another incident)
    recent = _recent(s, now, cfg.cooldown_seconds, DISRUPTIVE, plan.incident)
    if plan.disruptive and recent:
        last = max(h.time for h in recent)
        until = last + cfg.cooldown_seconds
        held = ", ".join(a.kind for a in actions if a.kind in DISRUPTIVE)
        why = (f"a disruptive action ran {now - last:.0f} s ago (< cool-down {cfg.cooldown_seconds:g} s): "
               f"{held} held until {until:.0f}; re-plan then")
        decisions.append(GuardrailDecision("cooldown", "deferred", why))
        keep = [a for a in actions if a.kind not in DISRUPTIVE]
        keep.append(Action("collect", why, nodes=plan.evicted, collect=("the same evidence again after the "
                                                                        "cool-down",)))
        return plan.with_actions(tuple(keep), *decisions)
    decisions.append(GuardrailDecision("cooldown", "pass", f"no disruptive action in the last "
                                                            f"{cfg.cooldown_seconds:g} s"))

    evict = plan.evicted
    if evict:
        cap, cap_text = _cap(s, plan, cfg)
        hourly = _recent(s, now, cfg.hourly_window_seconds, {"evict"}, plan.incident)
        already = len({n for h in hourly for n in h.nodes})
        room = max(0, cap - already)
        if len(evict) > room:
            why = (f"evicting {len(evict)} machine(s) ({', '.join(evict)}) exceeds the cap: {cap_text}"
                   + (f", {already} already evicted in the last {cfg.hourly_window_seconds:g} s" if already else ""))
            decisions.append(GuardrailDecision("evict-cap", "blocked", why + "; stop and ask a person"))
            keep = [a for a in actions if a.kind not in ("evict", "restart")]
            keep.insert(0, Action("stop", why + ": an eviction this large needs a person"))
            keep.append(Action("collect", "for the person deciding", nodes=evict, collect=(
                "the verdict's evidence per suspect machine",) + ("stop-time checks on the suspects",)))
            return plan.with_actions(tuple(keep), *decisions)
        decisions.append(GuardrailDecision("evict-cap", "pass", f"{len(evict)} machine(s) within the cap: {cap_text}"
                                           + (f" ({already} already evicted this hour)" if already else "")))
        # standby pool and quarantine
        quarantined = [m for m in s.standby if m in s.quarantine or m in evict]
        usable = [m for m in s.standby if m not in s.quarantine and m not in evict]
        if quarantined:
            decisions.append(GuardrailDecision("quarantine", "warn", (
                f"standby machine(s) {', '.join(quarantined)} are quarantined or being evicted: not used")))
        else:
            decisions.append(GuardrailDecision("quarantine", "pass", f"{len(s.quarantine)} quarantined machine(s) "
                                                                     "kept out of the placement"))
        pairs = tuple(zip(evict, usable, strict=False))  # fewer standbys than evictions: see below
        short = len(evict) - len(pairs)
        if not s.standby:
            decisions.append(GuardrailDecision("standby", "warn", (
                "no warm standby pool given: the restart waits for the scheduler to find replacements "
                f"for {len(evict)} machine(s)")))
        elif short > 0:
            decisions.append(GuardrailDecision("standby", "warn", (
                f"the standby pool is EMPTY after this: {len(usable)} usable standby(s) for {len(evict)} evicted "
                f"machine(s), {short} short; replenish the pool (the restart waits for the shortfall)")))
        elif len(usable) == len(evict):
            decisions.append(GuardrailDecision("standby", "warn", (
                f"the standby pool is EMPTY after this ({len(usable)} used): replenish it now")))
        else:
            decisions.append(GuardrailDecision("standby", "pass", (
                f"{len(pairs)} standby(s) used, {len(usable) - len(pairs)} left")))
        exclude = tuple(sorted(set(evict) | set(s.quarantine)))
        actions = [Action(a.kind, a.reason, a.nodes, a.checkpoint, a.step, a.code_version, a.collect,
                          pairs, exclude) if a.kind == "restart" else a for a in actions]
    elif s.quarantine and any(a.kind in ("restart", "rollback") for a in actions):
        exclude = tuple(sorted(s.quarantine))
        actions = [Action(a.kind, a.reason, a.nodes, a.checkpoint, a.step, a.code_version, a.collect,
                          a.replacements, exclude) if a.kind in ("restart", "rollback") else a for a in actions]
        decisions.append(GuardrailDecision("quarantine", "pass", f"restart kept off {len(exclude)} quarantined "
                                                                 "machine(s)"))
    return plan.with_actions(tuple(actions), *decisions)


def check_placement(machines: Sequence[str], quarantine: Sequence[str] | frozenset[str]) -> None:
    """Refuse to place a job or a standby on a quarantined machine."""
    bad = sorted(set(machines) & set(quarantine))
    if bad:
        raise RecoveryError(f"refusing to place work on quarantined machine(s) {', '.join(bad)}")


# ----------------------------------------------------------------------------------------------------------
# one executor per job


class JobLock:
    """An exclusive lock file per job: ``flock`` while held, and the holder's pid/host/time inside.

    A lock left by a dead process (same host, pid gone) or older than ``stale_seconds`` is taken over;
    a live holder makes :meth:`acquire` raise :class:`RecoveryError` naming it.
    """

    def __init__(self, path: str | os.PathLike[str], *, stale_seconds: float = 3600.0) -> None:
        self.path = Path(path)
        self.stale_seconds = stale_seconds
        self._fd: int | None = None

    def _holder(self) -> dict[str, Any]:
        try:
            return json.loads(self.path.read_text(encoding="utf-8") or "{}")
        except (OSError, ValueError):
            return {}

    def _stale(self, holder: dict[str, Any]) -> bool:
        if not holder:
            return True
        if time.time() - float(holder.get("time", 0)) > self.stale_seconds:
            return True
        if holder.get("host") == socket.gethostname():
            try:
                os.kill(int(holder.get("pid", -1)), 0)
            except ProcessLookupError:
                return True
            except (PermissionError, ValueError, OverflowError):
                return False
        return False

    def acquire(self) -> JobLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                raise
            holder = self._holder()
            raise RecoveryError(f"{self.path}: another executor holds this job's lock (pid {holder.get('pid')} on "
                                f"{holder.get('host')} since {holder.get('time')})") from None
        holder = self._holder()
        if holder and not self._stale(holder) and int(holder.get("pid", -1)) != os.getpid():
            # flock is free but a live process on this host wrote the file: it uses another lock
            # mechanism (or another mount); respect it.
            os.close(fd)
            raise RecoveryError(f"{self.path}: held by live pid {holder.get('pid')} on {holder.get('host')}")
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "time": time.time(),
                                 "stale_taken_over": bool(holder)}).encode())
        os.fsync(fd)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            os.ftruncate(self._fd, 0)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        finally:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> JobLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


# ----------------------------------------------------------------------------------------------------------
# argv-only subprocesses


@dataclass(frozen=True)
class CommandResult:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    seconds: float


def run_argv(argv: Sequence[str], *, timeout_seconds: float = 60.0, env: dict[str, str] | None = None,
             check: bool = False) -> CommandResult:
    """Run one command as an argv list (never through a shell) with a timeout.

    A string (which a shell would split) is refused, so a node name or a reason can never become a
    command. A timeout kills the command and raises :class:`RecoveryError`.
    """
    if isinstance(argv, (str, bytes)) or not argv or not all(isinstance(a, str) for a in argv):
        raise RecoveryError(f"run_argv needs a non-empty list of strings, not {argv!r}")
    t0 = time.monotonic()
    try:
        p = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_seconds, env=env, shell=False,
                           check=False, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise RecoveryError(f"{argv[0]}: timed out after {timeout_seconds:g} s ({' '.join(argv)})") from None
    except OSError as exc:
        raise RecoveryError(f"{argv[0]}: cannot run ({exc.strerror})") from None
    res = CommandResult(tuple(argv), p.returncode, p.stdout, p.stderr, time.monotonic() - t0)
    if check and p.returncode != 0:
        raise RecoveryError(f"{' '.join(argv)}: exit {p.returncode}: {(p.stderr or p.stdout).strip()[:300]}")
    return res


# ----------------------------------------------------------------------------------------------------------
# the audit trail


@dataclass(frozen=True)
class AuditRecord:
    """One action, as the audit trail keeps it: who, what, when, why, outcome."""

    job: str
    incident: str
    what: str  # the action kind
    why: str
    outcome: str  # planned | dry-run | ok | failed | skipped
    when: float
    who: str
    backend: str
    dry_run: bool
    nodes: tuple[str, ...] = ()
    commands: tuple[str, ...] = ()
    detail: str = ""
    rule: str = ""
    suspect_nodes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["nodes"] = list(self.nodes)
        d["commands"] = list(self.commands)
        d["suspect_nodes"] = list(self.suspect_nodes)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> AuditRecord:
        return cls(str(d["job"]), str(d["incident"]), str(d["what"]), str(d.get("why", "")), str(d["outcome"]),
                   float(d["when"]), str(d.get("who", "")), str(d.get("backend", "")), bool(d.get("dry_run", False)),
                   tuple(d.get("nodes") or ()), tuple(d.get("commands") or ()), str(d.get("detail", "")),
                   str(d.get("rule", "")), tuple(d.get("suspect_nodes") or ()))

    def to_action_record(self) -> ActionRecord:
        return ActionRecord(self.when, self.what, self.incident, self.nodes, self.rule,
                            executed=not self.dry_run and self.outcome == "ok", suspect_nodes=self.suspect_nodes)


def whoami() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return f"{user}@{socket.gethostname()} pid {os.getpid()}"


class AuditLog(Protocol):
    """An append-only trail of actions. The store's ``actions`` table implements the same interface."""

    def append(self, record: AuditRecord) -> None: ...

    def records(self, job: str | None = None) -> list[AuditRecord]: ...


class JsonlAuditLog:
    """The audit trail as a JSON-lines file: one record per line, appended under ``flock`` and fsync'd.

    Nothing is ever rewritten. A line that does not parse (a torn write from a crash) is skipped on read.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def append(self, record: AuditRecord) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = (json.dumps(record.to_dict(), sort_keys=True) + "\n").encode()
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                line = b"\n" + line  # close a line torn by a crash, so this record stays whole
            os.write(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)

    def _lines(self) -> Iterator[dict[str, Any]]:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return
        for raw in text.splitlines():
            try:
                d = json.loads(raw)
            except ValueError:
                continue
            if isinstance(d, dict):
                yield d

    def records(self, job: str | None = None) -> list[AuditRecord]:
        out = []
        for d in self._lines():
            try:
                r = AuditRecord.from_dict(d)
            except (KeyError, TypeError, ValueError):
                continue
            if job is None or r.job == job:
                out.append(r)
        return out

    def history(self, job: str | None = None) -> tuple[ActionRecord, ...]:
        """The records as the ladder's action history."""
        return tuple(r.to_action_record() for r in self.records(job))
