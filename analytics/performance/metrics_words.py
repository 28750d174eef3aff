"""The metric findings in words: each change as a sentence with its units, what the other machines did at the
same time (they wait), changes many machines shared, and the calibration as the verdict reports it."""

from __future__ import annotations

import math
import re
import warnings
from typing import Any

import numpy as np

from rankscope.analytics.performance.metrics import iso
from rankscope.datasets.domain.metrics import MetricCube

UNITS: tuple[tuple[str, str], ...] = (
    (r"THROTTLE_REASONS|EVENT_REASONS", "(slowdown flag, 0 or 1)"),
    (r"_UTIL$", "percentage points"),
    (r"POWER_USAGE", "W"),
    (r"TEMP", "degC"),
    (r"CLOCK", "MHz"),
    (r"ENERGY", "mJ/s"),
    (r"_BYTES$|bytes_total", "B/s"),
    (r"Retrans", "segments/s"),
    (r"REPLAY", "replays/s"),
    (r"cpu_utilisation|cpu_utilization", "of the CPU time"),
    (r"load\d+$", "runnable tasks"),
    (r"_ACTIVE$|_ratio$", "(ratio)"),
    (r"_celsius$", "degC"),
    (r"_watts$", "W"),
    (r"_hertz$", "Hz"),
)
_THROUGHPUT = re.compile(r"UTIL|POWER|NVLINK|PCIE_(TX|RX)_BYTES|bytes_total|_ACTIVE|utilization|_watts|_per_second")


def fmt(x: float) -> str:
    a = abs(x)
    if a >= 1e9:
        return f"{x / 1e9:.3g}e9"
    if a >= 1e6:
        return f"{x / 1e6:.3g}e6"
    if a >= 100:
        return f"{x:.0f}"
    return f"{x:.3g}"


def unit_of(feature: str, kind: str | None) -> str:
    base = feature.split("{")[0]
    for pat, u in UNITS:
        if re.search(pat, base):
            return u
    return "per second" if kind == "counter" else ""


def _score(x: float) -> str:
    return f"{x:.1f}" if abs(x) < 1e4 else f"{x:.3g}"


def _xid(ev: dict[str, Any]) -> str | None:
    """dcgm-exporter's DCGM_FI_DEV_XID_ERRORS holds the *last* Xid code, not a count, so its change is no
    size; which Xid it was is in the kernel log (``NVRM: Xid``), the change is not the code."""
    if not ev["feature"].startswith("DCGM_FI_DEV_XID_ERRORS") or ev["direction"] != "up":
        return None
    return (
        "reported a new Xid error (the metric holds the last Xid code, not a count: the kernel log's NVRM "
        "line says which)"
    )


def sentence(machine: str, ev: dict[str, Any], window_s: float) -> str:
    """One change as the verdict says it: metric, GPU, reference, direction, size, onset, persistence, score."""
    feat = ev["feature"]
    where = f" on GPU {ev['gpu']}" if ev.get("gpu") is not None else ""
    flat = ev["effect_peer_mads"] >= _FLAT  # the reference's spread was nil (a flag, a count): no multiple of it
    score = "far" if flat or abs(ev["score"]) >= _FLAT else f"score {_score(ev['score'])}"
    held = (
        f"held in {ev['quorum']:.0%} of the following {window_s:.0f} s; {score} over the calibrated threshold "
        f"{_score(ev['threshold'])}"
    )
    xid = _xid(ev)
    if xid is not None:
        return f"{machine}{where}: {xid} from {iso(ev['onset_s'])} (DCGM_FI_DEV_XID_ERRORS), {held}"
    sib = ev["reference"] == "siblings"
    ref = "the machine's other GPUs" if sib else "its peers"
    verb = "rose" if ev["direction"] == "up" else "fell"
    unit = unit_of(feat, ev.get("kind"))
    size = (
        (
            "(a slowdown bit set) while theirs stayed clear"
            if unit.startswith("(slowdown")
            else f"by {fmt(abs(ev['effect_units']))} {unit} while they held steady"
        )
        if flat
        else f"by {ev['effect_peer_mads']:.1f} {'sibling' if sib else 'peer'} MADs ({fmt(abs(ev['effect_units']))} "
        f"{unit})"
    )
    return (
        f"{machine}: {feat}{where} {verb} relative to {ref} {size} from {iso(ev['onset_s'])}, against its own "
        f"earlier relation to them, and {held}"
    )


