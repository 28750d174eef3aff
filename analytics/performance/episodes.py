"""Slow episodes in a series of log ratios: a change point after which the rolling median stays high.

One noisy step blames no one: an episode needs ``k`` steps whose rolling median is above the threshold,
and a shift that is significant against the series' own noise.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np


def _rolling_median(x: np.ndarray, k: int) -> np.ndarray:
    """Trailing rolling median along axis 0 (NaN-aware); the first k-1 rows use what they have."""
    if k <= 1 or x.shape[0] < k:
        return x.copy() if k <= 1 else np.full_like(x, np.nan)
    pad = np.concatenate([np.full((k - 1,) + x.shape[1:], np.nan), x])
    win = np.lib.stride_tricks.sliding_window_view(pad, k, axis=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmedian(win, axis=-1)


@dataclass(frozen=True)
class Episode:
    start: int
    end: int
    ratio: float
    significance: float


def episodes(log_ratio: np.ndarray, *, min_log: float, k: int, noise: float) -> list[Episode | None]:
    """Per column of ``log_ratio`` (steps x series): its strongest slow episode, or None.

    An episode starts at the first slow step of the first trailing ``k``-step window whose median is
    above ``min_log`` and lasts while that rolling median stays above it. Its significance is the
    shift of the mean against the rest of the series, in units of ``noise / sqrt(n)``.
    """
    roll = _rolling_median(log_ratio, k)
    out: list[Episode | None] = []
    for j in range(log_ratio.shape[1]):
        flag = np.nan_to_num(roll[:, j], nan=-np.inf) > min_log
        if not flag.any():
            out.append(None)
            continue
        best: Episode | None = None
        idx = np.flatnonzero(flag)
        runs = np.split(idx, np.flatnonzero(np.diff(idx) > 1) + 1)
        for run in runs:
            first, last = int(run[0]), int(run[-1])
            lo = max(0, first - k + 1)
            slow = np.flatnonzero(np.nan_to_num(log_ratio[lo : first + 1, j], nan=-np.inf) > min_log)
            start = lo + int(slow[0]) if slow.size else first
            seg = log_ratio[start : last + 1, j]
            rest = np.concatenate([log_ratio[:start, j], log_ratio[last + 1 :, j]])
            seg, rest = seg[np.isfinite(seg)], rest[np.isfinite(rest)]
            if seg.size == 0:
                continue
            base = float(np.median(rest)) if rest.size >= k else 0.0
            sig = (float(np.mean(seg)) - base) / (noise / np.sqrt(seg.size))
            ep = Episode(start, last + 1, float(np.exp(np.median(seg))), sig)
            if best is None or ep.significance * ep.ratio > best.significance * best.ratio:
                best = ep
        out.append(best)
    return out


def noise(log_ratio: np.ndarray) -> float:
    """Robust step-to-step noise of log ratios, floored at 1 %."""
    finite = log_ratio[np.isfinite(log_ratio)]
    if finite.size == 0:
        return 0.01
    return max(0.01, float(1.4826 * np.median(np.abs(finite - np.median(finite)))))
