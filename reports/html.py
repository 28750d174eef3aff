"""One self-contained HTML file per verdict: the decision, why, the figures, the clusters, the evidence.

Opened on air-gapped clusters, so nothing is fetched: CSS is inline, figures are PNG data URIs, there
is no script at all, and a Content-Security-Policy forbids scripts and any request but ``data:`` images.
Every string that came from the input (frames, file names, hosts, messages, job names, reasons) goes
through :func:`esc` exactly once, at the point it is written into markup.
"""

from __future__ import annotations

import base64
import html
import json
import os
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rankscope.reports.errors import ReportInputError
from rankscope.reports.evidence import ReportEvidence
from rankscope.reports.figures import Figure, all_figures
from rankscope.reports.ranges import short_ranges
from rankscope.spine import atomic_write

MAX_CLUSTERS = 60
MAX_EVIDENCE = 200
MAX_EXITS = 200
MAX_STALLS = 50
MAX_JSON_CHARS = 400_000
CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'"
"""No script, no request but ``data:`` images. (``frame-ancestors`` is ignored in a <meta> CSP and
makes chromium log a console error, so it is left out.)"""
VERDICT_COLOURS = {
    "crash": "#b71c1c",
    "hang": "#c62828",
    "fail-slow": "#e65100",
    "degraded": "#ef6c00",
    "imbalance": "#9e7700",
    "mismatch": "#6a1b9a",
    "healthy": "#2e7d32",
    "inconclusive": "#546e7a",
}

CSS = """
:root{--fg:#1d232a;--muted:#5f6b76;--line:#d9dee3;--bg:#ffffff;--soft:#f5f7f9;--red:#c62828}
*{box-sizing:border-box}
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;color:var(--fg);
 background:var(--bg);margin:0 auto;max-width:1200px;padding:20px 24px 40px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;padding-bottom:4px;
 border-bottom:1px solid var(--line)}h3{font-size:15px;margin:0 0 6px}
.badge{display:inline-block;color:#fff;border-radius:4px;padding:2px 10px;font-weight:600;letter-spacing:.02em;
 text-transform:uppercase;font-size:15px;vertical-align:2px}
.facts{color:var(--muted);margin:4px 0 0}.facts b{color:var(--fg);font-weight:600}
.meter{display:inline-block;width:90px;height:8px;background:var(--line);border-radius:4px;vertical-align:1px;
 overflow:hidden}.meter i{display:block;height:100%;background:var(--fg)}
.decision{display:grid;grid-template-columns:max-content 1fr;gap:4px 16px;background:var(--soft);
 border:1px solid var(--line);border-radius:6px;padding:12px 16px;margin-top:14px}
.decision dt{font-weight:600}.decision dd{margin:0}
.node{display:inline-block;font-family:ui-monospace,"DejaVu Sans Mono",monospace;font-size:12.5px;
 background:#fff;border:1px solid var(--line);border-radius:3px;padding:0 5px;margin:1px 2px}
.node.culprit{border-color:var(--red);color:var(--red);font-weight:600}
code,pre,.mono{font-family:ui-monospace,"DejaVu Sans Mono",monospace;font-size:12.5px}
pre{white-space:pre-wrap;word-break:break-all;background:var(--soft);border:1px solid var(--line);
 border-radius:4px;padding:8px 10px;margin:6px 0;max-height:480px;overflow:auto}
ol.reasons li{margin:3px 0}
figure{margin:18px 0 26px;padding:0}figure img{display:block;max-width:100%;height:auto;
 border:1px solid var(--line);border-radius:4px;background:#fff}
figure.wide .scroll{overflow-x:auto;border:1px solid var(--line);border-radius:4px}
figure.wide img{max-width:none;border:0}
figcaption{color:var(--muted);margin-top:6px;max-width:900px}
table{border-collapse:collapse;width:100%;font-size:13px}th,td{text-align:left;vertical-align:top;
 padding:4px 8px;border-bottom:1px solid var(--line)}th{background:var(--soft);font-weight:600}
td.num{text-align:right;font-variant-numeric:tabular-nums}
.tag{font-size:11.5px;font-weight:600;border-radius:3px;padding:0 5px;white-space:nowrap}
.tag.healthy{background:#e3edf7;color:#244a70}.tag.outlier{background:#fde3cc;color:#8a2c00}
.tag.primary{background:#fde0e0;color:#8e0000}.tag.cascade{background:#eceff1;color:#455a64}
details>summary{cursor:pointer;color:var(--muted)}ul.notes li{margin:2px 0}
.muted{color:var(--muted)}footer{margin-top:36px;color:var(--muted);font-size:12px}
nav a{margin-right:12px;color:var(--muted);text-decoration:none;font-size:13px}
"""


