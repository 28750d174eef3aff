"""Counter semantics: which metrics are cumulative counters, and how they become per-second rates.

Knowledge, in order of precedence (:func:`declared_kind`):

1. ``# TYPE`` lines of the data (Prometheus text exposition): ``counter`` or ``gauge``.
2. The field types dcgm-exporter declares (its ``etc/default-counters.csv`` and
   ``etc/dcp-metrics-included.csv``: ``DCGM FIELD, Prometheus metric type, help``), e.g.
   ``DCGM_FI_DEV_PCIE_REPLAY_COUNTER`` counter, ``DCGM_FI_DEV_XID_ERRORS`` gauge (the *last* Xid code),
   ``DCGM_FI_PROF_PCIE_TX_BYTES`` gauge (already a rate, bytes/s), ``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION``
   counter (mJ since boot).
3. node_exporter's conventions: ``*_total`` (and ``*_seconds_total``) are counters; the ``netstat``,
   ``vmstat``, ``snmp`` and ``softnet`` collectors export kernel counters without the suffix (as
   ``untyped``), e.g. ``node_netstat_Tcp_RetransSegs``, except a few gauges (``Tcp_CurrEstab``, ...).
4. A fallback for anything else (:func:`looks_monotonic`): a metric whose series never go down, except
   for rare drops to well under half (restarts), and that grow on most machines, is a counter.

Rates follow Prometheus' ``rate()``: the increase over the elapsed time between consecutive samples of
one series. A drop is a reset (reboot, exporter or driver restart): the interval that contains it is
unknown (NaN), never a negative rate and never a spike (a drop can also be a glitch of a counter near
1e14, where taking the new value as the increase would invent petabytes). Non-finite samples are
skipped, so an interval spans the gap; intervals longer than ``max_gap_s`` are unknown too.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Literal

import numpy as np

Kind = Literal["counter", "gauge"]

_G: Kind = "gauge"
_C: Kind = "counter"
DCGM_FIELD_TYPES: dict[str, Kind] = {
    # clocks, temperature, power
    **dict.fromkeys(
        (
            "DCGM_FI_DEV_SM_CLOCK",
            "DCGM_FI_DEV_MEM_CLOCK",
            "DCGM_FI_DEV_APP_SM_CLOCK",
            "DCGM_FI_DEV_APP_MEM_CLOCK",
            "DCGM_FI_DEV_VIDEO_CLOCK",
            "DCGM_FI_DEV_MEMORY_TEMP",
            "DCGM_FI_DEV_GPU_TEMP",
            "DCGM_FI_DEV_POWER_USAGE",
            "DCGM_FI_DEV_POWER_USAGE_INSTANT",
            "DCGM_FI_DEV_POWER_MGMT_LIMIT",
            "DCGM_FI_DEV_ENFORCED_POWER_LIMIT",
            # utilisation
            "DCGM_FI_DEV_GPU_UTIL",
            "DCGM_FI_DEV_MEM_COPY_UTIL",
            "DCGM_FI_DEV_ENC_UTIL",
            "DCGM_FI_DEV_DEC_UTIL",
            # the last Xid code and throttle reasons are states, not counts
            "DCGM_FI_DEV_XID_ERRORS",
            "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
            "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
            # memory
            "DCGM_FI_DEV_FB_FREE",
            "DCGM_FI_DEV_FB_USED",
            "DCGM_FI_DEV_FB_RESERVED",
            "DCGM_FI_DEV_FB_TOTAL",
            "DCGM_FI_DEV_ROW_REMAP_FAILURE",
            "DCGM_FI_DEV_ROW_REMAP_PENDING",
            "DCGM_FI_DEV_VGPU_LICENSE_STATUS",
            "DCGM_FI_DEV_COUNT",
            # DCP profiling fields: ratios and byte rates over the sample period
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
            "DCGM_FI_PROF_SM_ACTIVE",
            "DCGM_FI_PROF_SM_OCCUPANCY",
            "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
            "DCGM_FI_PROF_DRAM_ACTIVE",
            "DCGM_FI_PROF_PIPE_FP64_ACTIVE",
            "DCGM_FI_PROF_PIPE_FP32_ACTIVE",
            "DCGM_FI_PROF_PIPE_FP16_ACTIVE",
            "DCGM_FI_PROF_PCIE_TX_BYTES",
            "DCGM_FI_PROF_PCIE_RX_BYTES",
            "DCGM_FI_PROF_NVLINK_TX_BYTES",
            "DCGM_FI_PROF_NVLINK_RX_BYTES",
        ),
        _G,
    ),
    **dict.fromkeys(
        (
            "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",  # mJ since boot
            "DCGM_FI_DEV_PCIE_TX_THROUGHPUT",
            "DCGM_FI_DEV_PCIE_RX_THROUGHPUT",
            "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
            "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
            "DCGM_FI_DEV_NVLINK_BANDWIDTH_L0",
            "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
            "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
            "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
            "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
            # throttling time since boot (microseconds)
            "DCGM_FI_DEV_POWER_VIOLATION",
            "DCGM_FI_DEV_THERMAL_VIOLATION",
            "DCGM_FI_DEV_SYNC_BOOST_VIOLATION",
            "DCGM_FI_DEV_BOARD_LIMIT_VIOLATION",
            "DCGM_FI_DEV_LOW_UTIL_VIOLATION",
            "DCGM_FI_DEV_RELIABILITY_VIOLATION",
            # ECC, retired pages, remapped rows
            "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
            "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
            "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
            "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
            "DCGM_FI_DEV_RETIRED_SBE",
            "DCGM_FI_DEV_RETIRED_DBE",
            "DCGM_FI_DEV_RETIRED_PENDING",
            "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
            "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        ),
        _C,
    ),
}
"""dcgm-exporter's declared type of each field (``etc/default-counters.csv``, ``etc/dcp-metrics-included.csv``)."""

