"""Every metric source: host (/proc, /sys fakes and the real machine) and GPU (absent NVML and a fake one)."""

from __future__ import annotations

import os
import types
from pathlib import Path

from rankscope.collectors.gpu_metrics import GpuSampler
from rankscope.collectors.host_metrics import HostSampler, Sample


def by_metric(samples: list[Sample]) -> dict[str, list[Sample]]:
    out: dict[str, list[Sample]] = {}
    for s in samples:
        out.setdefault(s.metric, []).append(s)
    return out


def fake_host(root: Path, *, busy: int, idle: int = 900) -> tuple[str, str]:
    proc, sys_ = root / "proc", root / "sys"
    (proc / "42").mkdir(parents=True, exist_ok=True)
    (proc / "stat").write_text(f"cpu  {busy} 0 0 {idle} 0 0 0 0 0 0\ncpu0 1 2 3 4\n")
    (proc / "meminfo").write_text("MemTotal:       1000 kB\nMemFree:         100 kB\nMemAvailable:    500 kB\n")
    (proc / "loadavg").write_text("1.50 0.75 0.25 2/300 4000\n")
    fields = ["S", "1"] + ["0"] * 9 + ["300", "100"] + ["0"] * 8 + ["25"] + ["0"] * 3
    (proc / "42" / "stat").write_text(f"42 (python) {' '.join(fields)}\n")
    eth = sys_ / "class" / "net" / "eth0"
    (eth / "statistics").mkdir(parents=True, exist_ok=True)
    for name, value in {
        "rx_bytes": 1000,
        "tx_bytes": 2000,
        "rx_errors": 1,
        "tx_errors": 0,
        "rx_dropped": 3,
        "tx_dropped": 0,
    }.items():
        (eth / "statistics" / name).write_text(f"{value}\n")
    (eth / "carrier").write_text("1\n")
    (eth / "carrier_changes").write_text("4\n")
    port = sys_ / "class" / "infiniband" / "mlx5_0" / "ports" / "1"
    (port / "counters").mkdir(parents=True, exist_ok=True)
    (port / "counters" / "port_rcv_data").write_text("10\n")
    (port / "counters" / "link_downed").write_text("2\n")
    (port / "state").write_text("4: ACTIVE\n")
    return str(proc), str(sys_)


def test_host_sources_on_a_fake_tree(tmp_path: Path) -> None:
    proc, sys_ = fake_host(tmp_path, busy=100)
    sampler = HostSampler(proc_root=proc, sys_root=sys_, disk_paths=[str(tmp_path)])
    first = by_metric(sampler.sample([(42, 7)]))
    assert "node_cpu_utilization_ratio" not in first  # needs two samples
    fake_host(tmp_path, busy=400, idle=1000)  # 300 busy + 100 idle ticks since the first sample
    m = by_metric(sampler.sample([(42, 7)]))
    assert m["node_cpu_utilization_ratio"][0].value == 0.75
    assert m["node_memory_MemAvailable_bytes"][0].value == 500 * 1024
    assert m["node_load1"][0].value == 1.5
    assert m["node_network_receive_bytes_total"][0].value == 1000
    assert m["node_network_receive_bytes_total"][0].labels == {"device": "eth0"}
    assert m["node_network_receive_drop_total"][0].value == 3
    assert m["node_network_carrier_changes_total"][0].value == 4
    assert m["node_infiniband_port_data_received_bytes_total"][0].value == 40  # 4-byte words
    assert m["node_infiniband_link_downed_total"][0].value == 2
    assert m["node_infiniband_port_state_active"][0].value == 1.0
    assert m["node_filesystem_avail_bytes"][0].labels == {"mountpoint": str(tmp_path)}
    cpu = m["process_cpu_seconds_total"][0]
    assert (cpu.pid, cpu.rank) == (42, 7) and cpu.value == 400 / os.sysconf("SC_CLK_TCK")
    assert m["process_resident_memory_bytes"][0].value == 25 * os.sysconf("SC_PAGE_SIZE")
    row = cpu.to_row(job="j", node="n", ts=None)
    assert row["metric"] == "process_cpu_seconds_total" and row["rank"] == 7 and row["labels"] is None


def test_host_sampler_on_this_machine_and_missing_sources(tmp_path: Path) -> None:
    m = by_metric(HostSampler(disk_paths=["/"]).sample([(os.getpid(), None)]))
    assert m["node_memory_MemTotal_bytes"][0].value > 0
    assert m["process_resident_memory_bytes"][0].value > 0
    empty = HostSampler(proc_root=str(tmp_path / "none"), sys_root=str(tmp_path / "none"), disk_paths=["/nope"])
    assert empty.sample([(1, None)]) == []
    assert empty.errors  # counted, not raised


