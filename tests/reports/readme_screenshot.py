"""Render a saved case and screenshot the top of its report in Debian's chromium (the README image).

    .venv/bin/python tests/reports/readme_screenshot.py [tests/reports/fixtures/hang] [-o docs/report-hang.png]

The view is 1280 px wide and shows the verdict, the machines to isolate, the reasons and the first
figure; the page is loaded offline (every request but the file itself is aborted). The PNG is reduced
to a 128-colour palette so that the repository stays small.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from rankscope.reports.evidence import load_case
from rankscope.reports.html import render_html

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]

ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("case", nargs="?", default=str(HERE / "fixtures/hang"))
    ap.add_argument("-o", "--output", default=str(REPO / "docs/report-hang.png"))
    ap.add_argument("--height", type=int, default=1500, help="pixels of the page to capture")
    ap.add_argument("--chromium", default="/usr/bin/chromium")
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    verdict, evidence = load_case(args.case)
    with tempfile.TemporaryDirectory() as tmp:
        page_path = Path(tmp) / "report.html"
        page_path.write_text(render_html(verdict, evidence), encoding="utf-8")
        out = Path(args.output)
        out.parent.mkdir(parents=True, exist_ok=True)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=args.chromium, args=ARGS)
            page = browser.new_page(viewport={"width": 1280, "height": args.height}, device_scale_factor=1)
            page.route("**/*", lambda r: r.continue_() if r.request.url == page_path.as_uri() else r.abort())
            page.goto(page_path.as_uri(), wait_until="load")
            shot = page.screenshot(clip={"x": 0, "y": 0, "width": 1280, "height": args.height})
            browser.close()
    import io

    from PIL import Image

    img = Image.open(io.BytesIO(shot)).convert("RGB").quantize(colors=128, method=Image.Quantize.MEDIANCUT)
    img.save(out, optimize=True)
    print(f"wrote {out} ({out.stat().st_size:,} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
