"""Warm-standby sizing: how many spare machines cover the P99 of concurrent failures (ByteRobust §6.2).

Machines fail independently (the paper: failures are usually single-node and independent), so the
number that fail within one restart window is binomial: ``Binomial(machines, p)`` with ``p`` the chance
that one machine fails within the window, ``p = 1 - (1 - daily_rate) ** (window_hours / 24)``. The pool
is the smallest ``k`` with ``P(failures <= k) >= quantile``. The window is how long the pool must last
before it is replenished (ByteRobust replenishes asynchronously; a day is the paper's unit).

Check against the paper (Table 5): with a daily failure rate of 0.12% per machine and a one-day window,
128, 256, 512 and 1,024 machines need 2, 2, 3 and 4 standbys, the P99 column of the paper. Catastrophic
events (a switch taking 32 machines) are left out on purpose, as in the paper.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from rankscope.spine import InputError


@dataclass(frozen=True)
class StandbySizing:
    machines: int
    daily_failure_rate: float
    window_hours: float
    quantile: float
    p_window: float  # one machine's chance to fail within the window
    expected_failures: float
    standby: int  # the pool size
    coverage: float  # P(failures <= standby)

    def to_dict(self) -> dict[str, Any]:
        return {
            "machines": self.machines,
            "daily_failure_rate": self.daily_failure_rate,
            "window_hours": self.window_hours,
            "quantile": self.quantile,
            "p_window": round(self.p_window, 9),
            "expected_failures": round(self.expected_failures, 6),
            "standby": self.standby,
            "coverage": round(self.coverage, 6),
        }

    def explain(self) -> str:
        return (
            f"{self.standby} warm standby machine(s) for {self.machines} machines: at a daily failure rate of "
            f"{self.daily_failure_rate:.4%} per machine, {self.expected_failures:.3g} failures are expected "
            f"within {self.window_hours:g} h, and P(at most {self.standby} fail) = {self.coverage:.4f} >= "
            f"{self.quantile:g} (binomial)."
        )


def _log_pmf(n: int, k: int, p: float) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1) + k * math.log(p) + (n - k) * math.log1p(-p)


def standby_count(
    machines: int, daily_failure_rate: float, *, window_hours: float = 24.0, quantile: float = 0.99
) -> StandbySizing:
    """The warm-standby pool size covering ``quantile`` of concurrent failures within ``window_hours``."""
    if isinstance(machines, bool) or not isinstance(machines, int) or machines < 1:
        raise InputError(f"--machines must be a positive integer, got {machines!r}")
    if not 0.0 <= daily_failure_rate < 1.0:
        raise InputError(
            f"--daily-failure-rate must be a probability in [0, 1), got {daily_failure_rate!r} "
            "(e.g. 0.0012 for 0.12% of machines failing per day)"
        )
    if not window_hours > 0 or not math.isfinite(window_hours):
        raise InputError(f"--window-hours must be > 0, got {window_hours!r}")
    if not 0.0 < quantile < 1.0:
        raise InputError(f"--quantile must be in (0, 1), got {quantile!r} (e.g. 0.99)")
    p = 1.0 - (1.0 - daily_failure_rate) ** (window_hours / 24.0)
    if p == 0.0:
        return StandbySizing(machines, daily_failure_rate, window_hours, quantile, 0.0, 0.0, 0, 1.0)
    cdf = 0.0
    k = 0
    for k in range(machines + 1):
        cdf += math.exp(_log_pmf(machines, k, p)) if p < 1.0 else (1.0 if k == machines else 0.0)
        if cdf >= quantile - 1e-12:
            break
    return StandbySizing(machines, daily_failure_rate, window_hours, quantile, p, machines * p, k, min(cdf, 1.0))