_FLAT = 1e4
"""A change this many MADs of its reference (or a score this large) means the reference did not vary at all
(MAD floored): the multiple says nothing, so it is not printed."""


def waiting(cube: MetricCube, onset_s: float | None, exclude: set[int]) -> list[str]:
    """Job-wide shifts at the suspects' onset (the other machines waiting), as sentences."""
    if onset_s is None:
        return []
    k = int((onset_s - cube.t0_s) // cube.block_s)
    if k < 2 or k >= cube.n_blocks - 2:
        return []
    out = []
    for lv in cube.levels:
        keep = ~np.isin(lv.unit_machine, list(exclude))
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore", RuntimeWarning)
            before = np.nanmedian(lv.values[keep, max(0, k - 8) : k], axis=(0, 1))
            after = np.nanmedian(lv.values[keep, k + 2 : k + 10], axis=(0, 1))
        for j, f in enumerate(lv.features):
            if not (np.isfinite(before[j]) and np.isfinite(after[j])) or before[j] == 0:
                continue
            rel = after[j] / before[j] - 1
            if abs(rel) >= 0.05 and _THROUGHPUT.search(f):
                out.append(
                    f"{f} {'fell' if rel < 0 else 'rose'} {abs(rel):.0%} on the other machines from the same time"
                )
    return out[:4]


def shared_reasons(det: Any, cube: MetricCube) -> list[str]:
    """Large changes many machines shared (not one machine's), as sentences."""
    n = len(cube.machines)
    out = []
    many = det.bulk_exceed_.sum(axis=0) if det.bulk_exceed_.size else np.zeros(0, int)
    need = max(3, math.ceil(0.05 * n))
    for j in np.argsort(-many)[:3]:
        if many[j] >= need:
            feat, d, _, ref = det.tests_[j]
            where = " relative to the other GPUs of their machines" if ref == "siblings" else ""
            out.append(
                f"{int(many[j])} of {n} machines ({many[j] / n:.0%}) changed {feat} {d}{where} together: a part of "
                "the job changed (a pipeline stage, a rack, a staggered job-wide change), not one machine"
            )
    if out:
        return out
    big = (det.test_scores_ > det.threshold_) & det.test_strong_ & (det.test_shared_ > det.max_shared_fraction)
    for j in np.flatnonzero(big.any(axis=0))[:3]:
        feat, d, level, _ = det.tests_[j]
        i = int(np.argmax(np.where(big[:, j], det.test_scores_[:, j], -np.inf)))
        out.append(
            f"{feat} moved {d} on {cube.machines[i]} and on {det.test_shared_[i, j]:.0%} of the other "
            f"{'GPUs' if level == 'gpu' else 'machines'} at the same time: a shared change, not one machine's"
        )
    return out


def calibration(det: Any, cube: MetricCube) -> dict[str, Any]:
    """The false-alarm calibration as the verdict reports it (``details.metrics.calibration``)."""
    n = len(cube.machines)
    return {
        "false_alarm_target": f"{det.false_alarms_per_1000_machine_hours:g} false machine per 1,000 machine-hours",
        "machine_hours": round(det.machine_hours_, 2),
        "machines": n,
        "hours": round(cube.hours, 3),
        "alpha_per_machine": det.alpha_machine_,
        "tests_per_machine": len(det.tests_),
        "alpha_per_test": det.alpha_test_,
        "threshold": round(det.threshold_, 3),
        "method": "per test (feature, direction, reference): Gumbel fit to the per-machine maxima of the change "
        "statistic across machines (median, 75th and 90th percentiles), threshold = the Gumbel quantile at "
        "alpha_per_test (Bonferroni over tests)",
        "expected_false_machines_this_job": round(det.alpha_machine_ * n, 5),
        "min_effect_peer_mads": det.min_effect,
        "min_relative_effect": det.min_relative_effect,
        "max_shared_fraction": det.max_shared_fraction,
        "gumbel": [c.to_dict() for c in det.calibration_],
    }
