"""Read a :class:`~rankscope.datasets.domain.metrics.MetricSet` into a :class:`MetricCube` (:func:`build_cube`).

The streaming pass (:mod:`.metric_binning`) leaves, per series and block, value sums and counts (gauges)
and increase and seconds sums (counters); here the metrics of unknown kind are decided, series are
folded into units and features (:func:`~rankscope.datasets.readers.metric_series.fold_plan`), the time
range is trimmed to blocks that hold data, blocks are widened when a metric samples more slowly than
the first rows showed, and the result is one float32 array per level.
"""

from __future__ import annotations

import math
import re

import numpy as np

from rankscope.datasets.domain.bounds import FOREIGN
from rankscope.datasets.domain.metrics import LevelCube, MetricCube, MetricSet
from rankscope.datasets.readers.metric_binning import COUNTER, BlockRule, Stream, resolve_unknown, stream
from rankscope.datasets.readers.metric_series import fold_plan
from rankscope.datasets.readers.prometheus import PATH_NAMED
from rankscope.spine import InputError


class NoMetricSamples(InputError):
    """The metric files hold no usable sample (empty results, every row skipped): nothing to compare."""


def build_cube(ms: MetricSet, *, block_s: float | BlockRule, max_gap_s: float | None = None) -> MetricCube:
    """Bin ``ms`` into a cube (counters as rates, gauges as block means); ``block_s`` is the block length
    in seconds or a function of the measured sampling intervals (``{metric: seconds}``) that chooses it.
    ``max_gap_s`` (default 10 sampling intervals, at least 300 s): a longer silence of a counter is unknown.
    The reader's edge: anything but rankscope's own error on hostile samples is an :class:`InputError`."""
    try:
        return _build_cube(ms, block_s=block_s, max_gap_s=max_gap_s)
    except FOREIGN as exc:
        files = ", ".join(str(p) for p, _ in ms.files[:2]) or "the metrics"
        raise InputError(f"{files}: metric samples unusable ({type(exc).__name__}: {str(exc)[:120]})") from None


def _build_cube(ms: MetricSet, *, block_s: float | BlockRule, max_gap_s: float | None = None) -> MetricCube:
    st = stream(ms, block_s, max_gap_s)
    if st.grid is None or st.counters is None or st.reg.n == 0:
        raise NoMetricSamples("metrics: no samples with a finite time (every row was empty or skipped)")
    resolve_unknown(st)
    _mixed_names(st)
    n = st.reg.n
    kinds = np.asarray(st.kinds, np.int64)
    is_c_slot = kinds[st.reg.slot_metric[:n]] == COUNTER
    cnt = st.counters
    resets = int(sum(acc[2] for m, acc in cnt.by_metric.items() if kinds[m] == COUNTER))
    if resets:
        st.notes.append(
            f"{resets} counter reset(s) (a drop: reboot or exporter restart): those intervals count as unknown"
        )
    spans = [r for r in (st.grid.used(), cnt.grid.used()) if r is not None]
    if not spans:
        raise NoMetricSamples("metrics: no samples with a finite value")
    lo, hi = min(r[0] for r in spans), max(r[1] for r in spans)
    S, K = (_rows(a, n) for a in st.grid.columns(lo, hi))
    Inc, Sec = (_rows(a, cnt.slots.size) for a in cnt.grid.columns(lo, hi))
    intervals = dict(st.intervals)
    _more_intervals(st, K, is_c_slot, intervals)
    L = st.grid.block_s
    t0 = st.grid.t0 + lo * L
    L_needed = float(block_s(intervals)) if callable(block_s) else L
    if L_needed > L * 1.01:
        k = math.ceil(L_needed / L - 1e-9)
        t0, (S, K, Inc, Sec) = _coarsen(k, L, t0, (S, K, Inc, Sec))
        st.notes.append(f"blocks widened to {k * L:g} s: a metric samples every {max(intervals.values()):g} s")
        L *= k
    return _fold(st, (S, K, Inc, Sec), is_c_slot, t0, L, intervals)


def _rows(a: np.ndarray, n: int) -> np.ndarray:
    """The first ``n`` rows of a grid, zero rows added for series registered after its last sample (a series
    only ever seen as a counter, or first seen in a later file, has no row in the gauge grid)."""
    if a.shape[0] >= n:
        return a[:n]
    out = np.zeros((n, a.shape[1]), a.dtype)
    out[: a.shape[0]] = a
    return out


_IP = re.compile(r"^(\d{1,3}(\.\d{1,3}){3}|[0-9a-fA-F:]*:[0-9a-fA-F:]+)$")


def _mixed_names(st: Stream) -> None:
    """Machines named by IP address beside machines named by host name are probably the same machines twice
    (node_exporter's ``instance`` beside dcgm-exporter's ``Hostname``): say so, the verdict cannot know."""
    names = [str(x) for x in st.reg.nodes.names if x is not None]
    ips = [x for x in names if _IP.match(x)]
    if ips and len(ips) < len(names):
        st.notes.append(
            f"{len(ips)} machine(s) are named by IP address (an exporter's instance label, e.g. {ips[0]}) and "
            f"{len(names) - len(ips)} by host name: the same machine may count twice; give --node-label (a label "
            "every exporter carries) or relabel the scrapes"
        )


