"""The HTML report without a browser: self-contained, escaped, figures only with their evidence."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from rankscope.reports import ReportEvidence, ReportInputError, all_figures, load_case, render_html, write_report
from rankscope.reports.evidence import save_case

FIXTURES = Path(__file__).resolve().parent / "fixtures"
HOSTILE_FRAME = "<script>window.__pwned=1</script><svg/onload=window.__pwned=2>"  # make_fixtures.py injects it


@pytest.fixture(scope="module")
def hang() -> tuple[dict, ReportEvidence]:
    return load_case(FIXTURES / "hang")


def test_report_is_self_contained(hang: tuple[dict, ReportEvidence]) -> None:
    html = render_html(*hang)
    assert "<script" not in html and "<link" not in html and "@import" not in html and "url(" not in html
    refs = re.findall(r'(?:src|href)="([^"]*)"', html)
    assert refs and all(r.startswith(("data:image/png;base64,", "#")) for r in refs)
    assert not re.search(r"https?://", html.split("<pre>")[0])  # nothing outside the JSON dump names a URL
    assert "Content-Security-Policy" in html and "default-src 'none'" in html


def test_hostile_frame_is_escaped_in_the_markup() -> None:
    verdict, evidence = load_case(FIXTURES / "fail-slow")
    html = render_html(verdict, evidence)
    assert HOSTILE_FRAME not in html
    assert "&lt;script&gt;window.__pwned=1&lt;/script&gt;&lt;svg/onload=window.__pwned=2&gt;" in html


def test_every_verdict_field_is_escaped() -> None:
    evil = '"><script>x()</script>'
    v = {
        "verdict": "hang",
        "job": evil,
        "confidence": 0.5,
        "suspect_nodes": [evil],
        "culprit_nodes": [evil],
        "suspect_ranks": [1],
        "culprit_ranks": [1],
        "reasons": [evil],
        "world_size": 2,
        "sources": [evil],
        "suspect_group": {"kind": evil, "indices": [0], "ranks": "1", "nodes": [evil]},
        "clusters": [
            {
                "id": 0,
                "role": evil,
                "size": 1,
                "ranks": "1",
                "n_nodes": 1,
                "healthy": False,
                "state": evil,
                "representative": [evil, evil],
            }
        ],
        "evidence": [{"source": evil, "kind": evil, "detail": evil, "ranks": [1], "nodes": [evil]}],
        "details": {
            "notes": [evil],
            "crash": {
                "exits": [
                    {
                        "rank": 1,
                        "after_s": 0.0,
                        "cause": evil,
                        "node": evil,
                        "kind": evil,
                        "message": evil,
                        "where": evil,
                    }
                ]
            },
            "flight_recorder": {
                "stalls": [
                    {
                        "pg": evil,
                        "desc": evil,
                        "kind": evil,
                        "seq": 1,
                        "op": evil,
                        "missing_ranks": [1],
                        "waiting_ranks": "0",
                    }
                ]
            },
        },
    }
    html = render_html(v, ReportEvidence(topology=pl.DataFrame({"rank": [0, 1], "node": [evil, evil]})))
    assert "<script>x()" not in html and '"><script' not in html
    assert html.count("&lt;script&gt;x()&lt;/script&gt;") >= 12


def test_figures_appear_only_with_their_evidence(hang: tuple[dict, ReportEvidence]) -> None:
    verdict, evidence = hang
    assert [f.name for f in all_figures(verdict, evidence)] == ["rank-grid", "prefix-tree"]
    assert [f.name for f in all_figures(verdict, None)] == ["prefix-tree"]  # no topology: no grid
    bare = {k: v for k, v in verdict.items() if k not in ("clusters", "details")}
    assert all_figures(bare, None) == []
    html = render_html(bare)
    assert "<figure" not in html and 'id="figures"' not in html


def test_write_report_writes_html_and_one_png_per_figure(tmp_path: Path, hang: tuple[dict, ReportEvidence]) -> None:
    files = write_report(*hang, html_path=tmp_path / "r.html", png_dir=tmp_path / "png")
    assert files.html is not None and files.html.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    assert sorted(p.name for p in files.pngs) == ["prefix-tree.png", "rank-grid.png"]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in files.pngs)
    assert not list(tmp_path.glob("**/.*"))  # no temporary files left behind


def test_bad_input_is_one_line_naming_the_field(tmp_path: Path) -> None:
    with pytest.raises(ReportInputError, match="'verdict' field"):
        render_html({"job": "x"})
    with pytest.raises(ReportInputError, match=r"evidence.timings: missing column\(s\) duration_s"):
        ReportEvidence(timings=[{"rank": 0, "step": 1}])
    with pytest.raises(ReportInputError, match="evidence.topology: column rank holds 'a'"):
        ReportEvidence(topology=[{"rank": "a", "node": "n"}])
    (tmp_path / "v.json").write_text("{not json")
    p = subprocess.run(
        [sys.executable, "-m", "rankscope", "report", str(tmp_path / "v.json"), "-o", str(tmp_path / "o.html")],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "v.json: not a readable verdict JSON" in p.stderr
    assert "Traceback" not in p.stderr


def test_case_round_trip(tmp_path: Path, hang: tuple[dict, ReportEvidence]) -> None:
    verdict, evidence = hang
    save_case(tmp_path / "c", verdict, evidence)
    v2, e2 = load_case(tmp_path / "c")
    assert v2 == json.loads(json.dumps(verdict)) and e2.topology is not None
    assert e2.topology.equals(evidence.topology)  # type: ignore[arg-type]


def test_fixtures_are_small() -> None:
    for case in FIXTURES.iterdir():
        assert sum(f.stat().st_size for f in case.iterdir()) < 200_000, case


def test_importing_the_renderer_does_not_import_matplotlib() -> None:
    code = (
        "import sys, rankscope.reports.html, rankscope.reports.assemble; "
        "assert 'matplotlib' not in sys.modules, 'matplotlib imported eagerly'; "
        "import rankscope.reports.text; from rankscope.reports import render_text"
    )
    p = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr


def test_plain_text_rendering_imports_neither_polars_nor_matplotlib() -> None:
    """``rankscope diagnose`` renders through reports.text: the package must not load the HTML side."""
    code = (
        "import sys; from rankscope.reports.text import render_text; "
        "heavy = sorted(m for m in ('polars', 'matplotlib', 'pyarrow') if m in sys.modules); "
        "assert not heavy, heavy"
    )
    p = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
