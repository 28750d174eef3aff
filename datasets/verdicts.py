"""Keep verdicts in the store (the ``verdicts`` table)."""

from __future__ import annotations

import os
from datetime import datetime, timezone

from rankscope.analytics.verdict import Verdict
from rankscope.datasets.store.store import Store


def verdict_row(v: Verdict) -> dict:
    return {"job": v.job or "unknown", "time": datetime.now(timezone.utc), "verdict": v.verdict,
            "confidence": v.confidence, "suspect_nodes": list(v.suspect_nodes), "culprit_nodes": list(v.culprit_nodes),
            "suspect_ranks": list(v.suspect_ranks), "summary": v.explain(), "verdict_json": v.to_json()}


def save_verdict(root: str | os.PathLike[str], v: Verdict) -> None:
    Store(root).write("verdicts", [verdict_row(v)])
