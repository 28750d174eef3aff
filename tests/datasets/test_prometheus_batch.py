"""A directory of small Prometheus scrape files is read as one frame (:mod:`.prometheus_batch`): the same
samples, machines and notes as reading the files one by one, and any file that is not the plain case sends
its run back to the one-by-one reader, so a bad file still loses only itself, named."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pyarrow as pa

from rankscope.datasets.domain.metrics import MetricSet
from rankscope.datasets.readers.metric_files import iter_chunks, open_metrics
from rankscope.datasets.readers.prometheus import read_exposition
from rankscope.datasets.readers.prometheus_batch import read_exposition_batch

T0 = 1764584000


def _dcgm(host: str, k: int, *, temp: float = 60.0, stamped: bool = False) -> str:
    ts = f" {(T0 + 30 * k) * 1000}" if stamped else ""
    lines = ["# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (C).", "# TYPE DCGM_FI_DEV_GPU_TEMP gauge"]
    for g in range(2):
        lines.append(
            f'DCGM_FI_DEV_GPU_TEMP{{gpu="{g}",UUID="GPU-{host}-{g}",device="nvidia{g}",'
            f'modelName="NVIDIA H100 80GB HBM3",Hostname="{host}"}} {temp + g}{ts}'
        )
    lines += ["# TYPE DCGM_FI_DEV_PCIE_REPLAY_COUNTER counter"]
    lines += [f'DCGM_FI_DEV_PCIE_REPLAY_COUNTER{{gpu="0",Hostname="{host}"}} {k}{ts}']
    lines += [f"node_load1 {0.5 + k / 10}{ts}"]  # node_exporter's line beside it: no Hostname label
    return "\n".join(lines) + "\n"


def _node_exporter(k: int) -> str:
    return f'# TYPE node_cpu_seconds_total counter\nnode_cpu_seconds_total{{cpu="0",mode="user"}} {k * 30.5}\n'


def _canonical(tables: list[pa.Table]) -> pl.DataFrame:
    frames = [pl.from_arrow(t).with_columns(pl.col(pl.Categorical).cast(pl.Utf8)) for t in tables if t.num_rows]
    df = pl.concat(frames, how="diagonal_relaxed")
    return df.select(sorted(df.columns)).sort(sorted(df.columns), nulls_last=True)


def _scrape_dir(root: Path) -> list[Path]:
    paths = []
    for k in range(3):
        for host in ("gpu-a-001", "gpu-a-002"):
            p = root / host / f"{host}-dcgm-{T0 + 30 * k}.prom"
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(_dcgm(host, k, stamped=host.endswith("2")))
            paths.append(p)
        p = root / "gpu-a-003" / f"node_exporter-{T0 + 30 * k}.prom"  # no machine label: named by its folder
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(_node_exporter(k))
        paths.append(p)
    return paths


def test_a_run_of_scrapes_reads_as_the_files_one_by_one(tmp_path: Path) -> None:
    paths = _scrape_dir(tmp_path)
    batch = read_exposition_batch(paths)
    assert batch is not None
    table, types, notes = batch
    one_by_one = [read_exposition(p) for p in paths]
    assert _canonical([table]).equals(_canonical([t for t, _, _ in one_by_one]))
    assert types == {k: v for _, ty, _ in one_by_one for k, v in ty.items()}
    assert sorted(notes) == sorted(n for _, _, ns in one_by_one for n in ns)
    assert set(pl.from_arrow(table)["node"].cast(pl.Utf8)) == {"gpu-a-001", "gpu-a-002", "gpu-a-003"}


def test_a_bad_file_sends_its_run_back_one_by_one_and_loses_only_itself(tmp_path: Path) -> None:
    paths = _scrape_dir(tmp_path)
    bad = paths[4]
    bad.write_text(_dcgm("gpu-a-002", 1) + 'DCGM_FI_DEV_GPU_TEMP{gpu="0"} not-a-number\n')
    assert read_exposition_batch(paths) is None
    ms = open_metrics(tmp_path)
    chunks = list(iter_chunks(ms))
    skipped = [n for _, _, ns in chunks for n in ns if "skipped (the other metric files are read)" in n]
    assert len(skipped) == 1 and bad.name in skipped[0] and "not-a-number" in skipped[0]
    rows = sum(t.num_rows for t, _, _ in chunks)
    good = [p for p in paths if p != bad]
    assert rows == sum(read_exposition(p)[0].num_rows for p in good)


def test_files_that_name_machines_by_different_labels_are_read_one_by_one(tmp_path: Path) -> None:
    a = tmp_path / "a.prom"
    a.write_text('up{instance="10.0.0.7:9100",job="node"} 1\n')
    b = tmp_path / "b.prom"
    b.write_text('up{node="gpu-b-001"} 1\n')
    assert read_exposition_batch([a, b]) is None
    chunks = list(iter_chunks(MetricSet(((a, "prometheus-text"), (b, "prometheus-text")))))
    nodes = {str(n) for t, _, _ in chunks for n in t.column("node").to_pylist()}
    assert nodes == {"10.0.0.7", "gpu-b-001"}


def test_the_same_series_twice_in_one_file_is_refused_by_name_even_in_a_run(tmp_path: Path) -> None:
    paths = _scrape_dir(tmp_path)
    twice = paths[0]
    twice.write_text(_dcgm("gpu-a-001", 0) + _dcgm("gpu-a-001", 0))  # two scrapes appended, no timestamps
    notes = [n for _, _, ns in iter_chunks(open_metrics(tmp_path)) for n in ns]
    assert any(twice.name in n and "same series appears twice" in n for n in notes)


def test_scrape_files_named_by_their_paths_are_one_note(tmp_path: Path) -> None:
    """A node_exporter without a machine label, scraped every 30 s: a note per file (1,280 in an outside tester's
    32-machine run) said the same thing; the cube says it once, with how many files and machines."""
    from rankscope.datasets.readers.metric_cube import build_cube

    for k in range(4):
        for host in ("gpu-b-001", "gpu-b-002", "gpu-b-003"):
            p = tmp_path / host / f"node-{T0 + 30 * k}.prom"
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(_node_exporter(k))
    cube = build_cube(open_metrics(tmp_path), block_s=30.0)
    named = [n for n in cube.notes if "no node/Hostname/instance label" in n]
    assert len(named) == 1 and named[0].startswith("12 file(s)") and "3 machine(s)" in named[0], cube.notes


def test_a_bad_file_in_a_long_run_costs_only_its_part(tmp_path: Path, monkeypatch) -> None:
    """A truncated scrape among 128: the run is halved until the bad file's part is small, and only that part is
    read file by file (the whole run one by one took 16 s instead of 3 s at 2,560 files); the same samples."""
    from rankscope.datasets.readers import metric_files

    paths = []
    for k in range(64):
        for host in ("gpu-c-001", "gpu-c-002"):
            p = tmp_path / host / f"{host}-dcgm-{T0 + 30 * k}.prom"
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(_dcgm(host, k))
            paths.append(p)
    bad = paths[77]
    bad.write_text(_dcgm("gpu-c-002", 38)[:-40])  # cut mid-line, as an interrupted copy leaves it
    alone: list[Path] = []
    real = metric_files._file_chunks

    def counting(path, fmt, node_label):
        alone.append(path)
        return real(path, fmt, node_label)

    monkeypatch.setattr(metric_files, "_file_chunks", counting)
    chunks = list(iter_chunks(open_metrics(tmp_path)))
    assert bad in alone and len(alone) < 32, len(alone)
    skipped = [n for _, _, ns in chunks for n in ns if "skipped (the other metric files are read)" in n]
    assert len(skipped) == 1 and bad.name in skipped[0]
    assert sum(t.num_rows for t, _, _ in chunks) == sum(read_exposition(p)[0].num_rows for p in paths if p != bad)
