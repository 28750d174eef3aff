"""The local cluster's controller: the one long-lived process that starts the job's machine slots.

On a real cluster the scheduler's controller (slurmctld, the Kubernetes job controller) starts the
job's processes, whoever asked for the restart. The local backend's controller plays that role: it
runs ``python -m rankscope.recovery.backends.local_control RUN_DIR``, launches the slots when asked,
reaps them, and stops the job when it is stopped itself. Every process of the job therefore stays
below one parent across restarts (a node agent follows it with ``--launcher-pid``), even when the
restart was made by a short-lived ``rankscope recover`` process.

Requests are JSON files in ``RUN_DIR/requests/`` (written atomically), answered in
``RUN_DIR/responses/``: ``launch`` (with ``resume_from``), ``stop``, ``shutdown``. The backend's state
(``local-cluster.json``) is read afresh for each request, so an eviction another process saved is
honoured.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from rankscope.spine import RecoveryError, atomic_write

from ..procs import proc_start_time
from .local import LocalBackend

REQUESTS, RESPONSES = "requests", "responses"


def request(run_dir: str | os.PathLike[str], op: str, *, timeout_seconds: float = 120.0, **args: Any) -> dict[str, Any]:
    """Ask the controller of ``run_dir`` to do ``op`` and wait for its answer."""
    root = Path(run_dir)
    rid = f"{time.time():.6f}-{uuid.uuid4().hex[:8]}"
    (root / REQUESTS).mkdir(parents=True, exist_ok=True)
    atomic_write(root / REQUESTS / f"{rid}.json", json.dumps({"op": op, **args}), durable=False)
    answer = root / RESPONSES / f"{rid}.json"
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        if answer.exists():
            reply: dict[str, Any] = json.loads(answer.read_text())
            answer.unlink(missing_ok=True)
            if not reply.get("ok"):
                raise RecoveryError(f"local cluster controller ({root}): {op} failed: {reply.get('error')}")
            return reply
        time.sleep(0.05)
    raise RecoveryError(f"local cluster controller ({root}): no answer to {op} within {timeout_seconds:g} s")


def serve(run_dir: str | os.PathLike[str], *, poll_seconds: float = 0.05) -> int:
    """Run the controller until a ``shutdown`` request or SIGTERM/SIGINT; the job is stopped on the way out."""
    root = Path(run_dir)
    done = threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda s, f: done.set())
    be = LocalBackend.load(root)
    be.controller = {"pid": os.getpid(), "start": proc_start_time(os.getpid())}
    be.save()
    (root / REQUESTS).mkdir(parents=True, exist_ok=True)
    (root / RESPONSES).mkdir(parents=True, exist_ok=True)
    shutdown_reply = ""
    try:
        while not done.is_set():
            for path in sorted((root / REQUESTS).glob("*.json")):
                try:
                    req = json.loads(path.read_text())
                except (OSError, ValueError):
                    continue
                path.unlink(missing_ok=True)
                be = _fresh(be)
                reply: dict[str, Any] = {"ok": True, "steps": []}
                try:
                    if req.get("op") == "launch":
                        steps = be.launch(req.get("resume_from") or None)
                        reply["steps"] = [s.to_dict() for s in steps]
                    elif req.get("op") == "stop":
                        be.stop()
                    elif req.get("op") == "shutdown":
                        done.set()
                        shutdown_reply = path.name
                        continue  # answered once the job is stopped and the state saved
                    else:
                        raise RecoveryError(f"unknown request {req.get('op')!r}")
                except Exception as exc:  # answer every request, whatever happened
                    reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
                atomic_write(root / RESPONSES / path.name, json.dumps(reply), durable=False)
            be.poll()  # reaps the slots that ended
            done.wait(poll_seconds)
    finally:
        be = _fresh(be)
        be.stop()
        be.controller = {}
        be.save()
        if shutdown_reply:
            atomic_write(root / RESPONSES / shutdown_reply, json.dumps({"ok": True, "steps": []}), durable=False)
    return 0


def _fresh(be: LocalBackend) -> LocalBackend:
    """The state as saved now (another process may have evicted a machine), keeping the processes this
    controller started so it can still reap them."""
    fresh = LocalBackend.load(be.run_dir)
    fresh._procs = be._procs
    return fresh


def start(run_dir: str | os.PathLike[str], *, timeout_seconds: float = 30.0) -> int:
    """Start a controller for the cluster saved in ``run_dir`` (detached); its pid once it is serving."""
    import subprocess

    with open(Path(run_dir) / "controller.log", "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "rankscope.recovery.backends.local_control", str(run_dir)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        if LocalBackend.load(run_dir).controller.get("pid") == proc.pid:
            return proc.pid
        if proc.poll() is not None:
            raise RecoveryError(
                f"local cluster controller exited with {proc.returncode} (see {run_dir}/controller.log)"
            )
        time.sleep(0.05)
    raise RecoveryError(f"local cluster controller did not start within {timeout_seconds:g} s")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0] in ("-h", "--help"):
        print("usage: python -m rankscope.recovery.backends.local_control RUN_DIR", file=sys.stderr)
        return 2
    from rankscope.spine import error_edge

    with error_edge():
        return serve(args[0])
    return 1


if __name__ == "__main__":
    sys.exit(main())
