"""Real stores for the batch, fleet and export tests: real captures ingested with ``rankscope ingest``.

- the 4-rank gloo hang probe (py-spy text, rank 3 skipped an all_reduce) laid out the way users keep
  dumps, one folder per machine, so the machines have real names (rank ``r`` on ``hosts[r]``);
- the field captures shipped in tests/data/field (the 8-rank hang on 4 agents);
- many jobs at once: one real ingest, its part files relabelled under other job names (what ``ingest``
  would write for the same capture under another ``--job``; ingesting each would take a second apiece).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rankscope.datasets.loading.ingest import ingest_path
from rankscope.datasets.store.store import Store

REPO = Path(__file__).resolve().parents[2]
FIELD = REPO / "tests" / "data" / "field"


def lay_probe(probe: Path, dest: Path, hosts: list[str]) -> Path:
    """The probe's py-spy dumps in one folder per machine (``dest/<host>/rank<r>.txt``)."""
    for r in range(4):
        f = dest / hosts[r] / f"rank{r}.txt"
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes((probe / "pyspy" / "text" / f"rank{r}.txt").read_bytes())
    return dest


def ingest_probe(probe: Path, store: Path, job: str, hosts: list[str], tmp: Path) -> None:
    ingest_path(lay_probe(probe, tmp / f"dump-{job}", hosts), store, job=job, gpus_per_node=1)


def clone_job(store: Path, src: str, dst: str) -> None:
    """Every part file of job ``src`` written again for job ``dst`` (the job column relabelled)."""
    for table_dir in store.iterdir():
        part_dir = table_dir / f"job={src}"
        if not part_dir.is_dir():
            continue
        for part in part_dir.glob("part-*.parquet"):
            t = pq.read_table(part)
            t = t.set_column(t.schema.get_field_index("job"), "job", pa.array([dst] * t.num_rows, pa.string()))
            out = table_dir / f"job={dst}" / part.name
            out.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(t, out)


@pytest.fixture
def real_store(tmp_path: Path, probe_dir: Path) -> Path:
    """Three jobs from real captures: two probe hangs on named machines, the field hang."""
    root = tmp_path / "store"
    ingest_probe(probe_dir, root, "llama-a", ["gpu-a0", "gpu-a1", "gpu-a2", "gpu-bad"], tmp_path)
    ingest_probe(probe_dir, root, "llama-b", ["gpu-b0", "gpu-b1", "gpu-b2", "gpu-bad"], tmp_path)
    ingest_path(FIELD / "hang_mn4x2", root, job="field-hang")
    return root


@pytest.fixture
def many_jobs(tmp_path: Path, probe_dir: Path) -> tuple[Path, list[str]]:
    """120 jobs: the probe ingested once, relabelled under 119 more names (a run takes several seconds)."""
    root = tmp_path / "many"
    ingest_probe(probe_dir, root, "job-000", ["h0", "h1", "h2", "h3"], tmp_path)
    jobs = [f"job-{i:03d}" for i in range(120)]
    for j in jobs[1:]:
        clone_job(root, "job-000", j)
    return root, jobs


def verdict_rows(root: Path) -> list[dict]:
    st = Store(root)
    if not st.files("verdicts"):
        return []
    return st.read("verdicts").to_dicts()


def rankscope(*args: object, env: dict[str, str] | None = None, **kw) -> subprocess.Popen:
    """``rankscope ARGS`` in a process of its own (the signal and overlap tests need real processes)."""
    e = {**os.environ, "RANKSCOPE_PROGRESS": "0", **(env or {})}
    return subprocess.Popen(
        [sys.executable, "-m", "rankscope", *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=e,
        **kw,
    )


def copy_store(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst
