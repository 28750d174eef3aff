"""Identity of evidence files: manifests at any depth, path tokens, host folders, local ranks.

Rules (the order is the order of trust; see :mod:`rankscope.datasets.domain.identity`):

1. ``manifest.csv`` at any depth applies to the files under its folder. Its ``file`` column is relative
   to the manifest's folder (else to the input root); ``rank``, and optional ``node``, ``role``, ``pid``,
   ``snapshot``, ``local_rank`` (other columns are ignored). Several rows of one file with different ``pid``
   name the processes of a concatenated dump. Without a ``snapshot`` column the nearest enclosing
   ``snapshot-N/`` (or ``round-N/``) folder counts.
2. The hook's identities (``pid<PID>.json``), by pid.
3. The path: a ``rank[-_]N`` token in any component is the global rank (the file name's first), a
   ``local[-_]rank[-_]N`` token a local rank, torchrun's ``--log-dir`` layout
   (``<run_id>/attempt_<k>/<local_rank>/``) a local rank too; the nearest folder above the file that is no
   known container (``snapshot-N``, ``stacks``, ``dumps``, ``logs``, ``attempt_N``, ``rank_N``, digits,
   a ``--log-dir`` run id, ...) is the machine's name.
4. Sibling trainers of one host without a rank: ``--local-rank``/``LOCAL_RANK`` in their command line,
   else pid order (torchrun starts local ranks in order) when each host holds the same count (and that
   count is ``--gpus-per-node`` when given).
5. A local rank on a named host becomes the global rank ``host index * gpus_per_node + local rank`` over
   the sorted host names, with a note: the mapping is assumed unless a manifest or identity says otherwise.
"""

from __future__ import annotations

import csv
import io
import itertools
import operator
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache, partial
from typing import NamedTuple

from rankscope.datasets.domain.bounds import int_text, limits, open_regular
from rankscope.spine import InputError, ParseError

MANIFEST = "manifest.csv"

DATE = r"(?<!\d)(20\d\d)-?(0[1-9]|1[0-2])-?(0[1-9]|[12]\d|3[01])"
STAMP = re.compile(DATE + r"[-_T. ]?([01]\d|2[0-3])[-_:.]?([0-5]\d)[-_:.]?([0-5]\d)(?!\d)")  # to the second
_HOST_STAMP = re.compile(r"^(?P<host>[A-Za-z0-9][A-Za-z0-9._-]*?)[-_.]" + STAMP.pattern + r"(?:[-_.]?\d+|Z)?$")
"""A machine's folder stamped with its capture time: a sidecar's ``$(hostname)-$(date +%Y%m%d-%H%M%S)``."""


def host_and_stamp(part: str) -> tuple[str, str] | None:
    """(machine, stamp) of a ``<host>-<date>-<time>`` folder name whose host part names a machine, else None."""
    m = _HOST_STAMP.match(part)
    if m is None or not m.group("host") or _CONTAINER.match(m.group("host")) or m.group("host").isdigit():
        return None
    return m.group("host"), part[m.end("host") + 1 :]


# a space separates too ("round 0/", "rank 3.json": names typed by hand)
SNAPSHOT_DIR = re.compile(r"^(?:snap(?:shot)?|round)[-_ ]?(\d+)$", re.I)
_RANK = re.compile(r"(?<![A-Za-z])(?<!local_)(?<!local-)(?<!local )(?<!local)rank[-_ ]?(\d+)", re.I)
_LOCAL = re.compile(r"(?<![A-Za-z])local[-_ ]?(?:rank[-_ ]?)?(\d{1,5})(?!\d)", re.I)  # local_rank3, local3
_ATTEMPT = re.compile(r"^attempt[-_]?\d+$", re.I)
_CONTAINER = re.compile(
    r"^(?:snap(?:shot)?[-_ ]?\d+|round[-_ ]?\d+|attempt[-_]?\d+|(?:local[-_ ]?)?rank[-_ ]?\d+|\d+|text|txt|json|data"
    r"|(?:stacks?|dumps?|py-?spy(?:[-_]?(?:dumps?|text|json))?|traces?|logs?|log[-_]?dir|outputs?|fr|flight[-_]?recorder"
    r"|faulthandler(?:[-_]rounds?)?|torchelastic|errors?|runs?|captures?|incidents?|results?|artifacts?"
    r"|collect(?:ed|ion)?|evidence|tmp|temp)(?:[-_ ]?\d+(?:[-_T:]\d+)*Z?)?"
    r"|torchelastic_[a-z0-9_]+|tmp[a-z0-9_]{6,})$",  # torchrun's error-file and Python's temporary folders
    re.I,
)
"""Folder names that hold evidence rather than name a machine: what the capture calls its folders (``stacks/``,
``py-spy/``), numbered, stamped or not (``py-spy-1/``, ``dumps_2/``, ``pyspy-20261203-083301/``: a capture round
under a pod or host folder; not ``data01``, which may be a machine)."""


