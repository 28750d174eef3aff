"""The spine: what every layer of rankscope shares, importing nothing from rankscope itself.

- The one error hierarchy (:class:`RankscopeError` and its kinds). The library raises these and never
  prints or exits; every message names the offending file, field or parameter, the value and what is
  expected.
- :func:`atomic_write` / :func:`atomic_write_with`: temp file in the same directory, fsync,
  ``os.replace``; the temp file is removed on any failure, so a reader (or a ``kill -9`` of the
  writer) never sees a partial file. :func:`remove_stale_temps` clears what killed writers left.
- :func:`paused_gc`: the cyclic collector off while millions of small acyclic objects are built.
- Input validators that raise :class:`InputError` (or :class:`ConfigError`) with such a message.
- The one error edge (:func:`error_edge`), shared by the CLI and the agent daemon: a rankscope error is
  one ``rankscope: error: ...`` line on stderr and exit 2, Ctrl-C exit 130, anything else one line
  and exit 1 (``RANKSCOPE_DEBUG=1`` shows the traceback).
- Progress of long reads (:func:`progress`): the library wraps its loops over many files; nothing happens
  unless a caller installed a reporter (:func:`reporting_progress`; the CLI's bar on a terminal).

Standard library only: the in-process hook and the lean agent daemon import it.
"""

from __future__ import annotations

import gc
import numbers
import os
import sys
import time
import traceback
import uuid
from collections.abc import Callable, Iterable, Iterator, Sized
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import IO, Any, NoReturn, Protocol, TypeVar

# -- errors ---------------------------------------------------------------------------------------


class RankscopeError(Exception):
    """Base class of every error rankscope raises on purpose."""


class InputError(RankscopeError):
    """Bad user input: a malformed file, an unknown option value, an inconsistent layout."""


class LayoutError(InputError):
    """A parallel layout that cannot describe the job (sizes, order, world size, GPUs per node)."""


class ConfigError(InputError):
    """A setting that is unknown, of the wrong type or out of range (flag, environment or config file)."""


class LimitError(InputError):
    """Input larger than a configured limit (``rankscope.config.Limits``): refused, not half-read."""


class StoreError(RankscopeError):
    """The store is unreadable: a corrupt or truncated Parquet file, a missing or foreign root."""


class RecoveryError(RankscopeError):
    """A recovery step that could not be carried out: a backend command failed, the job's lock is held."""


class ParseError(InputError):
    """A dump file that no reader can make sense of."""

    def __init__(self, path: object, what: str) -> None:
        self.path = str(path)
        self.what = what
        super().__init__(f"{path}: {what}")


# -- atomic writes ----------------------------------------------------------------------------------

TEMP_PREFIX = ".tmp-"
"""Every temporary file rankscope writes starts with this (hidden; never matched by a reader's glob)."""


def _temp_path(path: Path) -> Path:
    return path.with_name(f"{TEMP_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}-{path.name}")


def _fsync_dir(directory: Path) -> None:
    """Make a rename durable (best effort: some filesystems refuse to open a directory)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_with(
    path: str | os.PathLike[str], writer: Callable[[IO[bytes]], Any], *, durable: bool = True
) -> Path:
    """Write ``path`` through ``writer(fh)`` (e.g. ``pq.write_table(t, fh)``) so that it either does not
    exist or is complete. ``durable`` fsyncs the file and the directory (off for hot, disposable files)."""
    target = Path(path)
    tmp = _temp_path(target)
    try:
        with open(tmp, "wb") as fh:
            writer(fh)
            if durable:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        _fsync_dir(target.parent)
    return target


def atomic_write(path: str | os.PathLike[str], data: bytes | str, *, durable: bool = True) -> Path:
    """Write ``data`` (text is UTF-8) to ``path`` atomically; see :func:`atomic_write_with`."""
    blob = data.encode("utf-8") if isinstance(data, str) else data
    return atomic_write_with(path, lambda fh: fh.write(blob), durable=durable)


def remove_stale_temps(directory: str | os.PathLike[str], *, older_than_seconds: float = 3600.0) -> int:
    """Remove temp files (``.tmp-*``) that killed writers left in ``directory``; how many were removed.

    Only files older than ``older_than_seconds``: a writer still busy with its temp file keeps it.
    """
    root = Path(directory)
    cutoff = time.time() - older_than_seconds
    removed = 0
    try:
        entries = list(os.scandir(root))
    except OSError:
        return 0
    for entry in entries:
        if not entry.name.startswith(TEMP_PREFIX):
            continue
        try:
            if entry.is_file(follow_symlinks=False) and entry.stat(follow_symlinks=False).st_mtime < cutoff:
                os.unlink(entry.path)
                removed += 1
        except OSError:
            continue
    return removed


# -- memory ---------------------------------------------------------------------------------------------


@contextmanager
def paused_gc() -> Iterator[None]:
    """The cyclic collector off for a block that allocates millions of small acyclic objects (it would
    rescan them again and again); restored to its previous state afterwards."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


