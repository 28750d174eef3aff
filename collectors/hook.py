"""The in-process hook: one call in a training script makes a rank observable to the agent.

``rankscope.collectors.hook.install()`` costs nothing while idle and never raises into training.
It talks to the agent only through files in a shared *run directory* (``RANKSCOPE_RUN_DIR``), one
set per process id, so the agent can read them even when the process is deadlocked or dead:

``pid<PID>.json``        identity: rank, local_rank, world_size, node, parallel groups, main thread id
                         (atomic rewrite)
``pid<PID>.stack.txt``   faulthandler dumps: on ``RANKSCOPE_STACK_SIGNAL`` (default SIGUSR2), on SIGTERM
                         (chained, so torchrun's teardown leaves each rank's last stack; a second SIGTERM
                         within about a millisecond kills the process mid-dump, a faulthandler limit the
                         reader treats as no evidence) and on fatal errors
``pid<PID>.steps.jsonl`` one JSON line per :func:`log_step` (a single ``O_APPEND`` write, no buffering)
``pid<PID>.exit.json``   the uncaught exception that ended the process (frames innermost first), or
                         ``type: exit`` for a normal interpreter exit; absent after a signal or os._exit
``pid<PID>.ctl``         a FIFO; a thread blocked on it (zero CPU while idle) runs requests such as
                         ``fr`` (dump the Flight Recorder to ``pid<PID>.fr.json``) and ``stack`` (a
                         faulthandler dump after a ``# rankscope: stack requested at <epoch>`` line)
``pid<PID>.fr.json``     the Flight Recorder dump (``_dump_fr_trace_json``, else ``_dump_fr_trace``), with the
                         time it was taken added (``rankscope_dump_time_ns``: FR records none)

Forked children (DataLoader workers, checkpoint writers) re-register faulthandler on their own
``pid<CHILD>.stack.txt`` so the agent's py-spy fallback works for them too. torch is optional.

Without touching the training script: export ``RANKSCOPE_HOOK=1`` and put the line
``import rankscope.collectors.hook as h; h.maybe_install_from_env()`` in a ``sitecustomize.py`` (or
a ``.pth`` file) on the workers' path; it installs only in torchrun workers (``RANK`` is set).
"""

from __future__ import annotations

import atexit
import faulthandler
import json
import os
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

# Both are standard library only (tests/collectors/test_hook_imports.py checks that importing this module
# loads no third-party package): the run directory's file names, and the atomic write.
from rankscope.datasets.readers import runfiles as rf
from rankscope.spine import atomic_write

ENV_RUN_DIR = rf.ENV_RUN_DIR
ENV_HOOK = "RANKSCOPE_HOOK"
ENV_NODE = "RANKSCOPE_NODE"
ENV_MANIFEST = "RANKSCOPE_MANIFEST"
ENV_RANKS_PER_NODE = "RANKSCOPE_RANKS_PER_NODE"
ENV_STACK_SIGNAL = "RANKSCOPE_STACK_SIGNAL"
DEFAULT_RUN_DIR = rf.DEFAULT_RUN_DIR
DEFAULT_STACK_SIGNAL = "SIGUSR2"
STACK_REQUEST = rf.STACK_REQUEST


class _State:
    """Everything the hook holds; one per process (reset in forked children)."""

    def __init__(self) -> None:
        self.run_dir: Path | None = None
        self.pid = 0
        self.identity: dict[str, Any] = {}
        self.stack_fh: Any = None
        self.steps_fd: int | None = None
        self.last_step_time: float | None = None
        self.groups_recorded = False
        self.ctl_thread: threading.Thread | None = None
        self.stack_signal: int | None = None
        self.errors = 0


_state: _State | None = None
_lock = threading.Lock()