def is_capture_folder(name: str) -> bool:
    """Whether a folder's name is a capture's (``stacks``, ``py-spy-1``, ``round-2``, digits), not a machine's."""
    return _CONTAINER.match(name) is not None


_CMD_LOCAL = re.compile(r"(?:--local[-_]rank[= ]|\bLOCAL_RANK=)(\d+)")
_HOSTNAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")
_SLURM_TASK = re.compile(r"[-_.](\d{3,})[-_.](\d{1,6})(?:\.[A-Za-z]+)?$")
"""A Slurm job id and task number at the end of a name (``llm-81235-3.out``: ``srun --output=%x-%j-%t.out``)."""
_GENERIC_STEMS = re.compile(
    r"^(?:torchrun|train(?:ing)?|stdout|stderr|output|out|log|logs|console|combined|job|run|slurm[-_].*|"
    r"torchrun[-_]?(?:stdout|stderr|combined|log)?.*|error|errors|debug|launcher|master|worker)$",
    re.I,
)


_GENERIC_TOKENS = frozenset(
    {"console", "stdout", "stderr", "log", "logs", "output", "combined", "torchrun", "launcher", "debug", "trainer"}
)
"""Words that name what a log is, not the machine it came from (a per-host log is named after its host)."""
_GENERIC_DIR_TOKENS = _GENERIC_TOKENS - {"trainer"}  # a folder: torchrun-logs/, job_output/ (pods may be trainer-3)


@dataclass(frozen=True)
class PathFacts:
    """What a file's path says about its process(es)."""

    snapshot: int | None
    rank: int | None
    local_rank: int | None
    host: str | None  # the nearest non-container folder (a machine name candidate)
    log_dir_layout: bool  # under torchrun's <run_id>/attempt_<k>/<local_rank>/


POD_DIR = (
    r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?_(?P<pod>[a-z0-9](?:[-.a-z0-9]*[a-z0-9])?)_"
    r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
)
"""The kubelet's folder of a pod's logs on its node: ``/var/log/pods/<namespace>_<pod>_<uid>/<container>/0.log``
(``<restart count>.log``: each restart of the container writes the next)."""
_POD_LOG_DIR = re.compile(f"^{POD_DIR}$")


@lru_cache(maxsize=1 << 16)
def _dir_facts(dirpart: str) -> tuple[int | None, int | None, int | None, str | None, bool]:
    parts = [p for p in dirpart.split("/") if p]
    snap = rank = local = host = None
    log_dir = False
    for part in parts:
        m = SNAPSHOT_DIR.match(part)
        if m:
            snap = int_text(m.group(1), lo=0, hi=2**31 - 1)  # a snapshot number the store's int32 holds, or none
    if len(parts) >= 2 and (m := _POD_LOG_DIR.match(parts[-2])):  # <ns>_<pod>_<uid>/<container>/: the pod
        return snap, None, None, m.group("pod"), False
    # torchrun --log-dir: .../<run_id>/attempt_<k>/<local_rank>/
    if len(parts) >= 2 and parts[-1].isdigit() and _ATTEMPT.match(parts[-2]):
        local, log_dir = int(parts[-1]), True
    run_id = len(parts) - 3 if log_dir else -1
    for i in range(len(parts) - 1, -1, -1):
        part = parts[i]
        if local is None:
            m = _LOCAL.search(part)
            if m:
                local = int(m.group(1))
        if rank is None:
            m = _RANK.search(part)
            if m:
                rank = int(m.group(1))
        if i == run_id or (i + 1 < len(parts) and _ATTEMPT.match(parts[i + 1])):
            continue  # a --log-dir run id ("none_ml68s5ij", "<uuid>_<random>")
        stamped = host_and_stamp(part)
        name = stamped[0] if stamped else part  # $(hostname)-$(date ...): the machine is the host part
        if (
            host is None
            and not _CONTAINER.match(name)
            and _HOSTNAME.match(name)
            and not _RANK.search(name)
            and not (_GENERIC_DIR_TOKENS & set(re.split(r"[-_.]+", name.lower())))
        ):
            host = name
            break
    return snap, rank, local, host, log_dir


