"""The stall and fail-slow detector: decides when the agent captures stacks by itself.

ByteRobust triggers aggregation on "zero RDMA traffic within 10 minutes"; on CPU the stand-in is
**no training step progress for ``stall_seconds``** (any rank's ``log_step`` counts as progress).
With ``slow_factor`` > 0 it also fires on fail-slow: the newest step interval is that many times
the baseline (the median of the first healthy intervals). A firing starts ``rounds`` captures
``round_interval_seconds`` apart (ByteRobust: every 10 s for 5 rounds); it re-arms only after
progress resumes. Pure logic over timestamps: the agent feeds it, tests drive it with fake clocks.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Firing:
    """One capture the detector asks for: why, which round of how many."""

    reason: str  # stall | fail-slow | trigger | crash
    round: int
    rounds: int
    detail: str = ""


@dataclass
class StallDetector:
    """Feed :meth:`progress` with step times and call :meth:`check` every tick."""

    stall_seconds: float
    rounds: int = 1
    round_interval_seconds: float = 10.0
    slow_factor: float = 0.0
    baseline_steps: int = 5
    _last_progress: float | None = None
    _last_step: int = -1
    _step_times: list[float] = field(default_factory=list)
    _intervals: list[float] = field(default_factory=list)
    _baseline: float | None = None
    _armed: bool = True
    _pending: list[tuple[float, Firing]] = field(default_factory=list)

    def progress(self, step: int, t: float) -> None:
        """A rank reached ``step`` at wall time ``t`` (only a new highest step counts)."""
        if step <= self._last_step:
            return
        if self._step_times:
            self._intervals.append(t - self._step_times[-1])
            if self._baseline is None and len(self._intervals) >= self.baseline_steps:
                self._baseline = statistics.median(self._intervals[-self.baseline_steps :])
            self._intervals = self._intervals[-64:]
        self._step_times = (self._step_times + [t])[-2:]
        self._last_step = step
        self._last_progress = t
        if not self._pending and not self._slow():
            self._armed = True

    def _slow(self) -> bool:
        return bool(
            self.slow_factor
            and self._baseline
            and self._intervals
            and self._intervals[-1] > self.slow_factor * self._baseline
        )

    def restart(self) -> None:
        """The job was launched again (a restart from a checkpoint): forget the previous launch's progress
        (its step numbers start again below the last one seen), baseline and pending rounds."""
        self._last_progress, self._last_step, self._baseline = None, -1, None
        self._step_times, self._intervals, self._pending = [], [], []
        self._armed = True

    def schedule(self, now: float, reason: str, detail: str = "") -> None:
        """Start a series of ``rounds`` captures now (used by the trigger and crash paths too)."""
        self._armed = False
        self._pending = [
            (now + i * self.round_interval_seconds, Firing(reason, i + 1, self.rounds, detail))
            for i in range(self.rounds)
        ]

    def check(self, now: float) -> Firing | None:
        """The capture due at ``now``, if any."""
        if self._armed and self._last_progress is not None:
            idle = now - self._last_progress
            if idle >= self.stall_seconds:
                self.schedule(now, "stall", f"no step progress for {idle:.1f}s (last step {self._last_step})")
            elif self._slow():
                assert self._baseline is not None
                self.schedule(
                    now,
                    "fail-slow",
                    f"step interval {self._intervals[-1]:.2f}s is "
                    f"{self._intervals[-1] / self._baseline:.1f}x the baseline {self._baseline:.2f}s",
                )
        if self._pending and self._pending[0][0] <= now:
            return self._pending.pop(0)[1]
        return None

    @property
    def busy(self) -> bool:
        """True while a series of rounds is still pending."""
        return bool(self._pending)
