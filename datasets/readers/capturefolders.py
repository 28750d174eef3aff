"""Folders that are captures, not machines, in stack dump paths.

Two structures the field leaves that the per-file path rules cannot see:

- ``<host>/<capture>/rank3.txt`` (``trn-a01/dumps_0/``, ``gpu7/job-1234/``, ``node3/2026-12-02T02-30/``): the
  nearest folder is taken for the machine, yet the same folder name recurs under several parents holding
  other ranks. A machine holds the same ranks wherever its folder appears (under ``round-N/`` too), so a
  name that recurs with other ranks is a capture's, and the folder above it names the machine.
- ``<host>/pyspy-0/`` and ``<host>/pyspy-1/``: sibling folders holding dumps of the same ranks are capture
  rounds, not one snapshot dumped twice; without a ``snapshot-N``/``round-N`` name or a manifest column they
  are numbered in the natural order of their names (``pyspy-2`` before ``pyspy-10``; timestamps sort).
"""

from __future__ import annotations

import calendar
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from rankscope.datasets.readers.identity import (
    DATE,
    SNAPSHOT_DIR,
    STAMP,
    _dir_facts,
    host_and_stamp,
    is_capture_folder,
    natural,
)

if TYPE_CHECKING:
    from rankscope.datasets.domain.stacks import ProcStacks
    from rankscope.datasets.readers.stackid import Found


def _folder_of(rel: str, name: str) -> tuple[str, str]:
    """(the path of the nearest folder called ``name`` above ``rel``, the path above it)."""
    parts = rel.split("/")[:-1]
    i = len(parts) - 1 - parts[::-1].index(name)
    return "/".join(parts[: i + 1]), "/".join(parts[:i])


def machines_above_recurring(found: list[Found], notes: list[str]) -> None:
    """Host-folder names that recur under several parents with other ranks (other processes, before ranks are
    known) give way to the folder above."""
    where: defaultdict[str, defaultdict[str, set[object]]] = defaultdict(lambda: defaultdict(set))
    for f in found:
        node = f.ident.node
        who = f.ident.rank if f.ident.rank is not None else (("pid", f.ident.pid) if f.ident.pid is not None else None)
        if (
            node is not None
            and f.ident.sources.get("node") == "host-folder"
            and who is not None  # a rank, else its process (whole-host dumps not yet numbered)
            and f"/{node}/" in f"/{f.rel}"
        ):
            where[node][_folder_of(f.rel, node)[0]].add(who)
    recurring = set()
    for node, paths in where.items():
        ranks = list(paths.values())
        # pairwise disjoint: a capture folder under several machines; overlapping sets are one machine's rounds
        if len(paths) > 1 and sum(len(r) for r in ranks) == len(set().union(*ranks)):
            recurring.add(node)
    if not recurring:
        return
    for f in found:
        node = f.ident.node
        if node in recurring and f.ident.sources.get("node") == "host-folder" and f"/{node}/" in f"/{f.rel}":
            up = _dir_facts(_folder_of(f.rel, node)[1])[3]
            f.ident = (
                f.ident._replace(node=up)
                if up
                else f.ident._replace(node=None, sources={k: v for k, v in f.ident.sources.items() if k != "node"})
            )
            f.host = up or f.host
    notes.append(
        f"folder name(s) {', '.join(sorted(recurring)[:3])} recur under several folders with other ranks: "
        "captures, not machines; the folder above each names its machine"
    )


