"""From inputs to a guarded plan: the one call ``rankscope plan`` and ``rankscope recover`` make."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rankscope.spine import InputError

from .classify import DEFAULT_TABLE, RuleTable
from .guardrails import GuardrailConfig, apply
from .ladder import LadderConfig, Situation, evaluate
from .plan import Plan


def make_plan(
    situation: Situation,
    *,
    ladder: LadderConfig | None = None,
    guards: GuardrailConfig | None = None,
    table: RuleTable = DEFAULT_TABLE,
) -> Plan:
    """The ladder's decision after the guardrails. Pure: the same situation gives the same plan."""
    return apply(evaluate(situation, ladder or LadderConfig(), table=table), situation, guards or GuardrailConfig())


def situation_from_obj(obj: Any, *, table: RuleTable = DEFAULT_TABLE, where: str = "input") -> Situation:
    """A situation from parsed JSON: either a bare verdict (what ``diagnose --format json`` prints) or an
    object with ``verdict``, ``events``, ``exits``, ``logs``, ``metrics``, ``checkpoints``, ... keys."""
    if isinstance(obj, Mapping) and isinstance(obj.get("verdict"), str):
        return Situation.from_dict({"verdict": obj}, table=table, where=where)
    return Situation.from_dict(obj, table=table, where=where)


def load_situation(
    path: str | os.PathLike[str], *, table: RuleTable = DEFAULT_TABLE, overrides: Mapping[str, Any] | None = None
) -> Situation:
    """Read a verdict or situation JSON file; ``overrides`` (e.g. history from the audit trail, the job's
    machines) replace keys of the file."""
    p = Path(path)
    try:
        obj = json.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InputError(f"{p}: cannot read ({exc.strerror})") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise InputError(f"{p}: not valid JSON ({exc})") from None
    if isinstance(obj, Mapping) and isinstance(obj.get("verdict"), str):
        obj = {"verdict": obj}
    if not isinstance(obj, Mapping):
        raise InputError(f"{p}: expected a JSON object (a verdict or a situation)")
    merged = dict(obj)
    merged.update(overrides or {})
    return Situation.from_dict(merged, table=table, where=str(p))
