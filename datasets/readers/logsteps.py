"""Training-step lines in logs: Megatron's ``iteration N/M | ... elapsed time per iteration (ms): X`` (with its
global batch size, which a ramp-up changes: time per sample compares), and a training loop's own step lines that
log the loss (``step 12 loss 2.31 step_time 0.8s`` from Python logging, torchtitan's ``step: 10  loss: 8.12``,
DeepSpeed's ``steps: 10 loss: 2.30 iter time (s): 0.51``). A line that only mentions a step is not one."""

from __future__ import annotations

import re
from typing import Any

_ITERATION = re.compile(  # and Megatron's global batch size, which its ramp-up changes (time per sample compares)
    r"iteration\s+(?P<it>\d+)\s*/\s*\d+\s*\|.*?elapsed time per iteration \(ms\):\s*(?P<ms>[\d.]+)"
    r"(?:.*?global batch size:\s*(?P<gbs>\d+))?"
)
_STEP_LINE = re.compile(  # a training loop's own step line, which logs the loss (torchtitan, DeepSpeed, scripts)
    r"(?<![\w.])(?:global[_ ])?steps?\s*[:=]?\s*(?P<it>\d{1,12})(?:\s*/\s*\d+)?(?![\w.])(?=.*\bloss\b)", re.I
)
_STEP_TIME = re.compile(
    r"(?:step[_ ]time|iter(?:ation)?[_ ]time(?: ?\(s\))?|time/step|train_step_timing in s)\s*[:=]?\s*"
    r"(?P<t>\d+(?:\.\d+)?)\s*(?P<unit>ms|s)?\b",
    re.I,
)


def step_record(text: str) -> dict[str, Any] | None:
    """A ``{"type": "step", "step", "elapsed_ms", "batch"}`` record of one log line, or None."""
    m = _ITERATION.search(text)
    if m:
        gbs = int(m.group("gbs")) if m.group("gbs") else None
        return {"type": "step", "step": int(m.group("it")), "elapsed_ms": float(m.group("ms")), "batch": gbs}
    m = _STEP_LINE.search(text) if "loss" in text.lower() else None
    if m is None:
        return None
    t = _STEP_TIME.search(text)
    ms = None if t is None else float(t.group("t")) * (1.0 if (t.group("unit") or "s").lower() == "ms" else 1e3)
    return {"type": "step", "step": int(m.group("it")), "elapsed_ms": ms, "batch": None}