def rounds_from_sibling_folders(found: list[Found], notes: list[str]) -> None:
    """Sibling folders holding dumps of the same ranks become snapshots, in the natural order of their names
    (only where no ``snapshot-N`` folder or manifest column numbers them)."""
    trainers = [f for f in found if f.role is None and _who(f) is not None and "snapshot" not in f.ident.sources]
    by_parent: defaultdict[str, defaultdict[str, set[tuple[object, int | None]]]] = defaultdict(
        lambda: defaultdict(set)
    )
    for f in trainers:
        parent, name = _round_parent(f.rel)
        if name:  # rounds of one capture are the same processes: same ranks (or local ranks), same pids
            by_parent[parent][name].add((_who(f), f.ident.pid))
    order: dict[tuple[str, str], int] = {}  # (parent, name) -> round: numbered within each machine's folder (each
    for parent, kids in by_parent.items():  # host's sidecar stamps its own rounds, a second or two apart)
        if len(kids) < 2:
            continue
        sets = list(kids.values())
        if any(isinstance(w, tuple) for s in sets for w, _ in s) and not (parent and _dir_facts(parent)[3]):
            continue  # local ranks (and containers' pids) repeat on every machine: rounds only inside one's folder
        if any(w[0] == "pid" for s in sets for w, _ in s if isinstance(w, tuple)) and not _capture_names(kids):
            continue  # pods of one job (``<job>/<job>-worker-0/``) repeat pids too: pids alone need capture names
        if all(s == sets[0] for s in sets[1:]) and _numbered(list(kids)):  # the same ranks: rounds of a capture
            order.update({(parent, n): i for i, n in enumerate(sorted(kids, key=natural))})
    if not order:
        return
    for f in trainers:
        parent, name = _round_parent(f.rel)
        if (parent, name) in order:
            sources = {**f.ident.sources, "snapshot": "path"}
            f.ident = f.ident._replace(snapshot=order[(parent, name)], sources=sources)
            if f.ident.node == name and f.ident.sources.get("node") == "host-folder":  # a round, not a machine
                up = _dir_facts(parent)[3] if parent else None
                sources = {k: v for k, v in f.ident.sources.items() if k != "node" or up}
                f.ident = f.ident._replace(node=up, sources=sources)
                f.host = up or f.host
    names = sorted({n for _, n in order}, key=natural)
    notes.append(
        f"sibling folders holding the same ranks read as capture rounds, in the order of their names (within each "
        f"machine's folder): {', '.join(names[:5])}"
    )


def _round_parent(rel: str) -> tuple[str, str]:
    """(the folder holding a file's folder, the name of its folder); a ``<host>-<stamp>`` folder counts as the
    ``<stamp>`` folder inside ``<host>`` (a sidecar's ``$(hostname)-$(date ...)``, one per machine and round)."""
    parent, _, name = rel.rpartition("/")[0].rpartition("/")
    split = host_and_stamp(name)
    if split is not None:
        parent, name = f"{parent}/{split[0]}" if parent else split[0], split[1]
    return parent, name


def rounds_from_outer_folders(found: list[Found], notes: list[str]) -> None:
    """Capture folders above the machines' (``<stamp>/<host>/rank3.txt``: each capture written into a folder of
    its own, a folder per machine inside): folders at one depth whose names are a numbered series of captures
    (stamped, or capture words: ``2026-12-02T14-50-09``, ``capture-3``), each holding the same processes in the
    same folders below it, are capture rounds in the natural order of their names (outermost first)."""
    trainers = [f for f in found if f.role is None and _who(f) is not None and "snapshot" not in f.ident.sources]
    below: defaultdict[tuple[int, str], defaultdict[str, set[tuple[object, int | None, str]]]] = defaultdict(
        lambda: defaultdict(set)
    )
    for f in trainers:
        parts = f.rel.split("/")[:-1]
        for depth in range(len(parts) - 1):  # the nearest folder's series is rounds_from_sibling_folders'
            below[(depth, "/".join(parts[:depth]))][parts[depth]].add(
                (_who(f), f.ident.pid, "/".join(parts[depth + 1 :]))
            )
    chosen: dict[tuple[int, str], dict[str, int]] = {}
    for where, kids in below.items():
        sets = list(kids.values())
        same = len(kids) > 1 and _numbered(list(kids)) and all(s == sets[0] for s in sets[1:])
        if same and (_capture_names(kids) or _same_ranked_processes(sets[0])):
            chosen[where] = {n: i for i, n in enumerate(sorted(kids, key=natural))}
    if not chosen:
        return
    for f in trainers:
        parts = f.rel.split("/")[:-1]
        for depth in range(len(parts) - 1):
            order = chosen.get((depth, "/".join(parts[:depth])))
            if order is not None and parts[depth] in order:
                sources = {**f.ident.sources, "snapshot": "path"}
                f.ident = f.ident._replace(snapshot=order[parts[depth]], sources=sources)
                break
    names = sorted({n for order in chosen.values() for n in order}, key=natural)
    notes.append(
        "folders holding the same processes in the same folders below them read as capture rounds, in the order "
        f"of their names: {', '.join(names[:5])}"
    )


