"""Health events: kernel log parsing, NIC carrier watching, disks, NVML Xid events, severities and actions."""

from __future__ import annotations

import os
import types
from pathlib import Path

import pytest

from rankscope.collectors.events import (
    KINDS,
    DiskWatcher,
    Event,
    KernelLog,
    NicWatcher,
    NvmlEvents,
    parse_kernel_line,
)


@pytest.mark.parametrize(
    ("line", "kind", "severity", "action"),
    [
        ("NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.", "xid", "critical", "evict"),
        (
            "6,1234,5678901,-;NVRM: Xid (PCI:0000:b1:00): 48, pid=99, An uncorrectable double bit error",
            "xid",
            "critical",
            "evict",
        ),
        ("[ 12.3] NVRM: Xid (PCI:0000:3b:00): 13, pid=1, Graphics Exception", "xid", "warning", "stop-time-check"),
        ("NVRM: GPU at PCI:0000:3b:00: GPU has fallen off the bus.", "gpu_lost", "critical", "evict"),
        ("EXT4-fs error (device nvme0n1p1): Remounting filesystem read-only", "fs_readonly", "critical", "evict"),
        ("mlx5_core 0000:5e:00.0 ens1f0: Link down", "nic_down", "warning", "tolerate"),
        ("ixgbe 0000:01:00.0 eth0: NIC Link is Down", "nic_down", "warning", "tolerate"),
    ],
)
def test_kernel_lines(line: str, kind: str, severity: str, action: str) -> None:
    ev = parse_kernel_line(line)
    assert ev is not None and (ev.kind, ev.severity, ev.action) == (kind, severity, action)
    row = ev.to_row(job="j", node="n1")
    assert row["kind"] == kind and row["node"] == "n1" and row["severity"] == severity


def test_xid_labels_and_unrelated_lines() -> None:
    ev = parse_kernel_line("NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.")
    assert ev is not None and ev.labels["xid"] == 79 and ev.labels["pci"] == "0000:3b:00"
    assert parse_kernel_line("usb 1-1: new high-speed USB device") is None
    assert parse_kernel_line("") is None


def test_every_kind_has_a_policy() -> None:
    for kind, (sev, act) in KINDS.items():
        assert sev in ("info", "warning", "critical") and act in (
            "evict",
            "tolerate",
            "stop-time-check",
            "capture",
            "none",
        )
        assert Event(kind, "x").severity == sev


def test_kernel_log_file_follows_from_the_end(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("NVRM: Xid (PCI:0000:3b:00): 79, old line before the agent started\n")
    k = KernelLog(str(log))
    assert k.poll() == []
    with open(log, "a") as fh:
        fh.write("NVRM: Xid (PCI:0000:3b:00): 74, NVLink error\nnoise\nEXT4-fs error (device sda1): Remounting filesy")
    evs = k.poll()
    assert [e.labels.get("xid") for e in evs] == [74]
    with open(log, "a") as fh:
        fh.write("stem read-only\n")
    assert [e.kind for e in k.poll()] == ["fs_readonly"]  # a line split across polls is joined
    k.close()
    missing = KernelLog(str(tmp_path / "nope"))
    assert missing.poll() == [] and "unreadable" in missing.error


def test_nic_watcher_carrier_down_and_flaps(tmp_path: Path) -> None:
    eth = tmp_path / "class" / "net" / "eth0"
    eth.mkdir(parents=True)
    port = tmp_path / "class" / "infiniband" / "mlx5_0" / "ports" / "1" / "counters"
    port.mkdir(parents=True)

    def state(carrier: int, changes: int, downed: int) -> None:
        (eth / "carrier").write_text(f"{carrier}\n")
        (eth / "carrier_changes").write_text(f"{changes}\n")
        (port / "link_downed").write_text(f"{downed}\n")

    w = NicWatcher(str(tmp_path))
    state(1, 2, 0)
    assert w.poll() == []
    state(0, 3, 0)
    assert [e.kind for e in w.poll()] == ["nic_down"]
    state(1, 6, 1)
    kinds = [(e.kind, e.labels.get("device")) for e in w.poll()]
    assert ("nic_flap", "eth0") in kinds and ("nic_flap", "mlx5_0") in kinds
    assert all(e.action == "tolerate" for e in w.poll() + [Event("nic_flap", "x")])


def test_disk_watcher_full_and_readonly_once_until_cleared() -> None:
    st = {"avail": 10, "flag": 0}

    def fake_statvfs(path: str) -> object:
        return types.SimpleNamespace(f_bavail=st["avail"], f_frsize=1, f_flag=st["flag"])

    w = DiskWatcher(["/data"], min_free_bytes=100)
    assert [e.kind for e in w.poll(fake_statvfs)] == ["disk_full"]
    assert w.poll(fake_statvfs) == []  # reported once
    st.update(avail=1000, flag=os.ST_RDONLY)
    assert [(e.kind, e.severity, e.action) for e in w.poll(fake_statvfs)] == [("fs_readonly", "critical", "evict")]
    st.update(avail=10)
    assert [e.kind for e in w.poll(fake_statvfs)] == ["disk_full"]  # cleared, then full again


def test_nvml_xid_events_and_lost_gpu() -> None:
    pending = [types.SimpleNamespace(eventData=79, device="h1")]

    def wait(eset: object, timeout: int) -> object:
        if not pending:
            raise RuntimeError("NVML_ERROR_TIMEOUT")
        return pending.pop()

    nv = types.SimpleNamespace(
        nvmlEventSetCreate=lambda: "set",
        nvmlDeviceRegisterEvents=lambda h, t, s: None,
        nvmlEventTypeXidCriticalError=8,
        nvmlEventSetWait_v2=wait,
    )
    sampler = types.SimpleNamespace(available=True, nvml=nv, handles=["h0", "h1"], lost={0})
    evs = NvmlEvents(sampler).poll()
    kinds = {(e.kind, e.gpu) for e in evs}
    assert kinds == {("gpu_lost", 0), ("xid", 1)}
    assert all(e.action == "evict" for e in evs)
    assert NvmlEvents(types.SimpleNamespace(available=False)).poll() == []
