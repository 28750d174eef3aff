"""Render synthetic process dumps byte-for-byte as py-spy 0.4.3 (text, ``--json``) and faulthandler print them.

Formats, from real samples (``shared/data/torch_gloo_hang_probe/pyspy``) and CPython 3.11:

- py-spy text: ``Process PID: CMDLINE`` / ``Python vX.Y.Z (EXE)`` / blank / per thread
  ``Thread TID (idle|active|active+gil): "NAME"`` then ``    func (short_file:line)``, main thread first.
- py-spy JSON: ``json.dumps(threads, indent=2)`` of thread objects (newest thread first, main last),
  absolute ``filename`` and ``short_filename`` relative to its sys.path entry per frame; ``is_entry``
  marks frames entered from C (thread/process targets, ``f(*args)`` calls), ``is_shim_entry`` the outermost.
- faulthandler: ``Thread 0x...`` blocks (``Current thread`` for the main one, last), ``File "ABS",
  line N in co_name``, blank line between threads; no names, no pids.
"""

from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from rankscope.datasets.domain.stacks import Frame, ProcessDump, ThreadDump
from rankscope.harness.synthetic_frames import ENTRY_CALLERS, InstallEnv, co_name
from rankscope.spine import InputError, atomic_write

if TYPE_CHECKING:
    from rankscope.harness.synthetic import SyntheticJob

FORMATS = ("pyspy-text", "pyspy-json", "faulthandler", "mixed")
SUFFIX = {"pyspy-text": ".txt", "pyspy-json": ".json", "faulthandler": ".txt"}
MANIFEST_HEADER = ("file", "rank", "node", "role", "pid", "snapshot")


def pthread_id(tid: int, main: bool) -> int:
    """A plausible ``pthread_self()`` value (py-spy JSON ``thread_id``, faulthandler ``0x...``) for a tid."""
    slot = (tid * 0x9E3779B1) & 0xFFFFFF
    return 0x7F0000000000 + slot * 0x1000 + (0x740 if main else 0x640)


def _status(t: ThreadDump, gil: bool) -> str:
    if not t.active:
        return "idle"
    return "active+gil" if gil else "active"


def _owns_gil(t: ThreadDump) -> bool:
    # Python-level compute leaves hold the GIL; waits inside C (autograd engine, cuda sync) release it.
    return (
        bool(t.active)
        and bool(t.frames)
        and t.frames[0].function.rsplit(".", 1)[-1]
        not in ("_engine_run_backward", "custom_backward", "synchronize", "read")
    )


class Renderer:
    """Formats dumps of one job, caching the rendering of each shared frame tuple."""

    def __init__(self) -> None:
        self._text: dict[int, str] = {}
        self._json: dict[tuple[int, str], str] = {}
        self._fh: dict[tuple[int, str], str] = {}

    # -- py-spy text ----------------------------------------------------------------------------
    def pyspy_text(self, dump: ProcessDump, env: InstallEnv) -> str:
        parts = [f"Process {dump.pid}: {dump.cmdline}\nPython v{env.python_version} ({env.python_real})\n\n"]
        for t in dump.threads:
            name = f': "{t.thread_name}"' if t.thread_name else ""
            parts.append(f"Thread {t.thread_id} ({_status(t, _owns_gil(t))}){name}\n")
            body = self._text.get(id(t.frames))
            if body is None:
                body = "".join(f"    {f.function} ({f.file}:{f.line})\n" for f in t.frames)
                self._text[id(t.frames)] = body
            parts.append(body)
        return "".join(parts)

    # -- py-spy JSON ----------------------------------------------------------------------------
    def _json_frames(self, frames: tuple[Frame, ...], env: InstallEnv) -> str:
        key = (id(frames), env.name)
        got = self._json.get(key)
        if got is None:
            n = len(frames)
            objs = []
            for i, f in enumerate(frames):
                outer = i == n - 1
                caller = co_name(frames[i + 1].function) if not outer else ""
                entry = (outer or caller in ENTRY_CALLERS) if env.qualnames else True
                objs.append(
                    {
                        "name": f.function,
                        "filename": env.abs_from_short(f.file),
                        "module": None,
                        "short_filename": f.file,
                        "line": f.line,
                        "locals": None,
                        "is_entry": entry,
                        "is_shim_entry": outer and env.qualnames,
                    }
                )
            text = json.dumps(objs, indent=2)
            got = text.replace("\n", "\n    ")  # nested two levels deep in the thread list
            self._json[key] = got
        return got

    def pyspy_json(self, dump: ProcessDump, env: InstallEnv) -> str:
        items = []
        for t in reversed(dump.threads):  # py-spy --json lists the newest thread first, the main thread last
            gil = _owns_gil(t)
            items.append(
                "  {\n"
                f'    "pid": {dump.pid},\n'
                f'    "thread_id": {pthread_id(t.thread_id or 0, t.is_main)},\n'
                f'    "thread_name": {json.dumps(t.thread_name)},\n'
                f'    "os_thread_id": {t.thread_id},\n'
                f'    "active": {"true" if t.active else "false"},\n'
                f'    "owns_gil": {"true" if gil else "false"},\n'
                f'    "frames": {self._json_frames(t.frames, env)},\n'
                '    "process_info": null\n'
                "  }"
            )
        return "[\n" + ",\n".join(items) + "\n]\n"

    # -- faulthandler ---------------------------------------------------------------------------
    def faulthandler(self, dump: ProcessDump, env: InstallEnv) -> str:
        blocks = []
        for t in reversed(dump.threads):  # the interpreter's thread list: newest first, main last
            head = "Current thread" if t.is_main else "Thread"
            key = (id(t.frames), env.name)
            body = self._fh.get(key)
            if body is None:
                body = "".join(
                    f'  File "{env.abs_from_short(f.file)}", line {f.line} in {co_name(f.function)}\n' for f in t.frames
                )
                self._fh[key] = body
            blocks.append(f"{head} 0x{pthread_id(t.thread_id or 0, t.is_main):016x} (most recent call first):\n{body}")
        return "\n".join(blocks)

    def render(self, dump: ProcessDump, env: InstallEnv, fmt: str) -> str:
        if fmt == "pyspy-text":
            return self.pyspy_text(dump, env)
        if fmt == "pyspy-json":
            return self.pyspy_json(dump, env)
        if fmt == "faulthandler":
            return self.faulthandler(dump, env)
        raise InputError(f"fmt={fmt!r} is not one of {', '.join(FORMATS)}")