def _safe(fn: Any) -> Any:
    """Run ``fn`` and swallow every exception: the hook must never raise into training."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception:
            if _state is not None:
                _state.errors += 1
            return None

    wrapper.__name__ = fn.__name__
    wrapper.__doc__ = fn.__doc__
    return wrapper


def _env_int(name: str) -> int | None:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return None


def node_name(rank: int | None) -> str:
    """This rank's node: ``RANKSCOPE_NODE``, else the manifest's entry, else
    ``node-{rank // RANKSCOPE_RANKS_PER_NODE}``, else the hostname."""
    if os.environ.get(ENV_NODE):
        return os.environ[ENV_NODE]
    manifest = os.environ.get(ENV_MANIFEST)
    if manifest and rank is not None:
        try:
            data = json.loads(Path(manifest).read_text())
            nodes = data.get("nodes", data) if isinstance(data, dict) else data
            if isinstance(nodes, dict) and str(rank) in nodes:
                return str(nodes[str(rank)])
            if isinstance(nodes, list) and rank < len(nodes):
                return str(nodes[rank])
        except (OSError, ValueError, AttributeError):
            pass
    per_node = _env_int(ENV_RANKS_PER_NODE)
    if per_node and rank is not None:
        return f"node-{rank // per_node}"
    return socket.gethostname()


def _atomic_write(path: Path, text: str) -> None:
    atomic_write(path, text, durable=False)  # no fsync: a training process must not wait on the disk


def _signal_number(value: str | int | None) -> int | None:
    if value is None or value == "":
        return None
    if isinstance(value, int):
        return value
    value = value.strip().upper()
    if value in ("0", "NONE", "OFF"):
        return None
    if value.isdigit():
        return int(value)
    return int(getattr(signal, value if value.startswith("SIG") else "SIG" + value))


@_safe
def install(
    *,
    run_dir: str | os.PathLike[str] | None = None,
    node: str | None = None,
    stack_signal: str | int | None = None,
    dump_on_sigterm: bool = True,
    control_thread: bool = True,
) -> bool:
    """Make this process observable; idempotent, never raises. Returns True when the hook is active.

    ``run_dir`` defaults to ``$RANKSCOPE_RUN_DIR`` (else ``/tmp/rankscope-run``); ``stack_signal``
    to ``$RANKSCOPE_STACK_SIGNAL`` (else SIGUSR2; ``none`` disables it).
    """
    global _state  # noqa: PLW0603 - one hook state per process, replaced in forked children
    with _lock:
        if _state is not None and _state.pid == os.getpid():
            return True
        st = _State()
        st.pid = os.getpid()
        st.run_dir = Path(run_dir or os.environ.get(ENV_RUN_DIR) or DEFAULT_RUN_DIR)
        st.run_dir.mkdir(parents=True, exist_ok=True)
        rank = _env_int("RANK")
        st.identity = {
            "pid": st.pid,
            "ppid": os.getppid(),
            "rank": rank,
            "local_rank": _env_int("LOCAL_RANK"),
            "world_size": _env_int("WORLD_SIZE"),
            "group_rank": _env_int("GROUP_RANK"),
            "master_addr": os.environ.get("MASTER_ADDR"),
            "node": node or node_name(rank),
            "role": "trainer" if rank is not None else "other",
            "groups": {},
            "started": time.time(),
            "argv": list(sys.argv),
            # the id faulthandler prints for the main thread: a reader tells it from the others exactly
            "main_thread_id": threading.main_thread().ident,
        }
        sig = stack_signal if stack_signal is not None else os.environ.get(ENV_STACK_SIGNAL, DEFAULT_STACK_SIGNAL)
        st.stack_signal = _signal_number(sig)
        _state = st
        _open_files(st, dump_on_sigterm=dump_on_sigterm)
        _write_identity(st)
        if control_thread:
            _start_control_thread(st)
        if not getattr(sys.excepthook, "_rankscope", False):
            prev = sys.excepthook

            def excepthook(tp: Any, value: Any, tb: Any) -> None:
                _record_exit(tp, value, tb)
                prev(tp, value, tb)

            excepthook._rankscope = True  # type: ignore[attr-defined]
            sys.excepthook = excepthook
        os.register_at_fork(after_in_child=_after_fork_in_child)
        atexit.register(_record_normal_exit)
        return True


def _open_files(st: _State, *, dump_on_sigterm: bool = True) -> None:
    assert st.run_dir is not None
    st.stack_fh = open(rf.path(st.run_dir, st.pid, rf.STACK), "ab", buffering=0)  # noqa: SIM115
    if st.stack_signal is not None:
        faulthandler.register(st.stack_signal, file=st.stack_fh, all_threads=True, chain=False)
    if dump_on_sigterm and threading.current_thread() is threading.main_thread():
        # chain=True: dump, then let the previous disposition (usually: terminate) run.
        faulthandler.register(signal.SIGTERM, file=st.stack_fh, all_threads=True, chain=True)
    if not faulthandler.is_enabled():
        faulthandler.enable(file=st.stack_fh, all_threads=True)
    if st.identity.get("role") == "child":
        return
    st.steps_fd = os.open(rf.path(st.run_dir, st.pid, rf.STEPS), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)


def _write_identity(st: _State) -> None:
    assert st.run_dir is not None
    _atomic_write(rf.path(st.run_dir, st.pid, rf.IDENTITY), json.dumps(st.identity, default=str))


@_safe
def _after_fork_in_child() -> None:
    """A forked child (DataLoader worker, checkpoint writer) gets its own stack file and identity."""
    global _state  # noqa: PLW0603 - one hook state per process, replaced in forked children
    parent = _state
    if parent is None or parent.run_dir is None:
        return
    st = _State()
    st.pid = os.getpid()
    st.run_dir = parent.run_dir
    st.stack_signal = parent.stack_signal
    st.identity = {
        **parent.identity,
        "pid": st.pid,
        "ppid": parent.pid,
        "role": "child",
        "parent_pid": parent.pid,
        "started": time.time(),
        "main_thread_id": threading.get_ident(),
    }
    _state = st
    _open_files(st, dump_on_sigterm=False)
    _write_identity(st)


@_safe
def set_role(role: str) -> None:
    """Declare this process's role (``checkpoint``, ``dataloader``, ...); also sets its ``comm`` name."""
    st = _state
    if st is None:
        return
    st.identity["role"] = role
    _write_identity(st)
    try:
        Path("/proc/self/comm").write_text(f"rs_{role}"[:15])
    except OSError:
        pass


@_safe
def record_groups(groups: Mapping[str, Sequence[int]] | None = None) -> None:
    """Record this rank's parallel groups (kind -> global ranks); without args, ask torch.distributed."""
    st = _state
    if st is None:
        return
    found = dict(groups) if groups is not None else _torch_groups()
    if not found:
        return
    rank = st.identity.get("rank")
    st.identity["groups"] = {k: [int(r) for r in v] for k, v in found.items()}
    if rank is not None:
        st.identity["coords"] = {k: sorted(v).index(rank) for k, v in st.identity["groups"].items() if rank in v}
    st.groups_recorded = True
    _write_identity(st)


def _torch_groups() -> dict[str, list[int]]:
    """Groups this rank belongs to, named by their ``group_desc`` (torch.distributed internals, best effort)."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return {}
    from torch.distributed import distributed_c10d as c10d

    world = c10d._world
    out: dict[str, list[int]] = {}
    for pg, ranks in world.pg_group_ranks.items():
        if pg is c10d.GroupMember.WORLD:
            continue
        desc = getattr(pg, "group_desc", None) or world.pg_names.get(pg, "")
        out[str(desc)] = sorted(int(r) for r in ranks)
    return out


@_safe
def log_step(
    step: int,
    *,
    loss: float | None = None,
    grad_norm: float | None = None,
    step_time_seconds: float | None = None,
    **extra: Any,
) -> None:
    """Report one training step (loss, grad norm, step time; extra numbers too) to the agent."""
    st = _state
    if st is None or st.steps_fd is None:
        return
    now = time.time()
    if step_time_seconds is None and st.last_step_time is not None:
        step_time_seconds = now - st.last_step_time
    st.last_step_time = now
    if not st.groups_recorded:
        st.groups_recorded = True  # try once
        record_groups()
    rec = {
        "t": now,
        "step": int(step),
        "rank": st.identity.get("rank"),
        "loss": _num(loss),
        "grad_norm": _num(grad_norm),
        "step_time_seconds": _num(step_time_seconds),
    }
    rec.update({k: _num(v) for k, v in extra.items()})
    os.write(st.steps_fd, (json.dumps(rec) + "\n").encode())


def _num(v: Any) -> Any:
    if v is None:
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return str(v)
    return f if f == f and f not in (float("inf"), float("-inf")) else str(f)  # JSON has no NaN


@_safe
def _record_exit(tp: Any, value: Any, tb: Any) -> None:
    st = _state
    if st is None or st.run_dir is None:
        return
    frames = [{"function": f.name, "file": f.filename, "line": f.lineno} for f in reversed(traceback.extract_tb(tb))]
    rec = {
        "pid": st.pid,
        "rank": st.identity.get("rank"),
        "role": st.identity.get("role"),
        "time": time.time(),
        "type": tp.__name__,
        "message": str(value)[:2000],
        "frames": frames,
    }
    _atomic_write(rf.path(st.run_dir, st.pid, rf.EXIT), json.dumps(rec))


@_safe
def _record_normal_exit() -> None:
    """At interpreter exit without an uncaught exception: tell the agent this exit was not a crash."""
    st = _state
    if st is None or st.run_dir is None or st.pid != os.getpid():
        return
    path = rf.path(st.run_dir, st.pid, rf.EXIT)
    if not path.exists():
        _atomic_write(
            path,
            json.dumps(
                {
                    "pid": st.pid,
                    "rank": st.identity.get("rank"),
                    "time": time.time(),
                    "type": "exit",
                    "message": "normal interpreter exit",
                    "frames": [],
                }
            ),
        )


@_safe
def dump_flight_recorder(path: str | os.PathLike[str] | None = None) -> str | None:
    """Dump the PyTorch Flight Recorder to ``path`` (default ``pid<PID>.fr.json``); the path, or None."""
    st = _state
    if "torch.distributed" not in sys.modules:  # no torch.distributed in this process: nothing recorded
        return None
    import torch._C._distributed_c10d as torch_c

    target = Path(path) if path else (rf.path(st.run_dir, os.getpid(), rf.FR) if st and st.run_dir else None)
    if target is None:
        return None
    when = time.time_ns()  # FR snapshots its ring buffer as the call starts: no entry is newer than this
    if hasattr(torch_c, "_dump_fr_trace_json"):
        data = torch_c._dump_fr_trace_json(includeCollectives=True, onlyActive=False)
        _atomic_write(target, _with_dump_time(data if isinstance(data, str) else data.decode(), when))
    elif hasattr(torch_c, "_dump_fr_trace"):
        import pickle

        target = target.with_suffix(".pkl")  # pid<PID>.fr.pkl (runfiles.FR_PICKLE)
        blob = torch_c._dump_fr_trace(includeCollectives=True, includeStackTraces=True, onlyActive=False)
        obj = pickle.loads(blob) if isinstance(blob, bytes) else blob  # this process's own dump
        if isinstance(obj, dict):
            obj[rf.FR_DUMP_TIME_KEY] = when
        atomic_write(target, pickle.dumps(obj), durable=False)
    else:
        return None
    return str(target)


def _with_dump_time(text: str, when_ns: int) -> str:
    """The JSON object ``text`` with :data:`runfiles.FR_DUMP_TIME_KEY` added first (no re-parse of the
    dump, which can be megabytes: the key goes in after the opening brace)."""
    body = text.lstrip()
    if not body.startswith("{"):
        return text
    rest = body[1:].lstrip()
    sep = "" if rest.startswith("}") else ", "
    return f'{{"{rf.FR_DUMP_TIME_KEY}": {when_ns}{sep}{rest}'


def _start_control_thread(st: _State) -> None:
    assert st.run_dir is not None
    ctl = rf.path(st.run_dir, st.pid, rf.CTL)
    try:
        if ctl.exists():
            ctl.unlink()
        os.mkfifo(ctl, 0o600)
    except OSError:
        return
    t = threading.Thread(target=_control_loop, args=(ctl,), name="rankscope-hook", daemon=True)
    t.start()
    st.ctl_thread = t


def _control_loop(ctl: Path) -> None:
    """Block on the FIFO (no CPU while idle) and run each request line; survive every error."""
    while True:
        try:
            # read-write: the FIFO always has a writer (this one), so reads never hit end-of-file between two
            # requests and a sender's non-blocking open always finds a reader; the read blocks (no CPU) while idle
            with open(os.open(ctl, os.O_RDWR), encoding="utf-8", errors="replace") as fh:
                for line in fh:
                    cmd = line.strip()
                    if cmd == "fr":
                        dump_flight_recorder()
                    elif cmd == "stack":
                        _requested_dump()
        except Exception:
            time.sleep(1.0)
        if _state is None or _state.pid != os.getpid():
            return


def _requested_dump() -> None:
    """Append a faulthandler dump after a ``STACK_REQUEST`` time line, both in one ``write``: the time
    lets a reader trust this dump when a later one (at SIGTERM) is cut off, and a SIGTERM dump cannot
    land between the line and its dump."""
    st = _state
    if st is None or st.stack_fh is None:
        return
    head = f"{STACK_REQUEST}{time.time():.3f}\n".encode()
    try:
        fd = os.memfd_create("rankscope-stack", os.MFD_CLOEXEC)
    except (AttributeError, OSError):
        fd = -1
    if fd < 0:  # no memfd: write the line, then the dump
        st.stack_fh.write(head)
        faulthandler.dump_traceback(file=st.stack_fh, all_threads=True)
        return
    with os.fdopen(fd, "w+b", buffering=0) as tmp:
        faulthandler.dump_traceback(file=tmp, all_threads=True)
        tmp.seek(0)
        st.stack_fh.write(head + tmp.read())


def request(run_dir: str | os.PathLike[str], pid: int, command: str) -> bool:
    """Send ``command`` to the hook of ``pid`` through its FIFO without blocking; True if delivered."""
    ctl = rf.path(run_dir, pid, rf.CTL)
    try:
        fd = os.open(ctl, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        os.write(fd, (command.strip() + "\n").encode())
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def installed() -> bool:
    """True when the hook is active in this process."""
    return _state is not None and _state.pid == os.getpid()


def maybe_install_from_env() -> bool:
    """The ``sitecustomize`` entry point: install when ``RANKSCOPE_HOOK=1`` and this is a torchrun worker."""
    if os.environ.get(ENV_HOOK, "") not in ("1", "true", "yes") or "RANK" not in os.environ:
        return False
    return bool(install())
