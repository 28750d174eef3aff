"""The physics of a generated metrics job: synchronous steps, power, thermals, clocks, counters since boot,
exporter sampling with jitter, drops and resets (see :mod:`.metric_cases`)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from rankscope.harness.metric_fleet import GPU_MODELS, Job

# -- the physics --------------------------------------------------------------------------------


def window(t: np.ndarray, start: float, dur: float) -> np.ndarray:
    return (t >= start) & (t < start + dur)


def _gpu_slowdown(job: Job, t: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per (machine, gpu, sample) at times ``t`` (shape (machines, 1, samples)): the GPU's compute
    stretch (>=1: it computes longer), its host stretch (>=1: it waits idle for its host: input
    pipeline, CPU), its clock factor and its extra temperature."""
    shape = (job.machines, job.gpus, t.shape[-1])
    stretch = np.ones(shape)
    host = np.ones(shape)
    clockf = np.ones(shape)
    dtemp = np.zeros(shape)
    for f in job.faults:
        m, g, t0 = f["node"], f["gpu"], f["onset"]
        tt = t[m, 0] - t0
        on = tt >= 0
        if f["kind"] == "thermal":
            rise = np.where(on, f["rise"] * (1 - np.exp(-np.clip(tt, 0, None) / f["tau"])), 0.0)
            dtemp[m, g] = rise
            thr = np.clip(rise / f["rise"] * 1.6 - 0.6, 0, 1)  # throttling starts once most of the rise is there
            clockf[m, g] = 1 - thr * (1 - f["clock"])
            stretch[m, g] = 1 / clockf[m, g]
        elif f["kind"] == "gpu-slow":
            clockf[m, g] = np.where(on, f["clock"], 1.0)
            stretch[m, g] = np.where(on, 1 / f["clock"], 1.0)
        elif f["kind"] == "pcie":
            stretch[m, g] = np.where(on, f["stretch"], 1.0)
        elif f["kind"] in ("slow-host", "nic"):
            host[m, :] = np.where(on, f["stretch"], 1.0)[None, :]
    for b in job.benign:
        if b["kind"] == "clock_dip":
            w = window(t[b["node"], 0], b["start"], b["duration"])
            clockf[b["node"], b["gpu"]] = np.where(w, b["factor"], clockf[b["node"], b["gpu"]])
        if b["kind"] == "temp_blip":
            tt = t[b["node"], 0] - b["start"]
            blip = np.where(
                tt < 0, 0, np.where(tt < b["duration"], 1 - np.exp(-tt / 15), np.exp(-(tt - b["duration"]) / 25))
            )
            dtemp[b["node"], b["gpu"]] += b["amp"] * blip
        if b["kind"] == "cpu_burst":
            w = window(t[b["node"], 0], b["start"], b["duration"])
            host[b["node"]] = np.where(w[None, :], np.maximum(host[b["node"]], 1.06), host[b["node"]])
    return stretch, host, clockf, dtemp