def _capture_names(names: Iterable[str]) -> bool:
    """Whether every name is a capture's: stamped with its time, or a capture word (``py-spy-1``, ``capture-3``)."""
    return all(is_capture_folder(n) or STAMP.search(n) for n in names)


def _same_ranked_processes(below: set[tuple[object, int | None, str]]) -> bool:
    """Whether one folder's processes are told by their global rank and pid: the same set under each numbered
    folder (``t0/``, ``10-00-00/``) is then the same processes captured again, whatever the names say (a rank
    runs on one machine only, and another job or pod would not repeat every pid)."""
    return all(isinstance(who, int) and pid is not None for who, pid, _ in below)


def _who(f: Found) -> object:
    """A process's rank, else its local rank (``<host>/py-spy-1/local0.txt``), else its pid
    (``<pod>/py-spy-1/stack-<pid>.txt``), else None. A local rank or a pid only tells a process apart within
    one machine (containers repeat pids)."""
    if f.ident.rank is not None:
        return f.ident.rank
    if f.ident.local_rank is not None:
        return ("local", f.ident.local_rank)
    return ("pid", f.ident.pid) if f.ident.pid is not None else None


_CAPTURE_WORD = re.compile(r"py-?spy|dump|stacks?\b|stack[-_]|traces?\b|capture|round|snap", re.I)


def _capture_named(files: Iterable[str]) -> bool:
    return all(_CAPTURE_WORD.search(re.sub(r"\d+", "", rel.rsplit("/", 1)[-1])) for rel in files)


