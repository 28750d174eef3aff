"""Exit codes and log lines, sorted into fault categories before anything is decided.

:class:`RuleTable` applies the table of :mod:`.catalog` (categories, domains, built-in rules) to one line
or one process exit; :func:`load_rules` reads a user's rules (TOML or JSON) that extend or override it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rankscope.datasets.domain.xid import XID_LINE
from rankscope.spine import InputError

from .catalog import BUILTIN_RULES, CATEGORIES, DOMAINS, FATAL_XIDS, RETRYABLE_EXIT_CODES, Rule

__all__ = [
    "BUILTIN_RULES",
    "CATEGORIES",
    "DOMAINS",
    "FATAL_XIDS",
    "Classification",
    "LogLine",
    "Rule",
    "RuleTable",
    "load_rules",
    "table_with",
]


@dataclass(frozen=True)
class LogLine:
    """One line of a job's output (or a kernel log), with where it came from when known."""

    text: str
    node: str = ""
    rank: int | None = None
    time: float | None = None
    source: str = ""

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, where: str = "log line") -> LogLine:
        if not isinstance(d, Mapping) or not isinstance(d.get("text", d.get("message")), str):
            raise InputError(f"{where}: expected an object with a 'text' string, got {str(d)[:80]!r}")
        rank = d.get("rank")
        t = d.get("time")
        try:
            return cls(
                d.get("text", d.get("message")),
                str(d.get("node") or ""),
                None if rank is None else int(rank),
                None if t is None else float(t),
                str(d.get("source") or ""),
            )
        except (TypeError, ValueError):
            raise InputError(f"{where}: rank {rank!r} / time {t!r} are not numbers") from None


_RANK_PREFIX = re.compile(r"^\s*\[(?:rank|default)(\d+)\]:")


@dataclass(frozen=True)
class Classification:
    """What one line (or one exit) says: the category, its domain, and the rule that decided it."""

    category: str
    domain: str
    confidence: float
    rule: str
    text: str = ""
    node: str = ""
    rank: int | None = None
    time: float | None = None
    exit_code: int | None = None
    xid: int | None = None
    note: str = ""

    @property
    def is_symptom(self) -> bool:
        """A collective timeout or a lost peer: never a verdict by itself."""
        return self.domain == "symptom"

    @property
    def retryable(self) -> bool | None:
        """Kubeflow's reading of the exit code, when there is one."""
        return None if self.exit_code is None else self.exit_code in RETRYABLE_EXIT_CODES

    def to_dict(self) -> dict[str, Any]:
        d = {
            "category": self.category,
            "domain": self.domain,
            "confidence": round(self.confidence, 3),
            "rule": self.rule,
            "text": self.text[:300],
            "node": self.node,
            "rank": self.rank,
            "time": self.time,
            "exit_code": self.exit_code,
            "xid": self.xid,
        }
        if self.note:
            d["note"] = self.note
        return d


