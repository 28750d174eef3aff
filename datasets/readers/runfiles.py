"""The names of every file in the hook's run directory, in one place (standard library only).

The in-process hook (``rankscope.collectors.hook``), the node agent and the readers all name these
files through this module, so the hook can import it inside a training process without pulling in
polars or pyarrow. Per process id ``PID``:

``pid<PID>.json``         identity (rank, node, role, parallel coordinates, main thread id)
``pid<PID>.stack.txt``    faulthandler dumps (on request, on SIGTERM, on fatal errors)
``pid<PID>.steps.jsonl``  one JSON line per ``log_step``
``pid<PID>.exit.json``    the uncaught exception that ended the process (or ``type: exit``)
``pid<PID>.ctl``          the hook's request FIFO
``pid<PID>.fr.json``      the Flight Recorder dump (``pid<PID>.fr.pkl`` when torch only pickles)

and for the directory: ``trigger`` (ask the agent for a capture), ``agent.pid``, ``manifest.json``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

ENV_RUN_DIR = "RANKSCOPE_RUN_DIR"
DEFAULT_RUN_DIR = "/tmp/rankscope-run"

IDENTITY = "json"
STACK = "stack.txt"
STEPS = "steps.jsonl"
EXIT = "exit.json"
CTL = "ctl"
FR = "fr.json"
FR_PICKLE = "fr.pkl"
KINDS = (IDENTITY, STACK, EXIT, STEPS, FR, FR_PICKLE, CTL)
"""The per-process files the readers recognise."""

FR_DUMP_TIME_KEY = "rankscope_dump_time_ns"
"""The top-level key the hook adds to each Flight Recorder dump it writes: when it was taken (epoch ns;
FR itself records no dump time). Equal to ``rankscope.datasets.domain.flight_recorder.DUMP_TIME_KEY``."""

TRIGGER = "trigger"
AGENT_PID = "agent.pid"
MANIFEST = "manifest.json"
AUX = frozenset({MANIFEST, AGENT_PID, TRIGGER})
"""Files of the run directory that belong to no process."""

STACK_REQUEST = "# rankscope: stack requested at "
"""The hook's line before a dump it wrote on request (followed by epoch seconds)."""

HOOK_FILE = re.compile(r"^pid(\d+)\.(" + "|".join(re.escape(k) for k in KINDS) + r")$")


def name(pid: int, kind: str) -> str:
    """``pid<PID>.<kind>``, e.g. ``name(42, STACK) == "pid42.stack.txt"``."""
    return f"pid{pid}.{kind}"


def path(run_dir: str | os.PathLike[str], pid: int, kind: str) -> Path:
    """The file of ``kind`` for process ``pid`` in ``run_dir``."""
    return Path(run_dir) / name(pid, kind)


def pattern(kind: str) -> str:
    """A glob matching every process's file of ``kind`` (``pid*.steps.jsonl``)."""
    return f"pid*.{kind}"


def parse(filename: str) -> tuple[int, str] | None:
    """``(pid, kind)`` for a per-process file name, else None."""
    m = HOOK_FILE.match(filename)
    return (int(m.group(1)), m.group(2)) if m else None
