"""Mutation fuzzer for every reader: valid seed inputs, mutated, run in-process and through the CLI.

Seeds are real captures (``tests/data``, and ``../shared/data/torch_gloo_hang_probe`` beside the checkout or
``$RANKSCOPE_SHARED_DIR`` where present) and the project's own generators (metrics, timings), plus a
store ingested from them. Each input is one seed directory copied and mutated 1-3 times: bit flips,
truncation, deep JSON nesting, huge/negative/inf/2^63 numbers, 5,000-digit line numbers, whitespace runs
and long lines, files renamed to rank 2^31/2^63, files swapped between kinds, FIFOs and symbolic links to
``/dev/zero``, ``/dev/urandom`` and to a canary file outside the input, hostile pickles (REDUCE/GLOBAL
code runners, memo-index and length bombs), extreme or unparseable timestamps, and in stores another
table's Parquet, bit-flipped parts and stale temp files.

Two modes, both seeded and reproducible (input ``i`` of seed ``S`` is always the same mutation):

- ``--inputs N`` in-process: worker processes call ``load_inputs`` (``load_fr_inputs`` for FR-only
  seeds) and ``diagnose`` on each input. Counted: project errors, *foreign* exceptions (anything that is
  not a ``RankscopeError``), runs over 5 s, runs killed (timeout, memory cap), code run by a pickle, the
  canary's content in the output.
- ``--cli N`` subprocesses: ``rankscope diagnose``, ``ingest`` and ``report`` on the same kinds of input.
  Counted: exit codes other than 0/2, tracebacks, more than one error line, runs over 30 s, files written
  outside the run's own directory (or into the input), the canary in the output.

Prints one JSON object (counts per class, the slowest run, peak RSS, an example of each failure class
with the input number to replay: ``--only I``). Default: 400 in-process + 30 CLI inputs (a few minutes on
2 cores); the issue's full run: ``--inputs 10000 --cli 545``.

Usage: ``python benchmarks/fuzz_readers.py [--inputs N] [--cli N] [--seed S] [--jobs J] [--only I]``
(``--python`` / ``--rankscope`` point it at another checkout's interpreter and CLI, e.g. a baseline).
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
PROBE = str(Path(os.environ.get("RANKSCOPE_SHARED_DIR") or REPO.parent / "shared") / "data" / "torch_gloo_hang_probe")
CANARY = "CANARY-7f3a9c-outside-the-input"
SLOW_INPROC_S = 5.0
SLOW_CLI_S = 30.0
MEM_CAP_MB = 3072

SEED_SOURCES: dict[str, list[str]] = {
    "pyspy_text": [f"{PROBE}/pyspy/text", "tests/data/stacks/hang_compute_mp8/round-0"],
    "pyspy_json": [f"{PROBE}/pyspy/json"],
    "manifest": ["tests/data/stacks/hang_compute_mp8/round-1", "tests/data/stacks/healthy_mp8"],
    "faulthandler": ["tests/data/stacks/throttled_mp8/round-0"],
    "fr_pickle": ["tests/data/fr_gloo/hang", f"{PROBE}/fr"],
    "fr_json": ["tests/data/fr_gloo/mp8_hang"],
    "rundir": ["tests/data/stacks/hook_slow", "tests/data/stacks/hook_sigterm_progress"],
    "logs": ["tests/data/field/crash_mn4x2"],
}
FR_ONLY = {"fr_pickle", "fr_json"}


# -- seeds ------------------------------------------------------------------------------------------------


def _copy_seed(src: Path, dst: Path, kind: str) -> None:
    shutil.copytree(src, dst, symlinks=False, ignore=shutil.ignore_patterns("*.md", "*.py"))
    if kind == "fr_json":  # keep one format: the JSON twins only
        for p in dst.iterdir():
            if not p.name.endswith(".json"):
                p.unlink()
    if kind == "fr_pickle":
        for p in dst.iterdir():
            if p.name.endswith(".json"):
                p.unlink()


def build_seeds(root: Path) -> dict[str, Path]:
    """Seed directories under ``root`` (one per kind and source), the metrics/timings made by the harness."""
    seeds: dict[str, Path] = {}
    for kind, sources in SEED_SOURCES.items():
        for j, s in enumerate(sources):
            src = Path(s) if s.startswith("/") else REPO / s
            if src.is_dir():
                dst = root / f"{kind}-{j}"
                _copy_seed(src, dst, kind)
                seeds[f"{kind}-{j}"] = dst
    from rankscope.harness.synthetic_metrics import make_metrics, make_timings

    run = make_metrics(n_machines=6, duration_s=600, faults={"gpu-throttle": 1}, onset_range_s=(200.0, 400.0), seed=1)
    df = run.to_long(job="fuzzjob")
    for fmt in ("csv", "parquet"):
        d = root / f"metrics-{fmt}"
        d.mkdir()
        (df.write_csv if fmt == "csv" else df.write_parquet)(d / f"metrics.{fmt}")
        seeds[f"metrics-{fmt}"] = d
    tdf, _, _ = make_timings("tp=2,pp=2,dp=2", n_steps=60, onset_step=30, seed=2)
    for fmt in ("csv", "parquet"):
        d = root / f"timings-{fmt}"
        d.mkdir()
        (tdf.write_csv if fmt == "csv" else tdf.write_parquet)(d / f"timings.{fmt}")
        seeds[f"timings-{fmt}"] = d
    mixed = root / "mixed"  # stacks + FR + timings in one directory: what the store is made from
    mixed.mkdir()
    for k in ("pyspy_text-0", "fr_pickle-0"):
        if k in seeds:
            for p in seeds[k].iterdir():
                shutil.copy(p, mixed / p.name)
    shutil.copy(seeds["timings-parquet"] / "timings.parquet", mixed / "timings.parquet")
    seeds["mixed"] = mixed
    store = root / "store"
    try:
        from rankscope.datasets.loading.ingest import ingest_path

        ingest_path(mixed, store, job="fuzzjob")
        seeds["store"] = store
    except Exception as exc:  # a tree whose ingest differs: fuzz without a store seed
        print(f"fuzz: no store seed ({type(exc).__name__}: {exc})", file=sys.stderr)
    return seeds


# -- mutations --------------------------------------------------------------------------------------------

NUMBERS = [
    str(2**63),
    str(-(2**63)),
    str(2**64 + 7),
    "-1",
    "-2147483649",
    str(2**31),
    "1" + "0" * 5000,
    "inf",
    "-inf",
    "nan",
    "1e309",
    "-1e309",
    "Infinity",
    "NaN",
    "99999999999999999999999",
    "0",
]
TIMESTAMPS = ["0001-01-01 00:00:00", "9999-12-31 23:59:59", "1e18", "-1e18", "garbage", "2026-13-45T99:99", "nan", ""]


def _files(d: Path) -> list[Path]:
    return sorted(p for p in d.rglob("*") if p.is_file() and not p.is_symlink())


def _text(p: Path) -> str:
    return p.read_bytes().decode("utf-8", "replace")


def hostile_pickles(marker: Path) -> dict[str, bytes]:
    """Pickles that run code under plain ``pickle.loads``, and bombs for a restricted unpickler."""
    cmd = f"touch {marker}"

    class Reduce:
        def __reduce__(self) -> Any:
            return (os.system, (cmd,))

    class Eval:
        def __reduce__(self) -> Any:
            import builtins

            return (builtins.eval, (f"__import__('os').system({cmd!r})",))

    class Sub:
        def __reduce__(self) -> Any:
            return (subprocess.call, (["touch", str(marker)],))

    out = {
        "reduce_os_system": pickle.dumps(Reduce(), protocol=2),
        "reduce_eval": pickle.dumps(Eval(), protocol=4),
        "reduce_subprocess": pickle.dumps(Sub(), protocol=0),
        "reduce_in_dict": pickle.dumps({"version": "2.10", "entries": [Reduce()]}, protocol=4),
        # memo index 2^30 (LONG_BINPUT then LONG_BINGET): a list memo sized by the index
        "memo_bomb": b"\x80\x04]r\x00\x00\x00@j\x00\x00\x00@.",
        "memo_get_only": b"\x80\x02j\xff\xff\xff\x7f.",
        "long4_bomb": b"\x80\x04\x8b\xff\xff\xff\x7f" + b"\x00" * 16 + b".",
        "binunicode_bomb": b"\x80\x04X\xff\xff\xff\x7fabc.",
        "bytes8_bomb": b"\x80\x04\x8e" + (2**40).to_bytes(8, "little") + b"ab.",
        "frame_bomb": b"\x80\x04\x95" + (2**62).to_bytes(8, "little") + b"N.",
        "mark_flood": b"\x80\x04" + b"(" * 200_000 + b".",
        "deep_list": b"\x80\x04" + b"]" * 100_000 + b"a" * 99_999 + b".",
        "global_os": b"cos\nsystem\n(V" + cmd.encode() + b"\ntR.",
        "global_posix": b"cposix\nsystem\n(V" + cmd.encode() + b"\ntR.",
        "stack_global": b"\x80\x04\x8c\x02os\x8c\x06system\x93\x8c" + bytes([len(cmd)]) + cmd.encode() + b"\x85R.",
        "inst": b"(S'" + cmd.encode() + b"'\nios\nsystem\n.",
        "obj": b"\x80\x02(cos\nsystem\nV" + cmd.encode() + b"\no.",
        "ext_code": b"\x80\x02\x82\x01.",
        "persid": b"\x80\x02P1\n.",
    }
    return out


def _sub_number(text: str, rng: random.Random) -> str:
    hits = list(re.finditer(r"(?<![\w.])-?\d+(?:\.\d+)?(?![\w.])", text))
    if not hits:
        return text + rng.choice(NUMBERS)
    m = rng.choice(hits)
    return text[: m.start()] + rng.choice(NUMBERS) + text[m.end() :]


def _nest(text: str, rng: random.Random) -> str:
    depth = rng.choice([64, 1000, 5000, 100_000])
    hits = list(re.finditer(r"(?<=[:\[,])\s*(-?\d+|\"[^\"\n]{0,40}\")", text))
    if hits and rng.random() < 0.7:
        m = rng.choice(hits)
        return text[: m.start()] + "[" * depth + m.group(0).strip() + "]" * depth + text[m.end() :]
    opener = rng.choice(["[", '{"a":'])
    closer = "]" if opener == "[" else "}"
    return opener * depth + "1" + closer * depth


def mutate_file(p: Path, rng: random.Random, ctx: dict[str, Any]) -> str:
    """One mutation of file ``p`` in place (or replacing it); a short word for the report."""
    data = p.read_bytes()
    op = rng.choice(
        [
            "bitflip",
            "bitflip",
            "truncate",
            "number",
            "number",
            "nest",
            "lineno",
            "spaces",
            "longline",
            "chunk",
            "empty",
            "swap",
            "rename_rank",
            "special",
            "timestamp",
            "binary",
        ]
    )
    if op == "bitflip":
        b = bytearray(data)
        for _ in range(rng.choice([1, 4, 32])):
            if b:
                b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
        p.write_bytes(bytes(b))
    elif op == "truncate":
        p.write_bytes(data[: rng.randrange(len(data) + 1)])
    elif op == "number":
        t = _text(p)
        for _ in range(rng.choice([1, 3, 10])):
            t = _sub_number(t, rng)
        p.write_text(t)
    elif op == "nest":
        p.write_text(_nest(_text(p), rng))
    elif op == "lineno":
        big = rng.choice(["9" * 5000, str(2**63), "-5", "0"])
        p.write_text(re.sub(r"(:|line |\"line\": ?)(\d+)", lambda m: m.group(1) + big, _text(p), count=5))
    elif op == "spaces":
        lines = _text(p).split("\n")
        run = rng.choice(["    ", " " * 32_768, " " * 2_000_000, "\t" * 100_000, "  File " + " " * 100_000])
        lines.insert(rng.randrange(len(lines) + 1), run)
        p.write_text("\n".join(lines))
    elif op == "longline":
        pos = rng.randrange(len(data) + 1)
        p.write_bytes(data[:pos] + b"x" * rng.choice([70_000, 5_000_000]) + data[pos:])
    elif op == "chunk":
        if data:
            a = rng.randrange(len(data))
            c = data[a : a + rng.randrange(1, 4096)]
            p.write_bytes(data[:a] + c * rng.choice([2, 100, 2000]) + data[a:])
    elif op == "empty":
        p.write_bytes(b"")
    elif op == "swap":
        other = rng.choice(ctx["all_files"])
        p.write_bytes(other.read_bytes())
        return f"swap<-{other.parent.name}/{other.name}"
    elif op == "rename_rank":
        big = rng.choice(["2147483648", "9223372036854775808", "-1", "99999999999", "1" + "0" * 40])
        suffix = "".join(p.suffixes) or ".txt"
        p.rename(p.with_name(f"rank{big}{suffix}"))
        return f"rename:rank{big}{suffix}"
    elif op == "special":
        return _special(p, rng, ctx)
    elif op == "timestamp":
        t = _text(p)
        hits = list(re.finditer(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:\.\d+)?|\b1[6-9]\d{8}(?:\.\d+)?\b", t))
        if not hits:
            return "timestamp:none"
        for m in rng.sample(hits, min(len(hits), rng.choice([1, 5, 50]))):
            t = t.replace(m.group(0), rng.choice(TIMESTAMPS), 1)
        p.write_text(t)
    elif op == "binary":
        p.write_bytes(rng.randbytes(rng.choice([16, 4096, 100_000])))
    return op


def _special(p: Path, rng: random.Random, ctx: dict[str, Any]) -> str:
    kind = rng.choice(["fifo", "dev_zero", "dev_urandom", "outside", "dangling", "dir_loop", "pickle"])
    if kind == "pickle":
        name, blob = rng.choice(sorted(ctx["pickles"].items()))
        p.write_bytes(blob)
        return f"pickle:{name}"
    p.unlink()
    if kind == "fifo":
        os.mkfifo(p)
    elif kind == "dev_zero":
        p.symlink_to("/dev/zero")
    elif kind == "dev_urandom":
        p.symlink_to("/dev/urandom")
    elif kind == "outside":
        p.symlink_to(ctx["canary"])
    elif kind == "dangling":
        p.symlink_to(p.parent / "no-such-file")
    elif kind == "dir_loop":
        p.symlink_to(p.parent)
    return kind


def _store_mutation(d: Path, rng: random.Random, ctx: dict[str, Any]) -> str:
    parts = [p for p in sorted(d.rglob("*.parquet")) if p.is_file() and not p.is_symlink()]
    op = rng.choice(["foreign_table", "bitflip_part", "truncate_part", "temp_file", "marker", "csv_as_part"])
    if op == "foreign_table" and len(parts) > 1:
        a, b = rng.sample(parts, 2)
        shutil.copy(b, a)
        return f"store:{b.parent.name}->{a.parent.name}"
    if op in ("bitflip_part", "truncate_part") and parts:
        p = rng.choice(parts)
        data = bytearray(p.read_bytes())
        if op == "bitflip_part":
            for _ in range(rng.choice([1, 8]) if data else 0):
                data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        else:
            data = data[: rng.randrange(len(data) + 1)]
        p.write_bytes(bytes(data))
        return f"store:{op}:{p.parent.name}"
    if op == "temp_file" and parts:
        p = rng.choice(parts)
        (p.parent / f".tmp-999-deadbeef-{p.name}").write_bytes(p.read_bytes()[:100])
        return "store:temp_file"
    if op == "csv_as_part" and parts:
        rng.choice(parts).write_bytes(b"a,b\n1,2\n")
        return "store:csv_as_part"
    markers = [p for p in d.iterdir() if p.is_file() and not p.name.endswith(".parquet")]
    if markers:
        m = rng.choice(markers)
        m.write_text(_nest(_text(m), rng) if rng.random() < 0.5 else _sub_number(_text(m), rng))
        return f"store:marker:{m.name}"
    return "store:none"


def make_input(i: int, seed: int, seeds: dict[str, Path], work: Path, ctx: dict[str, Any]) -> dict[str, Any]:
    """Input ``i``: a seed directory copied to ``work/in`` and mutated (reproducible from ``(seed, i)``)."""
    rng = random.Random(f"{seed}:{i}")
    name = rng.choice(sorted(seeds))
    src = seeds[name]
    dst = work / "in"
    shutil.copytree(src, dst, symlinks=True)
    ops = []
    for _ in range(rng.choice([1, 1, 2, 3])):
        try:
            ops.append(_mutate_one(name, dst, rng, ctx))
        except OSError as exc:  # a mutation that met an earlier one (a file made a FIFO or a link)
            ops.append(f"skipped:{exc.strerror}")
        except (ValueError, IndexError) as exc:  # one that met an empty file
            ops.append(f"skipped:{type(exc).__name__}")
    mode = "fr" if name.split("-")[0] in FR_ONLY else "dir"
    return {"i": i, "seed_dir": name, "mode": mode, "ops": [o[:60] for o in ops]}


def _mutate_one(name: str, dst: Path, rng: random.Random, ctx: dict[str, Any]) -> str:
    if name == "store" and rng.random() < 0.6:
        return _store_mutation(dst, rng, ctx)
    files = _files(dst)
    if not files:
        return "none"
    target = rng.choice(files)
    if name.startswith(("metrics", "timings")) and rng.random() < 0.5:
        return _table_mutation(target, rng)
    return mutate_file(target, rng, ctx)


def _table_mutation(p: Path, rng: random.Random) -> str:
    import polars as pl

    try:
        df = pl.read_parquet(p) if p.suffix == ".parquet" else pl.read_csv(p)
    except Exception:
        return "table:unreadable"
    col = rng.choice(df.columns)
    val = rng.choice([*TIMESTAMPS, *NUMBERS])
    n = df.height
    rows = rng.sample(range(n), min(n, rng.choice([1, 3, n]))) if n else []
    vals = df[col].cast(pl.Utf8).to_list()
    for r in rows:
        vals[r] = val
    df = df.with_columns(pl.Series(col, vals, dtype=pl.Utf8))
    if p.suffix == ".parquet":
        df.write_parquet(p)
    else:
        df.write_csv(p)
    return f"table:{col}={val[:12]}"


# -- the in-process worker -------------------------------------------------------------------------------


def _imports() -> dict[str, Any]:
    try:
        from rankscope.spine import RankscopeError
    except ImportError:  # an older tree
        from rankscope.errors import RankscopeError  # type: ignore[no-redef]
    try:
        from rankscope.datasets.loading.inputs import load_fr_inputs, load_inputs
    except ImportError:
        from rankscope.datasets.inputs import load_fr_inputs, load_inputs  # type: ignore[no-redef]
    from rankscope.analytics import diagnose

    api = {"err": RankscopeError, "load": load_inputs, "load_fr": load_fr_inputs, "diagnose": diagnose}
    try:
        from rankscope.datasets.loading.ingest import ingest_inputs
        from rankscope.datasets.store.store import Store

        api["ingest"] = lambda inputs, root: ingest_inputs(inputs, Store(root, create=True))
    except ImportError:  # an older tree: no in-process store round trip
        pass
    return api


def _peak_reset() -> None:
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        pass


def _peak_mb() -> float:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def worker() -> None:
    """Read one JSON job a line on stdin, run it, answer one JSON line (on the real stdout)."""
    out = os.fdopen(os.dup(1), "w", buffering=1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    api = _imports()
    for line in sys.stdin:
        job = json.loads(line)
        _peak_reset()
        t0 = time.perf_counter()
        res: dict[str, Any] = {"cls": "verdict"}
        try:
            if job["mode"] == "fr":
                inputs = api["load_fr"](job["path"])
            else:
                inputs = api["load"](job["path"])
            verdict = api["diagnose"](inputs)
            text = verdict.to_json()
            if job.get("store") and "ingest" in api and job["mode"] == "dir" and not inputs.source.endswith("store"):
                api["ingest"](inputs, job["store"])  # the write path, then the store read back
                text += api["diagnose"](api["load"](job["store"])).to_json()
            if CANARY in text:
                res = {"cls": "disclosure"}
        except api["err"] as exc:
            msg = str(exc)
            res = {"cls": "project_error", "msg": msg[:300], "lines": msg.count("\n") + 1}
            if CANARY in msg:
                res["cls"] = "disclosure"
        except BaseException as exc:  # the point: anything not ours is a finding
            tb = exc.__traceback__
            where = ""
            while tb is not None:
                where = f"{tb.tb_frame.f_code.co_filename.rsplit('/', 2)[-1]}:{tb.tb_lineno}"
                tb = tb.tb_next
            res = {"cls": f"foreign:{type(exc).__name__}", "msg": str(exc)[:300], "where": where}
        res["s"] = round(time.perf_counter() - t0, 3)
        res["rss_mb"] = round(_peak_mb(), 1)
        out.write(json.dumps(res) + "\n")


class Worker:
    def __init__(self, python: str) -> None:
        self.python = python
        self.proc: subprocess.Popen[str] | None = None

    def start(self) -> subprocess.Popen[str]:
        if self.proc is None or self.proc.poll() is not None:
            env = dict(os.environ, PYTHONUNBUFFERED="1", POLARS_MAX_THREADS="1", RANKSCOPE_PROGRESS="0")
            self.proc = subprocess.Popen(
                [self.python, __file__, "--worker"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
                env=env,
                start_new_session=True,
            )
        return self.proc

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.proc = None

    def run(self, job: dict[str, Any], hard_s: float) -> dict[str, Any]:
        import select

        p = self.start()
        assert p.stdin is not None and p.stdout is not None
        p.stdin.write(json.dumps(job) + "\n")
        p.stdin.flush()
        t0 = time.perf_counter()
        peak = 0.0
        while True:
            r, _, _ = select.select([p.stdout], [], [], 0.1)
            if r:
                line = p.stdout.readline()
                if line:
                    return dict(json.loads(line))
                self.kill()
                return {"cls": "crash", "s": round(time.perf_counter() - t0, 3)}
            el = time.perf_counter() - t0
            rss = _rss_mb(p.pid)
            peak = max(peak, rss)
            if rss > MEM_CAP_MB:
                self.kill()
                return {"cls": "killed:memory", "s": round(el, 3), "rss_mb": round(peak, 1)}
            if el > hard_s:
                self.kill()
                return {"cls": "killed:timeout", "s": round(el, 3), "rss_mb": round(peak, 1)}


def _rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


# -- the CLI runner -----------------------------------------------------------------------------------------


def _listing(root: Path, skip: tuple[str, ...] = ()) -> dict[str, tuple[int, int]]:
    """Every file under ``root`` with its size and mtime, not descending into the folders named in ``skip``."""
    out = {}
    for dirpath, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if os.path.join(dirpath, d) not in skip]
        for f in files:
            fp = os.path.join(dirpath, f)
            try:
                st = os.lstat(fp)
            except OSError:
                continue
            out[fp] = (st.st_size, st.st_mtime_ns)
    return out


def run_cli(rankscope: str, info: dict[str, Any], run_dir: Path, fuzz_root: Path, rng: random.Random) -> dict[str, Any]:
    inp = run_dir / "in"
    cmd_kind = rng.choice(["diagnose", "diagnose", "ingest", "report"])
    if info["seed_dir"] == "store" and cmd_kind == "ingest":
        cmd_kind = "diagnose"
    args = {
        "diagnose": [rankscope, "diagnose", str(inp)],
        "ingest": [rankscope, "ingest", str(inp), "--store", str(run_dir / "out" / "store")],
        "report": [rankscope, "report", str(inp), "-o", str(run_dir / "out" / "r.html")],
    }[cmd_kind]
    if cmd_kind == "diagnose" and rng.random() < 0.3:
        args += ["--format", "json"]
    out_dir = run_dir / "out"
    out_dir.mkdir()
    (run_dir / "tmp").mkdir()
    before_in = _listing(inp)
    runs = (str(fuzz_root / "cli"), str(fuzz_root / "inproc"))  # runs in flight write there, each in its own
    before_outside = _listing(fuzz_root, skip=runs)
    env = dict(
        os.environ,
        HOME=str(run_dir / "tmp"),
        TMPDIR=str(run_dir / "tmp"),
        MPLCONFIGDIR=str(run_dir / "tmp"),
        RANKSCOPE_PROGRESS="0",
        POLARS_MAX_THREADS="1",
    )
    env.pop("RANKSCOPE_DEBUG", None)
    t0 = time.perf_counter()
    p = subprocess.Popen(
        args, cwd=out_dir, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
    )
    try:
        so, se = p.communicate(timeout=SLOW_CLI_S * 2)
        rc = p.returncode
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        so, se = p.communicate()
        rc = None
    el = time.perf_counter() - t0
    err = se.decode("utf-8", "replace")
    findings = []
    if rc is None:
        findings.append("killed:timeout")
    elif rc < 0:
        findings.append(f"crash:signal{-rc}")
    elif rc not in (0, 2):
        findings.append(f"exit{rc}")
    if "Traceback (most recent call last)" in err:
        findings.append("traceback")
    err_lines = [ln for ln in err.splitlines() if ln.strip()]
    if rc == 2 and len(err_lines) != 1:
        findings.append("error_lines!=1")
    if el > SLOW_CLI_S:
        findings.append("slow>30s")
    written = set(_listing(fuzz_root, skip=runs)) - set(before_outside)
    if written:
        findings.append("wrote_outside")
    if _listing(inp) != before_in:
        findings.append("changed_input")
    blob = so.decode("utf-8", "replace") + err
    for f in out_dir.rglob("*"):
        if f.is_file() and f.suffix in (".html", ".json", ".txt"):
            blob += f.read_text(errors="replace")
    if CANARY in blob:
        findings.append("disclosure")
    return {
        "cmd": cmd_kind,
        "rc": rc,
        "s": round(el, 2),
        "findings": findings,
        "stderr": err_lines[-1][:300] if err_lines else "",
        "written": sorted(written)[:3],
    }


# -- driver -------------------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--inputs", type=int, default=400, help="in-process inputs (0: none)")
    ap.add_argument("--cli", type=int, default=30, help="CLI subprocess inputs (0: none)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=2, help="parallel in-process workers")
    ap.add_argument("--only", type=int, default=None, help="replay one input number (both modes as asked)")
    ap.add_argument("--hard-timeout", type=float, default=20.0, help="kill an in-process run after this long")
    ap.add_argument("--python", default=sys.executable, help="interpreter whose rankscope the workers import")
    ap.add_argument("--rankscope", default=str(Path(sys.executable).with_name("rankscope")), help="CLI to run")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        worker()
        return
    fuzz_root = Path(tempfile.mkdtemp(prefix="rankscope-fuzz-"))
    try:
        print(json.dumps(fuzz(a, fuzz_root), indent=2))
    finally:
        if not a.keep:
            shutil.rmtree(fuzz_root, ignore_errors=True)
        else:
            print(f"fuzz: kept {fuzz_root}", file=sys.stderr)


def fuzz(a: argparse.Namespace, fuzz_root: Path) -> dict[str, Any]:
    t_start = time.perf_counter()
    seeds = build_seeds(fuzz_root / "seeds")
    canary = fuzz_root / "canary.txt"
    canary.write_text(f"{CANARY}\n" * 4)
    marker = fuzz_root / "PICKLE-RAN-CODE"
    ctx = {
        "canary": canary,
        "pickles": hostile_pickles(marker),
        "all_files": [f for d in seeds.values() for f in _files(d) if f.stat().st_size < 300_000],
    }
    result: dict[str, Any] = {"seed": a.seed, "seeds": sorted(seeds), "python": a.python}
    numbers = [a.only] if a.only is not None else range(a.inputs)
    if a.inputs or a.only is not None:
        result["in_process"] = _in_process(a, numbers, seeds, fuzz_root, ctx)
    cli_numbers = [a.only] if a.only is not None else range(100_000, 100_000 + a.cli)
    if a.cli:
        result["cli"] = _cli(a, cli_numbers, seeds, fuzz_root, ctx)
    result["pickle_ran_code"] = marker.exists()
    result["wall_s"] = round(time.perf_counter() - t_start, 1)
    return result


def _in_process(
    a: argparse.Namespace, numbers: Any, seeds: dict[str, Path], fuzz_root: Path, ctx: dict[str, Any]
) -> dict[str, Any]:
    from concurrent.futures import ThreadPoolExecutor
    from queue import Queue

    pool: Queue[Worker] = Queue()
    workers = [Worker(a.python) for _ in range(max(1, a.jobs))]
    for w in workers:
        pool.put(w)
    classes: Counter[str] = Counter()
    per_seed: dict[str, Counter[str]] = {}
    examples: dict[str, Any] = {}
    slowest: dict[str, Any] = {"s": 0.0}
    peak = 0.0
    slow = 0
    errors: dict[str, str] = {}

    def one(i: int) -> tuple[dict[str, Any], dict[str, Any]]:
        work = fuzz_root / "inproc" / str(i)
        work.mkdir(parents=True)
        info = make_input(i, a.seed, seeds, work, ctx)
        w = pool.get()
        try:
            job = {"path": str(work / "in"), "mode": info["mode"]}
            if i % 4 == 1:  # every fourth input also goes through ingest and back out of the store
                job["store"] = str(work / "store")
            res = w.run(job, a.hard_timeout)
        finally:
            pool.put(w)
            shutil.rmtree(work, ignore_errors=True)
        return info, res

    with ThreadPoolExecutor(max_workers=len(workers)) as ex:
        for info, res in ex.map(one, numbers):
            cls = res["cls"]
            classes[cls] += 1
            per_seed.setdefault(info["seed_dir"], Counter())[cls] += 1
            s = float(res.get("s", 0.0))
            if s > SLOW_INPROC_S:
                slow += 1
                examples.setdefault(f"slow>{SLOW_INPROC_S:g}s", {**info, **res})
            if s > slowest["s"]:
                slowest = {**info, "s": s, "cls": cls}
            peak = max(peak, float(res.get("rss_mb", 0.0)))
            if cls not in ("verdict", "project_error"):
                key = f"{cls} @ {res.get('where', '')}"
                examples.setdefault(key, {**info, **res})
            if cls == "project_error":
                if res.get("lines", 1) > 1:
                    classes["project_error_multiline"] += 1
                shape = re.sub(r"/\S*rankscope-fuzz-\w+/inproc/\d+/in", "IN", res.get("msg", ""))[:160]
                errors[re.sub(r"\d+", "N", shape)[:60]] = shape
    for w in workers:
        w.kill()
    n = sum(v for k, v in classes.items() if k != "project_error_multiline")
    foreign = sum(v for k, v in classes.items() if k.startswith(("foreign:", "crash", "killed:")))
    return {
        "inputs": n,
        "foreign_or_killed": foreign,
        f"over_{SLOW_INPROC_S:g}s": slow,
        "classes": dict(classes.most_common()),
        "per_seed": {k: dict(v) for k, v in sorted(per_seed.items())},
        "slowest": slowest,
        "peak_rss_mb": round(peak, 1),
        "examples": examples,
        "project_error_shapes": dict(list(errors.items())[:40]),
    }


def _cli(
    a: argparse.Namespace, numbers: Any, seeds: dict[str, Path], fuzz_root: Path, ctx: dict[str, Any]
) -> dict[str, Any]:
    from concurrent.futures import ThreadPoolExecutor

    findings: Counter[str] = Counter()
    rcs: Counter[str] = Counter()
    examples: dict[str, Any] = {}
    slowest: dict[str, Any] = {"s": 0.0}

    def one(i: int) -> tuple[dict[str, Any], dict[str, Any]]:
        run_dir = fuzz_root / "cli" / str(i)
        run_dir.mkdir(parents=True)
        info = make_input(i, a.seed, seeds, run_dir, ctx)
        try:
            return info, run_cli(a.rankscope, info, run_dir, fuzz_root, random.Random(f"cli:{a.seed}:{i}"))
        finally:
            shutil.rmtree(run_dir, ignore_errors=True)

    n = bad = 0
    with ThreadPoolExecutor(max_workers=max(1, a.jobs)) as ex:
        for info, res in ex.map(one, numbers):
            n += 1
            bad += bool(res["findings"])
            rcs[str(res["rc"])] += 1
            for f in res["findings"]:
                findings[f] += 1
                examples.setdefault(f, {**info, **res})
            if res["s"] > slowest["s"]:
                slowest = {**info, "s": res["s"], "cmd": res["cmd"]}
    return {
        "runs": n,
        "exit_codes": dict(rcs.most_common()),
        "findings": dict(findings.most_common()),
        "runs_with_findings": bad,
        "slowest": slowest,
        "examples": examples,
    }


if __name__ == "__main__":
    main()
