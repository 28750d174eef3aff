"""The on-demand trigger: ``SIGUSR1`` to the agent, or a trigger file.

Why these two: a signal is the Unix convention for "daemon, do X now" (nginx, gunicorn and
faulthandler all use SIGUSR1/2); it needs no listening port, so there is nothing to secure, bind
or collide with on a shared training node, and ``kill -USR1 $(cat RUN_DIR/agent.pid)`` works from
``kubectl exec``. The trigger file covers what a signal cannot: a controller in another container
or user that shares only a volume (``touch RUN_DIR/trigger``; a line ``rounds=5`` asks for 5
rounds). Checking costs one ``stat`` per tick. The agent removes the file when it consumes it.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from typing import Any

from rankscope.datasets.readers import runfiles as rf
from rankscope.spine import atomic_write


class Trigger:
    """Collects trigger requests from a signal handler and a file; :meth:`poll` consumes them."""

    def __init__(self, trigger_file: str | os.PathLike[str], *, signum: int | None = signal.SIGUSR1) -> None:
        self.path = Path(trigger_file)
        self._flag = threading.Event()
        self.signum = None
        if signum is not None and threading.current_thread() is threading.main_thread():
            try:
                signal.signal(signum, self._on_signal)
                self.signum = signum
            except (ValueError, OSError):
                pass

    def _on_signal(self, signum: int, frame: Any) -> None:
        self._flag.set()

    def poll(self) -> dict[str, str] | None:
        """None when nothing was requested; else the request's options (from the file, if any)."""
        opts: dict[str, str] | None = None
        if self._flag.is_set():
            self._flag.clear()
            opts = {"source": "signal"}
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return opts
        except OSError:
            text = ""
        try:
            self.path.unlink()
        except OSError:
            pass
        opts = {"source": "file"}
        for part in text.replace(",", "\n").splitlines():
            key, sep, value = part.partition("=")
            if sep:
                opts[key.strip()] = value.strip()
        return opts

    def close(self) -> None:
        if self.signum is not None:
            try:
                signal.signal(self.signum, signal.SIG_DFL)
            except (ValueError, OSError):
                pass


def request_capture(run_dir: str | os.PathLike[str], *, rounds: int = 1, trigger_file: str | None = None) -> Path:
    """Ask a running agent for a capture by writing its trigger file atomically."""
    path = Path(trigger_file) if trigger_file else Path(run_dir) / rf.TRIGGER
    atomic_write(path, f"rounds={rounds}\n", durable=False)
    return path
