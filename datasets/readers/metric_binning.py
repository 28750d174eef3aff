"""From a :class:`~rankscope.datasets.domain.metrics.MetricSet` to a :class:`MetricCube`, in one streaming pass.

Chunks (:func:`~rankscope.datasets.readers.metric_files.iter_chunks`) are decoded on a second thread while
the first bins the previous one. Per row: the series slot (:class:`.metric_series.Registry`: one gather
from a lookup table of global codes), the time block (integer arithmetic on ``ts``), then one scatter-add
of the value and of a count into a (slot, block) grid. Counters (and metrics whose kind is unknown yet)
are also kept as (slot, ts, value) and turned into rates at the end, per series: the sum of the increases
over the sum of the elapsed seconds in each block (:mod:`~rankscope.datasets.domain.counters`: resets,
gaps and NaN never give a negative or invented rate). Nothing per row is a Python object, and memory is
the grid plus one chunk, whatever the number of rows.

Blocks are ``block_s(intervals)`` seconds long, decided once the first ~2 M rows show each metric's
sampling interval (median spacing of consecutive samples of the first machines' series), and aligned to
multiples of the block so the same data always lands in the same blocks. If a metric seen only later
samples more slowly than the block allows, adjacent blocks are merged (sums are additive).
"""

from __future__ import annotations

import math
import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from rankscope.datasets.domain.counters import CLOCK_EVENT_MASKS, declared_kind, slowdown_flags
from rankscope.datasets.domain.metrics import MetricSet
from rankscope.datasets.readers.metric_series import Registry
from rankscope.spine import InputError

BUFFER_ROWS = 2_000_000
GAUGE, COUNTER, UNKNOWN, SKIP = 0, 1, 2, 3
BlockRule = Callable[[dict[str, float]], float]


MAX_BLOCKS = 1 << 24
"""Time blocks one grid may span (16M: years at one-minute blocks); more is a corrupt timestamp, refused."""