def esc(value: object) -> str:
    """Any input value as HTML text (quotes too, so it is safe in attribute values)."""
    return html.escape(str(value), quote=True)


def _strs(value: object) -> list[str]:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [str(v) for v in value]
    return [str(value)]


def _nodes(names: Iterable[object], culprits: Collection[str] = (), limit: int = 64) -> str:
    names = list(names)
    out = "".join(
        f'<span class="node{" culprit" if str(n) in culprits else ""}">{esc(n)}</span>' for n in names[:limit]
    )
    if len(names) > limit:
        out += f' <span class="muted">… and {len(names) - limit} more</span>'
    return out


WIDE_PX = 1400
"""Figures wider than this (deep prefix trees) keep their natural size and scroll sideways."""


def _figure_html(f: Figure) -> str:
    data = base64.b64encode(f.png).decode("ascii")
    wide = ' class="wide"' if f.width_px > WIDE_PX else ""
    return (
        f'<figure id="fig-{esc(f.name)}" data-figure="{esc(f.name)}"{wide}><h3>{esc(f.title)}</h3>'
        f'<div class="scroll"><img src="data:image/png;base64,{data}" width="{f.width_px}" '
        f'height="{f.height_px}" alt="{esc(f.title)}"></div><figcaption>{esc(f.caption)}</figcaption></figure>'
    )


def _header(v: Mapping[str, Any]) -> str:
    verdict = str(v.get("verdict"))
    colour = VERDICT_COLOURS.get(verdict, "#37474f")
    try:
        conf = float(v.get("confidence") or 0.0)
    except (TypeError, ValueError):
        raise ReportInputError(f"verdict.confidence: {v.get('confidence')!r:.40} is not a number") from None
    sources = ", ".join(_strs(v.get("sources"))) or "-"
    job = v.get("job") or "-"
    return (
        f'<header><h1><span class="badge" style="background:{colour}">{esc(verdict)}</span> '
        f'<span class="mono">{esc(job)}</span></h1>'
        f'<p class="facts">confidence <b>{conf:.2f}</b> <span class="meter">'
        f'<i style="width:{max(0.0, min(conf, 1.0)) * 100:.0f}%">'
        f"</i></span> · ranks <b>{esc(v.get('world_size') or '-')}</b> · snapshots "
        f"<b>{esc(v.get('n_snapshots') or 0)}</b> · evidence <b>{esc(sources)}</b></p></header>"
    )


def _decision(v: Mapping[str, Any]) -> str:
    suspects = _strs(v.get("suspect_nodes"))
    culprits = _strs(v.get("culprit_nodes"))
    rows = []
    if suspects:
        g = v.get("suspect_group") if isinstance(v.get("suspect_group"), Mapping) else None
        where = ""
        if g and g.get("kind") and g.get("kind") != "node":
            idx = ", ".join(str(i) for i in _strs(g.get("indices"))[:12])
            where = f' <span class="muted">({esc(str(g["kind"]).upper())} group(s) {esc(idx)})</span>'
        rows.append(f"<dt>Isolate</dt><dd>{len(suspects)} machine(s){where}: {_nodes(suspects, set(culprits))}</dd>")
        cul = _nodes(culprits) if culprits else '<span class="muted">none singled out: isolate the whole group</span>'
        cr = v.get("culprit_ranks")
        if cr:
            named = esc(short_ranges(_ints(cr, "culprit_ranks")))
            cul += f' <span class="muted">rank(s)</span> <span class="mono">{named}</span>'
        rows.append(f"<dt>Likeliest culprit</dt><dd>{cul}</dd>")
    else:
        rows.append("<dt>Isolate</dt><dd>nothing</dd>")
        if v.get("culprit_ranks"):
            rows.append(
                f'<dt>Ranks named</dt><dd class="mono">'
                f"{esc(short_ranges(_ints(v.get('culprit_ranks'), 'culprit_ranks')))}</dd>"
            )
    sr = v.get("suspect_ranks")
    if sr:
        rows.append(f'<dt>Suspect ranks</dt><dd class="mono">{esc(short_ranges(_ints(sr, "suspect_ranks"), 300))}</dd>')
    return f'<dl class="decision" id="decision">{"".join(rows)}</dl>'


def _ints(value: object, field: str) -> list[int]:
    try:
        return [int(x) for x in value] if isinstance(value, (list, tuple)) else []
    except (TypeError, ValueError):
        raise ReportInputError(f"verdict.{field}: {value!r:.60} is not a list of ranks") from None