def test_gpu_without_nvml_says_so_once() -> None:
    broken = types.SimpleNamespace(nvmlInit=lambda: (_ for _ in ()).throw(OSError("NVML Shared Library Not Found")))
    s = GpuSampler(nvml=broken)
    assert not s.available and "GPU metrics unavailable" in s.message
    assert s.sample() == [] and s.sample() == []
    assert "disabled" in GpuSampler(enabled=False).message


class FakeNvml(types.SimpleNamespace):
    """The slice of pynvml the sampler uses, for 2 GPUs; GPU 1 does not support remapped rows."""

    NVML_TEMPERATURE_GPU, NVML_CLOCK_SM, NVML_VOLATILE_ECC = 0, 1, 0
    NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 0, 1
    NVML_PCIE_UTIL_TX_BYTES, NVML_PCIE_UTIL_RX_BYTES = 0, 1
    NVML_NVLINK_MAX_LINKS = 2
    NVML_NVLINK_ERROR_DL_REPLAY, NVML_NVLINK_ERROR_DL_RECOVERY = 0, 1
    NVML_ERROR_GPU_IS_LOST = 15

    class NVMLError(Exception):
        def __init__(self, value: int) -> None:
            self.value = value

    def __init__(self) -> None:
        super().__init__()
        self.lost = False

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetUtilizationRates(self, h: int) -> object:
        if self.lost and h == 0:
            raise self.NVMLError(15)
        return types.SimpleNamespace(gpu=80, memory=40)

    def nvmlDeviceGetMemoryInfo(self, h: int) -> object:
        return types.SimpleNamespace(used=2**30, total=2**34)

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        return 250_000

    def nvmlDeviceGetTemperature(self, h: int, kind: int) -> int:
        return 65

    def nvmlDeviceGetClockInfo(self, h: int, kind: int) -> int:
        return 1410

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: int) -> int:
        return 4

    def nvmlDeviceGetTotalEccErrors(self, h: int, t: int, c: int) -> int:
        return 3 if t else 0

    def nvmlDeviceGetRemappedRows(self, h: int) -> tuple[int, int, int, int]:
        if h == 1:
            raise self.NVMLError(3)  # NOT_SUPPORTED
        return (1, 0, 0, 0)

    def nvmlDeviceGetPcieThroughput(self, h: int, c: int) -> int:
        return 100

    def nvmlDeviceGetNvLinkErrorCounter(self, h: int, link: int, c: int) -> int:
        return link


def test_gpu_metrics_from_a_fake_nvml() -> None:
    nv = FakeNvml()
    s = GpuSampler(nvml=nv)
    assert s.available and s.message == ""
    m = by_metric(s.sample())
    g0 = {x.metric: x for x in m["gpu_utilization_ratio"] if x.gpu == 0}
    assert g0["gpu_utilization_ratio"].value == 0.8
    assert m["gpu_power_watts"][0].value == 250.0
    assert m["gpu_sm_clock_hertz"][0].value == 1.41e9
    assert m["gpu_temperature_celsius"][0].value == 65
    assert m["gpu_clock_event_reasons"][0].value == 4
    assert {x.labels["type"]: x.value for x in m["gpu_ecc_errors_total"] if x.gpu == 0} == {
        "corrected": 0,
        "uncorrected": 3,
    }
    assert [x.gpu for x in m["gpu_remapped_rows_total"]] == [0, 0]  # GPU 1 unsupported, skipped
    assert m["gpu_pcie_throughput_bytes_per_second"][0].value == 100 * 1024
    assert {x.labels["counter"] for x in m["gpu_nvlink_errors_total"]} == {"dl_replay", "dl_recovery"}
    nv.lost = True
    s.sample()
    assert s.lost == {0}
    assert all(x.gpu == 1 for x in s.sample())  # a lost GPU is not queried again


def test_self_usage_peak_is_this_memory_map_not_an_inherited_ru_maxrss() -> None:
    from rankscope.collectors.host_metrics import self_usage

    cpu, peak = self_usage()
    status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    hwm = int(status["VmHWM"].split()[0]) * 1024
    assert cpu > 0 and abs(peak - hwm) <= 4 * 2**20  # the same counter (read a moment apart)
