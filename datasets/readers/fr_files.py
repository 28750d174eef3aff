"""Flight Recorder files: recognising them, the rank in their name, and decoding their untrusted bytes.

FR dumps are untrusted input: pickles go through :class:`SafeUnpickler`, which admits only plain
containers and scalars and refuses any reference to a class or function before it is resolved.
:func:`select_fr_files` picks one dump per rank; :mod:`.flight_recorder` parses what :func:`load_raw` decodes.
"""

from __future__ import annotations

import io
import os
import pickle
import re
import threading
from collections import OrderedDict, defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import lru_cache
from typing import Any

from rankscope.datasets.domain.bounds import load_json, read_bounded
from rankscope.spine import InputError, ParseError


class RefusedPickle(pickle.UnpicklingError):
    """A pickle that references something other than plain containers and scalars."""


def _latin1_bytes(text: str, encoding: str = "latin1") -> bytes:
    """What protocol 0-2 pickles call (``_codecs.encode``) to rebuild ``bytes``; nothing else."""
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise RefusedPickle("_codecs.encode is only admitted to rebuild bytes from latin-1 text")
    return text.encode("latin1")


_SAFE_GLOBALS: dict[tuple[str, str], Any] = {
    ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset,
    ("__builtin__", "set"): set,  # protocol 0-2 pickles name Python 2's module
    ("__builtin__", "frozenset"): frozenset,
    ("collections", "OrderedDict"): OrderedDict,
    ("_codecs", "encode"): _latin1_bytes,
}


class SafeUnpickler(pickle.Unpickler):
    """An unpickler for plain data: dicts, lists, tuples, sets, str, bytes, numbers, bools and None.

    Any reference to a class or function (``GLOBAL``/``STACK_GLOBAL``, extension codes, persistent
    ids) raises :class:`RefusedPickle` before it is resolved, so no foreign code can run. Admitted:
    ``set``/``frozenset``/``OrderedDict`` and ``_codecs.encode`` for latin-1 text (old pickles' bytes).
    """

    def find_class(self, module: str, name: str) -> Any:
        try:
            return _SAFE_GLOBALS[(module, name)]
        except KeyError:
            raise RefusedPickle(f"refers to {module}.{name}; only plain containers and scalars are allowed") from None

    def persistent_load(self, pid: Any) -> Any:
        raise RefusedPickle("uses persistent ids; only plain containers and scalars are allowed")


def safe_loads(data: bytes) -> Any:
    """Unpickle ``data`` admitting only plain containers and scalars (see :class:`SafeUnpickler`), within a
    memory budget: the C unpickler sizes its memo by the index a ``LONG_BINPUT`` names (a 40-byte pickle can
    ask for 16 GiB), so the address space may grow by at most :func:`_budget` while it runs and more is a
    ``MemoryError`` (a :class:`ParseError` at the caller), never an exhausted machine.

    The stream is buffered whole: PyTorch writes protocol 2, which has no frames, and from a bare ``BytesIO``
    the C unpickler asks Python for every opcode's bytes (4-5x slower than ``pickle.loads``); with ``peek``
    (``BufferedReader``) it reads from one prefetched buffer, as fast as ``pickle.loads``."""
    with _address_space_budget(_budget(len(data))):
        stream = io.BufferedReader(io.BytesIO(data), buffer_size=max(io.DEFAULT_BUFFER_SIZE, len(data)))
        return SafeUnpickler(stream).load()


def _budget(size: int) -> int:
    return (1 << 30) + 32 * size  # decoded FR dumps take ~5-10x their pickle; the memo bomb asks for GiBs


_STATM: list[int] = [-1, -1]  # [pid that opened it, descriptor of /proc/self/statm]