@dataclass
class Grid:
    """Two sums per (slot, block) (a value and a count, or an increase and seconds); grows in both
    directions as slots and times appear. Block ``b`` starts at ``t0 + b * block_s``."""

    block_s: float
    t0: float
    S: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.float32))
    K: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.float32))
    b_lo: int = 0

    def blocks(self, ts: np.ndarray) -> np.ndarray:
        x = ts - self.t0
        x *= 1.0 / self.block_s
        return (np.floor(x) if x.size and x.min() < 0 else x).astype(np.int64)

    def _ensure(self, n_slots: int, lo: int, hi: int) -> None:
        rows, nb = self.S.shape
        if n_slots <= rows and nb and lo >= self.b_lo and hi < self.b_lo + nb:
            return
        cur_hi = self.b_lo + nb - 1
        new_lo, new_hi = (min(self.b_lo, lo), max(cur_hi, hi)) if nb else (lo, hi)
        if nb:  # amortised growth: time-ordered input keeps extending the range
            span = new_hi - new_lo + 1
            if new_hi > cur_hi:
                new_hi += max(8, span // 2)
            if new_lo < self.b_lo:
                new_lo -= max(8, span // 2)
        self.reserve(max(n_slots, 2 * rows, 256) if n_slots > rows else rows, new_lo, new_hi)

    def reserve(self, n_slots: int, lo: int, hi: int) -> None:
        """Room for ``n_slots`` slots and absolute blocks ``[lo, hi]`` (what is there is kept)."""
        rows, nb = self.S.shape
        if nb:
            lo, hi = min(lo, self.b_lo), max(hi, self.b_lo + nb - 1)
        n_slots = max(n_slots, rows)
        if n_slots == rows and nb and lo == self.b_lo and hi == self.b_lo + nb - 1:
            return
        if hi - lo + 1 > MAX_BLOCKS:  # before allocating: a corrupt timestamp far from the others
            raise InputError(
                f"metrics: the samples span {hi - lo + 1:,} time blocks (at most {MAX_BLOCKS:,}): a timestamp far "
                "outside the others (check the files' ts columns)"
            )
        S = np.zeros((n_slots, hi - lo + 1), self.S.dtype)
        K = np.zeros((n_slots, hi - lo + 1), self.K.dtype)
        off = self.b_lo - lo
        S[:rows, off : off + nb] = self.S
        K[:rows, off : off + nb] = self.K
        self.S, self.K, self.b_lo = S, K, lo

    def add(self, n_slots: int, slot: np.ndarray, blk: np.ndarray, s: np.ndarray, k: np.ndarray | float) -> None:
        """Add ``s`` and ``k`` (an array, or one number for every row: a count) at (slot, block)."""
        if slot.size == 0:
            return
        self._ensure(n_slots, int(blk.min()), int(blk.max()))
        cell = slot * self.S.shape[1]
        cell += blk - self.b_lo
        # same dtype on both sides: numpy's fast path for ufunc.at
        np.add.at(self.S.reshape(-1), cell, s.astype(self.S.dtype, copy=False))
        kk = self.K.dtype.type(k) if isinstance(k, (int, float)) else k.astype(self.K.dtype, copy=False)
        np.add.at(self.K.reshape(-1), cell, kk)

    def columns(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        """S and K over absolute blocks ``[lo, hi)`` (zeros outside what was filled; views when inside)."""
        rows, nb = self.S.shape
        if lo >= self.b_lo and hi <= self.b_lo + nb:
            return self.S[:, lo - self.b_lo : hi - self.b_lo], self.K[:, lo - self.b_lo : hi - self.b_lo]
        S = np.zeros((rows, hi - lo), self.S.dtype)
        K = np.zeros((rows, hi - lo), self.K.dtype)
        a, b = max(lo, self.b_lo), min(hi, self.b_lo + nb)
        if a < b:
            S[:, a - lo : b - lo] = self.S[:, a - self.b_lo : b - self.b_lo]
            K[:, a - lo : b - lo] = self.K[:, a - self.b_lo : b - self.b_lo]
        return S, K

    def used(self) -> tuple[int, int] | None:
        """The absolute block range that holds any count."""
        has = (self.K != 0).any(axis=0)
        if not has.any():
            return None
        return self.b_lo + int(np.argmax(has)), self.b_lo + int(has.size - np.argmax(has[::-1]))


class Counters:
    """Counters (and metrics of unknown kind) as they stream: per series the last sample is carried from
    chunk to chunk, so each interval's increase and seconds are known at once (Prometheus' ``rate()``;
    the rules of :func:`~rankscope.datasets.domain.counters.interval_increases`: a drop is a reset and
    the interval is unknown, a gap longer than ``max_gap_s`` is unknown). The monotonic test of
    :func:`~rankscope.datasets.domain.counters.looks_monotonic` is kept as running counts per metric."""

    def __init__(self, block_s: float, t0: float, max_gap_s: float) -> None:
        self.grid = Grid(block_s, t0)
        self.max_gap_s = max_gap_s
        self.local_of = np.full(0, -1, np.int64)
        self.slots = np.zeros(0, np.int64)  # global slot of each local one
        self.last_ts = np.zeros(0)
        self.last_v = np.zeros(0)
        self.grew = np.zeros(0, bool)
        self.by_metric: dict[int, np.ndarray] = {}  # per metric code: pairs, drops, resets, negatives, dt, n

    def _local(self, slot: np.ndarray, n_global: int) -> np.ndarray:
        if self.local_of.size < n_global:
            grown = np.full(max(n_global, 2 * self.local_of.size), -1, np.int64)
            grown[: self.local_of.size] = self.local_of
            self.local_of = grown
        local = self.local_of[slot]
        new = local < 0
        if new.any():
            mark = np.zeros(self.local_of.size, bool)
            mark[slot[new]] = True
            fresh = np.flatnonzero(mark)
            n0 = self.slots.size
            self.local_of[fresh] = np.arange(n0, n0 + fresh.size)
            self.slots = np.concatenate([self.slots, fresh])
            pad = fresh.size
            self.last_ts = np.concatenate([self.last_ts, np.full(pad, np.nan)])
            self.last_v = np.concatenate([self.last_v, np.full(pad, np.nan)])
            self.grew = np.concatenate([self.grew, np.zeros(pad, bool)])
            local = self.local_of[slot]
        return local

    def add(self, slot: np.ndarray, ts: np.ndarray, value: np.ndarray, metric: np.ndarray, n_global: int) -> None:
        """Samples (finite values only) of counter series; any order within the chunk."""
        if slot.size == 0:
            return
        local = self._local(slot, n_global)
        dl = np.diff(local)
        if np.any(dl < 0) or np.any((dl == 0) & (np.diff(ts) < 0)):
            order = np.lexsort((ts, local))
            local, ts, value, metric = local[order], ts[order], value[order], metric[order]
        start = np.r_[True, local[1:] != local[:-1]]
        end = np.r_[start[1:], True]
        prev_t = np.empty_like(ts)
        prev_v = np.empty_like(value)
        prev_t[1:], prev_v[1:] = ts[:-1], value[:-1]
        prev_t[start] = self.last_ts[local[start]]
        prev_v[start] = self.last_v[local[start]]
        self.last_ts[local[end]] = ts[end]
        self.last_v[local[end]] = value[end]
        dt = ts - prev_t
        inc = value - prev_v
        pair = np.isfinite(inc)
        drop = inc < 0  # NaN compares False
        reset = drop & (value < 0.5 * prev_v)
        self.grew[local[inc > 0]] = True
        ok = (inc >= 0) & (dt > 0) & (dt <= self.max_gap_s)
        flags = (pair, drop & ~reset, reset, value < 0)
        lo_m, hi_m = int(metric.min()), int(metric.max())
        if lo_m == hi_m:  # the usual chunk: one metric
            acc = self.by_metric.setdefault(lo_m, np.zeros(6))
            acc[:4] += [np.count_nonzero(f) for f in flags]
            acc[4] += dt[ok].sum()
            acc[5] += np.count_nonzero(ok)
        else:
            w = [*flags, np.where(ok, dt, 0.0), ok]
            for j, flag in enumerate(w):
                counts = np.bincount(metric, weights=flag, minlength=hi_m + 1)
                for m in np.flatnonzero(counts):
                    self.by_metric.setdefault(int(m), np.zeros(6))[j] += counts[m]
        if not ok.all():
            local, ts, inc, dt = local[ok], ts[ok], inc[ok], dt[ok]
        self.grid.add(self.slots.size, local, self.grid.blocks(ts), inc, dt)

    def monotonic(self, m: int, slot_metric: np.ndarray) -> bool:
        """The fallback test (:func:`~rankscope.datasets.domain.counters.looks_monotonic`) for metric code ``m``."""
        acc = self.by_metric.get(m)
        if acc is None:
            return False
        pairs, bad_drops, resets, negatives = acc[:4]
        mine = slot_metric[self.slots] == m
        if pairs < 2 or negatives > 0 or bad_drops > 0 or resets > max(2, 0.01 * pairs) or not mine.any():
            return False
        return bool(self.grew[mine].mean() >= 2 / 3)


@dataclass
class Stream:
    """What the pass collects: the series, the kind of each metric, the two grids, notes."""

    reg: Registry = field(default_factory=Registry)
    kinds: list[int] = field(default_factory=list)  # per metric code
    masks: list[bool] = field(default_factory=list)  # per metric code: a clock-event-reasons bitmask
    types: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    rows: int = 0
    skip_prefixes: tuple[str, ...] = ("rankscope_",)
    after_s: float = -np.inf  # MetricSet.after_s: older samples skipped
    grid: Grid | None = None
    counters: Counters | None = None
    intervals: dict[str, float] = field(default_factory=dict)

    def kind_lut(self) -> np.ndarray:
        names = self.reg.metrics.names
        for m in range(len(self.kinds), len(names)):
            name = names[m] or ""
            self.masks.append(name in CLOCK_EVENT_MASKS)
            if name.startswith(self.skip_prefixes):
                self.kinds.append(SKIP)
            else:
                k = declared_kind(name, self.types)
                self.kinds.append(COUNTER if k == "counter" else GAUGE if k == "gauge" else UNKNOWN)
        return np.asarray(self.kinds, np.int64)

    def declare(self, types: dict[str, str]) -> None:
        """New ``# TYPE`` declarations: metrics of unknown kind seen before take the declared one (their
        samples also went through the counter path, so a counter's rates are complete)."""
        self.types.update(types)
        for m, k in enumerate(self.kinds):
            if k == UNKNOWN:
                d = declared_kind(self.reg.metrics.names[m] or "", self.types)
                if d is not None:
                    self.kinds[m] = COUNTER if d == "counter" else GAUGE

    def rows_of(self, table: pa.Table) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(slot, ts, value) of one chunk; rows with a non-finite time or a skipped metric dropped."""
        reg = self.reg
        cols = {c: table.column(c).combine_chunks() for c in ("node", "metric", "gpu")}
        extra = {c: table.column(c).combine_chunks() for c in table.column_names if c not in _CORE}
        if extra:
            node, metric, gpu = (reg.nodes.of(cols["node"]), reg.metrics.of(cols["metric"]), reg.gpus.of(cols["gpu"]))
            slot = reg.slots_labelled(node, gpu, metric, reg.label_tuple_codes(extra, table.num_rows))
        else:
            slot = reg.slots_of_chunk(cols["node"], cols["gpu"], cols["metric"])
        ts = np.asarray(table.column("ts").to_numpy(), dtype=np.float64)
        value = np.asarray(table.column("value").to_numpy(), dtype=np.float64)
        kinds = self.kind_lut()
        keep = np.isfinite(ts)
        if self.after_s > -np.inf:
            keep &= ts > self.after_s
        if (kinds == SKIP).any():
            keep &= kinds[reg.slot_metric[slot]] != SKIP
        if not keep.all():
            slot, ts, value = slot[keep], ts[keep], value[keep]
        if any(self.masks):  # a bitmask: compared as "slowed down or not", never as a number
            sel = np.asarray(self.masks, bool)[reg.slot_metric[slot]]
            if sel.any():
                value = value.copy()
                value[sel] = slowdown_flags(value[sel])
        self.rows += int(slot.size)
        return slot, ts, value

    def bin(self, slot: np.ndarray, ts: np.ndarray, value: np.ndarray) -> None:
        """One chunk's rows into the grids (gauges: value and count; counters: increase and seconds)."""
        assert self.grid is not None and self.counters is not None
        metric = self.reg.slot_metric[slot]
        kinds = self.kind_lut()[metric]
        fin = np.isfinite(value)
        to_counter = (kinds != GAUGE) & fin
        if to_counter.any():
            sel = np.flatnonzero(to_counter)
            self.counters.add(slot[sel], ts[sel], value[sel], metric[sel], self.reg.n)
        gauge = (kinds != COUNTER) & fin
        if not gauge.all():
            slot, ts, value = slot[gauge], ts[gauge], value[gauge]
        self.grid.add(self.reg.n, slot, self.grid.blocks(ts), value, 1.0)

    def start(
        self,
        buffered: list[tuple[np.ndarray, np.ndarray, np.ndarray]],
        block_s: float | BlockRule,
        max_gap_s: float | None,
        hint: tuple[int, float, float] | None = None,
    ) -> None:
        """Block length from the sampling intervals of the buffered rows; then bin them."""
        self.intervals = _intervals(self, buffered)
        L = float(block_s(self.intervals) if callable(block_s) else block_s)
        if not L > 0:
            raise ValueError(f"block_s={L!r} must be positive")
        t_min = min((float(r[1].min()) for r in buffered if r[1].size), default=0.0)
        t_max = max((float(r[1].max()) for r in buffered if r[1].size), default=0.0)
        if hint is not None:
            t_min, t_max = min(t_min, hint[1]), max(t_max, hint[2])
        t0 = math.floor(t_min / L) * L
        self.grid = Grid(L, t0)
        n_buf = sum(r[0].size for r in buffered)
        expect = self.reg.n if hint is None else max(self.reg.n, int(1.2 * hint[0] * self.reg.n / max(n_buf, 1)))
        self.grid.reserve(expect, 0, int((t_max - t0) // L))
        gap = max_gap_s if max_gap_s is not None else max(300.0, 10 * max(self.intervals.values(), default=1.0))
        self.counters = Counters(L, t0, gap)
        for rows in buffered:
            self.bin(*rows)


_CORE = frozenset({"ts", "value", "node", "metric", "gpu"})


def _prefetch(chunks: Iterable[Any], depth: int = 2) -> Iterator[Any]:
    """``chunks`` produced on a second thread (Parquet decoding releases the GIL), errors re-raised here."""
    q: queue.Queue[Any] = queue.Queue(maxsize=depth)
    stop = threading.Event()
    end = object()

    def run() -> None:
        try:
            for c in chunks:
                if stop.is_set():
                    return
                q.put(c)
            q.put(end)
        except BaseException as exc:  # handed to the consumer, which re-raises it
            q.put(exc)

    t = threading.Thread(target=run, name="rankscope-metrics-read", daemon=True)
    t.start()
    try:
        while True:
            item = q.get()
            if item is end:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        while t.is_alive():  # unblock a producer waiting on a full queue
            try:
                q.get_nowait()
            except queue.Empty:
                t.join(0.05)


def _intervals(st: Stream, rows: list[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> dict[str, float]:
    """Median spacing of consecutive samples per metric, from the series of the first 64 machines seen."""
    reg = st.reg
    slot = np.concatenate([r[0] for r in rows]) if rows else np.zeros(0, np.int64)
    ts = np.concatenate([r[1] for r in rows]) if rows else np.zeros(0)
    sel = reg.slot_node[slot] < 64
    slot, ts = slot[sel], ts[sel]
    ds = np.diff(slot)
    if np.any(ds < 0) or np.any((ds == 0) & (np.diff(ts) < 0)):
        order = np.lexsort((ts, slot))
        slot, ts = slot[order], ts[order]
    same = slot[1:] == slot[:-1]
    dt = np.diff(ts)[same]
    metric = reg.slot_metric[slot[1:][same]]
    ok = dt > 0
    dt, metric = dt[ok], metric[ok]
    if not metric.size:  # no metric sampled twice yet (one scrape, or no samples at all)
        return {}
    order = np.argsort(metric, kind="stable")
    dt, metric = dt[order], metric[order]
    bounds = np.flatnonzero(np.r_[True, metric[1:] != metric[:-1], True])
    return {str(reg.metrics.names[int(metric[a])]): float(np.median(dt[a:b])) for a, b in zip(bounds[:-1], bounds[1:])}


def stream(ms: MetricSet, block_s: float | BlockRule, max_gap_s: float | None = None) -> Stream:
    """The streaming pass: every chunk of ``ms`` into the grids (module docstring)."""
    from rankscope.datasets.readers.metric_files import iter_chunks, size_hint

    st = Stream(types=dict(ms.types), notes=list(ms.notes), after_s=ms.after_s)
    hint = size_hint(ms)
    buffered: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    n_buf = 0
    for table, types, notes in _prefetch(iter_chunks(ms)):
        if types:
            st.declare(types)
        st.notes.extend(notes)
        if table.num_rows == 0:
            continue
        rows = st.rows_of(table)
        if st.grid is None:
            buffered.append(rows)
            n_buf += rows[0].size
            if n_buf >= BUFFER_ROWS:
                st.start(buffered, block_s, max_gap_s, hint)
                buffered = []
            continue
        st.bin(*rows)
    if st.grid is None:
        st.start(buffered, block_s, max_gap_s, hint)
    return st


def resolve_unknown(st: Stream) -> None:
    """Metrics without a declared kind: counters when their series behave like counters, else gauges."""
    assert st.counters is not None
    for m, k in enumerate(st.kinds):
        if k != UNKNOWN:
            continue
        is_counter = st.counters.monotonic(m, st.reg.slot_metric)
        st.kinds[m] = COUNTER if is_counter else GAUGE
        if is_counter:
            st.notes.append(f"{st.reg.metrics.names[m]}: no declared type; its series only grow: read as a counter")