def path_facts(rel: str) -> PathFacts:
    """The identity facts of the file at ``rel`` (relative to the input root, ``/``-separated)."""
    dirpart, _, name = rel.rpartition("/")
    snap, drank, dlocal, host, log_dir = _dir_facts(dirpart)
    stem = name.split(".", 1)[0] if not name.startswith(".") else name
    dotted = name.rsplit(".", 1)[0]  # pyspy.rank0.txt: the rank between dots, before the extension
    m = _LOCAL.search(stem) or _LOCAL.search(dotted)
    local = int(m.group(1)) if m else dlocal
    m = _RANK.search(stem) or _RANK.search(dotted)
    rank = int(m.group(1)) if m else drank
    return PathFacts(snap, rank, local, host, log_dir)


def slurm_task(rel: str) -> tuple[str, int] | None:
    """(job id, task) of a file named by ``srun --output=%x-%j-%t.out``, else None: a task, no machine."""
    m = _SLURM_TASK.search(rel.rsplit("/", 1)[-1])
    return (m.group(1), int(m.group(2))) if m else None


def host_from_log_name(rel: str) -> str | None:
    """A per-host log's machine name from its file name (``dgx-h100-0743.log``), when it looks like one."""
    name = rel.rsplit("/", 1)[-1]
    stem = re.sub(r"\.(?:log|out|err|txt|json|stdout|stderr)$", "", name, flags=re.I)
    if not stem or _GENERIC_STEMS.match(stem) or _RANK.search(stem) or _LOCAL.search(stem):
        return None
    if _GENERIC_TOKENS & set(re.split(r"[-_.]+", stem.lower())):  # trainer-console.log, job_stdout.txt
        return None
    if slurm_task(stem):  # srun --output=%x-%j-%t.out: a job id and a task number, no machine
        return None
    return stem if _HOSTNAME.match(stem) and not _CONTAINER.match(stem) else None


def local_rank_from_cmdline(cmdline: str | None) -> int | None:
    """``--local-rank=N`` / ``--local_rank N`` / ``LOCAL_RANK=N`` in a command line, else None."""
    if not cmdline or ("ocal" not in cmdline and "LOCAL" not in cmdline):
        return None
    m = _CMD_LOCAL.search(cmdline)
    return int(m.group(1)) if m else None


def natural(name: str) -> tuple[tuple[int, int, str] | tuple[int, str], ...]:
    """Sort key: ``node-2`` before ``node-10``."""
    # digit runs by value without int() (no digit limit on hostile names)
    return tuple(
        (0, len(t.lstrip("0")), t.lstrip("0")) if t.isdigit() else (1, t) for t in re.split(r"(\d+)", name) if t
    )


def folders_not_machines(
    per_folder: Mapping[str, Mapping[int, Collection[object]]], gpus_per_node: int | None
) -> tuple[set[str], str]:
    """Host-folder names that cannot be machines, and why: the only folder, when it holds more than one rank's
    dump (``2026-12-01T21-00/``, ``fh/``, ``on-error/``: the job's dump folder, not a host; host folders split a
    job's ranks over machines) unless it holds one machine's block of ranks after rank 0 (``gpu-st-a12/rank4..7``,
    the only machine collected) or it is named like a host and holds one machine's ranks from 0 (``trn-k01/``: a
    one-node job, ``$(hostname)`` of the collection script), and a folder holding more ranks in one snapshot than
    ``gpus_per_node`` allows.
    ``per_folder``: folder name -> snapshot -> the ranks whose dumps it holds there (stack or Flight Recorder;
    an object other than an int stands for a dump whose rank is still unknown)."""
    most = {h: max((len(r) for r in c.values()), default=0) for h, c in per_folder.items()}
    if len(most) == 1 and next(iter(most.values())) > 1:
        held = {r for rs in next(iter(per_folder.values())).values() for r in rs if isinstance(r, int)}
        block = bool(held) and max(held) - min(held) + 1 == len(held) and (min(held) > 0 or _host_like(*most))
        if not (block and len(held) <= (gpus_per_node or 8)):
            return set(most), "one folder holds every rank's dump (the dump folder, not a host)"
    bad = {h for h, n in most.items() if gpus_per_node is not None and n > gpus_per_node}
    return bad, (f"each holds more ranks than --gpus-per-node {gpus_per_node}" if bad else "")


_STAMPISH = re.compile(r"\d{4}[-_]?\d\d[-_]?\d\d|\d{6,}")
_NOT_HOST_WORDS = frozenset({"job", "jobs", "run", "exp", "experiment", "incident", "case", "test", "task", "step"})