def _clusters(v: Mapping[str, Any], max_clusters: int) -> str:
    clusters = [c for c in v.get("clusters") or () if isinstance(c, Mapping)]
    if not clusters:
        return ""
    rows = []
    for c in clusters[:max_clusters]:
        healthy = bool(c.get("healthy"))
        frames = _strs(c.get("representative"))[::-1]  # innermost first, as py-spy prints
        top = esc(frames[0]) if frames else '<span class="muted">(no frame)</span>'
        more = (
            (
                f"<details><summary>{len(frames)} frame(s), innermost first</summary><pre>"
                f"{esc(chr(10).join(frames))}</pre></details>"
            )
            if len(frames) > 1
            else ""
        )
        rows.append(
            f'<tr><td class="num">#{esc(c.get("id"))}</td><td><span class="tag {"healthy" if healthy else "outlier"}">'
            f"{'healthy' if healthy else 'outlier'}</span></td><td>{esc(c.get('role', ''))}</td>"
            f'<td>{esc(c.get("state", ""))}</td><td class="num">{esc(c.get("size", ""))}</td>'
            f'<td class="num">{esc(c.get("n_nodes", ""))}</td>'
            f'<td class="mono">{esc(short_ranges(str(c.get("ranks", "")), 80))}</td>'
            f'<td class="mono">{top}{more}</td></tr>'
        )
    extra = (
        f'<p class="muted">… {len(clusters) - max_clusters} more cluster(s) in the verdict JSON below.</p>'
        if len(clusters) > max_clusters
        else ""
    )
    return (
        '<h2 id="clusters">Stack clusters</h2><table><thead><tr><th>id</th><th></th><th>role</th><th>state</th>'
        "<th>procs</th><th>nodes</th><th>ranks</th><th>innermost frame</th></tr></thead><tbody>"
        + "".join(rows)
        + "</tbody></table>"
        + extra
    )


def _table(anchor: str, title: str, headers: Sequence[str], rows: Sequence[str], total: int) -> str:
    """One report section: a heading, a table of already rendered ``<tr>`` rows, and how many were left out
    (``total`` counted, ``len(rows)`` shown)."""
    extra = f'<p class="muted">… {total - len(rows)} more.</p>' if total > len(rows) else ""
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    return (
        f'<h2 id="{anchor}">{esc(title)}</h2><table><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table>{extra}"
    )


def _evidence(v: Mapping[str, Any]) -> str:
    items = [e for e in v.get("evidence") or () if isinstance(e, Mapping)]
    if not items:
        return ""
    rows = [
        f"<tr><td>{esc(e.get('source', ''))}</td><td>{esc(e.get('kind', ''))}</td><td>{esc(e.get('detail', ''))}</td>"
        f'<td class="mono">{esc(short_ranges(_ints(e.get("ranks"), "evidence.ranks"), 60))}</td>'
        f"<td>{_nodes(_strs(e.get('nodes')), limit=8)}</td></tr>"
        for e in items[:MAX_EVIDENCE]
    ]
    return _table("evidence", "Evidence", ("source", "kind", "detail", "ranks", "nodes"), rows, len(items))


def _crash(details: Mapping[str, Any]) -> str:
    crash = details.get("crash")
    exits = [x for x in (crash.get("exits") or ()) if isinstance(x, Mapping)] if isinstance(crash, Mapping) else []
    if not exits:
        return ""
    rows = [
        f'<tr><td class="num">{esc(x.get("after_s", ""))}</td><td class="num">{esc(x.get("rank", ""))}</td>'
        f"<td>{_nodes([x.get('node', '')])}</td>"
        f'<td><span class="tag {"primary" if x.get("cause") == "primary" else "cascade"}">'
        f'{esc(x.get("cause", ""))}</span></td><td class="mono">{esc(x.get("kind", ""))}</td>'
        f'<td>{esc(x.get("message", ""))}</td><td class="mono">{esc(x.get("where", ""))}</td></tr>'
        for x in exits[:MAX_EXITS]
    ]
    headers = ("after (s)", "rank", "node", "cause", "error", "message", "where")
    return _table("exits", "Process exits", headers, rows, len(exits))


def _fr(details: Mapping[str, Any]) -> str:
    fr = details.get("flight_recorder")
    stalls = [s for s in (fr.get("stalls") or ()) if isinstance(s, Mapping)] if isinstance(fr, Mapping) else []
    if not stalls:
        return ""
    rows = [
        f'<tr><td class="mono">{esc(s.get("pg", ""))}</td><td>{esc(s.get("desc", ""))}</td>'
        f"<td>{esc(s.get('kind', ''))}</td>"
        f'<td class="num">{esc(s.get("seq", ""))}</td><td class="mono">{esc(s.get("op", ""))}</td>'
        f'<td class="mono">{esc(short_ranges(_ints(s.get("missing_ranks"), "missing_ranks"), 60))}</td>'
        f'<td class="mono">{esc(short_ranges(str(s.get("waiting_ranks", "")), 60))}</td></tr>'
        for s in stalls[:MAX_STALLS]
    ]
    headers = ("pg", "desc", "kind", "seq", "op", "never reached by", "waiting")
    return _table("stalls", "Unfinished collectives (Flight Recorder)", headers, rows, len(stalls))