@dataclass(frozen=True)
class RuleTable:
    """An ordered rule table. The best match is the most confident; ties go to the earlier rule."""

    rules: tuple[Rule, ...] = field(default_factory=lambda: BUILTIN_RULES)

    def __post_init__(self) -> None:
        ids = [r.id for r in self.rules]
        dup = sorted({i for i in ids if ids.count(i) > 1})
        if dup:
            raise InputError(f"classification rules: duplicate id(s) {dup}")

    def extended(self, rules: Sequence[Rule]) -> RuleTable:
        """This table with ``rules`` added in front; a rule with an existing id replaces that rule."""
        new = {r.id for r in rules}
        return replace(self, rules=tuple(rules) + tuple(r for r in self.rules if r.id not in new))

    def classify(
        self,
        text: str = "",
        *,
        exit_code: int | None = None,
        node: str = "",
        rank: int | None = None,
        time: float | None = None,
    ) -> Classification | None:
        """The category of one line or one exit (``text`` + ``exit_code``), or None when no rule matches."""
        best: tuple[float, int, Rule] | None = None
        for i, rule in enumerate(self.rules):
            if rule.matches(text, exit_code) and (best is None or rule.confidence > best[0]):
                best = (rule.confidence, i, rule)
        if best is None:
            return None
        rule = best[2]
        m = XID_LINE.search(text)
        if rank is None:
            pm = _RANK_PREFIX.match(text)
            rank = int(pm.group(1)) if pm else None
        return Classification(
            rule.category,
            rule.effective_domain,
            rule.confidence,
            rule.id,
            text.strip(),
            node,
            rank,
            time,
            exit_code,
            int(m.group("xid")) if m else None,
            rule.note,
        )

    def classify_lines(self, lines: Iterable[str | LogLine]) -> tuple[Classification, ...]:
        """Every line that some rule recognises, in input order."""
        out = []
        for line in lines:
            ll = line if isinstance(line, LogLine) else LogLine(str(line))
            c = self.classify(ll.text, node=ll.node, rank=ll.rank, time=ll.time)
            if c is not None:
                out.append(c)
        return tuple(out)

    def classify_exit(
        self,
        *,
        exit_code: int | None = None,
        kind: str = "",
        message: str = "",
        node: str = "",
        rank: int | None = None,
        time: float | None = None,
    ) -> Classification | None:
        """A process exit: its exception (``kind: message``) and/or its exit code."""
        text = f"{kind}: {message}" if kind and message else (kind or message)
        if kind == "vanished" and exit_code is None:
            return Classification(
                "termination",
                "symptom",
                0.3,
                "vanished",
                "vanished without a record",
                node,
                rank,
                time,
                None,
                None,
                "killed by a signal, os._exit or the OOM killer: look at the kernel log",
            )
        by_text = self.classify(text, node=node, rank=rank, time=time) if text else None
        by_code = (
            self.classify("", exit_code=exit_code, node=node, rank=rank, time=time) if exit_code is not None else None
        )
        best = max((c for c in (by_text, by_code) if c is not None), key=lambda c: c.confidence, default=None)
        return None if best is None else replace(best, exit_code=exit_code, text=text or best.text)


DEFAULT_TABLE = RuleTable()


def load_rules(path: str | Path) -> tuple[Rule, ...]:
    """User rules from a TOML or JSON file: ``[[rules]]`` tables (or a JSON ``{"rules": [...]}``) with
    ``id``, ``category``, ``pattern`` and/or ``exit_codes``, ``confidence``, optional ``note`` and ``domain``."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise InputError(f"{p}: cannot read the rules file ({exc.strerror})") from None
    try:
        if p.suffix.lower() == ".toml":
            try:
                import tomllib  # type: ignore[import-not-found,unused-ignore]
            except ModuleNotFoundError:  # Python 3.10
                import tomli as tomllib  # type: ignore[import-not-found,no-redef,unused-ignore]
            data = tomllib.loads(raw.decode("utf-8"))
        else:
            data = json.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise InputError(f"{p}: not valid {'TOML' if p.suffix.lower() == '.toml' else 'JSON'} ({exc})") from None
    items = data.get("rules") if isinstance(data, dict) else data
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise InputError(f"{p}: expected a list of rules under 'rules' (each a table with id, category, pattern)")
    out = []
    allowed = {"id", "category", "pattern", "exit_codes", "confidence", "note", "domain"}
    for n, item in enumerate(items):
        extra = sorted(set(item) - allowed)
        if extra:
            raise InputError(
                f"{p}: rule {n} ({item.get('id', '?')}): unknown key(s) {extra}; allowed: {sorted(allowed)}"
            )
        try:
            codes = tuple(int(c) for c in item.get("exit_codes", ()))
            conf = float(item.get("confidence", 0.8))
        except (TypeError, ValueError):
            raise InputError(
                f"{p}: rule {n} ({item.get('id', '?')}): exit_codes must be integers and confidence a number"
            ) from None
        try:
            out.append(
                Rule(
                    str(item.get("id", "")),
                    str(item.get("category", "")),
                    str(item.get("pattern", "")),
                    codes,
                    conf,
                    str(item.get("note", "")),
                    str(item.get("domain", "")),
                )
            )
        except InputError as exc:
            raise InputError(f"{p}: {exc}") from None
    return tuple(out)


def table_with(path: str | Path | None) -> RuleTable:
    """The built-in table, extended by a user's rules file when one is given."""
    return DEFAULT_TABLE if path is None else DEFAULT_TABLE.extended(load_rules(path))
