"""``rankscope report SOURCE -o report.html [--png DIR]`` from a dump directory, a store and a verdict file."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from typer.testing import CliRunner

from rankscope.cli.main import app

runner = CliRunner()


def _run(*args: object):
    return runner.invoke(app, [str(a) for a in args])


def _figures(html: str) -> list[str]:
    return re.findall(r'data-figure="([a-z-]+)"', html)


def test_report_from_a_dump_directory_with_pngs(tmp_path: Path, probe_dir: Path) -> None:
    for f in (probe_dir / "pyspy" / "text").iterdir():
        shutil.copy(f, tmp_path / f.name)
    for f in (probe_dir / "fr").glob("rank_*"):
        shutil.copy(f, tmp_path / f.name)
    out = tmp_path / "out" / "report.html"
    res = _run("report", tmp_path, "--gpus-per-node", "1", "-o", out, "--png", tmp_path / "png")
    assert res.exit_code == 0, res.output
    assert res.stdout.startswith("hang: wrote ") and "rank-grid, prefix-tree, fr-wavefront" in res.stdout
    html = out.read_text(encoding="utf-8")
    assert _figures(html) == ["rank-grid", "prefix-tree", "fr-wavefront"]
    assert "node-3" in html and "<script" not in html
    pngs = sorted(p.name for p in (tmp_path / "png").iterdir())
    assert pngs == ["fr-wavefront.png", "prefix-tree.png", "rank-grid.png"]
    assert all((tmp_path / "png" / p).read_bytes()[:4] == b"\x89PNG" for p in pngs)


def test_report_from_a_store_diagnosed_or_saved(tmp_path: Path, probe_dir: Path) -> None:
    st = tmp_path / "store"
    assert (
        _run("ingest", probe_dir / "pyspy" / "json", "--store", st, "--job", "probe", "--gpus-per-node", "1").exit_code
        == 0
    )
    res = _run("report", st, "--job", "probe", "-o", tmp_path / "a.html")
    assert res.exit_code == 0, res.output
    assert _figures((tmp_path / "a.html").read_text()) == ["rank-grid", "prefix-tree"]
    err = _run("report", st, "--saved", "-o", tmp_path / "b.html")
    assert err.exit_code == 2 and "no saved verdict for job 'probe'" in err.stderr
    assert _run("diagnose", st, "--save").exit_code == 0
    res = _run("report", st, "--saved", "-o", tmp_path / "b.html")
    assert res.exit_code == 0, res.output
    assert "hang" in (tmp_path / "b.html").read_text()
    bad = _run("report", probe_dir / "pyspy" / "text", "--saved", "-o", tmp_path / "c.html")
    assert bad.exit_code == 2 and "--saved needs a store SOURCE" in bad.stderr


def test_report_from_a_verdict_file(tmp_path: Path, probe_dir: Path) -> None:
    v = _run("diagnose", probe_dir / "pyspy" / "text", "--gpus-per-node", "1", "--format", "json")
    (tmp_path / "v.json").write_text(v.stdout)
    res = _run("report", tmp_path / "v.json", "-o", tmp_path / "r.html")
    assert res.exit_code == 0, res.output
    html = (tmp_path / "r.html").read_text()
    assert _figures(html) == ["prefix-tree"]  # no topology without the evidence: no rank grid
    assert json.loads(v.stdout)["reasons"][0].split(":")[0] in html
    (tmp_path / "list.json").write_text("[1, 2]")
    res = _run("report", tmp_path / "list.json", "-o", tmp_path / "x.html")
    assert res.exit_code == 2 and "not a verdict" in res.stderr and len(res.stderr.splitlines()) == 1
    assert not (tmp_path / "x.html").exists()
