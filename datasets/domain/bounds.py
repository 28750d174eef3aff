"""Reading untrusted files within bounds: the one place every reader opens, decodes and coerces through.

Dump directories come from crashed processes, half-written files, other tools and, in batch mode, other
people's jobs. Whatever is in them, a reader must end in a value of the right type or in the project's
own error naming the file, within a bounded time and memory. The mechanisms, each used by every reader:

- :func:`open_regular` / :func:`read_bounded` / :func:`check_regular`: only regular files are opened
  (``O_NONBLOCK`` so a FIFO never blocks the open, then ``fstat``: FIFOs, devices and sockets are refused
  with :class:`NotRegularFile`), and a file larger than ``limits.max_file_bytes`` is a :class:`LimitError`
  saying how to raise the limit; the read itself never returns more than the limit.
- :func:`load_json`: JSON whose nesting is deeper than ``limits.max_json_depth`` is refused *before* it is
  parsed (a linear scan, no recursion), and any decoding failure is a :class:`ParseError` naming the file.
- :func:`to_int` / :func:`to_float` / :func:`int_text`: numbers from untrusted fields coerced safely
  (``inf``, NaN, ``2**63``, 5,000-digit strings, booleans, nested lists: ``None`` or a :class:`ParseError`,
  never ``OverflowError``/``ValueError``/``TypeError``).
- :func:`reading_limits`: the limits in force (``rankscope.config.Limits``; ``[limits]`` in ``--config`` or
  ``RANKSCOPE_LIMITS_*``), set once by the loader for everything read under it.
"""

from __future__ import annotations

import io
import json
import math
import os
import re
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from rankscope.config import Limits
from rankscope.spine import LimitError, ParseError

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
"""Every integer from a dump (ranks, sequence ids, sizes, times in ns) fits in 64 bits, or it is corrupt."""

MAX_LINE_NO = 2**31 - 1
"""A source line number beyond this is corrupt (read as unknown, never the 4,300-digit ``ValueError``)."""
MAX_LINE_CHARS = 1 << 16
"""A stack-frame line longer than this is no frame any tool prints (skipped: no parser sees megabyte lines)."""

FOREIGN: tuple[type[Exception], ...] = (
    ValueError,
    TypeError,
    LookupError,
    AttributeError,
    ArithmeticError,
    RecursionError,
    EOFError,
    AssertionError,
)
"""What a parser raises on bytes it did not expect: a reader's edge turns these into a note or a
:class:`ParseError` naming the file (never a traceback; never a value of the wrong type further in)."""

_LIMITS: ContextVar[Limits | None] = ContextVar("rankscope_reading_limits", default=None)


_DEFAULT = Limits()


def limits() -> Limits:
    """The limits in force for the current read (the defaults unless :func:`reading_limits` set others)."""
    return _LIMITS.get() or _DEFAULT


@contextmanager
def reading_limits(value: Limits | None) -> Iterator[Limits]:
    """Read under ``value`` (None: keep what is in force)."""
    token = _LIMITS.set(value or limits())
    try:
        yield limits()
    finally:
        _LIMITS.reset(token)


class NotRegularFile(ParseError):
    """A FIFO, device, socket or directory where a file was expected: never opened for reading."""


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISDIR(mode):
        return "a directory"
    return "not a regular file"


def _too_big(path: object, size: int, cap: int) -> LimitError:
    return LimitError(
        f"{path}: {size:,} bytes is over the {cap:,}-byte limit per file (limits.max_file_bytes; raise it with "
        "RANKSCOPE_LIMITS_MAX_FILE_BYTES or [limits] max_file_bytes in --config)"
    )


