"""The reports in a real browser: Debian's chromium through Playwright, no network at all.

Each page must load with no console error, no page error and no request but the report file itself
(every other request is aborted and fails the test); every figure must decode to a non-blank image
of a sane size; the hostile frame name must show as text and run nothing. Screenshots (whole page and
each figure) are saved under $REPORT_ARTIFACTS_DIR (default: pytest's tmp dir).
"""

from __future__ import annotations

import copy
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rankscope.reports import ReportEvidence, load_case, render_html

FIXTURES = Path(__file__).resolve().parent / "fixtures"
HOSTILE_FRAME = "<script>window.__pwned=1</script><svg/onload=window.__pwned=2>"  # make_fixtures.py injects it

pytestmark = pytest.mark.browser

EXPECTED_FIGURES = {
    "hang": ["rank-grid", "prefix-tree"],
    "fail-slow": ["rank-grid", "prefix-tree", "failslow-rounds"],
    "fr": ["rank-grid", "fr-wavefront"],
    "metrics": ["metrics"],
    "crash": ["rank-grid", "prefix-tree", "timings", "crash-timeline"],
    "hang-gloo": ["rank-grid", "prefix-tree", "fr-wavefront"],
}


@dataclass
class PageLog:
    """Everything that must stay empty while a report is open."""

    console_errors: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    blocked: list[str] = field(default_factory=list)

    def problems(self) -> list[str]:
        return (
            [f"console: {m}" for m in self.console_errors]
            + [f"pageerror: {m}" for m in self.page_errors]
            + [f"request failed: {u}" for u in self.failed]
            + [f"network request: {u}" for u in self.blocked]
        )


@pytest.fixture
def open_report(browser: Any, tmp_path: Path) -> Iterator[Any]:
    """``open_report(html, name, bypass_csp=False) -> (page, log)``; pages are closed afterwards."""
    contexts = []

    def _open(html: str, name: str, *, bypass_csp: bool = False) -> tuple[Any, PageLog]:
        path = tmp_path / f"{name}.html"
        path.write_text(html, encoding="utf-8")
        url = path.as_uri()
        ctx = browser.new_context(
            viewport={"width": 1280, "height": 900}, bypass_csp=bypass_csp, service_workers="block"
        )
        contexts.append(ctx)
        log = PageLog()

        def route(r: Any) -> None:
            if r.request.url == url or r.request.url.startswith("data:"):
                r.continue_()
            else:
                log.blocked.append(r.request.url)
                r.abort()

        ctx.route("**/*", route)
        page = ctx.new_page()
        page.on("console", lambda m: log.console_errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: log.page_errors.append(str(e)))
        page.on("requestfailed", lambda r: log.failed.append(r.url))
        page.goto(url, wait_until="load")
        return page, log

    yield _open
    for ctx in contexts:
        ctx.close()


def image_stats(png: bytes) -> tuple[int, int, float, float]:
    """(width, height, grey-level std, fraction of non-white pixels) of a PNG."""
    from PIL import Image

    im = np.asarray(Image.open(io.BytesIO(png)).convert("L"), dtype=float)
    return im.shape[1], im.shape[0], float(im.std()), float((im < 245).mean())


@pytest.mark.parametrize("case", list(EXPECTED_FIGURES))
def test_report_loads_cleanly_with_every_figure_drawn(case: str, open_report: Any, artifacts: Path) -> None:
    verdict, evidence = load_case(FIXTURES / case)
    page, log = open_report(render_html(verdict, evidence), case)
    names = page.eval_on_selector_all("figure[data-figure]", "els => els.map(e => e.dataset.figure)")
    assert names == EXPECTED_FIGURES[case]
    imgs = page.eval_on_selector_all(
        "figure img",
        """els => els.map(i => ({complete: i.complete,
        w: i.naturalWidth, h: i.naturalHeight, src: i.src.slice(0, 22), shown: i.getBoundingClientRect().width}))""",
    )
    assert len(imgs) == len(names)
    for name, img in zip(names, imgs):
        assert img["complete"] and img["src"] == "data:image/png;base64,", (name, img)
        assert 300 <= img["w"] <= 4000 and 150 <= img["h"] <= 3000, (name, img)
        assert img["shown"] > 250, (name, img)
        shot = page.locator(f'figure[data-figure="{name}"] img').screenshot(path=str(artifacts / f"{case}-{name}.png"))
        w, h, std, ink = image_stats(shot)
        assert w > 250 and h > 100, (name, w, h)
        assert std > 8 and ink > 0.02, f"{case}/{name} looks blank (std {std:.1f}, non-white {ink:.3f})"
    assert page.inner_text(".badge").strip().lower() == verdict["verdict"]
    assert page.locator("ol.reasons li").count() == len(verdict["reasons"])
    for node in verdict["culprit_nodes"]:
        assert page.locator("#decision .node.culprit", has_text=node).count() >= 1
    page.screenshot(path=str(artifacts / f"{case}-page.png"), full_page=True)
    assert page.evaluate("document.querySelectorAll('script').length") == 0
    assert log.problems() == []