NODE_GAUGES = re.compile(
    r"^node_netstat_(Tcp_CurrEstab|Tcp_MaxConn|Tcp_RtoAlgorithm|Tcp_RtoMin|Tcp_RtoMax|TcpExt_TCPMemoryPressures?Chrono)$"
    r"|^node_vmstat_nr_"
)
"""node_exporter series from counter collectors that are gauges."""

NODE_COUNTERS = re.compile(r"^node_(netstat|vmstat|snmp|snmp6|softnet)_")
"""node_exporter collectors that export kernel counters without the ``_total`` suffix."""

KNOWN_GAUGES = re.compile(
    r"^node_load(1|5|15)$|^node_memory_|^node_filesystem_(avail|free|size|files|readonly)|^node_hwmon_|"
    r"^node_(boot_)?time_seconds$|^node_network_(up|mtu_bytes|speed_bytes|carrier)$|^up$|^scrape_|"
    r"_ratio$|_percent(age)?$|_celsius$|_temperature$|_info$|"
    r":(rate|irate|increase|avg|sum|max|min|ratio|utilisation|utilization|saturation)[a-z0-9_]*$|:rate\d+[smh]$"
)
"""Gauges by name: load averages, memory and filesystem sizes, ratios, and Prometheus recording rules
(``level:metric:operation`` names such as ``instance:node_cpu_utilisation:rate1m`` hold rates already)."""

_FAMILY = re.compile(r"_(total|count|sum|bucket|created)$")
_DCGM_COUNTER = re.compile(r"_(TOTAL|COUNT|COUNTER|VIOLATION)$")


def declared_kind(name: str, types: Mapping[str, str] | None = None) -> Kind | None:
    """The kind a metric is known to have (``# TYPE`` > dcgm-exporter's table > naming conventions), else None."""
    if types:
        t = types.get(name) or types.get(_FAMILY.sub("", name))
        if t == "counter":
            return "counter"
        if t == "gauge":
            return "gauge"
        if t in ("histogram", "summary") and name.endswith(("_count", "_sum", "_bucket")):
            return "counter"
    if name in DCGM_FIELD_TYPES:
        return DCGM_FIELD_TYPES[name]
    if name.startswith("DCGM_FI_") and _DCGM_COUNTER.search(name):
        return "counter"
    if NODE_GAUGES.search(name) or KNOWN_GAUGES.search(name):
        return "gauge"
    if name.endswith("_total") or NODE_COUNTERS.search(name):
        return "counter"
    return None