def _notes(details: Mapping[str, Any]) -> str:
    notes = _strs(details.get("notes"))
    for key in ("disagreements",):
        notes += [f"{key}: {d}" for d in _strs(details.get(key))]
    if not notes:
        return ""
    return '<h2 id="notes">Notes</h2><ul class="notes">' + "".join(f"<li>{esc(n)}</li>" for n in notes) + "</ul>"


def _raw(v: Mapping[str, Any]) -> str:
    text = json.dumps(v, indent=1, ensure_ascii=False, default=str)
    cut = ""
    if len(text) > MAX_JSON_CHARS:
        cut = f" (first {MAX_JSON_CHARS:,} of {len(text):,} characters)"
        text = text[:MAX_JSON_CHARS]
    return (
        f'<h2 id="raw">Verdict JSON</h2><details><summary>show the verdict as rankscope printed it{esc(cut)}'
        f"</summary><pre>{esc(text)}</pre></details>"
    )


def render_html(
    verdict: Mapping[str, Any],
    evidence: ReportEvidence | None = None,
    *,
    figures: Sequence[Figure] | None = None,
    max_clusters: int = MAX_CLUSTERS,
) -> str:
    """The report as one self-contained HTML document (figures drawn unless ``figures`` is given)."""
    if not isinstance(verdict, Mapping) or not isinstance(verdict.get("verdict"), str):
        raise ReportInputError("verdict: expected an object with a 'verdict' field (rankscope diagnose --format json)")
    figs = list(figures) if figures is not None else all_figures(verdict, evidence)
    details = verdict.get("details") if isinstance(verdict.get("details"), Mapping) else {}
    assert isinstance(details, Mapping)
    reasons = _strs(verdict.get("reasons"))
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">',
        '<meta name="referrer" content="no-referrer">',
        '<meta name="viewport" content="width=device-width,initial-scale=1">',
        '<meta name="generator" content="rankscope report">',
        f"<title>rankscope: {esc(verdict.get('verdict'))} · {esc(verdict.get('job') or '-')}</title>",
        f"<style>{CSS}</style></head><body>",
        _header(verdict),
        '<nav><a href="#why">why</a>'
        + ('<a href="#figures">figures</a>' if figs else "")
        + ('<a href="#clusters">clusters</a>' if verdict.get("clusters") else "")
        + ('<a href="#evidence">evidence</a>' if verdict.get("evidence") else "")
        + '<a href="#raw">JSON</a></nav>',
        _decision(verdict),
        '<h2 id="why">Why</h2>',
        ('<ol class="reasons">' + "".join(f"<li>{esc(r)}</li>" for r in reasons) + "</ol>")
        if reasons
        else '<p class="muted">No reasons given.</p>',
    ]
    if figs:
        parts.append('<h2 id="figures">Figures</h2>')
        parts.extend(_figure_html(f) for f in figs)
    parts += [
        _clusters(verdict, max_clusters),
        _evidence(verdict),
        _crash(details),
        _fr(details),
        _notes(details),
        _raw(verdict),
        "<footer>rankscope report · self-contained: no scripts, no network requests; figures drawn with "
        "matplotlib.</footer></body></html>",
    ]
    return "\n".join(p for p in parts if p)


# -- files --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ReportFiles:
    html: Path | None
    pngs: tuple[Path, ...]
    figures: tuple[str, ...]


def write_pngs(figures: Sequence[Figure], directory: str | os.PathLike[str]) -> tuple[Path, ...]:
    """Each figure as ``DIR/<name>.png`` (atomic writes); names are fixed identifiers, never input text."""
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    out = []
    for f in figures:
        p = root / f"{f.name}.png"
        atomic_write(p, f.png)
        out.append(p)
    return tuple(out)


def write_report(
    verdict: Mapping[str, Any],
    evidence: ReportEvidence | None = None,
    *,
    html_path: str | os.PathLike[str] | None = None,
    png_dir: str | os.PathLike[str] | None = None,
) -> ReportFiles:
    """Draw the figures once; write the HTML report and/or one PNG per figure."""
    figs = all_figures(verdict, evidence)
    out_html = None
    if html_path is not None:
        out_html = Path(html_path)
        out_html.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(out_html, render_html(verdict, evidence, figures=figs))
    pngs = write_pngs(figs, png_dir) if png_dir is not None else ()
    return ReportFiles(out_html, pngs, tuple(f.name for f in figs))