def check_regular(path: str | os.PathLike[str], *, max_bytes: int | None = None) -> int:
    """The size of ``path`` when it is a regular file within the size limit; else :class:`NotRegularFile`,
    :class:`LimitError` or a :class:`ParseError` (missing, unreadable). Follows symbolic links (the walk
    decides which links stay inside the input)."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise ParseError(path, f"unreadable ({exc.strerror or exc})") from None
    if not stat.S_ISREG(st.st_mode):
        raise NotRegularFile(path, f"{_kind(st.st_mode)}, not a regular file: not read")
    cap = limits().max_file_bytes if max_bytes is None else max_bytes
    if st.st_size > cap:
        raise _too_big(path, st.st_size, cap)
    return st.st_size


_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)


def open_regular(path: str | os.PathLike[str], *, max_bytes: int | None = None) -> io.BufferedReader:
    """``path`` opened for binary reading when it is a regular file within the size limit.

    ``O_NONBLOCK`` keeps the open of a FIFO from waiting for a writer; the check is on the opened
    descriptor (``fstat``), so a file swapped for a FIFO or device between a check and the open is refused."""
    fd, _, _ = open_regular_fd(os.fspath(path), max_bytes=max_bytes)
    return open(fd, "rb")


def open_regular_fd(path: str, *, max_bytes: int | None = None) -> tuple[int, int, int]:
    """``(fd, size, cap)`` of ``path`` opened read-only when it is a regular file within the size limit (the
    caller closes ``fd``): :func:`open_regular` without a Python file object, for readers of many small
    files (one ``open``, one ``fstat``, one ``read`` each)."""
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError as exc:
        raise ParseError(path, f"unreadable ({exc.strerror or exc})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(path, f"{_kind(st.st_mode)}, not a regular file: not read")
        cap = limits().max_file_bytes if max_bytes is None else max_bytes
        if st.st_size > cap:
            raise _too_big(path, st.st_size, cap)
        return fd, st.st_size, cap
    except BaseException:
        os.close(fd)
        raise


def read_fd(fd: int, n: int) -> bytes:
    """Up to ``n`` bytes from ``fd`` (a regular file: a read comes back short only at the end of the file,
    or at the kernel's 2 GiB cap per read, where it reads on)."""
    first = os.read(fd, n)
    if len(first) < min(n, _MAX_READ):
        return first
    chunks = [first]
    n -= len(first)
    while n > 0:
        b = os.read(fd, min(n, 1 << 30))
        if not b:
            break
        chunks.append(b)
        n -= len(b)
    return b"".join(chunks)


_MAX_READ = 0x7FFFF000  # Linux's most bytes per read(2)


def read_to_end(fd: int, have: bytes, size: int, want: int) -> bytes:
    """``have`` (the bytes already read from ``fd``) and what follows, ``want`` bytes at most in all: in one
    read up to the size ``fstat`` saw (+1, to see growth; never a buffer of the whole limit), then on in
    1 MiB reads while the file keeps growing (or ``fstat`` said 0, as for ``/proc`` files)."""
    chunks, n = [have], len(have)
    if n < min(size + 1, want):
        b = read_fd(fd, min(size + 1, want) - n)
        chunks.append(b)
        n += len(b)
    if n > size:
        while n < want and (b := os.read(fd, min(want - n, 1 << 20))):
            chunks.append(b)
            n += len(b)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def read_bounded(path: str | os.PathLike[str], *, max_bytes: int | None = None, head: int | None = None) -> bytes:
    """The bytes of a regular file (its first ``head`` bytes when given), never more than the size limit
    (a file that grows while read is cut there, not read on)."""
    fd, size, cap = open_regular_fd(os.fspath(path), max_bytes=max_bytes)
    try:
        data = read_to_end(fd, b"", size, cap + 1 if head is None else min(head, cap + 1))
    except OSError as exc:
        raise ParseError(path, f"unreadable ({exc.strerror or exc})") from None
    finally:
        os.close(fd)
    if head is None and len(data) > cap:
        raise _too_big(path, len(data), cap)
    return data


# -- JSON ------------------------------------------------------------------------------------------------

_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)  # unrolled: a tight loop over plain characters
_INNERMOST = re.compile(rb"\[\]|\{\}")
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def json_too_deep(data: bytes, max_depth: int) -> bool:
    """Whether the JSON text ``data`` nests arrays/objects deeper than ``max_depth``: linear in the size,
    no recursion (strings are removed first, so brackets inside them do not count)."""
    if data.count(b"[") + data.count(b"{") <= max_depth:
        return False
    # without an escaped quote, every other piece between quotes is a string: no regular expression needed
    outside = b"".join(data.split(b'"')[::2]) if b'\\"' not in data else _JSON_STRING.sub(b"", data)
    brackets = outside.translate(None, _NOT_BRACKETS)
    if len(brackets) <= max_depth:
        return False
    if re.search(rb"[\[{]{%d}" % (max_depth + 1), brackets):  # a run of openers deeper than the limit
        return True
    # innermost pairs vanish one level per pass; what remains after max_depth passes nests deeper
    for _ in range(max_depth):
        shorter = _INNERMOST.sub(b"", brackets)  # one level per pass (a chained replace would take two)
        if len(shorter) == len(brackets):
            return bool(shorter)  # unbalanced leftovers: the parser will say what is wrong
        brackets = shorter
        if not brackets:
            return False
    return bool(brackets)