def node_format(node_index: int, fmt: str, seed: int = 0) -> str:
    """The dump format of a node: ``fmt`` itself, or for ``mixed`` one of the three by node."""
    if fmt != "mixed":
        return fmt
    return ("pyspy-text", "pyspy-json", "faulthandler")[(node_index + seed) % 3]


def file_name(rank: int, role: str, k: int, fmt: str) -> str:
    """``rank{R}.txt``, ``rank{R}-dataloader{k}.txt``, ``rank{R}-checkpoint.txt`` (``.json`` for py-spy JSON)."""
    suffix = SUFFIX[fmt]
    if role == "trainer":
        return f"rank{rank}{suffix}"
    if role == "dataloader":
        return f"rank{rank}-dataloader{k}{suffix}"
    return f"rank{rank}-{role}{suffix}"


def write_job_dir(
    job: SyntheticJob, path: str | os.PathLike[str], *, fmt: str = "pyspy-text", manifest: bool = True
) -> Path:
    """Write every dump of ``job`` as one file per process (``snapshot-{i}/`` when several) plus ``manifest.csv``."""
    if fmt not in FORMATS:
        raise InputError(f"fmt={fmt!r} is not one of {', '.join(FORMATS)}")
    root = Path(path)
    if root.exists() and not root.is_dir():
        raise InputError(f"{root}: exists and is not a directory")
    root.mkdir(parents=True, exist_ok=True)
    renderer = Renderer()
    topo = job.topology
    node_idx = {n: i for i, n in enumerate(topo.node_names)}
    envs = {n: job.env_of(n) for n in topo.node_names}
    rows: list[tuple[str, int, str, str, int | None, int]] = []
    made: set[Path] = set()
    worker_k: dict[tuple[int, int], int] = {}
    for d in job.dumps:
        ni = node_idx[d.node]
        f = node_format(ni, fmt, job.seed)
        k = 0
        if d.role == "dataloader":
            k = worker_k.get((d.snapshot, d.rank), 0)
            worker_k[(d.snapshot, d.rank)] = k + 1
        name = file_name(d.rank, d.role, k, f)
        rel = f"snapshot-{d.snapshot}/{name}" if job.n_snapshots > 1 else name
        target = root / rel
        if target.parent not in made:
            target.parent.mkdir(parents=True, exist_ok=True)
            made.add(target.parent)
        with open(target, "w", encoding="utf-8", newline="") as fh:
            fh.write(renderer.render(d.dump, envs[d.node], f))
        rows.append((rel, d.rank, d.node, d.role, d.dump.pid, d.snapshot))
    if manifest:
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(MANIFEST_HEADER)
        w.writerows(rows)
        atomic_write(root / "manifest.csv", buf.getvalue(), durable=False)
    return root
