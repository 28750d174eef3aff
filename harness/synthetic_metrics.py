"""Synthetic per-machine metrics and per-rank timings with injected faults and their ground truth.

Metrics: every machine runs the same synchronous training step (8-12 s: a compute phase, then a
communication phase), sampled at 1 Hz with a per-machine sampling offset, static per-machine
heterogeneity (a hotter rack, a slightly faster NIC), sample noise, a job-wide checkpoint pause every
15 minutes and rare benign ECC corrections. Faults change one machine from an onset on:

- ``gpu-throttle``: SM clock -25 %, power -20 %, +10 C, busy through the communication phase;
- ``nic-degrade``: receive throughput falls linearly to -50 % over 10 minutes;
- ``ecc-growth``: corrected-error counter grows at an accelerating rate;
- ``pcie-downgrade``: host-to-device throughput halves (x16 -> x8);
- ``slow-cpu``: host CPU pinned near 100 %, GPU waits a little for data.

Timings: Megatron-style per-rank forward/backward/optimizer durations and a data-parallel all-reduce
that waits for the slowest member of its group, for a layout, with a slow
machine, a slow pipeline stage, data imbalance across replicas, a job-wide slowdown, or nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

import numpy as np
import polars as pl

from rankscope.datasets.domain.topology import Layout, Topology
from rankscope.spine import InputError

METRIC_NAMES = (
    "gpu_utilization_ratio",
    "gpu_power_watts",
    "gpu_temperature_celsius",
    "gpu_sm_clock_hertz",
    "node_network_receive_bytes_per_second",
    "gpu_pcie_throughput_bytes_per_second",
    "node_cpu_utilization_ratio",
    "gpu_ecc_errors_total",
)
FAULT_KINDS = ("gpu-throttle", "nic-degrade", "ecc-growth", "pcie-downgrade", "slow-cpu")
TIMING_SCENARIOS = ("healthy", "slow-machine", "slow-stage", "data-imbalance", "global-slowdown")
EPOCH = datetime(2026, 1, 1, tzinfo=timezone.utc)


@dataclass(frozen=True)
class InjectedFault:
    """Ground truth of one injected fault: which machine, what, from when (seconds from start)."""

    machine: int
    node: str
    kind: str
    onset_s: float


@dataclass(frozen=True, eq=False)
class MetricsRun:
    """A synthetic run: ``values`` is ``(n_machines, n_seconds, n_metrics)`` float32 at 1 Hz."""

    values: np.ndarray
    metric_names: tuple[str, ...]
    nodes: tuple[str, ...]
    faults: tuple[InjectedFault, ...]
    interval_s: float = 1.0

    def to_long(self, *, job: str = "synthetic") -> pl.DataFrame:
        """The run in the long form of the ``metrics`` table (``job, ts, node, metric, value``)."""
        n, t, m = self.values.shape
        ts = np.datetime64(EPOCH.replace(tzinfo=None), "us") + (np.arange(t) * self.interval_s * 1e6).astype(
            "timedelta64[us]"
        )
        return pl.DataFrame(
            {
                "job": np.full(n * t * m, job, dtype=object),
                "ts": np.tile(np.repeat(ts, m), n),
                "node": np.repeat(np.asarray(self.nodes, dtype=object), t * m),
                "metric": np.tile(np.asarray(self.metric_names, dtype=object), n * t),
                "value": self.values.reshape(-1).astype(np.float64),
            }
        ).with_columns(pl.col("ts").dt.replace_time_zone("UTC"))


def _phase_fraction(period_s: np.ndarray, compute_frac: float, t_end: float, sample_t: np.ndarray) -> np.ndarray:
    """Fraction of the second before each sample time spent in the compute phase."""
    # step boundaries from the (varying) period; cumulative compute time on a fine grid, then interpolate
    starts = np.concatenate([[0.0], np.cumsum(period_s)])
    starts = starts[starts <= t_end + 20]
    grid = np.arange(0.0, t_end + 2.0, 0.05)
    step = np.searchsorted(starts, grid, side="right") - 1
    step = np.clip(step, 0, len(starts) - 2)
    within = grid - starts[step]
    compute = within < compute_frac * (starts[step + 1] - starts[step])
    cum = np.concatenate([[0.0], np.cumsum(compute[:-1] * 0.05)])
    return (np.interp(sample_t, grid, cum) - np.interp(sample_t - 1.0, grid, cum)).clip(0, 1)


def make_metrics(
    *,
    n_machines: int = 1200,
    duration_s: int = 3600,
    faults: dict[str, int] | None = None,
    onset_range_s: tuple[float, float] = (300.0, 2700.0),
    severity: float = 1.0,
    seed: int = 0,
) -> MetricsRun:
    """A run of ``n_machines`` nodes; ``faults`` maps a fault kind to how many machines get it.

    ``severity`` scales every fault's magnitude (1.0 = the magnitudes in the module docstring).
    """
    faults = dict(faults or {})
    for kind in faults:
        if kind not in FAULT_KINDS:
            raise InputError(f"faults: unknown fault kind {kind!r}; valid: {', '.join(FAULT_KINDS)}")
    if n_machines < 3 or duration_s < 60:
        raise InputError(f"n_machines={n_machines} must be >= 3 and duration_s={duration_s} >= 60")
    rng = np.random.default_rng(seed)
    n, t = n_machines, duration_s
    nodes = tuple(f"node-{i:04d}" for i in range(n))
    period = rng.uniform(8.0, 12.0) + rng.normal(0, 0.15, size=t // 4 + 10)
    offsets = rng.uniform(0.0, 1.0, size=(n, 1))
    sample_t = np.arange(1, t + 1, dtype=np.float64)[None, :] + offsets  # (n, t)
    c = _phase_fraction(period, 0.7, float(t + 2), sample_t.ravel()).reshape(n, t).astype(np.float32)
    ckpt = np.zeros(t, dtype=np.float32)  # job-wide checkpoint pause: GPUs idle, host busy
    for start in range(600, t, 900):
        ckpt[start : start + 20] = 1.0

    def noise(scale: float) -> np.ndarray:
        return rng.normal(0.0, scale, size=(n, t)).astype(np.float32)

    def static(scale: float) -> np.ndarray:
        return rng.normal(0.0, scale, size=(n, 1)).astype(np.float32)

    util = (0.35 + 0.6 * c) * (1 - 0.9 * ckpt) + noise(0.03)
    comm = (1 - c) * (1 - ckpt)
    v = np.empty((n, t, len(METRIC_NAMES)), dtype=np.float32)
    clock_static = 1.0 + static(0.004)
    v[..., 3] = 1.98e9 * clock_static * (1 + noise(0.002))
    v[..., 4] = (2e9 + 38e9 * comm) * (1 + static(0.02)) * (1 + noise(0.04))
    v[..., 5] = (3e9 + 9e9 * c * (1 - ckpt)) * (1 + static(0.02)) * (1 + noise(0.05))
    v[..., 6] = 0.18 + 0.08 * comm + 0.3 * ckpt + static(0.02) + noise(0.02)
    ecc_rate = np.full((n, t), 2e-5, dtype=np.float32)  # rare benign corrections

    truth: list[InjectedFault] = []
    chosen = rng.choice(n, size=sum(faults.values()), replace=False) if faults else np.array([], dtype=int)
    i_f = 0
    for kind, count in faults.items():
        for _ in range(count):
            i = int(chosen[i_f])
            i_f += 1
            onset = float(rng.uniform(*onset_range_s))
            on = (np.arange(t) >= onset).astype(np.float32)
            ramp30 = np.clip((np.arange(t) - onset) / 30.0, 0, 1).astype(np.float32)
            if kind == "gpu-throttle":
                v[i, :, 3] *= 1 - 0.25 * severity * ramp30
                util[i] = np.where(on > 0, np.minimum(0.98, util[i] + 0.3 * severity * comm[i]), util[i])
            elif kind == "nic-degrade":
                v[i, :, 4] *= 1 - 0.5 * severity * np.clip((np.arange(t) - onset) / 600.0, 0, 1)
            elif kind == "ecc-growth":
                ecc_rate[i] += on * severity * (0.05 + 2e-4 * np.clip(np.arange(t) - onset, 0, None))
            elif kind == "pcie-downgrade":
                cap = (12e9 - 6e9 * severity) * (1 + noise(0.05)[0])
                v[i, :, 5] = np.where(on > 0, np.minimum(v[i, :, 5], cap), v[i, :, 5])
            elif kind == "slow-cpu":
                busy = v[i, :, 6] + (0.93 - v[i, :, 6]) * severity + noise(0.02)[0]
                v[i, :, 6] = np.where(on > 0, busy, v[i, :, 6])
                util[i] = np.where(on > 0, util[i] * (1 - 0.07 * severity), util[i])
            truth.append(InjectedFault(i, nodes[i], kind, onset))

    v[..., 0] = np.clip(util, 0, 1)
    temp_static = static(1.5)
    power = (90 + 560 * v[..., 0]) * (1 + static(0.02)) * (1 + noise(0.02))
    throttled = [f.machine for f in truth if f.kind == "gpu-throttle"]
    for f in truth:
        if f.kind == "gpu-throttle":
            ramp = np.clip((np.arange(t) - f.onset_s) / 30.0, 0, 1)
            power[f.machine] *= 1 - 0.2 * severity * ramp
    v[..., 1] = power
    # temperature follows power with a thermal time constant of ~60 s
    temp_in = 35 + 0.06 * power + temp_static
    for f in truth:
        if f.machine in throttled:
            temp_in[f.machine] += 10 * severity * (np.arange(t) >= f.onset_s)
    kernel = np.exp(-np.arange(180) / 60.0)
    kernel /= kernel.sum()
    pad = np.repeat(temp_in[:, :1], 179, axis=1)
    smooth = np.apply_along_axis(
        lambda r: np.convolve(r, kernel, mode="valid"), 1, np.concatenate([pad, temp_in], axis=1)
    )
    v[..., 2] = smooth[:, :t] + noise(0.3)
    v[..., 7] = np.cumsum(rng.poisson(ecc_rate), axis=1) + rng.integers(0, 50, size=(n, 1)) * (rng.random((n, 1)) < 0.1)
    return MetricsRun(v, METRIC_NAMES, nodes, tuple(truth))


# -- timings ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TimingTruth:
    """Ground truth of a timing scenario: the slow nodes (empty for imbalance/healthy) and onset step."""

    scenario: str
    slow_nodes: tuple[str, ...]
    slow_stage: int | None
    onset_step: int | None


def make_timings(
    layout: Layout | str = "tp=2,pp=4,dp=8",
    *,
    scenario: str = "slow-machine",
    gpus_per_node: int = 8,
    n_steps: int = 200,
    onset_step: int = 80,
    slowdown: float = 1.4,
    seed: int = 0,
) -> tuple[pl.DataFrame, Topology, TimingTruth]:
    """Per-rank forward/backward/optimizer timings in the long form of the ``timings`` table."""
    if scenario not in TIMING_SCENARIOS:
        raise InputError(f"scenario={scenario!r} is not one of {', '.join(TIMING_SCENARIOS)}")
    lay = Layout.parse(layout) if isinstance(layout, str) else layout
    topo = Topology.from_layout(lay, gpus_per_node=gpus_per_node)
    rng = np.random.default_rng(seed)
    world = topo.world_size
    pp, dp = topo.coords["pp"], topo.coords["dp"]
    base = {"forward": 0.30, "backward": 0.60, "optimizer": 0.05}
    steps = np.arange(n_steps)
    factor = np.ones((n_steps, world))
    slow_nodes: tuple[str, ...] = ()
    slow_stage = None
    onset: int | None = onset_step
    after = (steps >= onset_step)[:, None]
    if scenario == "slow-machine":
        node = int(rng.integers(len(topo.node_names)))
        slow_nodes = (topo.node_names[node],)
        factor = np.where(after & (topo.node_index == node)[None, :], slowdown, 1.0)
    elif scenario == "slow-stage":
        slow_stage = int(rng.integers(int(pp.max()) + 1))
        factor = np.where(after & (pp == slow_stage)[None, :], slowdown, 1.0)
    elif scenario == "data-imbalance":
        per_replica = np.exp(rng.normal(0.0, 0.25, size=(n_steps, int(dp.max()) + 1)))
        factor = per_replica[:, dp]
        onset = None
    elif scenario == "global-slowdown":
        factor = np.where(after, slowdown, 1.0) * np.ones((1, world))
    else:
        onset = None
    rows_rank, rows_step, rows_op, rows_dur, rows_start = [], [], [], [], []
    step_len = sum(base.values()) * 1.6
    durations = {
        op: b * (factor if op != "optimizer" else 1.0) * np.exp(rng.normal(0.0, 0.03, size=(n_steps, world)))
        for op, b in base.items()
    }
    # the data-parallel all-reduce waits for the slowest member of the group: a slow rank waits least
    compute = durations["forward"] + durations["backward"]
    gid = topo.group_ids("dp")
    slowest = np.zeros_like(compute)
    for g in np.unique(gid):
        slowest[:, gid == g] = compute[:, gid == g].max(axis=1, keepdims=True)
    durations["dp-allreduce"] = 0.08 * np.exp(rng.normal(0.0, 0.03, size=(n_steps, world))) + (slowest - compute)
    for op, dur in durations.items():
        rows_rank.append(np.tile(topo.ranks, n_steps))
        rows_step.append(np.repeat(steps, world))
        rows_op.append(np.full(n_steps * world, op, dtype=object))
        rows_dur.append(dur.ravel())
        rows_start.append(np.repeat(steps * step_len, world).astype(np.float64))
    rank = np.concatenate(rows_rank)
    df = pl.DataFrame(
        {
            "rank": rank.astype(np.int32),
            "step": np.concatenate(rows_step).astype(np.int64),
            "op": np.concatenate(rows_op),
            "duration_s": np.concatenate(rows_dur),
            "start_s": np.concatenate(rows_start),
            "node": topo.nodes[rank],
            **{d: topo.coords[d][rank].astype(np.int32) for d in ("tp", "pp", "dp")},
        }
    )
    return df, topo, TimingTruth(scenario, slow_nodes, slow_stage, onset)
