"""Timing stragglers: a worker whose step time, relative to its peers, changed after an onset and stayed changed.

:class:`StragglerDetector` applies the principles of the metric peer-change detector to per-worker step
(or per-op) durations. What it assumes, and so what it can and cannot see:

- Peer-relative: per step, each worker's duration over a reference (by default the median of all
  workers at that step; the analysis passes the median of the worker's symmetric peers on other
  machines), as a log ratio. Every worker slowing together (a slower phase, a checkpoint, shared
  storage) moves the reference, not the ratios: nobody stands out.
- Own baseline: a worker that is always 10 % slower (a slower GPU share, a busier host, a heavier
  pipeline stage) has a steady ratio; what counts is the change against the median of its own ratio over
  the ``baseline_steps`` steps before a candidate onset. A straggler present from the first step is
  invisible by design.
- Persistence: the change must hold in a ``quorum`` of the ``continuity_steps`` recorded steps after the
  onset; one slow step (a GC pause, a hiccup in the input pipeline) blames no one.
- Calibrated per job: the statistic is the change in units of the worker's own step-to-step noise; the
  threshold is an extreme-value bound fitted to the job's own window scores (all workers, all onsets:
  an exponential tail over the top decile, its scale from the *median* excess so a real straggler's
  windows do not widen it), for ``false_alarm_per_worker`` false workers per job (durations are often
  normalised, so the target is per job rather than per hour). A straggler must also be at least
  ``min_slowdown`` times slower than before.
- Steps that fewer than half of the workers reached (a trace starting or ending) compare nothing.

It cannot see a straggler that was slow from the start, one slower for fewer than ``continuity_steps``
steps, or many workers slowing together. ``X`` is ``(n_steps, n_workers)`` durations (NaN where missing);
scores, thresholds and labels are per worker (one column each).
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np

from rankscope.models.base import BaseDetector, check_is_fitted
from rankscope.spine import InputError


class StragglerDetector(BaseDetector):
    """Workers whose step time relative to their peers changed after an onset and persisted (module docstring)."""

    def __init__(
        self,
        *,
        continuity_steps: int = 8,
        baseline_steps: int = 30,
        min_baseline_steps: int = 8,
        quorum: float = 0.75,
        min_slowdown: float = 1.1,
        false_alarm_per_worker: float = 1e-3,
    ) -> None:
        self.continuity_steps = continuity_steps
        self.baseline_steps = baseline_steps
        self.min_baseline_steps = min_baseline_steps
        self.quorum = quorum
        self.min_slowdown = min_slowdown
        self.false_alarm_per_worker = false_alarm_per_worker

    def _validate_params(self) -> None:
        for name in ("continuity_steps", "baseline_steps", "min_baseline_steps"):
            v = getattr(self, name)
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 2:
                raise InputError(f"StragglerDetector: {name}={v!r} must be an integer >= 2, e.g. 8")
        if not isinstance(self.quorum, (int, float)) or not 0.5 <= self.quorum <= 1:
            raise InputError(f"StragglerDetector: quorum={self.quorum!r} must be in [0.5, 1], e.g. 0.75")
        if not isinstance(self.min_slowdown, (int, float)) or not self.min_slowdown > 1:
            raise InputError(f"StragglerDetector: min_slowdown={self.min_slowdown!r} must be above 1, e.g. 1.1")
        if not isinstance(self.false_alarm_per_worker, float) or not 0 < self.false_alarm_per_worker < 1:
            raise InputError(
                f"StragglerDetector: false_alarm_per_worker={self.false_alarm_per_worker!r} must be in (0, 1)"
            )

    def _allow_nan(self) -> bool:
        return True

    def _log_ratio(self, X: np.ndarray, reference: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """Rows (steps) that at least half of the workers reached, and their log ratio to the reference."""
        present = np.isfinite(X).sum(axis=1)
        rows = np.flatnonzero(present >= max(3, 0.5 * X.shape[1]))
        x = X[rows]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            ref = np.nanmedian(x, axis=1, keepdims=True) if reference is None else reference[rows]
            lr = np.log(np.clip(x, 1e-12, None) / np.clip(ref, 1e-12, None))
        return rows, lr

    def _stats(self, lr: np.ndarray) -> dict[str, Any]:
        n, w = lr.shape
        W = self.continuity_steps
        if n < self.min_baseline_steps + W:
            raise InputError(
                f"StragglerDetector: {n} usable steps, fewer than min_baseline_steps + continuity_steps "
                f"({self.min_baseline_steps + W})"
            )
        B = min(self.baseline_steps, n - W)
        valid = np.isfinite(lr)
        idx = np.where(valid, np.arange(n)[:, None], -1)  # carry gaps forward so windows stay aligned
        np.maximum.accumulate(idx, axis=0, out=idx)
        idx = np.where(idx < 0, np.argmax(valid, axis=0)[None, :], idx)
        lf = np.take_along_axis(np.where(valid, lr, 0.0), idx, axis=0)
        sw = np.lib.stride_tricks.sliding_window_view
        m = n - W - B + 1  # candidate onsets k = B .. n-W
        base = np.median(sw(lf, B, axis=0), axis=-1)[:m]  # steps [k-B, k)
        d = np.abs(np.diff(lf, axis=0))
        sig = np.median(sw(d, B - 1, axis=0), axis=-1)[:m] * 1.4826 / math.sqrt(2)
        typical = float(np.median(d) * 1.4826 / math.sqrt(2)) if d.size else 0.01
        sig = np.maximum(sig, max(0.3 * typical, 0.005))
        q = int(math.floor((1 - self.quorum) * W))
        post = np.partition(sw(lf, W, axis=0), q, axis=-1)[..., q][B:]  # steps [k, k+W)
        vc = valid.astype(np.int32)
        ok = (sw(vc, B, axis=0).sum(axis=-1)[:m] >= min(self.min_baseline_steps, B)) & (
            sw(vc, W, axis=0).sum(axis=-1)[B:] >= math.ceil(self.quorum * W)
        )
        change = np.where(ok, post - base, -np.inf)
        score = change / sig
        best = np.argmax(score, axis=0)
        cols = np.arange(w)
        bs = score[best, cols]
        bc = change[best, cols]
        # the onset: the first step, up to two windows before the best one, from which the ratio held at
        # least half the change over a window (a slowly noisy rank's best window may start late)
        roll = np.median(sw(lf, W, axis=0), axis=-1)  # roll[s] covers steps [s, s+W)
        onset = np.empty(w, np.int64)
        for j in cols:
            k = int(best[j]) + B
            if not np.isfinite(bs[j]):
                onset[j] = k
                continue
            lo, hi = max(0, k - 2 * W), min(k + W, roll.shape[0])
            rise = 0.5 * bc[j] + base[best[j], j]
            held = (roll[lo:hi, j] >= rise) & (lr[lo:hi, j] >= rise)
            onset[j] = lo + int(np.argmax(held)) if held.any() else k
        return {
            "score": np.where(np.isfinite(bs), bs, -10.0),
            "change": np.where(np.isfinite(bs), bc, 0.0),
            "onset": onset,
            "pooled": score[np.isfinite(score)],
            "windows": m,
        }

    def _threshold(self, pooled: np.ndarray, n_windows: int) -> tuple[float, dict[str, float]]:
        """Extreme-value bound on the job's own window scores (module docstring)."""
        v = pooled[np.isfinite(pooled)]
        if v.size < 20:
            return float("inf"), {"pooled_windows": float(v.size)}
        u = float(np.quantile(v, 0.9))
        excess = v[v > u] - u
        scale = max(float(np.median(excess) / math.log(2)) if excess.size else 1.0, 0.1)
        n_eff = max(1.0, n_windows / self.continuity_steps)
        thr = u + scale * math.log(0.1 * n_eff / self.false_alarm_per_worker)
        return thr, {
            "tail_start": u,
            "tail_scale": scale,
            "independent_windows_per_worker": n_eff,
            "pooled_windows": float(v.size),
        }

    def fit(self, X: Any, y: Any = None, *, reference: np.ndarray | None = None) -> StragglerDetector:
        """``X`` durations (n_steps, n_workers); ``reference`` the peer reference per step and worker
        (default: the median of all workers at each step)."""
        self._validate_params()
        arr = self._check_X(X, fitting=True)
        if arr.shape[1] < 3:
            raise InputError(f"StragglerDetector: X has {arr.shape[1]} workers; peer comparison needs at least 3")
        rows, lr = self._log_ratio(arr, reference)
        s = self._stats(lr)
        self.threshold_, self.calibration_ = self._threshold(s["pooled"], int(s["windows"]))
        self.ratio_ = np.exp(s["change"])
        self.onset_index_ = rows[np.clip(s["onset"], 0, rows.size - 1)]
        self.n_windows_ = int(s["windows"])
        self.decision_scores_ = np.asarray(s["score"], dtype=np.float64)
        self.labels_ = ((self.decision_scores_ > self.threshold_) & (self.ratio_ >= self.min_slowdown)).astype(np.int64)
        return self

    def decision_function(self, X: Any, *, reference: np.ndarray | None = None) -> np.ndarray:
        check_is_fitted(self)
        arr = self._check_X(X, fitting=False)
        return np.asarray(self._stats(self._log_ratio(arr, reference)[1])["score"], dtype=np.float64)

    def predict(self, X: Any) -> np.ndarray:
        """1 for workers over the threshold (and slower by ``min_slowdown``), 0 otherwise."""
        return (self.decision_function(X) > self.threshold_).astype(np.int64)
