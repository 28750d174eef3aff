"""Rendering verdicts for people: plain text (:mod:`.text`), and an HTML report with figures.

``render_html(verdict, evidence)`` takes the verdict as ``Verdict.to_dict()`` (the JSON that
``rankscope diagnose --format json`` prints) and optional :class:`ReportEvidence` tables, which the
caller assembles from the loaded evidence (:func:`rankscope.reports.assemble.evidence_from_inputs`).
Submodules load on first use: ``rankscope diagnose`` imports only :mod:`.text`, never polars or matplotlib.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "ReportInputError": "errors",
    "ReportEvidence": "evidence",
    "load_case": "evidence",
    "load_verdict": "evidence",
    "save_case": "evidence",
    "FIGURES": "figures",
    "Figure": "figures",
    "all_figures": "figures",
    "ReportFiles": "html",
    "render_html": "html",
    "write_pngs": "html",
    "write_report": "html",
    "evidence_from_inputs": "assemble",
    "render_text": "text",
}
__all__ = [
    "FIGURES",
    "Figure",
    "ReportEvidence",
    "ReportFiles",
    "ReportInputError",
    "all_figures",
    "evidence_from_inputs",
    "load_case",
    "load_verdict",
    "render_html",
    "render_text",
    "save_case",
    "write_pngs",
    "write_report",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"rankscope.reports.{module}"), name)