def _host_like(name: str) -> bool:
    """A folder name that reads as a numbered machine's: a letter, ending in a digit (``trn-k01``, ``gpu0115``,
    ``nid00207``; not a model's ``llama-7b``), neither a date or time stamp (``2026-12-01T21-00``) nor a long
    number, nor a job's, run's or incident's word (``job-1234``)."""
    return (
        any(c.isalpha() for c in name)
        and name[-1:].isdigit()
        and _STAMPISH.search(name) is None
        and not (_NOT_HOST_WORDS & set(re.split(r"[-_.]+|(?<=[a-z])(?=\d)", name.lower())))
    )


def folders_note(bad: set[str], why: str) -> str:
    """The note for :func:`folders_not_machines`' folders."""
    return f"folder(s) {', '.join(sorted(bad)[:3])} not taken for machine names: {why}"


# -- manifests ----------------------------------------------------------------------------------------
class ManifestRow(NamedTuple):
    """One row of a manifest, its ``file`` resolved relative to the input root (a tuple: 100,000 rows)."""

    file: str
    rank: int
    node: str | None
    role: str | None
    pid: int | None
    snapshot: int | None
    local_rank: int | None
    manifest: str  # the manifest's own path (relative to the root)


_COLUMNS = ("file", "rank", "node", "role", "pid", "snapshot", "local_rank")


def _roles() -> tuple[str, ...]:
    from rankscope.datasets.domain.stacks import ROLES

    return ROLES


def _uint(v: str, hi: int) -> bool:
    """Whether ``v`` is a plain decimal integer in ``[0, hi]`` (the common short case without int_text's
    general parsing; an overlong digit run never meets int()'s digit limit)."""
    if v.isascii() and v.isdigit() and len(v) < 19:
        return int(v) <= hi
    return v.isdigit() and int_text(v, lo=0, hi=hi) is not None


def read_manifest(path: str, rel: str) -> dict[str, tuple[str, ...]]:
    """The columns of one manifest.csv (``file``, ``rank`` and whichever of node, role, pid, snapshot,
    local_rank it has), stripped and validated: one clear error naming the file and line."""
    try:
        with io.TextIOWrapper(open_regular(path), newline="", encoding="utf-8") as fh:
            reader = csv.reader(fh)
            header = [h.strip() for h in next(reader, [])]
            missing = {"file", "rank"} - set(header)
            if missing:
                raise InputError(
                    f"{rel}: header must have file,rank (and node to name machines); missing "
                    f"{', '.join(sorted(missing))}"
                )
            recs = list(reader)
    except UnicodeDecodeError:
        raise InputError(f"{rel}: not a UTF-8 CSV file") from None
    except ParseError as exc:  # not a regular file, unreadable
        raise InputError(f"{rel}: {exc.what}") from None
    except csv.Error as exc:
        raise InputError(f"{rel}: malformed CSV ({exc})") from None
    except OSError as exc:
        raise InputError(f"{rel}: unreadable ({exc.strerror})") from None
    idx = {c: header.index(c) for c in _COLUMNS if c in header}
    return _columns_at_once(recs, idx, len(header)) or _columns_by_row(recs, idx, len(header), rel)


def _bounds() -> list[tuple[str, int]]:
    return [("rank", limits().max_world_size - 1), ("pid", 2**63 - 1), ("snapshot", 2**31 - 1)] + [
        ("local_rank", limits().max_world_size - 1)
    ]


def _columns_at_once(recs: list[list[str]], idx: dict[str, int], width: int) -> dict[str, tuple[str, ...]] | None:
    """The fast path (a 200,000-row manifest in one pass of C loops): every row as wide as the header, every
    value valid; anything else (a blank or short line, a bad value) is None and the row-by-row path names it."""
    if not recs or set(map(len, recs)) != {width}:
        return None
    cols = list(zip(*recs))
    out = {c: tuple(map(str.strip, cols[i])) for c, i in idx.items()}
    if not all(out["file"]) or not all(out["rank"]):
        return None
    for c, hi in _bounds():
        vals = out.get(c)
        if vals is None:
            continue
        vals = tuple(filter(None, vals))
        if vals and not (
            all(map(str.isascii, vals))
            and all(map(str.isdigit, vals))
            and max(map(len, vals)) < 19
            and max(map(int, vals)) <= hi
        ):
            return None
    if "role" in out and not set(out["role"]) <= {"", *_roles()}:
        return None
    return out


