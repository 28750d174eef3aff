"""Every file under an input directory, symlinked folders inside it included, without leaving it.

Only regular files are listed: FIFOs, devices and sockets are noted, never opened (a reader opening
one would wait forever or read without end). Plain strings and ``os.scandir``: at 100,000 files
pathlib's object churn costs more than parsing.
A symlinked folder is followed when it points inside the input (each real folder is read once: cycles
are cut by ``(st_dev, st_ino)``); a link that leaves the input is not followed and is reported, as is a
dangling one. Hidden entries (``.name``) are skipped.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field


@dataclass
class Walk:
    """The files found (``(absolute path, path relative to the root with '/')``) and what was not followed."""

    files: list[tuple[str, str]] = field(default_factory=list)
    outside: list[str] = field(default_factory=list)  # links that leave the input (relative paths)
    dangling: list[str] = field(default_factory=list)
    special: list[str] = field(default_factory=list)  # FIFOs, devices, sockets: never opened
    cycles: int = 0
    twice: int = 0  # files reached both directly and through a link: read once, under the link's path

    def notes(self) -> list[str]:
        out = []
        if self.outside:
            shown = ", ".join(self.outside[:5]) + (", ..." if len(self.outside) > 5 else "")
            out.append(
                f"{len(self.outside)} symbolic link(s) pointing outside the input were not followed: {shown} "
                "(copy the files in, or point rankscope at their directory)"
            )
        if self.dangling:
            out.append(f"{len(self.dangling)} dangling symbolic link(s) skipped: {', '.join(self.dangling[:5])}")
        if self.special:
            shown = ", ".join(self.special[:5]) + (", ..." if len(self.special) > 5 else "")
            out.append(f"{len(self.special)} FIFO(s), device(s) or socket(s) not read: {shown}")
        if self.cycles:
            out.append(f"{self.cycles} symbolic link(s) to a folder already read were not read twice")
        if self.twice:
            out.append(
                f"{self.twice} file(s) reached both directly and through a symbolic link were read once, under "
                "the link's path (the layout the links make names them)"
            )
        return out


def _inside(real: str, root_real: str) -> bool:
    return real == root_real or real.startswith(root_real.rstrip(os.sep) + os.sep)


def walk(root: str, *, follow_outside: bool = False) -> Walk:
    """Every regular file under ``root``, sorted by path within each folder (deterministic order).

    ``follow_outside`` (``--follow-symlinks``): links that leave the input are followed too (the owner of the
    directory vouches for them); FIFOs and devices are still never listed, cycles still cut."""
    out = Walk()
    root_real = os.path.realpath(root)
    try:
        st = os.stat(root)
    except OSError:
        return out
    seen = {(st.st_dev, st.st_ino)}
    linked: set[str] = set()  # the real paths file links point at
    stack: list[tuple[str, str]] = [(root, "")]
    while stack:
        dirpath, prefix = stack.pop()
        try:
            with os.scandir(dirpath) as it:
                entries = sorted((e for e in it if not e.name.startswith(".")), key=lambda e: e.name)
        except OSError:
            continue
        subdirs = []
        for e in entries:
            rel = prefix + e.name
            try:
                is_link = e.is_symlink()
                if is_link:
                    real = os.path.realpath(e.path)
                    if not os.path.exists(real):
                        out.dangling.append(rel)
                        continue
                    if not follow_outside and not _inside(real, root_real):
                        out.outside.append(rel)
                        continue
                if e.is_dir(follow_symlinks=True):
                    dst = e.stat(follow_symlinks=True)
                    key = (dst.st_dev, dst.st_ino)
                    if key in seen:
                        out.cycles += 1
                        continue
                    seen.add(key)
                    subdirs.append((e.path, rel + "/"))
                elif e.is_file(follow_symlinks=True):
                    out.files.append((e.path, rel))
                    if is_link:
                        linked.add(real)
                else:
                    out.special.append(rel)
            except OSError:
                continue
        stack.extend(reversed(subdirs))
    if linked:  # a file also reached through a link is one file: the link's path names it (host, round, rank)
        n = len(out.files)
        out.files = [(a, r) for a, r in out.files if os.path.islink(a) or os.path.realpath(a) not in linked]
        out.twice = n - len(out.files)
    return out
