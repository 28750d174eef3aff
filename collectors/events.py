"""Health events: Xid errors, lost GPUs, NIC link down/flap, full or read-only disks, NaN, exits.

Each event carries a ``severity`` (info | warning | critical) and an ``action`` that encodes
ByteRobust's policy (paper §3.2) for the recovery issue to apply:

- ``evict``: high-confidence, machine-specific (GPU lost, uncorrectable ECC / row-remap Xids, disk
  full or read-only): stop and evict at once, skip stop-time checks.
- ``drain``: the GPU needs a reset at its next opportunity (Xid 63 row remap pending, 92 high corrected
  error rate): keep training, take the machine out when the job next restarts.
- ``tolerate``: network alerts (NIC down, carrier flap, IB link_downed): may self-recover; evict
  only when seen **twice within 5 minutes** (:data:`NETWORK_TOLERANCE`).
- ``stop-time-check``: a crash or NaN with no clear machine: suspend and run diagnostics.
- ``capture``: a stall or fail-slow: aggregate stacks (the agent already did).
- ``none``: informational.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rankscope.collectors.host_metrics import _read
from rankscope.datasets.domain.xid import XIDS, xid_info

NETWORK_TOLERANCE = (2, 300.0)
"""(count, window seconds): network alerts are tolerated until this many within the window."""

# Xid -> (severity, action, meaning): NVIDIA's Xid catalogue as rankscope.datasets.domain.xid reads it (the
# recovery ladder reads the same table); unlisted Xids are warnings to check.
XID = {x: (i.severity, i.action, i.meaning) for x, i in XIDS.items()}

KINDS = {
    "xid": ("warning", "stop-time-check"),
    "gpu_lost": ("critical", "evict"),
    "nic_down": ("warning", "tolerate"),
    "nic_flap": ("warning", "tolerate"),
    "disk_full": ("critical", "evict"),
    "fs_readonly": ("critical", "evict"),
    "nan": ("critical", "stop-time-check"),
    "process_exit": ("critical", "stop-time-check"),
    "stall": ("warning", "capture"),
    "fail_slow": ("warning", "capture"),
    "capture": ("info", "none"),
    "agent": ("info", "none"),
}
"""Event kinds and their default (severity, action)."""


@dataclass(frozen=True)
class Event:
    """One health event; :meth:`to_row` makes an ``events`` row."""

    kind: str
    message: str
    severity: str = ""
    action: str = ""
    ts: float = field(default_factory=time.time)
    gpu: int | None = None
    rank: int | None = None
    pid: int | None = None
    node: str | None = None
    labels: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        sev, act = KINDS.get(self.kind, ("info", "none"))
        if not self.severity:
            object.__setattr__(self, "severity", sev)
        if not self.action:
            object.__setattr__(self, "action", act)

    def to_row(self, *, job: str, node: str) -> dict[str, Any]:
        from datetime import datetime, timezone

        return {
            "job": job,
            "ts": datetime.fromtimestamp(self.ts, tz=timezone.utc),
            "node": self.node or node,
            "kind": self.kind,
            "severity": self.severity,
            "action": self.action,
            "gpu": self.gpu,
            "rank": self.rank,
            "pid": self.pid,
            "message": self.message,
            "labels": json.dumps(dict(self.labels), sort_keys=True, default=str) if self.labels else None,
        }


def xid_event(
    xid: int,
    message: str,
    *,
    pci: str | None = None,
    gpu: int | None = None,
    source: str = "kernel-log",
    ts: float | None = None,
) -> Event:
    """An Xid event with the policy of that Xid."""
    info = xid_info(xid, message)
    labels = {"xid": xid, "meaning": info.meaning, "source": source}
    if pci:
        labels["pci"] = pci
    return Event("xid", message, info.severity, info.action, ts=ts or time.time(), gpu=gpu, labels=labels)


_XID_LINE = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9a-fA-F:.]+)\): (\d+),\s*(.*)")
_GPU_LOST = re.compile(r"NVRM: .*(fallen off the bus|GPU is lost|GPU at PCI:\S+ has fallen)", re.I)
_LINK_DOWN = re.compile(r"(?:^|\s)(\S+?): (?:NIC )?Link (?:is )?[Dd]own")
_FS_RO = re.compile(
    r"(?:EXT4-fs|XFS|Btrfs).*?(?:\(([^)]+)\))?.*(Remounting filesystem read-only|remount.*read-only)", re.I
)


def parse_kernel_line(line: str, ts: float | None = None) -> Event | None:
    """The health event in one kernel log line (``/dev/kmsg`` record or dmesg text), or None."""
    if ";" in line and line.split(";", 1)[0].count(",") >= 2:  # /dev/kmsg: "pri,seq,usec,flags;msg"
        line = line.split(";", 1)[1]
    m = _XID_LINE.search(line)
    if m:
        xid = int(m.group(2))
        return xid_event(xid, line.strip(), pci=m.group(1), ts=ts)
    if _GPU_LOST.search(line):
        return Event("gpu_lost", line.strip(), ts=ts or time.time(), labels={"source": "kernel-log"})
    m = _FS_RO.search(line)
    if m:
        return Event(
            "fs_readonly",
            line.strip(),
            ts=ts or time.time(),
            labels={"device": m.group(1) or "", "source": "kernel-log"},
        )
    m = _LINK_DOWN.search(line)
    if m:
        return Event(
            "nic_down", line.strip(), ts=ts or time.time(), labels={"device": m.group(1), "source": "kernel-log"}
        )
    return None


class KernelLog:
    """Follows the kernel log (``/dev/kmsg``, or a text file) from now on, without blocking."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd: int | None = None
        self.error = ""
        self._partial = b""
        if not path:
            self.error = "kernel log disabled"
            return
        try:
            self.fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
            os.lseek(self.fd, 0, os.SEEK_END)
        except OSError as exc:
            self.error = f"kernel log {path} unreadable ({exc.strerror}); Xid lines will not be seen"
            if self.fd is not None:
                os.close(self.fd)
            self.fd = None

    def poll(self, max_records: int = 1000) -> list[Event]:
        if self.fd is None:
            return []
        lines: list[str] = []
        is_kmsg = self.path.startswith("/dev/kmsg")
        for _ in range(max_records):
            try:
                chunk = os.read(self.fd, 8192)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == 32:  # EPIPE: kmsg records overwritten; keep reading
                    continue
                break
            if not chunk:
                break
            if is_kmsg:
                lines.append(chunk.decode(errors="replace"))
            else:
                data = self._partial + chunk
                *done, self._partial = data.split(b"\n")
                lines.extend(d.decode(errors="replace") for d in done)
        return [e for e in (parse_kernel_line(line) for line in lines) if e is not None]

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class NicWatcher:
    """Link down and carrier flaps from /sys/class/net, link_downed from /sys/class/infiniband."""

    def __init__(self, sys_root: str = "/sys") -> None:
        self.net = Path(sys_root, "class", "net")
        self.ib = Path(sys_root, "class", "infiniband")
        self._prev: dict[str, tuple[int | None, int | None]] = {}
        self._ib_prev: dict[str, int] = {}

    @staticmethod
    def _int(path: Path) -> int | None:
        text = _read(str(path))
        try:
            return int(text.strip()) if text is not None else None
        except ValueError:
            return None

    def poll(self) -> list[Event]:
        out: list[Event] = []
        try:
            devices = sorted(p.name for p in self.net.iterdir() if p.name != "lo")
        except OSError:
            devices = []
        for dev in devices:
            carrier, changes = self._int(self.net / dev / "carrier"), self._int(self.net / dev / "carrier_changes")
            prev = self._prev.get(dev)
            self._prev[dev] = (carrier, changes)
            if prev is None:
                continue
            if prev[0] == 1 and carrier == 0:
                out.append(Event("nic_down", f"{dev}: carrier lost", labels={"device": dev}))
            elif changes is not None and prev[1] is not None and changes > prev[1]:
                out.append(
                    Event(
                        "nic_flap",
                        f"{dev}: carrier changed {changes - prev[1]} time(s)",
                        labels={"device": dev, "changes": changes - prev[1]},
                    )
                )
        if self.ib.is_dir():
            for counter in sorted(self.ib.glob("*/ports/*/counters/link_downed")):
                key = str(counter)
                v = self._int(counter)
                if v is None:
                    continue
                prev_v = self._ib_prev.get(key)
                self._ib_prev[key] = v
                if prev_v is not None and v > prev_v:
                    dev, port = counter.parts[-5], counter.parts[-3]
                    out.append(
                        Event(
                            "nic_flap",
                            f"{dev} port {port}: link_downed +{v - prev_v}",
                            labels={"device": dev, "port": port},
                        )
                    )
        return out


