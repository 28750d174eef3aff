"""Which machine each log file ran on, where its path misleads (see :func:`machine_names`)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from rankscope.datasets.readers.logs import FileRead


def machine_names(reads: Sequence[FileRead], notes: list[str]) -> None:
    """Which machine each log file ran on, where the path misleads. A folder holding several per-host
    consoles (each several workers' lines, each named after another machine: ``pods/<pod>.log``,
    ``slurm-<jobid>/<host>.out``) is a collection, not a machine: each console's own name is. NCCL's debug
    lines name the machine they ran on (``gethostname()``): that beats a file's name (``%x-%j-%t.out`` names a
    SLURM task) and a collection's, never a folder the user named after a machine."""
    by_folder: defaultdict[str, list[FileRead]] = defaultdict(list)
    for f in reads:
        if f.host_from == "folder" and f.path_local is None:
            by_folder[f.rel.rsplit("/", 1)[0] if "/" in f.rel else ""].append(f)
    for folder, fs in by_folder.items():
        own = {f.rel: f.nccl_host or f.name_host for f in fs if f.workers >= 2 or f.nccl_host}
        if len(fs) < 2 or len(own) < len(fs) or len(set(own.values()) - {None}) < len(fs):
            continue
        for f in fs:
            f.host, f.host_from = own[f.rel], "nccl" if f.nccl_host else "file"
            f.host_source = "log" if f.nccl_host else "host-folder"
        notes.append(
            f"logs: {folder}/ holds {len(fs)} consoles of different machines: each is named by its own "
            "(NCCL's host name, else the file name), not by the folder"
        )
    for f in reads:
        if f.nccl_host and f.host_from in ("file", ""):
            f.host, f.host_from, f.host_source = f.nccl_host, "nccl", "log"


def is_machine_name(host: str | None) -> bool:
    """A host name worth naming (torchrun prints ``localhost`` when it knows no better)."""
    return bool(host) and host not in ("localhost", "127.0.0.1", "::1", "<N/A>")
