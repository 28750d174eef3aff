"""The fleet of a generated metrics job: sizes, names, GPU models, faults and benign events (see
:mod:`.metric_cases` for the whole model)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

FAULT_KINDS = ("thermal", "slow-host", "nic", "pcie", "gpu-slow", "two-faults")
NO_FAULT_KINDS = ("healthy", "job-wide", "stage")
KINDS = FAULT_KINDS + NO_FAULT_KINDS
BENIGN_KINDS = ("temp_blip", "retrans_burst", "cpu_burst", "clock_dip", "stall", "net_burst")

GPU_MODELS: dict[str, dict[str, float]] = {
    # max SM clock (MHz), board power limit (W), idle power (W), base temperature at idle (C)
    "A100-SXM4-80GB": {"clock": 1410, "tdp": 400, "idle": 60, "t_idle": 34},
    "H100-SXM5-80GB": {"clock": 1980, "tdp": 700, "idle": 90, "t_idle": 32},
    "H200-SXM5-141GB": {"clock": 1980, "tdp": 700, "idle": 95, "t_idle": 33},
    "H800-SXM5-80GB": {"clock": 1980, "tdp": 700, "idle": 90, "t_idle": 33},
    "L40S": {"clock": 2520, "tdp": 350, "idle": 35, "t_idle": 30},
}
DCGM_METRICS = (
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_MEM_COPY_UTIL",
    "DCGM_FI_PROF_PCIE_TX_BYTES",
    "DCGM_FI_PROF_PCIE_RX_BYTES",
    "DCGM_FI_PROF_NVLINK_TX_BYTES",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
)
NODE_METRICS = (
    "instance:node_cpu_utilisation:rate1m",
    "node_load1",
    "node_network_transmit_bytes_total",
    "node_network_receive_bytes_total",
    "node_netstat_Tcp_RetransSegs",
)
BENCH_METRICS = DCGM_METRICS[:9] + NODE_METRICS  # the 14 of the speed goal
CONTINUITY_S = 240.0


@dataclass
class Job:
    """One generated job: sizes, sampling, GPU model, what goes wrong and when."""

    machines: int
    gpus: int
    duration_s: float
    dcgm_interval_s: float
    node_interval_s: float
    gpu_model: str
    pp: int
    step_s: float
    metrics: tuple[str, ...]
    kind: str
    seed: int
    names: list[str] = field(default_factory=list)
    faults: list[dict[str, Any]] = field(default_factory=list)
    jobwide: dict[str, Any] | None = None
    benign: list[dict[str, Any]] = field(default_factory=list)
    resets: list[dict[str, Any]] = field(default_factory=list)
    outages: list[dict[str, Any]] = field(default_factory=list)
    start_ts: float = 1.78e9


# -- the job ------------------------------------------------------------------------------------


def _names(rng: np.random.Generator, n: int) -> list[str]:
    style = rng.integers(4)
    if style == 0:
        return [
            f"ip-10-{a}-{b}-{c}"
            for a, b, c in zip(rng.integers(0, 16, n), rng.integers(0, 256, n), rng.integers(1, 255, n))
        ]
    if style == 1:
        return [f"gpu-node-{i:04d}" for i in rng.choice(9999, n, replace=False)]
    if style == 2:
        tails = ["".join(rng.choice(list("abcdefghjkmnpqrstvwxz0123456789"), 4)) for _ in range(n)]
        return [
            f"gke-train-pool-{a}-{b:08x}-{c}"
            for a, b, c in zip(rng.integers(1, 9, n), rng.integers(0, 2**32, n), tails)
        ]
    return [f"r{a:02d}n{b:02d}.cluster.local" for a, b in zip(rng.integers(0, 99, n), rng.integers(0, 99, n))]


def make_job(
    kind: str,
    *,
    seed: int,
    machines: int | None = None,
    duration_s: float | None = None,
    dcgm_interval_s: float | None = None,
    node_interval_s: float | None = None,
    gpu_model: str | None = None,
    metrics: tuple[str, ...] | None = None,
    n_benign: int | None = None,
    severity: float = 1.0,
) -> Job:
    """Draw a job of ``kind`` (see KINDS); every unspecified size is drawn from the ranges in the docstring.
    ``severity`` in (0, 1] scales every fault's departure from healthy (1 = the full ranges below)."""
    if kind not in KINDS:
        raise ValueError(f"kind {kind!r} is not one of {', '.join(KINDS)}")
    rng = np.random.default_rng(seed)
    n = int(machines or rng.choice([64, 96, 128, 200, 256, 384, 512, 768, 1024, 1200]))
    dur = float(duration_s or rng.choice([900, 1200, 1800, 2700, 3600]))
    dcgm = float(dcgm_interval_s or rng.choice([1, 5, 15, 30], p=[0.1, 0.4, 0.35, 0.15]))
    node = float(node_interval_s or rng.choice([1, 5, 15, 30], p=[0.1, 0.4, 0.35, 0.15]))
    # keep a drawn case under ~25 M rows: 1 s sampling only for small, short jobs (given intervals are kept)
    while dcgm_interval_s is None and n * 8 * 10 * dur / dcgm > 25e6 and dcgm < 30:
        dcgm = {1: 5, 5: 15, 15: 30}[int(dcgm)]
    while node_interval_s is None and n * 5 * dur / node > 8e6 and node < 30:
        node = {1: 5, 5: 15, 15: 30}[int(node)]
    model = gpu_model or str(rng.choice(list(GPU_MODELS)))
    if metrics is None:
        core = ["DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_SM_CLOCK"]
        optional = [m for m in DCGM_METRICS + NODE_METRICS if m not in core]
        keep = [m for m in optional if rng.random() < 0.75]
        metrics = tuple(core + keep)
    if kind in ("nic", "two-faults") and "node_netstat_Tcp_RetransSegs" not in metrics:
        # a NIC fault shows in retransmits; a job without them exported cannot show it (not a check of the detector)
        metrics = tuple(metrics) + ("node_netstat_Tcp_RetransSegs",)
    if kind in ("slow-host", "two-faults") and not {"node_load1", "instance:node_cpu_utilisation:rate1m"} & set(
        metrics
    ):
        metrics = tuple(metrics) + ("node_load1",)
    job = Job(
        n,
        8,
        dur,
        dcgm,
        node,
        model,
        int(rng.choice([1, 2, 4, 8])),
        float(rng.uniform(2.5, 25.0)),
        tuple(metrics),
        kind,
        seed,
        names=_names(rng, n),
        start_ts=float(1.75e9 + rng.integers(0, 50_000_000)),
    )
    if len(set(job.names)) < n:
        job.names = [f"{nm}-{i}" for i, nm in enumerate(job.names)]
    lo, hi = 0.3 * dur, min(0.65 * dur, dur - 2.2 * CONTINUITY_S)
    onset = float(rng.uniform(lo, max(lo + 1, hi)))
    victims = list(rng.choice(n, 2, replace=False))
    if kind == "two-faults":
        kinds = list(rng.choice(["thermal", "slow-host", "nic", "pcie", "gpu-slow"], 2, replace=False))
        for i, k in enumerate(kinds):
            job.faults.append(_fault(rng, k, int(victims[i]), onset + i * rng.uniform(0, 120), job, severity))
    elif kind in FAULT_KINDS:
        job.faults.append(_fault(rng, kind, int(victims[0]), onset, job, severity))
    elif kind == "job-wide":
        variant = str(rng.choice(["power-cap", "slow-phase", "checkpoints", "net-congestion"]))
        job.jobwide = {
            "variant": variant,
            "onset": onset,
            "cap": float(rng.uniform(0.55, 0.8)),
            "stretch": float(rng.uniform(1.15, 1.5)),
        }
        if variant == "checkpoints":
            every = float(rng.uniform(240, 600))
            job.jobwide["pauses"] = [[float(t), float(rng.uniform(15, 60))] for t in np.arange(onset, dur - 30, every)]
    elif kind == "stage":
        job.pp = max(job.pp, 4)
        job.jobwide = {
            "variant": "stage",
            "onset": onset,
            "stage": int(rng.integers(job.pp)),
            "stretch": float(rng.uniform(1.15, 1.4)),
        }
    if kind in ("healthy", "job-wide") and rng.random() < 0.5:
        # checkpoints happen in healthy jobs too
        every = float(rng.uniform(300, 900))
        pauses = [[float(t), float(rng.uniform(10, 40))] for t in np.arange(rng.uniform(60, every), dur - 30, every)]
        if job.jobwide is None:
            job.jobwide = {"variant": "checkpoints", "onset": pauses[0][0] if pauses else 0.0, "pauses": pauses}
    culprits = {f["node"] for f in job.faults}
    nb = int(n_benign if n_benign is not None else rng.integers(2, 9))
    for _ in range(nb):
        k = str(rng.choice(BENIGN_KINDS))
        m = int(rng.integers(n))
        while m in culprits:
            m = int(rng.integers(n))
        # durations up to just under the 240 s continuity window: shorter events must never name a machine
        d = {
            "temp_blip": (20, 220),
            "retrans_burst": (10, 220),
            "cpu_burst": (15, 220),
            "clock_dip": (15, 200),
            "stall": (3, 30),
            "net_burst": (20, 200),
        }[k]
        job.benign.append(
            {
                "kind": k,
                "node": m,
                "start": float(rng.uniform(60, dur - 150)),
                "duration": float(rng.uniform(*d)),
                "gpu": int(rng.integers(8)),
                "amp": float(rng.uniform(4, 10)),
                "factor": float(rng.uniform(0.6, 0.85)),
                "rate": float(rng.uniform(50, 600)),
                "cpu": float(rng.uniform(0.4, 0.9)),
                "load": float(rng.uniform(60, 200)),
            }
        )
    for _ in range(int(rng.integers(0, 3))):
        job.resets.append({"node": int(rng.integers(n)), "t": float(rng.uniform(60, dur - 60))})
    for _ in range(int(rng.integers(0, 3))):
        job.outages.append(
            {
                "node": int(rng.integers(n)),
                "exporter": str(rng.choice(["dcgm", "node", "both"])),
                "start": float(rng.uniform(30, dur - 200)),
                "duration": float(rng.uniform(30, 150)),
            }
        )
    return job