def _vm_bytes() -> int | None:
    """The address space now, measured afresh on every call (a measurement reused after memory was freed
    would let a memo bomb have what was freed). ``/proc/self/statm`` stays open and is re-read with one
    ``pread`` (an open, read and close for each of thousands of small dumps was a tenth of the read); a
    forked child opens its own (the parent's descriptor names the parent)."""
    try:
        pid = os.getpid()
        if _STATM[0] != pid:
            fd = os.open("/proc/self/statm", os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            _STATM[0], _STATM[1] = pid, fd  # (a parent's descriptor inherited by a fork stays open: one fd)
        return int(os.pread(_STATM[1], 64, 0).split()[0]) * _PAGE
    except (OSError, ValueError, IndexError, AttributeError):
        return None


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


@contextmanager
def _address_space_budget(extra: int) -> Iterator[None]:
    """``RLIMIT_AS`` at the current address space + ``extra`` for the block (no-op where unsupported, or when a
    lower limit is already set)."""
    try:
        import resource
    except ImportError:  # not POSIX
        yield
        return
    vm = _vm_bytes()
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    want = None if vm is None else vm + extra
    if (
        want is None
        or (soft != resource.RLIM_INFINITY and soft <= want)
        or (hard != resource.RLIM_INFINITY and want > hard)
    ):
        yield
        return
    with _RLIMIT_LOCK:
        resource.setrlimit(resource.RLIMIT_AS, (want, hard))
        try:
            yield
        finally:
            resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


_RLIMIT_LOCK = threading.Lock()


SNIFF_BYTES = 1 << 12  # an FR dict's first key (version, entries, pg_config...) is in its first bytes


_EXTENSIONS = (".json", ".pkl", ".pickle", ".pk")


_RANK_AT_END = re.compile(r"^(.*?)(\d+)$")


# -- sniffing and loading ---------------------------------------------------------------------
def is_fr_file(path: str | os.PathLike[str]) -> bool:
    """Cheap check: a pickle, or a JSON object whose first bytes name an FR key. Never raises."""
    try:
        head = read_bounded(path, head=SNIFF_BYTES)
    except InputError:  # unreadable, not a regular file, too big
        return False
    return is_fr_bytes(head)


def is_fr_bytes(head: bytes) -> bool:
    """:func:`is_fr_file` on a file's first :data:`SNIFF_BYTES` bytes."""
    if len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5:
        return any(k in head for k in (b"version", b"entries", b"pg_config"))
    text = head.lstrip()
    if text.startswith(b"\xef\xbb\xbf"):
        text = text[3:].lstrip()
    return text.startswith(b"{") and any(k in text for k in (b'"entries"', b'"pg_config"', b'"pg_status"'))


def rank_from_name(path: str | os.PathLike[str]) -> int | None:
    """The rank at the end of a dump's file name (``nccl_trace_rank_12``, ``fr_rank3.json``), else None."""
    return _rank_from_basename(os.path.basename(os.fspath(path)))


@lru_cache(maxsize=1 << 16)
def _rank_from_basename(stem: str) -> int | None:
    low = stem.lower()
    for ext in _EXTENSIONS:
        if low.endswith(ext):
            stem = stem[: -len(ext)]
            break
    m = _RANK_AT_END.match(stem)
    return int(m.group(2)) if m else None


def _family(path: str | os.PathLike[str]) -> str:
    """``<prefix>#<extension>`` of a dump file name, the unit torchfrtrace calls a prefix."""
    name = os.path.basename(os.fspath(path))
    ext = next((e for e in _EXTENSIONS if name.lower().endswith(e)), "")
    stem = name[: len(name) - len(ext)]
    m = _RANK_AT_END.match(stem)
    return f"{m.group(1) if m else stem}#{ext}"


def read_bytes(path: str | os.PathLike[str]) -> bytes:
    """A regular file's bytes within the size limit; anything else is a :class:`ParseError` naming it."""
    return read_bounded(path)


def load_raw(path: str | os.PathLike[str], data: bytes | None = None) -> tuple[dict[str, Any], str]:
    """The decoded top-level dict of an FR file (its ``data`` when already read) and its format
    (``fr-pickle`` or ``fr-json``)."""
    if data is None:
        data = read_bytes(path)
    if data[:1] == b"\x80":
        fmt = "fr-pickle"
        try:
            obj = safe_loads(data)
        except RefusedPickle as exc:
            raise ParseError(path, f"refused pickle: {exc}") from None
        except (
            pickle.UnpicklingError,
            EOFError,
            ValueError,
            TypeError,
            AttributeError,
            IndexError,
            KeyError,
            OverflowError,
            RecursionError,
            UnicodeDecodeError,
        ) as exc:
            raise ParseError(path, f"corrupt or truncated pickle ({type(exc).__name__}: {exc})") from None
        except MemoryError:
            raise ParseError(
                path, f"corrupt pickle: it asks for more than {_budget(len(data)) >> 20} MiB to decode"
            ) from None
    else:
        fmt = "fr-json"
        try:
            obj = load_json(data, path, what="JSON")
        except ParseError as exc:
            raise ParseError(path, f"neither a pickle nor valid JSON ({exc.what})") from None
    if not isinstance(obj, dict):
        raise ParseError(path, f"top level is a {type(obj).__name__}, not a Flight Recorder dict")
    if not any(k in obj for k in ("entries", "pg_config", "pg_status")):
        raise ParseError(path, "no 'entries', 'pg_config' or 'pg_status' key: not a Flight Recorder dump")
    return obj, fmt


def select_fr_files(paths: Sequence[str | os.PathLike[str]], *, prefix: str | None = None) -> list[str]:
    """One dump per rank out of ``paths``: files are grouped by name family (prefix + extension,
    e.g. ``rank_<N>`` pickles vs ``fr_rank<N>.json``); ``prefix`` picks a family, else the family
    covering most ranks wins (pickles, which carry stack frames, on a tie). Files whose name has
    no rank are kept apart and appended (their rank must come from the dump itself)."""
    families: dict[str, list[str]] = defaultdict(list)
    unnamed: list[str] = []
    for p in (os.fspath(x) for x in paths):
        if rank_from_name(p) is None:
            unnamed.append(p)
        elif prefix is None or os.path.basename(p).startswith(prefix):
            families[_family(p)].append(p)
    if not families:
        return unnamed
    best = max(families, key=lambda k: (len({rank_from_name(p) for p in families[k]}), not k.endswith(".json"), k))
    return families[best] + unnamed
