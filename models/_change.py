"""The statistics behind :class:`~rankscope.models.peer_change.PeerChangeDetector`, one function per idea.

- :func:`peer_z`: each unit's robust z among its peers per block (median, MAD with physical floors).
- :func:`sibling_z`: each GPU against the other GPUs of its machine (lockstep: step-phase noise cancels).
- :func:`change_statistic`: per unit, the strongest persistent change away from the pack, relative to
  its own baseline before a candidate onset, in units of its own block-to-block noise.
- :func:`shared_fraction`, :func:`rides_job_change`, :func:`moved`: is a change one machine's, or shared?
- :func:`gumbel_fit`: the per-job extreme-value law of the per-machine maxima (the calibration).
- direction, smoothing and damping of a metric by its name (:func:`direction_of`, ...).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

DIRECTION_RULES: tuple[tuple[str, str], ...] = (
    # (regex on the metric name, direction in which it is suspicious)
    (r"_CLOCK$|clock", "down"),
    (r"TEMP|temperature|_celsius", "up"),
    (
        r"REPLAY|_ECC_|XID|RETIRED|REMAP|_ERROR|errors?_total|_VIOLATION|Retrans|retrans|_drop|_err|Timeouts|"
        r"_failed|nvlink.*crc",
        "up",
    ),
    (r"cpu_utilisation|cpu_utilization|node_load|cpu_seconds|pressure|procs_(running|blocked)|context_switches", "up"),
    (r"PCIE_(TX|RX)_BYTES|NVLINK_(TX|RX)_BYTES|PCIE_(TX|RX)_THROUGHPUT|NVLINK_BANDWIDTH|_bytes_total|_bytes$", "both"),
    (r"UTIL|_ACTIVE|POWER|ENERGY|OCCUPANCY", "both"),
)
SMOOTHING_RULES: tuple[tuple[str, float], ...] = (
    # (regex, seconds a short event keeps a windowed average up): Prometheus recording rules over 1m/5m
    (r":rate1m$|_1m$|\[1m\]", 60.0),
    (r":rate5m$|_5m$|\[5m\]", 300.0),
    # a temperature is the thermal mass's lagged response to power: a short event shows for its length plus
    # a few tens of seconds of decay (a 200 s blip on one GPU held 270 s above its siblings' pack)
    (r"TEMP|temperature|_celsius", 60.0),
)
DAMPED_RULES: tuple[tuple[str, float], ...] = (
    # (regex, time constant): the kernel's load averages are exponentially damped run-queue lengths
    (r"load1$", 60.0),
    (r"load5$", 300.0),
    (r"load15$", 900.0),
)
GUMBEL_Q = {p: -math.log(-math.log(p)) for p in (0.25, 0.5, 0.75, 0.9)}


def _rule(metric: str, rules: tuple[tuple[str, Any], ...], default: Any) -> Any:
    base = metric.split("{")[0]
    for pat, out in rules:
        if re.search(pat, base):
            return out
    return default


def direction_of(metric: str, overrides: dict[str, str] | None = None) -> str:
    """``up``, ``down`` or ``both``: the direction in which ``metric`` is suspicious."""
    return str(_rule(metric, tuple((overrides or {}).items()) + DIRECTION_RULES, "both"))


def smoothing_of(metric: str) -> float:
    """Seconds by which the exporter's own smoothing stretches a short event (0 for raw samples)."""
    return float(_rule(metric, SMOOTHING_RULES, 0.0))


def damping_of(metric: str) -> float:
    """Time constant of an exponentially damped metric (the load averages), 0 for others."""
    return float(_rule(metric, DAMPED_RULES, 0.0))


def undamp(x: np.ndarray, tau: float, block_s: float) -> np.ndarray:
    """Invert ``L_k = a L_(k-1) + (1 - a) n_k`` along axis 1 (``a = exp(-block/tau)``): the run-queue length
    behind a load average, so a CPU burst is as long as it was, not minutes of decay."""
    a = math.exp(-block_s / tau)
    prev = np.concatenate([x[:, :1], x[:, :-1]], axis=1)
    return np.asarray((x - a * prev) / (1 - a))


