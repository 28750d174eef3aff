"""What every backend implements, and the checks all of them share."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from rankscope.spine import RecoveryError

from ..plan import Action, Plan

OUTCOMES = ("dry-run", "ok", "failed", "noop", "refused")
_NODE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")


@dataclass(frozen=True)
class StepResult:
    """One command or API call of an action: what it is, exactly, and what came of it."""

    action: str
    command: str
    outcome: str  # one of OUTCOMES; noop = nothing to run for this action on this backend
    detail: str = ""

    def to_dict(self) -> dict[str, str]:
        return {"action": self.action, "command": self.command, "outcome": self.outcome, "detail": self.detail}


class Backend(Protocol):
    name: str

    def carry_out(self, action: Action, plan: Plan, *, apply: bool) -> list[StepResult]:
        """The steps of one action; run them only when ``apply``."""
        ...


def check_nodes(nodes: Sequence[str]) -> tuple[str, ...]:
    """Machine names as they may appear in a command: letters, digits, '.', '_', '-' only."""
    bad = [n for n in nodes if not _NODE.match(n)]
    if bad:
        raise RecoveryError(f"refusing machine name(s) {bad!r}: only letters, digits, '.', '_' and '-' are allowed")
    return tuple(nodes)


def one_line(text: str, limit: int = 200) -> str:
    """A reason fit for a scheduler field: one line, printable, bounded."""
    flat = " ".join("".join(ch if ch.isprintable() else " " for ch in text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."