def _fault(
    rng: np.random.Generator, kind: str, node: int, onset: float, job: Job, severity: float = 1.0
) -> dict[str, Any]:
    f: dict[str, Any] = {
        "kind": kind,
        "node": node,
        "onset": float(onset),
        "gpu": int(rng.integers(job.gpus)),
        "severity": severity,
    }
    s = severity
    if kind == "thermal":
        f.update(
            rise=s * float(rng.uniform(18, 35)),
            tau=float(rng.uniform(30, 120)),
            clock=1 - s * (1 - float(rng.uniform(0.6, 0.88))),
        )
    elif kind == "slow-host":
        f.update(
            stretch=1 + s * (float(rng.uniform(1.15, 1.5)) - 1),
            cpu=0.06 + s * (float(rng.uniform(0.85, 1.0)) - 0.06),
            load=26 + s * (float(rng.uniform(150, 600)) - 26),
        )
    elif kind == "nic":
        f.update(
            retrans=1 + s * float(rng.uniform(15, 200)),
            stretch=1 + s * float(rng.uniform(0.0, 0.15)),
            flaps=int(rng.integers(0, 3)),
        )
    elif kind == "pcie":
        f.update(
            replay=s * float(rng.uniform(0.5, 10)),
            cap=float(rng.uniform(0.05, 0.4)),
            stretch=1 + s * (float(rng.uniform(1.1, 1.6)) - 1),
        )
    elif kind == "gpu-slow":
        f.update(clock=1 - s * (1 - float(rng.uniform(0.6, 0.85))), stretch=0.0)
    return f