def _columns_by_row(recs: list[list[str]], idx: dict[str, int], width: int, rel: str) -> dict[str, tuple[str, ...]]:
    """Row by row: blank lines skipped, short rows padded, the first bad value named with its line."""
    cols, fields = tuple(idx), operator.itemgetter(*idx.values())  # file and rank: always two or more
    max_rank = limits().max_world_size - 1
    bounded = [c for c in _bounds() if c[0] in idx and c[0] != "rank"]
    roles = _roles()
    rows = []
    for i, rec in enumerate(recs, start=2):
        if not rec or not "".join(rec).strip():
            continue
        if len(rec) < width:
            rec = rec + [""] * (width - len(rec))
        row = dict(zip(cols, map(str.strip, fields(rec))))
        if not row["file"]:
            raise InputError(f"{rel}: line {i}: empty 'file'")
        if not row["rank"].isdigit():
            raise InputError(f"{rel}: line {i}: rank {row['rank'][:40]!r} is not a non-negative integer")
        if not _uint(row["rank"], max_rank):
            raise InputError(
                f"{rel}: line {i}: rank {row['rank'][:40]!r} is not a rank (an integer 0 .. "
                f"{max_rank}, limits.max_world_size)"
            )
        role = row.get("role")
        if role and role not in roles:
            raise InputError(f"{rel}: line {i}: role {role!r} is not one of {', '.join(roles)}")
        for col, hi in bounded:
            v = row[col]
            if v and not _uint(v, hi):
                raise InputError(f"{rel}: line {i}: {col} {v[:40]!r} is not an integer 0 .. {hi}")
        rows.append(tuple(row[c] for c in cols))
    return {c: tuple(r[k] for r in rows) for k, c in enumerate(cols)}


def _ints(col: tuple[str, ...] | None, n: int) -> Iterable[int | None]:
    if col is None:
        return itertools.repeat(None, n)
    return [int(v) if v else None for v in col]


_new_row = partial(tuple.__new__, ManifestRow)


def _needs_cleaning(files: tuple[str, ...]) -> bool:
    joined = "\n".join(files)
    return "\\" in joined or joined.startswith("./") or "\n./" in joined


def _clean(f: str) -> str:
    """A ``file`` value as a POSIX path without leading ``./``."""
    f = f.replace("\\", "/")
    while f.startswith("./"):
        f = f[2:]
    return f


class Manifests:
    """Every manifest under the input, each scoped to its folder."""

    def __init__(self) -> None:
        self.by_file: dict[str, list[ManifestRow]] = {}
        self.scopes: list[str] = []  # folders ("" = root, else "a/b/") that hold a manifest, deepest first

    def add(self, manifest_rel: str, cols: Mapping[str, tuple[str, ...]], present: set[str]) -> None:
        """A manifest's rows (its :func:`read_manifest` columns), each ``file`` resolved under the root."""
        scope = manifest_rel[: -len(MANIFEST)]
        self.scopes.append(scope)
        self.scopes.sort(key=len, reverse=True)
        files = [_clean(f) for f in cols["file"]] if _needs_cleaning(cols["file"]) else cols["file"]
        rels = list(map(scope.__add__, files))
        if not all(map(present.__contains__, rels)):  # relative to the root (the older convention)
            rels = [f if r not in present and f in present else r for r, f in zip(rels, files)]
        n = len(rels)
        nodes, roles = cols.get("node"), cols.get("role")
        rows = map(
            _new_row,
            zip(
                rels,
                map(int, cols["rank"]),
                [v or None for v in nodes] if nodes is not None else itertools.repeat(None, n),
                [v or None for v in roles] if roles is not None else itertools.repeat(None, n),
                _ints(cols.get("pid"), n),
                _ints(cols.get("snapshot"), n),  # None: the file's snapshot-N/ folder counts
                _ints(cols.get("local_rank"), n),
                itertools.repeat(manifest_rel, n),
            ),
        )
        by_file = self.by_file
        for row in rows:
            by_file.setdefault(row[0], []).append(row)

    def __bool__(self) -> bool:
        return bool(self.scopes)

    def scope_of(self, rel: str) -> str | None:
        """The deepest manifest folder ``rel`` lies in, or None when no manifest covers it."""
        for s in self.scopes:
            if rel.startswith(s):
                return s
        return None

    def rows(self, rel: str) -> list[ManifestRow]:
        return self.by_file.get(rel, [])

    def absent(self, present: set[str]) -> list[ManifestRow]:
        """Rows whose file is not under the input."""
        return [r for rel, rows in self.by_file.items() if rel not in present for r in rows]