def nanmedian(a: np.ndarray, axis: int | None = None) -> Any:
    """``np.nanmedian`` that gives NaN for all-NaN slices without a warning (``warnings.catch_warnings``
    is not thread-safe before Python 3.14, and features run on threads)."""
    a = np.asarray(a)
    if axis is None:
        f = a[np.isfinite(a)]
        return float(np.median(f)) if f.size else float("nan")
    m = np.moveaxis(a, axis, -1)
    finite = np.isfinite(m)
    if finite.all():
        return np.median(m, axis=-1)
    # numpy's nanmedian goes row by row (or through masked arrays) when there are NaNs; one sort along the
    # axis puts them last, and the middle of each row's finite values is then known from their count
    s = np.sort(np.where(finite, m, np.inf), axis=-1)
    n = finite.sum(axis=-1)
    lo = np.take_along_axis(s, np.maximum((n - 1) // 2, 0)[..., None], axis=-1)[..., 0].astype(np.float64)
    hi = np.take_along_axis(s, np.maximum(n // 2, 0)[..., None], axis=-1)[..., 0].astype(np.float64)
    with np.errstate(invalid="ignore"):
        return np.where(n > 0, (lo + hi) / 2, np.nan)


def nanmean(a: np.ndarray) -> float:
    f = np.asarray(a)[np.isfinite(a)]
    return float(f.mean()) if f.size else float("nan")


def _scale(mad: np.ndarray, level: float, counter: bool, block_s: float) -> np.ndarray:
    """A robust scale per block, floored at half its typical value (a moment when every machine reads the
    same, e.g. a checkpoint pause, divides by nothing), at 0.1 % of the metric's level, and at one event
    per block for counters."""
    typical = nanmedian(mad) if np.isfinite(mad).any() else 0.0
    floor = max(
        0.5 * float(np.nan_to_num(typical)), 1e-3 * float(np.nan_to_num(level)), (1.0 / block_s) if counter else 1e-9
    )
    return np.where(np.isfinite(mad), np.maximum(mad, floor), floor)


def peer_z(
    x: np.ndarray, *, counter: bool, block_s: float, max_peers: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Robust z of every unit among its peers per block -> (z, peer median, peer scale)."""
    n = x.shape[0]
    peers = x if n <= max_peers else x[np.sort(rng.choice(n, max_peers, replace=False))]
    med = nanmedian(peers, axis=0)
    mad = 1.4826 * nanmedian(np.abs(peers - med[None, :]), axis=0)
    level = nanmedian(np.abs(med)) if np.isfinite(med).any() else 0.0
    scale = _scale(mad, level, counter, block_s)
    return (x - med[None, :]) / scale[None, :], med, scale


def sibling_z(
    x: np.ndarray, starts: np.ndarray, *, counter: bool, block_s: float, min_siblings: int = 3
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Each GPU against the median of the GPUs of its own machine, in units of the fleet-wide spread of
    that difference -> (z, scale per block, machine medians); None when machines have fewer than
    ``min_siblings`` GPUs. The GPUs of one machine are sampled at the same instants and run the same step
    in lockstep, so the difference is free of the step-phase noise that dominates peer comparisons."""
    sizes = np.diff(np.r_[starts, x.shape[0]])
    if sizes.max(initial=0) < min_siblings:
        return None
    pad = np.full((starts.size, int(sizes.max()), x.shape[1]), np.nan, dtype=x.dtype)
    mach = np.repeat(np.arange(starts.size), sizes)
    pad[mach, np.arange(x.shape[0]) - np.repeat(starts, sizes)] = x
    med = nanmedian(pad, axis=1)  # (machines, K)
    n_obs = np.sum(np.isfinite(pad), axis=1)
    d = x - med[mach]
    d = np.where((n_obs[mach] >= min_siblings) & (sizes[mach][:, None] >= min_siblings), d, np.nan)
    mad = 1.4826 * nanmedian(np.abs(d), axis=0)
    level = nanmedian(np.abs(x)) if np.isfinite(x).any() else 0.0
    scale = _scale(mad, level, counter, block_s)
    return d / scale[None, :], scale, med


@dataclass(frozen=True)
class Best:
    """One direction's per-unit best change: statistic, effect (reference MADs), onset blocks."""

    stat: np.ndarray
    effect: np.ndarray
    onset: np.ndarray  # the block where the best window starts
    first: np.ndarray  # the earliest block, near it, that moved at least half the effect (reported onset)


@dataclass(frozen=True)
class Change:
    """What :func:`change_statistic` found for every unit, and what the sharing checks need."""

    up: Best
    down: Best
    zf: np.ndarray  # z with missing blocks carried forward
    base: np.ndarray  # baseline per unit and candidate onset
    cand: np.ndarray  # block index of each candidate onset
    n_post: int

    def column(self, onset: int) -> int | None:
        """Index of candidate ``onset`` in ``base`` (None when it was not a candidate)."""
        j = int(np.searchsorted(self.cand, onset))
        return j if j < self.cand.size and self.cand[j] == onset else None


def _ffill_time(z: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """Carry each unit's last valid block forward (leading gaps take the first valid value)."""
    k = z.shape[1]
    idx = np.where(valid, np.arange(k)[None, :], -1)
    np.maximum.accumulate(idx, axis=1, out=idx)
    idx = np.where(idx < 0, np.argmax(valid, axis=1)[:, None], idx)
    return np.take_along_axis(z, idx, axis=1)


def _windows(x: np.ndarray, n: int, starts: np.ndarray) -> np.ndarray:
    """Copy of the ``n``-block windows of ``x`` (axis 1) starting at ``starts``: (units, len(starts), n)."""
    return np.lib.stride_tricks.sliding_window_view(x, n, axis=1)[:, starts]


def _window_median(x: np.ndarray, n: int, starts: np.ndarray) -> np.ndarray:
    w = _windows(x, n, starts)
    w.partition(n // 2, axis=-1)
    return np.asarray(w[..., n // 2])


_HOLD = 4  # blocks an onset's move must hold in (all but one)


def _best(
    sign: float,
    eff: np.ndarray,
    stat: np.ndarray,
    z0: np.ndarray,
    valid: np.ndarray,
    base: np.ndarray,
    cand: np.ndarray,
    n_post: int,
) -> Best:
    rows = np.arange(z0.shape[0])
    best = np.argmax(stat, axis=1)
    st = stat[rows, best]
    e = eff[rows, best]
    fin = np.isfinite(st)
    kb = cand[best]
    # the onset: the first block, from a window before the best one, that moved at least half the effect and
    # stayed moved (3 of it and the next 3 blocks: one noisy block minutes before a throughput change is no onset)
    cols = np.arange(z0.shape[1])[None, :]
    rel = sign * (z0 - base[rows, best][:, None])
    near = (cols >= (kb - n_post)[:, None]) & (cols < (kb + n_post)[:, None]) & valid
    moved = valid & (rel >= 0.5 * np.where(fin, e, np.inf)[:, None])
    run = np.cumsum(np.pad(moved, ((0, 0), (1, _HOLD))), axis=1)
    held = (run[:, _HOLD : _HOLD + moved.shape[1]] - run[:, : moved.shape[1]]) >= _HOLD - 1
    first = np.argmax(near & moved & held, axis=1)
    first = np.where(first > 0, first, kb)
    return Best(st, np.where(fin, e, 0.0), np.where(fin, kb, -1), np.where(fin, first, -1))


def change_statistic(
    z: np.ndarray,
    valid: np.ndarray,
    *,
    n_base: int,
    n_min_base: int,
    n_post: int,
    coverage: float,
    quorum: float,
    noise_floor: float,
    stride: int = 1,
) -> Change:
    """Per unit, the strongest persistent change up and down relative to its own baseline.

    For each candidate onset ``k`` (every ``stride`` blocks): ``base`` = median of the unit's z over the
    ``n_base`` blocks before ``k`` (at least ``n_min_base`` observed); the window is blocks ``k ..
    k+n_post-1`` (at least ``coverage`` of them observed; a missing block counts as no deviation). Up: the
    shift of the window mean over ``base``, but never more than 1.5 times the shift held by a ``quorum`` of
    the blocks (a benign event shorter than the window moves a few blocks, never the quorum), and only
    away from the peers (from ``max(base, 0)`` up, ``min(base, 0)`` down: rejoining the pack is not a
    fault). The statistic divides by the unit's own noise before the onset (robust scale of its
    block-to-block differences in the baseline window); the effect stays in reference-MAD units.
    """
    u, k = z.shape
    z = z.astype(np.float32, copy=False)
    zf = _ffill_time(z, valid)  # for the baseline median: robust to a carried value
    z0 = np.where(valid, z, np.float32(0.0))  # for the window: a missing block is no evidence
    if k < n_min_base + n_post:
        empty = Best(np.full(u, -np.inf), np.zeros(u), np.full(u, -1), np.full(u, -1))
        return Change(empty, empty, zf, np.zeros((u, 0)), np.zeros(0, np.int64), n_post)
    nb = min(n_base, k - n_post)
    cand = np.arange(nb, k - n_post + 1, max(1, stride))
    vc = np.concatenate([np.zeros((u, 1), np.int32), np.cumsum(valid, axis=1, dtype=np.int32)], axis=1)
    base_cov = vc[:, cand] - vc[:, cand - nb]
    post_cov = vc[:, cand + n_post] - vc[:, cand]
    base = _window_median(zf, nb, cand - nb)
    dz = np.abs(np.diff(zf, axis=1))
    dz = np.where(valid[:, 1:] & valid[:, :-1], dz, np.nan).astype(np.float32)
    typical = float(np.nan_to_num(nanmedian(dz), nan=1.0)) * 1.4826 / math.sqrt(2)
    nd = max(1, nb - 1)
    spread = _window_median(np.where(np.isfinite(dz), dz, np.float32(0.0)), nd, cand - nb)
    sig = np.maximum(spread * (1.4826 / math.sqrt(2)), max(noise_floor, 0.3 * typical))
    q = int(math.floor((1.0 - quorum) * n_post))
    w = _windows(z0, n_post, cand)
    w.partition([q, n_post - 1 - q], axis=-1)
    post_lo, post_hi = w[..., q], w[..., n_post - 1 - q]
    del w
    cs = np.concatenate([np.zeros((u, 1)), np.cumsum(z0, axis=1, dtype=np.float64)], axis=1)
    post_mean = (cs[:, cand + n_post] - cs[:, cand]) / n_post
    ok = (base_cov >= min(n_min_base, nb)) & (post_cov >= math.ceil(coverage * n_post))
    hi_ref, lo_ref = np.maximum(base, 0.0), np.minimum(base, 0.0)
    up = np.where(ok, np.minimum(post_mean - hi_ref, 1.5 * (post_lo - hi_ref)), -np.inf)
    dn = np.where(ok, np.minimum(lo_ref - post_mean, 1.5 * (lo_ref - post_hi)), -np.inf)
    return Change(
        _best(1.0, up, up / sig, z0, valid, base, cand, n_post),
        _best(-1.0, dn, dn / sig, z0, valid, base, cand, n_post),
        zf,
        base,
        cand,
        n_post,
    )


def shared_fraction(ch: Change, unit: int, direction: str, effect: float, exclude: np.ndarray) -> float:
    """Fraction of the other units whose z moved the same way over the same window (window mean against
    their own baseline), by at least half as much: a change many units share is not one machine's."""
    st = ch.up if direction == "up" else ch.down
    k = int(st.onset[unit])
    j = ch.column(k) if k >= 0 else None
    if j is None or effect <= 0:
        return 0.0
    sign = 1.0 if direction == "up" else -1.0
    post = ch.zf[:, k : k + ch.n_post].mean(axis=1)
    moved_ = sign * (post - ch.base[:, j]) >= 0.5 * effect
    others = np.ones(ch.zf.shape[0], dtype=bool)
    others[exclude] = False
    return float(moved_[others].mean()) if others.any() else 0.0


def moved(ch: Change, unit: int, onset: int) -> float:
    """How far ``unit``'s z moved (either way, window mean against its baseline) from ``onset``."""
    j = ch.column(onset)
    if j is None:
        return 0.0
    return abs(float(np.mean(ch.zf[unit, onset : onset + ch.n_post])) - float(ch.base[unit, j]))


def raw_move(x: np.ndarray, med: np.ndarray, onset: int, n: int, direction: str) -> float | None:
    """How far one unit's values ``x`` moved away from the peer median ``med`` at ``onset``, in the metric's
    units, in ``direction`` (the median distance over the ``n`` blocks from the onset against the ``n`` before
    it): :func:`moved` in units, not z. None when either side has too little data (a scrape gap)."""
    dist = x - med
    before, after = dist[max(0, onset - n) : onset], dist[onset : onset + n]
    before, after = before[np.isfinite(before)], after[np.isfinite(after)]
    if before.size < 2 or after.size < 2:
        return None
    shift = float(np.median(after) - np.median(before))
    return max(0.0, shift if direction == "up" else -shift)


def rides_job_change(
    x: np.ndarray, med: np.ndarray, unit: int, onset: int, ch: Change, job_change: float = 1.25, same: float = 1.5
) -> bool:
    """Did the whole job's level change at ``onset`` (peer median by more than ``job_change`` x) and this
    unit change by about the same factor (within ``same`` x)? Then it rides a job-wide change (every host's
    retransmits x8 on a congested fabric: the host that always had the most looks like it jumped the
    most); it is not a fault of its own. Positive quantities only."""
    if ch.column(onset) is None or onset < 1:
        return False
    lo = max(0, onset - int(ch.cand[0]))  # the first candidate onset is the baseline length in blocks
    mb, ma = nanmedian(med[lo:onset]), nanmean(med[onset : onset + ch.n_post])
    ub, ua = nanmedian(x[unit, lo:onset]), nanmean(x[unit, onset : onset + ch.n_post])
    if not all(np.isfinite(v) and v > 0 for v in (mb, ma, ub, ua)):
        return False
    r_job, r_unit = ma / mb, ua / ub
    return bool(max(r_job, 1 / r_job) >= job_change and abs(math.log(r_unit / r_job)) <= math.log(same))


def gumbel_fit(values: np.ndarray, *, min_scale: float, bulk_only: bool = False) -> tuple[float, float, bool]:
    """Robust Gumbel location/scale of per-machine maxima from the upper half of the machines (q50, q75,
    q90): the upper tail is what a threshold extrapolates, and the lower half is shaped by the
    away-from-the-pack rule (machines with offsets sit far below zero), not by chance. Up to 10 % of the
    machines may be faulty without moving it; the larger of the two scale estimates is kept. With fewer than
    11 machines q90 would lean on the strongest machine (one faulty machine setting its own threshold): q75 only,
    and with 4 machines the quantile of the second strongest (q67: q75 would lean on the strongest too).

    ``bulk_only`` uses q25 and q50 instead: the law of the unchanged machines even when a large share of
    the job changed (used to recognise shared changes, never to name a machine)."""
    v = values[np.isfinite(values)]
    q25, q50, q75, q90 = np.quantile(v, [0.25, 0.5, 0.75, 0.9])
    if bulk_only:
        scale = (q50 - q25) / (GUMBEL_Q[0.5] - GUMBEL_Q[0.25])
    elif 0.9 * (v.size - 1) <= v.size - 2:
        scale = max((q75 - q50) / (GUMBEL_Q[0.75] - GUMBEL_Q[0.5]), (q90 - q50) / (GUMBEL_Q[0.9] - GUMBEL_Q[0.5]))
    elif v.size >= 4:  # fewer than 11 machines: q90 would interpolate towards the strongest one (the fault?);
        p = min(0.75, (v.size - 2) / (v.size - 1))  # and with 4, q75 would too: the second strongest at most
        scale = (float(np.quantile(v, p)) - q50) / (-math.log(-math.log(p)) - GUMBEL_Q[0.5])
    else:
        scale = (q75 - q50) / (GUMBEL_Q[0.75] - GUMBEL_Q[0.5])
    floored = scale < min_scale
    scale = max(float(scale), min_scale)
    return float(q50 - GUMBEL_Q[0.5] * scale), scale, bool(floored)