def test_hostile_frame_from_real_dumps_shows_as_text_and_runs_nothing(open_report: Any, artifacts: Path) -> None:
    verdict, evidence = load_case(FIXTURES / "fail-slow")
    assert HOSTILE_FRAME in json.dumps(verdict)  # it came through the released diagnose, from the dump files
    # without the page's CSP, so that only the escaping stands between the payload and the page
    page, log = open_report(render_html(verdict, evidence), "hostile-frame", bypass_csp=True)
    assert page.evaluate("typeof window.__pwned") == "undefined"
    assert page.evaluate("document.querySelectorAll('script, svg').length") == 0
    hits = page.locator("td.mono", has_text=HOSTILE_FRAME)
    assert hits.count() >= 1
    hits.first.scroll_into_view_if_needed()
    page.screenshot(path=str(artifacts / "hostile-frame.png"))
    assert log.problems() == []


PAYLOAD = (
    '<script>window.__pwned=1</script>"><img src=x onerror="window.__pwned=2">'
    "'><svg onload=window.__pwned=3></style><script>window.__pwned=4</script>"
)
KEEP = {"verdict", "ranks", "frame"}  # a verdict word and rank lists must stay valid; "frame" is poisoned below


def poison(obj: Any, key: str = "") -> Any:
    """Every string of the verdict (job, reasons, nodes, frames, states, notes, evidence) made hostile."""
    if isinstance(obj, dict):
        return {k: poison(v, k) for k, v in obj.items()}
    if isinstance(obj, list):
        return [poison(v, key) for v in obj]
    if isinstance(obj, str) and key not in KEEP:
        return obj + PAYLOAD
    return obj


def test_every_input_string_is_escaped(open_report: Any) -> None:
    verdict, evidence = load_case(FIXTURES / "hang")
    bad = poison(copy.deepcopy(verdict))
    for line in bad["details"]["prefix_tree"]:
        line["frame"] += PAYLOAD
    topo = evidence.topology
    assert topo is not None
    import polars as pl

    ev = ReportEvidence(topology=topo.with_columns(pl.col("node") + PAYLOAD))
    html = render_html(bad, ev)
    page, log = open_report(html, "poisoned", bypass_csp=True)
    assert page.evaluate("typeof window.__pwned") == "undefined"
    assert page.evaluate("document.querySelectorAll('script, svg, img:not([src^=\"data:image/png\"])').length") == 0
    text = page.inner_text("body")
    assert text.count(PAYLOAD) >= len(bad["reasons"]) + len(bad["suspect_nodes"])
    assert log.problems() == []


def test_a_report_written_by_the_cli_from_real_dumps(open_report: Any, artifacts: Path, probe_dir: Path) -> None:
    """End to end: ``rankscope report`` on the real gloo probe (py-spy text + Flight Recorder pickles)."""
    import shutil

    from typer.testing import CliRunner

    from rankscope.cli.main import app

    dumps = artifacts / "cli-probe-dumps"
    shutil.rmtree(dumps, ignore_errors=True)
    dumps.mkdir()
    for f in [*(probe_dir / "pyspy" / "text").iterdir(), *(probe_dir / "fr").glob("rank_*")]:
        shutil.copy(f, dumps / f.name)
    out = artifacts / "cli-probe.html"
    res = CliRunner().invoke(app, ["report", str(dumps), "--gpus-per-node", "1", "-o", str(out)])
    assert res.exit_code == 0, res.output
    page, log = open_report(out.read_text(encoding="utf-8"), "cli-probe")
    names = page.eval_on_selector_all("figure[data-figure]", "els => els.map(e => e.dataset.figure)")
    assert names == ["rank-grid", "prefix-tree", "fr-wavefront"]
    for name in names:
        shot = page.locator(f'figure[data-figure="{name}"] img').screenshot(
            path=str(artifacts / f"cli-probe-{name}.png")
        )
        _, _, std, ink = image_stats(shot)
        assert std > 8 and ink > 0.02, name
    assert page.inner_text(".badge").strip().lower() == "hang"
    assert page.locator("#decision .node.culprit", has_text="node-3").count() >= 1
    assert log.problems() == []