def _coarsen(k: int, L: float, t0: float, arrays: tuple[np.ndarray, ...]) -> tuple[float, list[np.ndarray]]:
    """Merge every ``k`` adjacent blocks (aligned to multiples of ``k * L``)."""
    b_abs = int(round(t0 / L))
    front = b_abs % k
    out = []
    for a in arrays:
        nb = a.shape[1] + front
        padded = np.zeros((a.shape[0], nb + (-nb) % k), a.dtype)
        padded[:, front : front + a.shape[1]] = a
        out.append(padded.reshape(a.shape[0], -1, k).sum(axis=2, dtype=a.dtype))
    return (b_abs - front) * L, out


def _more_intervals(st: Stream, K: np.ndarray, is_counter: np.ndarray, out: dict[str, float]) -> None:
    """Sampling intervals of metrics the first rows did not show: counters from their mean interval,
    gauges from the counts (blocks spanned x block length / samples)."""
    assert st.grid is not None and st.counters is not None
    reg, cnt, L = st.reg, st.counters, st.grid.block_s
    per_metric = {m: acc[4] / acc[5] for m, acc in cnt.by_metric.items() if acc[5] > 0}
    samples = K.sum(axis=1)
    has = K > 0
    first = np.argmax(has, axis=1)
    last = K.shape[1] - np.argmax(has[:, ::-1], axis=1)
    ok = (samples >= 2) & ~is_counter
    per_g = np.where(ok, (last - first) * L / np.maximum(samples, 1), np.nan)
    g_metric = reg.slot_metric[: K.shape[0]]
    for m, name in enumerate(reg.metrics.names):
        if name is None or name in out:
            continue
        if st.kinds[m] == COUNTER:
            if m in per_metric:
                out[name] = float(per_metric[m])
            continue
        vals = per_g[g_metric == m]
        vals = vals[np.isfinite(vals)]
        if vals.size:
            out[name] = float(np.median(vals))


def _fold(
    st: Stream, grids: tuple[np.ndarray, ...], is_c_slot: np.ndarray, t0: float, L: float, intervals: dict[str, float]
) -> MetricCube:
    """Series -> units x features per level, as float32 cubes (module docstring)."""
    assert st.counters is not None
    S, K, Inc, Sec = grids
    reg = st.reg
    has = (K > 0).any(axis=1) & ~is_c_slot
    crow = np.full(reg.n, -1, np.int64)
    crow[st.counters.slots] = np.arange(st.counters.slots.size)
    has[st.counters.slots] |= (Sec > 0).any(axis=1) & is_c_slot[st.counters.slots]
    slots = np.flatnonzero(has)
    plan = fold_plan(reg, slots)
    nb = S.shape[1]
    kinds = np.asarray(st.kinds, np.int64)
    levels = []
    for lv, name in ((0, "gpu"), (1, "node")):
        sel = plan.level == lv
        feats = plan.features[lv]
        if not sel.any() or not feats:
            continue
        nu, nf = plan.unit_machine[lv].size, len(feats)
        cell = plan.unit[sel] * nf + plan.feature[sel]
        s_lv = slots[sel]
        num = np.zeros((nu * nf, nb), np.float32)
        den = np.zeros((nu * nf, nb), np.float32)
        g = ~is_c_slot[s_lv]
        # one series per cell (no pooled labels): plain assignment; else pooled sums
        put = _assign if np.unique(cell).size == cell.size else np.add.at
        if g.any():
            put(num, cell[g], S[s_lv[g]])
            put(den, cell[g], K[s_lv[g]])
        if (~g).any():
            rows = crow[s_lv[~g]]
            put(num, cell[~g], Inc[rows])
            put(den, cell[~g], Sec[rows])
        with np.errstate(invalid="ignore", divide="ignore"):
            num /= den
        values = np.ascontiguousarray(num.reshape(nu, nf, nb).transpose(0, 2, 1))
        fk: tuple[str, ...] = tuple("counter" if kinds[m] == COUNTER else "gauge" for m in plan.feature_metric[lv])
        levels.append(LevelCube(name, values, plan.unit_machine[lv], plan.unit_gpu[lv], feats, fk))  # type: ignore[arg-type]
    return MetricCube(plan.machines, tuple(levels), t0, L, nb, intervals, tuple(_dedupe(st.notes)), st.rows)


def _assign(out: np.ndarray, rows: np.ndarray, values: np.ndarray) -> None:
    out[rows] = values


def _dedupe(items: list[str], limit: int = 20) -> list[str]:
    """Each note once, with how often it was said; the readers' per-file "named from its path" notes (a
    node_exporter without the label: one per scrape file, thousands) as one."""
    seen: dict[str, int] = {}
    named = [m for m in map(PATH_NAMED.match, items) if m]
    if len(named) > 1:
        machines = {m["name"] for m in named}
        items = [it for it in items if not PATH_NAMED.match(it)]
        items.insert(
            0,
            f"{len(named)} file(s) with no node/Hostname/instance label: machine named from the path "
            f"({len(machines)} machine(s); {named[0]['file']} -> {named[0]['name']})",
        )
    for it in items:
        seen[it] = seen.get(it, 0) + 1
    out = [k if v == 1 else f"{k} (x{v})" for k, v in seen.items()]
    return out[:limit] + ([f"... {len(out) - limit} more notes"] if len(out) > limit else [])