class DiskWatcher:
    """Full or read-only filesystems under the watched paths; reports each condition once until it clears."""

    def __init__(self, paths: Iterable[str], *, min_free_bytes: int = 1 << 30) -> None:
        self.paths = tuple(dict.fromkeys(paths))
        self.min_free_bytes = min_free_bytes
        self._active: set[tuple[str, str]] = set()

    def poll(self, statvfs: Any = os.statvfs) -> list[Event]:
        out = []
        for path in self.paths:
            try:
                st = statvfs(path)
            except OSError:
                continue
            avail = st.f_bavail * st.f_frsize
            conds = {"disk_full": avail < self.min_free_bytes, "fs_readonly": bool(st.f_flag & os.ST_RDONLY)}
            for kind, on in conds.items():
                key = (path, kind)
                if on and key not in self._active:
                    msg = (
                        f"{path}: {avail} bytes free (< {self.min_free_bytes})"
                        if kind == "disk_full"
                        else f"{path}: filesystem is read-only"
                    )
                    out.append(Event(kind, msg, labels={"path": path, "avail_bytes": avail}))
                    self._active.add(key)
                elif not on:
                    self._active.discard(key)
        return out


class NvmlEvents:
    """Xid critical errors from NVML's event set, and GPUs that became lost (from the sampler)."""

    def __init__(self, sampler: Any) -> None:
        self.sampler = sampler
        self.eset: Any = None
        self._lost_reported: set[int] = set()
        if not getattr(sampler, "available", False):
            return
        n = sampler.nvml
        try:
            self.eset = n.nvmlEventSetCreate()
            for h in sampler.handles:
                try:
                    n.nvmlDeviceRegisterEvents(h, n.nvmlEventTypeXidCriticalError, self.eset)
                except Exception:
                    continue
        except Exception:
            self.eset = None

    def poll(self) -> list[Event]:
        out: list[Event] = []
        for gpu in sorted(getattr(self.sampler, "lost", set()) - self._lost_reported):
            out.append(Event("gpu_lost", f"GPU {gpu}: NVML reports GPU is lost", gpu=gpu, labels={"source": "nvml"}))
            self._lost_reported.add(gpu)
        if self.eset is None:
            return out
        n = self.sampler.nvml
        for _ in range(64):
            try:
                data = n.nvmlEventSetWait_v2(self.eset, 0)
            except Exception:
                break
            xid = int(getattr(data, "eventData", 0))
            gpu = None
            for i, h in enumerate(self.sampler.handles):
                if h == getattr(data, "device", None):
                    gpu = i
            out.append(xid_event(xid, f"NVML Xid {xid} on GPU {gpu}", gpu=gpu, source="nvml"))
        return out
