"""Process exits: which rank died, when, and of what, from the hook's records or the agent's events.

Two sources, one shape (:class:`ProcessExit`):

- the in-process hook's ``pid<PID>.exit.json`` files (``rankscope.collectors.hook``): the uncaught
  exception (type, message, frames innermost first) and the wall time it was raised, or
  ``"type": "exit"`` for a normal interpreter exit;
- the ``events`` table the node agent writes: one ``process_exit`` row per trainer that died, with
  the hook's facts in ``labels`` (``exception``, ``message``, ``where``, ``time_source``), or only
  the time the agent noticed a process that vanished without a record (a signal, ``os._exit``,
  the OOM killer).

Only abnormal exits are returned; the crash analysis (``rankscope.analytics.crashes``) orders them.
The readers of both sources are in ``rankscope.datasets.readers.exits``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ProcessExit:
    """One process that ended abnormally."""

    rank: int
    time: float  # wall-clock seconds since the epoch
    kind: str  # the exception type name, or "vanished" (no record: killed by a signal, os._exit, ...)
    message: str = ""
    where: str = ""  # innermost frame, "function (file:line)", when known
    node: str = ""
    pid: int | None = None
    role: str = "trainer"
    time_source: str = "hook"  # hook (when raised) | detected (when the agent noticed; up to a tick late)
    # | error-file | launcher | log | unordered (no failure had a time) | untimed (this one had none: placed at
    # the incident's first failure)
    source: str = ""  # the file or table it came from

    @property
    def timed(self) -> bool:
        """Whether its time is its own (not placed at the incident's first failure, nor from a set none timed)."""
        return self.time_source not in ("unordered", "untimed")

    def describe(self) -> str:
        what = (
            "vanished without a record (killed by a signal, os._exit or the OOM killer)"
            if self.kind == "vanished"
            else f"{self.kind}: {_short(self.message)}"
        )
        return what + (f", in {self.where}" if self.where else "")


def _short(text: str, limit: int = 160) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