def looks_monotonic(value: np.ndarray, series: np.ndarray) -> bool:
    """The fallback: does one metric behave like a counter across its series?

    ``series`` labels each sample (samples of one series contiguous and time-ordered). A counter's
    series never go down except for resets, which drop to well under half the previous value (at most
    2, or 1 % of the intervals); at least 2 of 3 of the series grow. A gauge that only rose during the
    window (a warming GPU) is still told apart because the test asks it of every series, and real gauges
    jitter down somewhere.
    """
    ok = np.isfinite(value)
    value, series = value[ok], series[ok]
    if value.size < 3 or np.any(value < 0):
        return False
    same = series[1:] == series[:-1]
    dv = np.diff(value)[same]
    if dv.size == 0:
        return False
    drops = dv < 0
    resets = drops & (value[1:][same] < 0.5 * value[:-1][same])
    if np.count_nonzero(drops & ~resets) > 0:
        return False
    if np.count_nonzero(resets) > max(2, 0.01 * dv.size):
        return False
    ids = np.unique(series)
    grew = np.zeros(ids.size, dtype=bool)
    np.logical_or.at(grew, np.searchsorted(ids, series[1:][same]), dv > 0)
    return bool(grew.mean() >= 2 / 3)


def interval_increases(
    ts: np.ndarray, value: np.ndarray, series: np.ndarray, *, max_gap_s: float
) -> tuple[np.ndarray, np.ndarray]:
    """Per sample, the counter increase and the seconds since the previous finite sample of its series.

    Input: one counter's samples, grouped by ``series`` and time-ordered within a series (the caller
    sorts). The first sample of a series, a reset (drop), a non-positive time step or a gap longer
    than ``max_gap_s`` give NaN for both. Non-finite samples are NaN and do not break the chain: the
    next interval spans them.
    """
    n = value.size
    inc = np.full(n, np.nan)
    dts = np.full(n, np.nan)
    finite = np.isfinite(value)
    ok = np.arange(n) if finite.all() else np.flatnonzero(finite)
    if ok.size < 2:
        return inc, dts
    v, t, s = value[ok], ts[ok], series[ok]
    dv = np.diff(v)
    dt = np.diff(t)
    good = (s[1:] == s[:-1]) & (dv >= 0) & (dt > 0) & (dt <= max_gap_s)
    idx = ok[1:][good]
    inc[idx] = dv[good]
    dts[idx] = dt[good]
    return inc, dts


def counter_resets(value: np.ndarray, series: np.ndarray) -> int:
    """How many drops (resets) the samples hold, NaN skipped (same layout as :func:`interval_increases`)."""
    ok = np.isfinite(value)
    v, s = value[ok], series[ok]
    return int(np.count_nonzero((np.diff(v) < 0) & (s[1:] == s[:-1])))


def counter_rates(ts: np.ndarray, value: np.ndarray, series: np.ndarray, *, max_gap_s: float) -> np.ndarray:
    """Per-sample rate (increase / elapsed seconds) of one counter; NaN where unknown (see above)."""
    inc, dts = interval_increases(ts, value, series, max_gap_s=max_gap_s)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.asarray(inc / dts)


CLOCK_EVENT_MASKS = ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS")
"""DCGM's clock-event (throttle) reasons: a bitmask, not a quantity (``nvmlClocksEventReasons``)."""
SLOWDOWN_BITS = 0x08 | 0x20 | 0x40 | 0x80
"""The reasons that mean the hardware is slowed against the workload's will: HW slowdown (0x8), SW thermal
(0x20), HW thermal (0x40) and HW power brake (0x80). Idle (0x1), application clocks (0x2), the software
power cap (0x4: every busy GPU sits there), sync boost (0x10) and display clocks (0x100) are not faults."""


def slowdown_flags(value: np.ndarray) -> np.ndarray:
    """A clock-event-reasons bitmask as 1.0 when a slowdown bit is set, else 0.0 (NaN stays NaN, and so
    does what is no bitmask: a negative or fractional number, or one past 2**53)."""
    out = np.full(value.shape, np.nan)
    ok = np.isfinite(value) & (value >= 0) & (value <= 2.0**53) & (value == np.floor(value))
    out[ok] = ((value[ok].astype(np.int64) & SLOWDOWN_BITS) != 0).astype(np.float64)
    return out