def _job_factor(job: Job, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Job-wide step stretch and power-cap fraction (1 = no cap) at times ``t``."""
    stretch = np.ones_like(t)
    cap = np.ones_like(t)
    jw = job.jobwide
    if jw is not None:
        on = t >= jw["onset"]
        if jw["variant"] == "power-cap":
            cap = np.where(on, jw["cap"], 1.0)
        elif jw["variant"] == "slow-phase":
            stretch = np.where(on, jw["stretch"], 1.0)
        elif jw["variant"] == "net-congestion":
            stretch = np.where(on, 1 + (jw["stretch"] - 1) / 2, 1.0)
    return stretch, cap


def _paused(job: Job, t: np.ndarray) -> np.ndarray:
    """1 where the whole job is paused (checkpoint write, a machine's brief stall)."""
    p = np.zeros(t.shape, dtype=bool)
    jw = job.jobwide
    if jw is not None and jw.get("pauses"):
        for s, d in jw["pauses"]:
            p |= window(t, s, d)
    for b in job.benign:
        if b["kind"] == "stall":
            p |= window(t, b["start"], b["duration"])
    return p


def _sample_times(rng: np.random.Generator, job: Job, interval: float) -> np.ndarray:
    """Per machine, the exporter's sample times (seconds from the job start): own phase, jitter."""
    k = int(job.duration_s // interval) - 1
    phase = rng.uniform(0, interval, (job.machines, 1))
    jitter = rng.normal(0, 0.02 * interval, (job.machines, k))
    return phase + interval * np.arange(k)[None, :] + jitter


def _lag(x: np.ndarray, dt: float, tau: float, x0: np.ndarray | None = None) -> np.ndarray:
    """First-order lag along the last axis (thermal mass, the kernel's load average)."""
    a = 1 - math.exp(-dt / tau)
    out = np.empty_like(x)
    cur = x[..., 0] if x0 is None else x0
    for i in range(x.shape[-1]):
        cur = cur + a * (x[..., i] - cur)
        out[..., i] = cur
    return out


def _box(x: np.ndarray, dt: float, width: float) -> np.ndarray:
    """Trailing mean over ``width`` seconds along the last axis (a ``rate(x[1m])`` recording rule)."""
    k = max(1, int(round(width / dt)))
    c = np.cumsum(np.concatenate([np.repeat(x[..., :1], k, axis=-1), x], axis=-1), axis=-1)
    return (c[..., k:] - c[..., :-k]) / k


def simulate(job: Job) -> dict[str, Any]:
    """Sample every metric: returns {metric: (times (machines, S), values (machines, gpus|1, S))}."""
    rng = np.random.default_rng(job.seed + 1_000_003)
    gm = GPU_MODELS[job.gpu_model]
    n, g = job.machines, job.gpus
    # static differences between machines and GPUs (not faults)
    clock_bin = gm["clock"] - 15 * rng.choice([0, 0, 0, 0, 0, 1, 2, 3], (n, g))
    hot = rng.normal(0, 2.0, (n, g)) + np.where(rng.random((n, g)) < 0.03, rng.uniform(5, 12, (n, g)), 0)
    amb = rng.normal(0, 1.5, (n, 1))
    power_gain = rng.normal(1, 0.03, (n, g))
    stage = (np.arange(n) * job.pp // n)[:, None]  # pipeline stage of each machine (TP within a node)
    stage_load = 1 - 0.06 * rng.random(job.pp)[stage]  # some stages do a little less work
    cpu_base = rng.lognormal(math.log(0.06), 0.3, (n, 1)) + np.where(rng.random((n, 1)) < 0.05, 0.1, 0)
    load_base = rng.normal(26, 2, (n, 1))
    retrans_base = rng.lognormal(0, 0.8, (n, 1)) * np.where(rng.random((n, 1)) < 0.05, 15, 1)
    out: dict[str, Any] = {}

    # -- DCGM: per-GPU samples
    t = _sample_times(rng, job, job.dcgm_interval_s)[:, None, :]  # (n, 1, S)
    stretch, host, clockf, dtemp = _gpu_slowdown(job, t)
    jstretch, cap = _job_factor(job, t)
    paused = _paused(job, t)
    if job.jobwide is not None and job.jobwide["variant"] == "stage":
        jw = job.jobwide
        st = np.where((t >= jw["onset"]) & (stage[:, :, None] == jw["stage"]), jw["stretch"], 1.0)
        stretch = stretch * st
    # the job runs as fast as its slowest GPU: per sample time, the max stretch over all GPUs
    # (approximated on the first machine's sample grid: every machine's grid is the same up to a phase)
    slowest = np.max(np.maximum(stretch, host), axis=(0, 1))  # (S,)
    compute = 0.72 * stage_load[:, :, None]
    step = job.step_s * jstretch * (0.72 * slowest[None, None, :] + 0.28)
    busy = np.clip(compute * stretch * job.step_s * jstretch / step, 0, 1)  # fraction of the step it computes
    idle = np.clip(0.72 * (host - 1) * job.step_s * jstretch / step, 0, 1 - busy)  # starved by its own host
    slow_host_nodes = [f["node"] for f in job.faults if f["kind"] == "slow-host"]
    nic_like = np.ones(job.machines, dtype=bool)
    nic_like[slow_host_nodes] = False
    idle = np.where(nic_like[:, None, None], 0.0, idle)  # a NIC fault's wait is in NCCL, like everyone's
    wait = 1 - busy - idle
    # the GPUs of one machine run the same step in lockstep and dcgm-exporter reads them at the same
    # instant: the step-phase noise is the machine's, each GPU adds only a little of its own
    phase_noise = rng.normal(0, 0.06 if job.dcgm_interval_s >= 5 else 0.1, (n, 1, busy.shape[-1])) + rng.normal(
        0, 0.012, busy.shape
    )
    util_frac = np.clip(busy + 0.35 * wait + phase_noise, 0, 1)
    util_frac = np.where(paused, rng.uniform(0, 0.05, busy.shape), util_frac)
    capf = np.minimum(1.0, cap / 0.9)  # a cap below ~90 % of TDP pulls clocks down
    clock = clock_bin[:, :, None] * clockf * np.where(cap < 1, 0.6 + 0.4 * capf, 1.0)
    clock = np.where(paused, clock * 0.7, clock)
    clock = np.round(clock / 15) * 15
    power = (
        gm["idle"]
        + (gm["tdp"] - gm["idle"]) * power_gain[:, :, None] * (0.15 + 0.8 * util_frac) * (clock / gm["clock"]) ** 1.5
    )
    power = np.minimum(power, gm["tdp"] * cap) + rng.normal(0, 0.008 * gm["tdp"], power.shape)
    dt = job.dcgm_interval_s
    temp_target = gm["t_idle"] + amb[:, :, None] + hot[:, :, None] + 0.055 * power * (400 / gm["tdp"]) + dtemp
    temp = _lag(temp_target, dt, 45.0, x0=temp_target[..., 0]) + rng.normal(0, 0.4, power.shape)
    rate_scale = 1 / (step / job.step_s)
    pcie_base = rng.lognormal(math.log(6e8), 0.1, (n, g, 1))
    pcie = pcie_base * rate_scale * rng.lognormal(0, 0.08, busy.shape)
    nvl = 5.5e10 * rate_scale * rng.lognormal(0, 0.05, busy.shape) * (1 - 0.9 * paused)
    replay_rate = np.full((n, g, 1), 0.0) + np.where(rng.random((n, g, 1)) < 0.01, 1e-3, 0.0)
    replay_rate = np.broadcast_to(replay_rate, busy.shape).copy()
    for f in job.faults:
        m, gi = f["node"], f["gpu"]
        on = t[m, 0] >= f["onset"]
        if f["kind"] == "pcie":
            pcie[m, gi] = np.where(
                on,
                np.minimum(pcie[m, gi], f["cap"] * 2.5e10)
                * rng.lognormal(0, 0.15, on.shape)
                * (0.5 + 0.5 * f["cap"] / 0.4),
                pcie[m, gi],
            )
            replay_rate[m, gi] = np.where(on, f["replay"], replay_rate[m, gi])
    pcie = np.where(paused, pcie * 0.1, pcie)
    tensor = np.clip(util_frac * 0.55 * (clock / gm["clock"]) + rng.normal(0, 0.02, busy.shape), 0, 1)
    memcopy = np.clip(45 * util_frac * stage_load[:, :, None] + rng.normal(0, 4, busy.shape), 0, 100)
    replay = np.cumsum(rng.poisson(replay_rate * dt), axis=-1) + rng.choice([0, 0, 0, 0, 3, 40], (n, g, 1))
    energy = np.cumsum(power * dt * 1e3, axis=-1) + rng.uniform(1e9, 1e12, (n, g, 1))
    tt = np.broadcast_to(t, busy.shape)
    gpu_values = {
        "DCGM_FI_DEV_GPU_UTIL": np.round(util_frac * 100),
        "DCGM_FI_DEV_POWER_USAGE": np.round(power, 3),
        "DCGM_FI_DEV_GPU_TEMP": np.round(temp),
        "DCGM_FI_DEV_SM_CLOCK": clock,
        "DCGM_FI_DEV_MEM_COPY_UTIL": np.round(memcopy),
        "DCGM_FI_PROF_PCIE_TX_BYTES": np.round(pcie),
        "DCGM_FI_PROF_PCIE_RX_BYTES": np.round(pcie * rng.lognormal(0, 0.05, busy.shape)),
        "DCGM_FI_PROF_NVLINK_TX_BYTES": np.round(nvl),
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": replay.astype(float),
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": np.round(energy),
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": np.round(tensor, 4),
    }
    for name, v in gpu_values.items():
        if name in job.metrics:
            out[name] = (tt, v)

    # -- node_exporter: per-machine samples
    t = _sample_times(rng, job, job.node_interval_s)[:, None, :]
    dt = job.node_interval_s
    stretch_n, host_n, _, _ = _gpu_slowdown(job, t)
    jstretch, _ = _job_factor(job, t)
    paused = _paused(job, t)
    slowest = np.max(np.maximum(stretch_n, host_n), axis=(0, 1))
    step = job.step_s * jstretch * (0.72 * slowest[None, None, :] + 0.28)
    cpu = np.broadcast_to(cpu_base[:, :, None], t.shape).copy() * rng.lognormal(0, 0.08, t.shape)
    runq = np.broadcast_to(load_base[:, :, None], t.shape).copy() + rng.normal(0, 1.5, t.shape)
    retr = np.broadcast_to(retrans_base[:, :, None], t.shape).copy()
    net = 4.3e9 * job.step_s / step * rng.lognormal(0, 0.01, t.shape) * (1 - 0.95 * paused)
    for f in job.faults:
        m = f["node"]
        on = t[m, 0] >= f["onset"]
        if f["kind"] == "slow-host":
            cpu[m] = np.where(on, f["cpu"] * rng.uniform(0.95, 1.0, on.shape), cpu[m])
            runq[m] = np.where(on, f["load"] + rng.normal(0, 10, on.shape), runq[m])
        if f["kind"] == "nic":
            retr[m] = np.where(on, f["retrans"], retr[m])
            for _ in range(f["flaps"]):
                s = f["onset"] + rng.uniform(0, job.duration_s - f["onset"])
                net[m] = np.where(window(t[m, 0], s, rng.uniform(5, 30)), net[m] * 0.05, net[m])
    for b in job.benign:
        m = b["node"]
        w = window(t[m, 0], b["start"], b["duration"])
        if b["kind"] == "cpu_burst":
            cpu[m] = np.where(w, b["cpu"], cpu[m])
            runq[m] = np.where(w, b["load"], runq[m])
        elif b["kind"] == "retrans_burst":
            retr[m] = np.where(w, b["rate"], retr[m])
        elif b["kind"] == "net_burst":
            net[m] = np.where(w, net[m] * 1.8, net[m])
    if job.jobwide is not None and job.jobwide["variant"] == "net-congestion":
        on = t >= job.jobwide["onset"]
        retr = np.where(on, retr * 8, retr)
    cpu_rate1m = _box(np.clip(cpu, 0, 1), dt, 60.0)
    load1 = _lag(runq, dt, 60.0, x0=runq[..., 0])
    tx = np.cumsum(net * dt, axis=-1) + rng.uniform(1e9, 5e14, (n, 1, 1))
    rx = np.cumsum(net * dt * rng.lognormal(0, 0.002, t.shape), axis=-1) + rng.uniform(1e9, 5e14, (n, 1, 1))
    retrans = np.cumsum(rng.poisson(retr * dt), axis=-1) + rng.integers(10_000, 10_000_000, (n, 1, 1))
    node_values = {
        "instance:node_cpu_utilisation:rate1m": np.round(cpu_rate1m, 6),
        "node_load1": np.round(load1, 2),
        "node_network_transmit_bytes_total": np.round(tx),
        "node_network_receive_bytes_total": np.round(rx),
        "node_netstat_Tcp_RetransSegs": retrans.astype(float),
    }
    for name, v in node_values.items():
        if name in job.metrics:
            out[name] = (t, v)
    _apply_resets(job, out)
    return out


def _apply_resets(job: Job, out: dict[str, Any]) -> None:
    """Counters of a machine restart from zero at a reset (exporter or driver restart)."""
    counters = (
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "node_network_transmit_bytes_total",
        "node_network_receive_bytes_total",
        "node_netstat_Tcp_RetransSegs",
    )
    for r in job.resets:
        for name in counters:
            if name not in out:
                continue
            t, v = out[name]
            m = r["node"]
            after = t[m, 0] >= r["t"]
            if not after.any():
                continue
            first = int(np.argmax(after))
            base = v[m, :, first - 1 : first] if first > 0 else v[m, :, :1]
            v[m, :, first:] = v[m, :, first:] - base