def rounds_from_repeated_pids(found: list[Found], notes: list[str], gpus_per_node: int | None) -> None:
    """Files of one host that hold the same processes (the same pids, each once per file: ``py-spy dump`` of a
    node's processes run again into ``<host>/pyspy-all-<k>.txt``) are capture rounds, in the natural order of
    their names, where nothing else numbers them. Pods in their own pid namespaces repeat pids too, so the
    same pids alone are not enough: the same process instances (py-spy JSON's pthread addresses, see
    ``ProcessDump.instance``) are, and so are file names stamped with their capture times, as many on every host
    (``<host>/pyspy-20261202-145141.txt``: pods are not named by the second); else ``--gpus-per-node`` tells
    rounds from pods (one file's trainers fit the machine, all of them together do not)."""
    pids: defaultdict[str, defaultdict[str, list[tuple[int, int | None, int | None]]]] = defaultdict(
        lambda: defaultdict(list)
    )
    for f in found:
        if f.host is not None and f.ident.pid is not None and "snapshot" not in f.ident.sources:
            # the same pids, and the same ranks where known (one-process pods all run as pid 42)
            pids[f.host][f.rel].append((int(f.ident.pid), f.ident.rank, f.dump.instance))
    trainers: defaultdict[str, int] = defaultdict(int)
    for f in found:
        trainers[f.rel] += f.role is None
    order: dict[str, int] = {}
    stamped_counts = {
        len(files) for files in pids.values() if all(STAMP.search(rel.rsplit("/", 1)[-1]) for rel in files)
    }
    named_counts = {len(files) for files in pids.values() if _capture_named(files)}
    for files in pids.values():
        sets = [sorted(p, key=lambda t: (t[0], -1 if t[1] is None else t[1], t[2] or 0)) for p in files.values()]
        n = trainers[next(iter(files))]
        if len(files) < 2 or not _numbered([rel.rsplit("/", 1)[-1] for rel in files]):
            continue
        if not all(len(set(s)) == len(s) and s == sets[0] for s in sets):
            continue
        stamps = {m.group(0) for rel in files if (m := STAMP.search(rel.rsplit("/", 1)[-1]))}
        # the very same processes dumped again, or the same pids at the times the names give, as many times on
        # every host (a capture round covers every machine; a sidecar dumping each pod at its own second does not)
        named = _capture_named(files) and len(named_counts) == 1
        if all(t[2] is not None for t in sets[0]) or (len(stamps) == len(files) and len(stamped_counts) == 1):
            ok = n > 0
        elif named:  # named for what they hold, a capture (pyspy-all-2.txt), not a pod (worker-2.txt), and as many
            # on every host (a node sidecar's file per pod, named for py-spy too, is not)
            ok = n > 0 and len(sets[0]) >= 2
        else:  # a node's dump holds several processes; one process per file (pods) repeats pids across containers
            ok = gpus_per_node is not None and 0 < n <= gpus_per_node < n * len(files) and len(sets[0]) >= 2
        if ok:
            order.update({rel: i for i, rel in enumerate(sorted(files, key=natural))})
    if not order:
        return
    for f in found:
        if f.rel in order and "snapshot" not in f.ident.sources:
            f.ident = f.ident._replace(snapshot=order[f.rel], sources={**f.ident.sources, "snapshot": "path"})
    names = sorted({rel.rsplit("/", 1)[-1] for rel in order}, key=natural)
    notes.append(
        f"files of one host holding the same processes read as capture rounds, in name order: {', '.join(names[:4])}"
    )


def _numbered(names: list[str]) -> bool:
    """Whether ``names`` differ only in their digits (``pyspy-0``, ``pyspy-1``; timestamps): a numbered series
    of captures. A copy (``rank0 (copy).txt``, ``backup/``) is no round: it stays one snapshot dumped twice."""
    return len({re.sub(r"\d+", "#", n) for n in names}) == 1


_DAY = re.compile(DATE + r"(?!\d)")


def folder_times(
    procs: Sequence[ProcStacks], other_files: Mapping[str, float | None] | None = None
) -> dict[int, float]:
    """When each snapshot was captured, from its folders' or files' names (``pyspy-20261202-055119/``,
    ``2026-12-02T05-51-19/``: an operator's ``date +%Y%m%d-%H%M%S``, read as the naive time the node's logs
    also write): snapshot -> the latest stamp among its trainer dumps. Empty unless every trainer dump has one
    stamp in its folders and the snapshots' stamps rise with their order; a single snapshot counts only when
    no log (``other_files``: each with its first logged time, None when unknown) written after its stamp lies in
    its stamped folders (a capture folder, where logs are copied in, not a run folder
    named by the job's start). The stamp is taken when the capture starts, on the capturing node's clock: only
    ever evidence that the job moved after it."""
    stamps: dict[int, list[float]] = defaultdict(list)
    folders: set[str] = set()
    for p in procs:
        if p.role != "trainer":
            continue
        parts = p.source.split("/")  # folders, and the file's own name (``<host>/pyspy-20261202-063504.txt``)
        found = {(m.groups(), "/".join(parts[: i + 1])) for i, part in enumerate(parts) for m in STAMP.finditer(part)}
        if len({g for g, _ in found}) != 1 or len(found) != 1:
            return {}
        groups, folder = found.pop()
        folders.add(folder + "/")
        y, mo, d, hh, mi, ss = (int(x) for x in groups)
        try:
            stamps[p.snapshot].append(float(calendar.timegm((y, mo, d, hh, mi, ss, 0, 0, 0))))
        except (ValueError, OverflowError):
            return {}
    out = {s: max(ts) for s, ts in stamps.items()}
    order = [out[s] for s in sorted(out)]
    first = min(out.values(), default=0.0)
    inside = [t for f, t in (other_files or {}).items() if f.startswith(tuple(folders))]
    timed = [t for t in inside if t is not None]
    if len(out) == 1 and not any(t >= first - 1.0 for t in timed) and (timed or not inside):  # logged before it
        return out
    return out if len(out) > 1 and all(a < b for a, b in zip(order, order[1:])) else {}


