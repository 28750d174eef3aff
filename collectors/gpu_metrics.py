"""GPU metrics through NVML (``import pynvml``, from the nvidia-ml-py package).

Without NVML (no package, no driver, no GPU) the sampler says so once in :attr:`GpuSampler.message`
and returns nothing from then on. Each query is separate: a query the GPU does not support is
skipped for good after its first failure; NVML_ERROR_GPU_IS_LOST marks the GPU lost (the event
source reports it). Names follow Prometheus conventions (``gpu_power_watts``,
``gpu_sm_clock_hertz``); the meanings are NVML's (and DCGM's ``DCGM_FI_DEV_*``).
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import Any

from rankscope.collectors.host_metrics import Sample


class GpuSampler:
    """Samples every visible GPU; ``available`` is False (and ``message`` says why) without NVML."""

    def __init__(self, *, enabled: bool = True, nvml: Any = None) -> None:
        self.available = False
        self.message = ""
        self.lost: set[int] = set()
        self._unsupported: set[tuple[int, str]] = set()
        self.nvml: Any = None
        self.handles: list[Any] = []
        if not enabled:
            self.message = "GPU metrics disabled by configuration"
            return
        try:
            self.nvml = nvml if nvml is not None else importlib.import_module("pynvml")
            self.nvml.nvmlInit()
            count = self.nvml.nvmlDeviceGetCount()
            self.handles = [self.nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except Exception as exc:
            self.message = f"GPU metrics unavailable: NVML not usable ({type(exc).__name__}: {exc})"
            return
        if not self.handles:
            self.message = "GPU metrics unavailable: NVML reports no GPUs"
            return
        self.available = True

    def _is_lost(self, exc: Exception) -> bool:
        lost = getattr(self.nvml, "NVML_ERROR_GPU_IS_LOST", 15)
        return getattr(exc, "value", None) == lost

    def _query(self, i: int, name: str, fn: Callable[[], Any]) -> Any:
        if (i, name) in self._unsupported or i in self.lost:
            return None
        try:
            return fn()
        except Exception as exc:
            if self._is_lost(exc):
                self.lost.add(i)
            else:
                self._unsupported.add((i, name))
            return None

    def sample(self) -> list[Sample]:
        """One sample of every GPU (nothing when NVML is unavailable)."""
        if not self.available:
            return []
        out: list[Sample] = []
        for i, h in enumerate(self.handles):
            try:
                out.extend(self._sample_gpu(i, h))
            except Exception:
                continue
        return out

    def _sample_gpu(self, i: int, h: Any) -> list[Sample]:
        n = self.nvml
        out: list[Sample] = []

        def add(metric: str, value: Any, **labels: Any) -> None:
            if value is not None:
                out.append(Sample(metric, float(value), labels, gpu=i))

        util = self._query(i, "util", lambda: n.nvmlDeviceGetUtilizationRates(h))
        if util is not None:
            add("gpu_utilization_ratio", util.gpu / 100.0)
            add("gpu_memory_utilization_ratio", util.memory / 100.0)
        mem = self._query(i, "mem", lambda: n.nvmlDeviceGetMemoryInfo(h))
        if mem is not None:
            add("gpu_memory_used_bytes", mem.used)
            add("gpu_memory_total_bytes", mem.total)
        power = self._query(i, "power", lambda: n.nvmlDeviceGetPowerUsage(h))
        add("gpu_power_watts", None if power is None else power / 1000.0)
        add(
            "gpu_temperature_celsius",
            self._query(i, "temp", lambda: n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU)),
        )
        clk = self._query(i, "sm_clock", lambda: n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM))
        add("gpu_sm_clock_hertz", None if clk is None else clk * 1e6)
        get_reasons = (
            getattr(n, "nvmlDeviceGetCurrentClocksEventReasons", None) or n.nvmlDeviceGetCurrentClocksThrottleReasons
        )
        add("gpu_clock_event_reasons", self._query(i, "reasons", lambda: get_reasons(h)))
        for err_type, tname in (
            (n.NVML_MEMORY_ERROR_TYPE_CORRECTED, "corrected"),
            (n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, "uncorrected"),
        ):
            add(
                "gpu_ecc_errors_total",
                self._query(
                    i,
                    f"ecc_{tname}",
                    functools.partial(lambda t: n.nvmlDeviceGetTotalEccErrors(h, t, n.NVML_VOLATILE_ECC), err_type),
                ),
                type=tname,
                counter="volatile",
            )
        rows = self._query(i, "remap", lambda: n.nvmlDeviceGetRemappedRows(h))
        if rows is not None:
            corr, unc, pending, failed = rows[:4]
            add("gpu_remapped_rows_total", corr, kind="correctable")
            add("gpu_remapped_rows_total", unc, kind="uncorrectable")
            add("gpu_remapped_rows_pending", pending)
            add("gpu_remapped_rows_failed", failed)
        for direction, counter in (("tx", "NVML_PCIE_UTIL_TX_BYTES"), ("rx", "NVML_PCIE_UTIL_RX_BYTES")):
            kb = self._query(
                i,
                f"pcie_{direction}",
                functools.partial(lambda c: n.nvmlDeviceGetPcieThroughput(h, getattr(n, c)), counter),
            )
            add("gpu_pcie_throughput_bytes_per_second", None if kb is None else kb * 1024, direction=direction)
        for link in range(getattr(n, "NVML_NVLINK_MAX_LINKS", 18)):
            if (i, f"nvlink{link}") in self._unsupported:
                continue
            for cname in (
                "NVML_NVLINK_ERROR_DL_REPLAY",
                "NVML_NVLINK_ERROR_DL_RECOVERY",
                "NVML_NVLINK_ERROR_DL_CRC_FLIT",
            ):
                if not hasattr(n, cname):
                    continue
                v = self._query(
                    i,
                    f"nvlink{link}",
                    functools.partial(
                        lambda c, ln: n.nvmlDeviceGetNvLinkErrorCounter(h, ln, getattr(n, c)), cname, link
                    ),
                )
                if v is None:
                    break
                add("gpu_nvlink_errors_total", v, link=link, counter=cname.removeprefix("NVML_NVLINK_ERROR_").lower())
        return out

    def close(self) -> None:
        if self.available:
            try:
                self.nvml.nvmlShutdown()
            except Exception:
                pass
            self.available = False