def load_json(data: bytes | str, where: object, *, what: str = "JSON") -> Any:
    """``data`` decoded as JSON within the depth limit; a :class:`ParseError` naming ``where`` otherwise."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    depth = limits().max_json_depth
    if json_too_deep(raw, depth):
        raise LimitError(
            f"{where}: {what} nested deeper than {depth} levels (limits.max_json_depth; raise it with "
            "RANKSCOPE_LIMITS_MAX_JSON_DEPTH)"
        )
    import orjson  # (here: start-up of commands that never read JSON)

    try:  # orjson for speed; what it refuses (NaN literals, numbers past 64 bits, lone surrogates) goes the
        return orjson.loads(raw)  # standard library's way, which accepts some of it and words the errors
    except orjson.JSONDecodeError:
        pass
    try:
        return json.loads(data)
    except RecursionError:
        raise LimitError(f"{where}: {what} nested too deeply to decode") from None
    except (ValueError, TypeError) as exc:
        raise ParseError(where, f"invalid {what} ({exc})") from None


def load_json_file(path: str | os.PathLike[str], *, what: str = "JSON") -> Any:
    """A regular file's JSON within the size and depth limits (see :func:`load_json`)."""
    return load_json(read_bounded(path), path, what=what)


# -- numbers ---------------------------------------------------------------------------------------------

_MAX_DIGITS = 20  # 2**64 has 20 digits: anything longer is not a 64-bit integer


def int_text(text: str | bytes | None, *, lo: int = INT64_MIN, hi: int = INT64_MAX) -> int | None:
    """A decimal (or ``0x`` hex) integer in ``text`` within ``[lo, hi]``, else None (never the 4,300-digit
    ``ValueError``: the length is checked before converting)."""
    if text is None:
        return None
    s = text.decode("ascii", "replace") if isinstance(text, bytes) else text
    s = s.strip()
    if not s or len(s) > _MAX_DIGITS + 3:
        return None
    try:
        v = int(s, 16) if s[:2].lower() in ("0x",) or s[:3].lower() in ("-0x",) else int(s)
    except ValueError:
        return None
    return v if lo <= v <= hi else None


def to_int(value: Any, *, lo: int = INT64_MIN, hi: int = INT64_MAX) -> int | None:
    """``value`` as an int within ``[lo, hi]`` (ints, integral finite floats, integer strings), else None."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return value if lo <= value <= hi else None
    if isinstance(value, float):
        if not math.isfinite(value) or value != int(value):
            return None
        v = int(value)
        return v if lo <= v <= hi else None
    if isinstance(value, (str, bytes)):
        return int_text(value, lo=lo, hi=hi)
    return None


def to_float(value: Any, *, finite: bool = True) -> float | None:
    """``value`` as a float (finite unless ``finite=False``), else None; never raises."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        try:
            v = float(value)
        except OverflowError:
            return None
    elif isinstance(value, (str, bytes)) and len(value) <= 64:
        try:
            v = float(value)
        except ValueError:
            return None
    else:
        return None
    return v if (math.isfinite(v) or not finite) else None


# -- times -----------------------------------------------------------------------------------------------


def epoch_range() -> tuple[float, float]:
    """Seconds since the epoch of the first and last instants ``limits.min_year`` .. ``max_year`` allow."""
    import calendar

    lim = limits()
    return float(calendar.timegm((lim.min_year, 1, 1, 0, 0, 0))), float(calendar.timegm((lim.max_year, 1, 1, 0, 0, 0)))


def plausible_epoch(t: float) -> bool:
    """Whether ``t`` (seconds since the epoch) lies in the years the limits allow: a time far outside is a
    corrupt record (a zeroed clock, a bit flip), and a time range sized by it would allocate without end."""
    lo, hi = epoch_range()
    return lo <= t < hi
