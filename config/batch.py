"""The ``batch`` section: scheduled batch analysis (``rankscope batch``) and the fleet view over its verdicts
(``rankscope fleet``), and durations as people write them (``5m``, ``7d``). Imports only :mod:`rankscope.spine`."""

from __future__ import annotations

from dataclasses import dataclass

from rankscope.spine import ConfigError, check_int, check_non_negative, check_positive

RUNNERS = ("local", "ray")
"""Engines ``rankscope batch`` can schedule its per-job work on."""


@dataclass(frozen=True, kw_only=True)
class BatchConfig:
    """Scheduled batch analysis (``rankscope batch``) and the fleet view over its verdicts (``rankscope fleet``)."""

    runner: str = "local"  # local | ray
    workers: int = 0  # local: processes (0 or 1: in this process); ray: CPUs of the local instance (0: all)
    ray_address: str = ""  # empty: start a local Ray instance; else join this cluster (auto, ray://host:10001)
    ray_object_store_bytes: int = 200_000_000  # the local instance's object store (small machines)
    since_seconds: float = 0.0  # >0: leave incidents older than this alone
    every_seconds: float = 0.0  # >0: run again every this many seconds until SIGTERM
    fleet_window_seconds: float = 7 * 86400.0  # verdicts older than this are out of the fleet view
    fleet_half_life_seconds: float = 3 * 86400.0  # an incident's weight halves every this many seconds
    quarantine_threshold: float = 1.5  # risk score above which a machine is quarantined
    collateral_weight: float = 0.05  # a suspect evicted beside a named culprit (over-eviction's collateral)
    repeat_in_job_weight: float = 0.5  # a machine's 2nd, 3rd... incident in one job (a job's own fault repeats)

    def __post_init__(self) -> None:
        if self.runner not in RUNNERS:
            raise ConfigError(f"batch.runner={self.runner!r} must be one of {', '.join(RUNNERS)}")
        check_int("batch.workers", self.workers, minimum=0, error=ConfigError)
        check_int("batch.ray_object_store_bytes", self.ray_object_store_bytes, minimum=78_643_200, error=ConfigError)
        for name in ("since_seconds", "every_seconds"):
            check_non_negative(f"batch.{name}", getattr(self, name), error=ConfigError)
        for name in ("fleet_window_seconds", "fleet_half_life_seconds", "quarantine_threshold"):
            check_positive(f"batch.{name}", getattr(self, name), error=ConfigError)
        for name in ("collateral_weight", "repeat_in_job_weight"):
            check_non_negative(f"batch.{name}", getattr(self, name), error=ConfigError)
            if getattr(self, name) > 1:
                raise ConfigError(f"batch.{name}={getattr(self, name)!r} must be in [0, 1]")


_DURATION = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}


def parse_duration(where: str, text: str | float) -> float:
    """``"90s"``, ``"5m"``, ``"1h30m"``, ``"7d"``, ``"2w"`` or a number of seconds, as seconds (ConfigError
    naming ``where`` otherwise)."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return check_non_negative(where, float(text), error=ConfigError)
    raw = str(text).strip().lower()
    total, number, matched = 0.0, "", bool(raw)
    for ch in raw:
        if ch.isdigit() or ch == ".":
            number += ch
        elif ch in _DURATION and number and number.count(".") <= 1:
            total += float(number) * _DURATION[ch]
            number = ""
        else:
            matched = False
            break
    if number:
        if total or number.count(".") > 1:
            matched = False
        else:
            total = float(number)
    if not matched:
        raise ConfigError(f"{where}={text!r} is not a duration (e.g. 90s, 5m, 1h30m, 7d)")
    return total