def _outer_stamp(rel: str) -> tuple[str, tuple[int, ...]] | None:
    """The outermost folder of ``rel`` whose name carries a date (and time): (its path, the stamp's fields)."""
    parts = rel.split("/")[:-1]
    for i, part in enumerate(parts):
        m = STAMP.search(part) or _DAY.search(part)
        if m:
            return "/".join(parts[: i + 1]), tuple(int(x) for x in m.groups())
    return None


def older_incidents(found: list[Found], notes: list[str]) -> list[Found]:
    """Two processes that claim one rank in one snapshot, in folders stamped with different dates or times
    (``incident-20261201/...`` beside ``<host>/pyspy-20261202-062650/...``): every folder of the process whose
    stamps all come before the other's is an earlier incident kept beside the current one, and every dump
    under those folders is left out, with a note. Only when every such clash is settled the same way (one
    side older); otherwise nothing changes (the clash is refused)."""
    first_pid: dict[tuple[int, object], int | None] = {}
    clash = False
    for f in found:  # the common case, no rank claimed twice, in one cheap pass
        if f.role is None and (who := _claim(f)) is not None:
            pid = first_pid.setdefault((f.ident.snapshot, who), f.ident.pid)
            clash = clash or (pid is not None and f.ident.pid is not None and pid != f.ident.pid)
    if not clash:
        return found
    by_key: defaultdict[tuple[int, object], defaultdict[int, list[tuple[str, tuple[int, ...]]]]] = defaultdict(
        lambda: defaultdict(list)
    )
    for f in found:
        if f.role is None and (who := _claim(f)) is not None and f.ident.pid is not None:
            by_key[(f.ident.snapshot, who)][f.ident.pid].append(_outer_stamp(f.rel) or ("", ()))
    drop: set[str] = set()
    keep: set[str] = set()
    for pids in by_key.values():
        if len(pids) < 2:
            continue
        if any(not stamp for folders in pids.values() for _, stamp in folders):
            return found  # an undated side: which came first is unknown
        spans = sorted(_span(pid, [t for _, t in v]) for pid, v in pids.items())
        for older, newer in zip(spans, spans[1:]):
            if not older[1] < newer[0] or older[2] & newer[3] or newer[2] & older[3]:
                return found  # overlapping stamps, or one day only on one side: not one incident after another
        newest = spans[-1][4]
        drop |= {d for pid, v in pids.items() if pid != newest for d, _ in v}
        keep |= {d for d, _ in pids[newest]}
    if not drop or drop & keep:
        return found
    kept = [f for f in found if not any(f.rel.startswith(d + "/") for d in drop)]
    shown = ", ".join(sorted(drop)[:3]) + (" ..." if len(drop) > 3 else "")
    notes.append(
        f"{len(found) - len(kept)} dump(s) under {shown} left out: an older incident than the dumps that claim the "
        "same ranks beside it (the latest incident is diagnosed)"
    )
    return kept


def _claim(f: Found) -> object:
    """What a process claims to be before capture rounds are numbered: its rank, else its local rank in its place
    with the stamped folders left out (``<incident-20261201>/<host>/pyspy-<stamp>/local0.txt`` and
    ``<capture-20261202>/<host>/pyspy-<stamp>/local0.txt`` claim one slot: two runs' processes if their pids
    differ, where the same process's rounds repeat its pid)."""
    if f.ident.rank is not None:
        return f.ident.rank
    if f.ident.local_rank is None:
        return None
    place = [q for p in f.rel.split("/")[:-1] if (q := _unstamped(p)) and not SNAPSHOT_DIR.match(q)]
    return ("local", "/".join(place), f.ident.local_rank)  # (round-N/ folders number rounds, not places)


