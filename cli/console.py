"""The one console helper of the CLI: output, the error edge on every command, and progress bars.

- :func:`echo` prints plain text (no colour codes, no markup: verdicts are pasted into tickets).
- :func:`fail` is one ``rankscope: error: ...`` line on stderr and exit 2; :func:`handle_errors` runs a
  command inside the spine's error edge (``rankscope.spine.error_edge``).
- :func:`long_reads` shows a rich progress bar for the library's long loops (``rankscope.spine.progress``:
  thousands of dump files, many Parquet parts) when stderr is a terminal, and nothing when it is piped or
  redirected. rich is imported only then, so ``--help`` and piped runs never load it.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import wraps
from typing import Any, NoReturn, TypeVar

import typer

from rankscope.spine import ProgressTask, error_edge, reporting_progress

F = TypeVar("F", bound=Callable[..., Any])


def echo(text: str = "", *, end: str = "\n") -> None:
    """Plain text on stdout."""
    sys.stdout.write(text + end)


def fail(message: str, code: int = 2) -> NoReturn:
    """One clear line on stderr and exit ``code`` (2 = bad input)."""
    print(f"rankscope: error: {message}", file=sys.stderr)
    raise typer.Exit(code)


def handle_errors(fn: F) -> F:
    """Run a command inside the spine's error edge, with progress bars for long reads on a terminal:
    rankscope errors and unreadable files are one stderr line and exit 2, Ctrl-C exit 130, anything
    else one line and exit 1 (RANKSCOPE_DEBUG=1: traceback)."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with error_edge(passthrough=(typer.Exit, typer.Abort)), long_reads():
            return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]  # wraps() keeps the signature typer reads


# -- progress -----------------------------------------------------------------------------------------
SHOW_AFTER_SECONDS = 0.5
"""A loop shows its bar only once it has run this long: short reads draw nothing."""


def progress_wanted() -> bool:
    """A bar only on a terminal (stderr a TTY), never in CI logs or pipes; RANKSCOPE_PROGRESS=0/1 forces it."""
    forced = os.environ.get("RANKSCOPE_PROGRESS", "")
    if forced in ("0", "1"):
        return forced == "1"
    return sys.stderr.isatty() and os.environ.get("TERM", "") != "dumb"


@contextmanager
def long_reads() -> Iterator[None]:
    """Inside this block, the library's :func:`rankscope.spine.progress` loops draw a bar on stderr."""
    with reporting_progress(_BarTask if progress_wanted() else None):
        yield


class _BarTask:
    """One loop's bar: created silently, drawn once the loop has run ``SHOW_AFTER_SECONDS``, updated in
    batches (a rich update per item would cost more than reading a small dump), removed when done."""

    def __init__(self, label: str, total: int | None) -> None:
        self.label, self.total = label, total
        self.t0 = time.monotonic()
        self.done = self.pending = 0
        self.step = max(1, (total or 0) // 200) if total else 64
        self.bar: Any = None
        self.task: Any = None

    def advance(self, n: int = 1) -> None:
        self.pending += n
        if self.pending < self.step:
            return
        self.done += self.pending
        self.pending = 0
        if self.bar is None:
            if time.monotonic() - self.t0 < SHOW_AFTER_SECONDS:
                return
            self._start()
        self.bar.update(self.task, completed=self.done)

    def _start(self) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        columns: list[Any] = [TextColumn("{task.description}")]
        if self.total:
            columns += [BarColumn(), MofNCompleteColumn()]
        else:
            columns += [TextColumn("{task.completed:,} files")]
        columns.append(TimeElapsedColumn())
        self.bar = Progress(*columns, console=Console(stderr=True), transient=True)
        self.bar.start()
        self.task = self.bar.add_task(self.label, total=self.total, completed=self.done)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None


_: type[ProgressTask] = _BarTask  # the spine's protocol