# -- validators -----------------------------------------------------------------------------------------


def _is_number(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_positive(where: str, value: Any, *, error: type[InputError] = InputError) -> float:
    """``value`` as a float when it is a finite number > 0, else ``error`` naming ``where``."""
    if not _is_number(value) or not float(value) > 0 or float(value) == float("inf"):
        raise error(f"{where}={value!r} must be a positive number")
    return float(value)


def check_non_negative(where: str, value: Any, *, error: type[InputError] = InputError) -> float:
    """``value`` as a float when it is a finite number >= 0, else ``error`` naming ``where``."""
    if not _is_number(value) or not float(value) >= 0 or float(value) == float("inf"):
        raise error(f"{where}={value!r} must be a number >= 0")
    return float(value)


def check_fraction(where: str, value: Any, *, error: type[InputError] = InputError) -> float:
    """``value`` as a float in (0, 1], else ``error`` naming ``where``."""
    if not _is_number(value) or not 0.0 < float(value) <= 1.0:
        raise error(f"{where}={value!r} must be in (0, 1]")
    return float(value)


def check_int(where: str, value: Any, *, minimum: int = 0, error: type[InputError] = InputError) -> int:
    """``value`` when it is an integer >= ``minimum``, else ``error`` naming ``where``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise error(f"{where}={value!r} must be an integer >= {minimum}")
    if int(value) < minimum:
        raise error(f"{where}={value!r} must be an integer >= {minimum}")
    return int(value)


# -- the error edge -------------------------------------------------------------------------------------

DEBUG_ENV = "RANKSCOPE_DEBUG"


def os_error_words(exc: OSError) -> str:
    """An OSError as ``FILE: reason``."""
    where = exc.filename or ""
    return f"{where}: {exc.strerror or exc}" if where else str(exc)


def _die(message: str, code: int) -> NoReturn:
    one_line = " ".join(message.split()) if "\n" in message else message  # the promise: one line
    print(f"rankscope: error: {one_line}", file=sys.stderr, flush=True)
    raise SystemExit(code)


@contextmanager
def error_edge(*, passthrough: tuple[type[BaseException], ...] = ()) -> Iterator[None]:
    """The one place where errors become exit codes (the CLI's commands, the agent daemon's main).

    rankscope's own errors and unreadable files: one ``rankscope: error: ...`` line, exit 2.
    Ctrl-C: exit 130. Anything else is a bug: one line naming it, exit 1 (``RANKSCOPE_DEBUG=1``
    prints the traceback first). ``passthrough`` exceptions (a CLI framework's own exits) and
    ``SystemExit`` pass unchanged.
    """
    try:
        yield
    except SystemExit:
        raise
    except passthrough:
        raise
    except RankscopeError as exc:
        _die(str(exc), 2)
    except OSError as exc:
        _die(os_error_words(exc), 2)
    except KeyboardInterrupt:
        print("rankscope: interrupted", file=sys.stderr, flush=True)
        raise SystemExit(130) from None
    except Exception as exc:
        if os.environ.get(DEBUG_ENV, "") not in ("", "0"):
            traceback.print_exc()
        _die(f"internal error: {type(exc).__name__}: {exc} (set {DEBUG_ENV}=1 for the traceback; please report it)", 1)


# -- progress of long reads -------------------------------------------------------------------------------

T = TypeVar("T")


class ProgressTask(Protocol):
    """One reported loop: ``advance`` after each item, ``close`` at the end."""

    def advance(self, n: int = 1) -> None: ...

    def close(self) -> None: ...


ProgressReporter = Callable[[str, "int | None"], ProgressTask]
"""``reporter(label, total)`` starts a task (``total`` None when unknown, e.g. a directory walk)."""

_REPORTER: ContextVar[ProgressReporter | None] = ContextVar("rankscope_progress", default=None)


def progress(items: Iterable[T], label: str, *, total: int | None = None) -> Iterable[T]:
    """``items`` as they are; under :func:`reporting_progress` each item also advances the reporter's task.

    Without a reporter (the library's default, the daemon, a pipe) this returns ``items`` itself: no cost.
    """
    reporter = _REPORTER.get()
    if reporter is None:
        return items
    if total is None and isinstance(items, Sized):
        total = len(items)
    return _tracked(items, reporter(label, total))


def _tracked(items: Iterable[T], task: ProgressTask) -> Iterator[T]:
    try:
        for item in items:
            yield item
            task.advance(1)
    finally:
        task.close()


def current_reporter() -> ProgressReporter | None:
    """The reporter :func:`progress` loops report to here (None: nobody draws)."""
    return _REPORTER.get()


@contextmanager
def reporting_progress(reporter: ProgressReporter | None) -> Iterator[None]:
    """Report :func:`progress` loops to ``reporter`` inside this block (None: report nothing)."""
    token = _REPORTER.set(reporter)
    try:
        yield
    finally:
        _REPORTER.reset(token)
