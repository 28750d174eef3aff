"""Host and per-process metrics from /proc and /sys, named like Prometheus' node_exporter.

Every source is read independently: one unreadable file costs that metric, never the sample.
Counters keep their ``_total`` names and raw values (rates are the analysis' business); the CPU
ratio is computed from the previous sample. Roots are parameters so tests use a fake tree.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096

NET_COUNTERS = {
    "rx_bytes": "node_network_receive_bytes_total",
    "tx_bytes": "node_network_transmit_bytes_total",
    "rx_errors": "node_network_receive_errs_total",
    "tx_errors": "node_network_transmit_errs_total",
    "rx_dropped": "node_network_receive_drop_total",
    "tx_dropped": "node_network_transmit_drop_total",
}
IB_COUNTERS = {
    "port_rcv_data": "node_infiniband_port_data_received_bytes_total",  # in 4-byte words, scaled below
    "port_xmit_data": "node_infiniband_port_data_transmitted_bytes_total",
    "link_downed": "node_infiniband_link_downed_total",
    "symbol_error": "node_infiniband_port_errors_total",
    "port_rcv_errors": "node_infiniband_port_receive_errors_total",
    "link_error_recovery": "node_infiniband_link_error_recovery_total",
}
MEMINFO = {"MemTotal": "node_memory_MemTotal_bytes", "MemAvailable": "node_memory_MemAvailable_bytes"}


@dataclass(frozen=True)
class Sample:
    """One metric value; ``labels`` become the JSON ``labels`` column."""

    metric: str
    value: float
    labels: Mapping[str, Any] = field(default_factory=dict)
    pid: int | None = None
    rank: int | None = None
    gpu: int | None = None

    def to_row(self, *, job: str, node: str, ts: object) -> dict[str, Any]:
        return {
            "job": job,
            "ts": ts,
            "node": node,
            "metric": self.metric,
            "value": float(self.value),
            "gpu": self.gpu,
            "rank": self.rank,
            "pid": self.pid,
            "labels": _labels_json(tuple(sorted(self.labels.items()))) if self.labels else None,
        }


@lru_cache(maxsize=4096)
def _labels_json(items: tuple[tuple[str, Any], ...]) -> str:
    return json.dumps(dict(items), sort_keys=True)


def _read(path: str | Path) -> str | None:
    """A small /proc or /sys file's text (raw ``os`` calls: 3x cheaper than ``open()``), None if unreadable."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        chunks = []
        while True:
            b = os.read(fd, 65536)
            if not b:
                break
            chunks.append(b)
        return b"".join(chunks).decode(errors="replace")
    except OSError:
        return None
    finally:
        os.close(fd)


