"""Raw Flight Recorder dumps kept in the store, one file per rank and capture (standard library only).

The node agent does not decode Flight Recorder dumps (a full ring buffer parses to tens of MB of Python
objects): it copies the bytes the hook wrote into the store, atomically, and indexes them in the
``fr_dumps`` table (job, capture time, rank, node, pid, path, format, size, sha256)::

    ROOT/artifacts/fr/job=<job>/capture=<UTC stamp>/rank_<R>.json     (or .pkl)
    ROOT/fr_dumps/job=<job>/part-*.parquet                              the index

``rankscope diagnose STORE`` reads the latest captures back through the Flight Recorder reader
(:mod:`rankscope.datasets.readers.fr_store`). The copy streams in 1 MiB chunks, hashing as it goes:
the agent's memory does not grow with the size of a dump.
"""

from __future__ import annotations

import importlib
import os
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Any

from rankscope.spine import InputError, atomic_write_with


def _sha256() -> Any:
    """A SHA-256 hasher from CPython's own implementation (what hashlib falls back to): importing hashlib maps
    OpenSSL's libcrypto, 3 MB more resident in a daemon that must stay small."""
    for module in ("_sha2", "_sha256"):  # 3.12+, 3.10-3.11
        try:
            return importlib.import_module(module).sha256()
        except (ImportError, AttributeError):
            continue
    import hashlib

    return hashlib.sha256()


ARTIFACTS = "artifacts/fr"
_JOB = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")  # the store's partition-value rule
_CHUNK = 1 << 20


def capture_dir(job: str, capture_time: float) -> str:
    """The folder (relative to the store root) of one capture's dumps."""
    if not _JOB.match(job):
        raise InputError(f"job {job!r} cannot name a store folder (use letters, digits, '.', '_' or '-')")
    t = datetime.fromtimestamp(capture_time, tz=timezone.utc)
    return f"{ARTIFACTS}/job={job}/capture={t.strftime('%Y%m%dT%H%M%S')}.{t.microsecond:06d}Z"


def keep_dump(
    store_root: str | os.PathLike[str],
    src: str | os.PathLike[str],
    *,
    job: str,
    capture_time: float,
    rank: int,
    node: str | None = None,
    pid: int | None = None,
) -> dict[str, Any]:
    """Copy one rank's raw dump ``src`` into the store (atomic, durable); its ``fr_dumps`` index row."""
    source = Path(src)
    fmt = "fr-pickle" if source.suffix in (".pkl", ".pickle") else "fr-json"
    rel = f"{capture_dir(job, capture_time)}/rank_{rank}{'.pkl' if fmt == 'fr-pickle' else '.json'}"
    dest = Path(store_root) / rel
    dest.parent.mkdir(parents=True, exist_ok=True)
    digest = _sha256()
    size = 0

    def copy(out: IO[bytes]) -> None:
        nonlocal size
        with open(source, "rb") as fh:
            while chunk := fh.read(_CHUNK):
                digest.update(chunk)
                out.write(chunk)
                size += len(chunk)

    atomic_write_with(dest, copy)
    return {
        "job": job,
        "capture_time": datetime.fromtimestamp(capture_time, tz=timezone.utc),
        "rank": rank,
        "node": node,
        "pid": pid,
        "path": rel,
        "format": fmt,
        "size_bytes": size,
        "sha256": digest.hexdigest(),
    }