def _unstamped(part: str) -> str:
    """A folder name without its stamp: what comes before the stamp when it names a machine (``<host>-<stamp>``,
    a sidecar's ``$(hostname)-$(date ...)``), else nothing (``incident-20261201``, ``pyspy-<stamp>``)."""
    m = STAMP.search(part) or _DAY.search(part)
    if m is None:
        return part
    before = part[: m.start()].rstrip("-_. ")
    return before if before and _dir_facts(before)[3] else ""


Stamp = tuple[int, ...]


def _span(pid: int, stamps: list[Stamp]) -> tuple[Stamp, Stamp, set[Stamp], set[Stamp], int]:
    """(earliest, latest, the days stamped with a date alone, every day stamped, pid) of one process's folders."""
    full = [t + (0,) * (6 - len(t)) for t in stamps]  # a date alone as the first second of its day
    return min(full), max(full), {t[:3] for t in stamps if len(t) < 6}, {t[:3] for t in stamps}, pid


def rounds_from_repeated_files(found: list[Found], notes: list[str]) -> None:
    """One file per process and round in a machine's folder (``<host>/pyspy_round2_local0.txt``,
    ``<host>/pyspy_<pid>_<epoch>.txt``: a loop of ``py-spy dump --pid`` per trainer): the files of one process
    (its pid, local rank or rank, and the same command line) are its captures, numbered in the natural order
    of their names, where nothing else numbers them. Only where every process in the folder has as many such
    files, at least two, and the names differ only in their digits; py-spy JSON's process instances (see
    ``ProcessDump.instance``) must agree, so two pods' pid 1 in one folder stay two processes."""
    files: defaultdict[str, defaultdict[object, list[Found]]] = defaultdict(lambda: defaultdict(list))
    per_file: defaultdict[str, int] = defaultdict(int)
    for f in found:
        per_file[f.rel] += 1
    for f in found:
        if f.host is None or f.role is not None or "snapshot" in f.ident.sources or per_file[f.rel] != 1:
            continue
        key = _who(f)
        if key is not None:
            files[f.rel.rpartition("/")[0]][key].append(f)
    order: dict[str, int] = {}
    for procs in files.values():
        counts = {len(fs) for fs in procs.values()}
        names = [f.rel.rsplit("/", 1)[-1] for fs in procs.values() for f in fs]
        if len(counts) != 1 or min(counts) < 2 or len(set(names)) != len(names) or not _numbered(names):
            continue
        if not all(_one_process(fs) for fs in procs.values()):
            continue
        for fs in procs.values():
            order.update({f.rel: i for i, f in enumerate(sorted(fs, key=lambda f: natural(f.rel)))})
    if not order:
        return
    for f in found:
        if f.rel in order:
            f.ident = f.ident._replace(snapshot=order[f.rel], sources={**f.ident.sources, "snapshot": "path"})
    shown = sorted({rel.rsplit("/", 1)[-1] for rel in order}, key=natural)
    notes.append(
        "files of one process in its machine's folder read as its capture rounds, in name order: "
        f"{', '.join(shown[:4])}"
    )


def _one_process(fs: Sequence[Found]) -> bool:
    """Whether dumps keyed alike are one process: one pid, one command line, one instance where py-spy gave
    them (a pid alone repeats across containers)."""
    pids = {f.ident.pid for f in fs}
    cmds = {f.dump.cmdline for f in fs if f.dump.cmdline}
    inst = {f.dump.instance for f in fs if f.dump.instance is not None}
    return len(pids) == 1 and None not in pids and len(cmds) <= 1 and len(inst) <= 1