class HostSampler:
    """Samples CPU, memory, load, disk, NICs, RDMA ports and processes; remembers CPU counters."""

    def __init__(self, *, proc_root: str = "/proc", sys_root: str = "/sys", disk_paths: Iterable[str] = ("/",)) -> None:
        self.proc_root, self.sys_root = proc_root, sys_root
        self.disk_paths = tuple(disk_paths)
        self._cpu_prev: tuple[float, float] | None = None
        self.errors: dict[str, int] = {}

    def _err(self, source: str) -> None:
        self.errors[source] = self.errors.get(source, 0) + 1

    def sample(self, procs: Iterable[tuple[int, int | None]] = ()) -> list[Sample]:
        """One sample of every host source, plus CPU/RSS of each ``(pid, rank)``."""
        out: list[Sample] = []
        for fn in (self.cpu, self.memory, self.load, self.disk, self.network, self.infiniband):
            try:
                out.extend(fn())
            except Exception:
                self._err(fn.__name__)
        for pid, rank in procs:
            out.extend(self.process(pid, rank))
        return out

    def cpu(self) -> list[Sample]:
        text = _read(f"{self.proc_root}/stat")
        if not text:
            self._err("cpu")
            return []
        parts = text.split("\n", 1)[0].split()[1:]
        vals = [float(x) for x in parts]
        idle = vals[3] + (vals[4] if len(vals) > 4 else 0.0)
        total = sum(vals[:8])
        out = [Sample("node_cpu_seconds_total", total / CLK_TCK), Sample("node_cpu_idle_seconds_total", idle / CLK_TCK)]
        if self._cpu_prev is not None and total > self._cpu_prev[0]:
            busy = 1.0 - (idle - self._cpu_prev[1]) / (total - self._cpu_prev[0])
            out.append(Sample("node_cpu_utilization_ratio", max(0.0, min(1.0, busy))))
        self._cpu_prev = (total, idle)
        return out

    def memory(self) -> list[Sample]:
        text = _read(f"{self.proc_root}/meminfo") or ""
        out = []
        for line in text.splitlines():
            key, _, rest = line.partition(":")
            if key in MEMINFO:
                out.append(Sample(MEMINFO[key], float(rest.split()[0]) * 1024))
        return out

    def load(self) -> list[Sample]:
        text = _read(f"{self.proc_root}/loadavg")
        if not text:
            return []
        a, b, c = (float(x) for x in text.split()[:3])
        return [Sample("node_load1", a), Sample("node_load5", b), Sample("node_load15", c)]

    def disk(self) -> list[Sample]:
        out = []
        for path in self.disk_paths:
            try:
                st = os.statvfs(path)
            except OSError:
                self._err("disk")
                continue
            lab = {"mountpoint": path}
            out += [
                Sample("node_filesystem_size_bytes", st.f_blocks * st.f_frsize, lab),
                Sample("node_filesystem_avail_bytes", st.f_bavail * st.f_frsize, lab),
                Sample("node_filesystem_readonly", float(bool(st.f_flag & os.ST_RDONLY)), lab),
            ]
        return out

    def network(self) -> list[Sample]:
        base = f"{self.sys_root}/class/net"
        out = []
        try:
            devices = sorted(os.listdir(base))
        except OSError:
            return []
        for dev in devices:
            if dev == "lo":
                continue
            lab = {"device": dev}
            for fname, metric in NET_COUNTERS.items():
                text = _read(f"{base}/{dev}/statistics/{fname}")
                if text is not None and text.strip().isdigit():
                    out.append(Sample(metric, float(text), lab))
            for fname, metric in (
                ("carrier", "node_network_carrier"),
                ("carrier_changes", "node_network_carrier_changes_total"),
            ):
                text = _read(f"{base}/{dev}/{fname}")
                if text is not None and text.strip().lstrip("-").isdigit():
                    out.append(Sample(metric, float(text), lab))
        return out

    def infiniband(self) -> list[Sample]:
        base = Path(self.sys_root, "class", "infiniband")
        if not base.is_dir():
            return []
        out = []
        for dev in sorted(base.iterdir()):
            for port in sorted((dev / "ports").glob("*")):
                lab = {"device": dev.name, "port": port.name}
                for fname, metric in IB_COUNTERS.items():
                    text = _read(port / "counters" / fname)
                    if text is None or not text.strip().isdigit():
                        continue
                    value = float(text) * (4 if fname in ("port_rcv_data", "port_xmit_data") else 1)
                    out.append(Sample(metric, value, lab))
                state = _read(port / "state")
                if state:
                    out.append(Sample("node_infiniband_port_state_active", float("ACTIVE" in state), lab))
        return out

    def process(self, pid: int, rank: int | None = None) -> list[Sample]:
        """CPU seconds and resident memory of one process (nothing when it is gone)."""
        text = _read(f"{self.proc_root}/{pid}/stat")
        if not text:
            return []
        rest = text[text.rfind(")") + 2 :].split()
        try:
            cpu = (int(rest[11]) + int(rest[12])) / CLK_TCK
            rss = int(rest[21]) * PAGE_SIZE
        except (IndexError, ValueError):
            self._err("process")
            return []
        return [
            Sample("process_cpu_seconds_total", cpu, pid=pid, rank=rank),
            Sample("process_resident_memory_bytes", float(rss), pid=pid, rank=rank),
        ]


def self_usage(proc_root: str = "/proc") -> tuple[float, int]:
    """(CPU seconds, peak RSS bytes) of this process, for the agent's own health metrics.

    The peak is ``VmHWM`` of this process's own memory map: ``getrusage``'s ``ru_maxrss`` survives
    fork and exec, so a daemon started from a large parent (a test harness, a supervisor written in
    Python, the ``rankscope agent`` CLI itself) would report the parent's size as its own.
    """
    import resource

    ru = resource.getrusage(resource.RUSAGE_SELF)
    peak = ru.ru_maxrss * 1024
    try:
        with open(f"{proc_root}/self/status", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    peak = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        pass
    return ru.ru_utime + ru.ru_stime, peak
