"""The fleet view: machines that keep being blamed across jobs, a risk score, and the quarantine list.

Every saved verdict inside the window (by incident time, else when it was analysed) is one incident of
one job (rows of one ``(job, incident_id)``: the latest counts; a row without ``incident_id`` is its own
incident). Each incident spreads at most one unit of blame over the machines it names:

- named culprits share it (``1/k`` each for ``k`` culprits); the other suspects, evicted beside them by
  design (a whole TP group for one bad GPU), get ``collateral_weight`` each (0.05);
- with no culprit, the suspects share it (``1/n`` each: one suspect takes it all, a group of 8 an eighth).

A machine's contribution from one incident is ``confidence x kind weight x share x 0.5^(age / half-life)``,
kind weights: crash, hang and fail-slow 1.0, degraded 0.5; mismatch (a code fault), imbalance,
inconclusive and healthy 0 (counted, never scored). Within one job a machine's largest contribution
counts fully and each further one at ``repeat_in_job_weight`` (0.5: a job that keeps failing on its
own machines says less than different jobs failing on one machine). The risk score is the sum; a machine
above ``quarantine_threshold`` (1.5: e.g. two confident culprit verdicts in different jobs this week) is
quarantined. Names rankscope made up (``node-<rank // N>``, ``details.inferred_node_names``) are never
scored: the same made-up name means different machines in different jobs.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from rankscope.config import BatchConfig

KIND_WEIGHTS: Mapping[str, float] = {
    "crash": 1.0,
    "hang": 1.0,
    "fail-slow": 1.0,
    "degraded": 0.5,
    "mismatch": 0.0,
    "imbalance": 0.0,
    "inconclusive": 0.0,
    "healthy": 0.0,
}


@dataclass
class Machine:
    """One machine of the fleet view."""

    machine: str
    risk: float = 0.0
    incidents: int = 0
    jobs: set[str] = field(default_factory=set)
    culprit: int = 0  # incidents naming it a culprit
    suspect: int = 0  # incidents naming it a suspect but not a culprit
    kinds: dict[str, int] = field(default_factory=dict)
    first_seen: datetime | None = None
    last_seen: datetime | None = None
    quarantined: bool = False
    by_job: dict[str, list[float]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "machine": self.machine,
            "risk": round(self.risk, 4),
            "quarantined": self.quarantined,
            "incidents": self.incidents,
            "jobs": len(self.jobs),
            "culprit": self.culprit,
            "suspect": self.suspect,
            "kinds": dict(sorted(self.kinds.items())),
            "first_seen": _iso(self.first_seen),
            "last_seen": _iso(self.last_seen),
        }


@dataclass
class FleetView:
    machines: list[Machine]
    incidents: int
    jobs: int
    unnamed: int  # incidents whose machines all had made-up names
    window_seconds: float
    threshold: float
    now: datetime

    @property
    def quarantine(self) -> list[Machine]:
        return [m for m in self.machines if m.quarantined]


def _iso(t: datetime | None) -> str | None:
    return t.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ") if t is not None else None


def _aware(t: Any) -> datetime | None:
    if not isinstance(t, datetime):
        return None
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)


def _incidents(store: Any, since: datetime) -> list[dict[str, Any]]:
    """The latest verdict row of every incident in the window."""
    if not store.files("verdicts"):
        return []
    cols = [
        "job",
        "time",
        "verdict",
        "confidence",
        "suspect_nodes",
        "culprit_nodes",
        "verdict_json",
        "incident_time",
        "incident_id",
    ]
    df = store.scan("verdicts").select(cols).collect()
    latest: dict[tuple[str, str], dict[str, Any]] = {}
    for r in df.sort("time", nulls_last=False).iter_rows(named=True):
        when = _aware(r["incident_time"]) or _aware(r["time"])
        if when is None or when < since:
            continue
        key = r["incident_id"] or f"row-{_iso(when)}-{r['verdict']}"
        latest[(r["job"], key)] = {**r, "when": when}
    return list(latest.values())


def _inferred(verdict_json: str | None) -> set[str]:
    try:
        details = json.loads(verdict_json or "{}").get("details") or {}
    except (ValueError, AttributeError):
        return set()
    names = details.get("inferred_node_names") if isinstance(details, dict) else None
    return {str(n) for n in names} if isinstance(names, list) else set()


def fleet_view(store: Any, config: BatchConfig | None = None, *, now: float | None = None) -> FleetView:
    """Score every machine named in the window (see the module doc); riskiest first."""
    bc = config or BatchConfig()
    t_now = datetime.fromtimestamp(time.time() if now is None else now, tz=timezone.utc)
    since = datetime.fromtimestamp(t_now.timestamp() - bc.fleet_window_seconds, tz=timezone.utc)
    machines: dict[str, Machine] = {}
    rows = _incidents(store, since)
    unnamed = 0
    for r in rows:
        made_up = _inferred(r["verdict_json"])
        culprits = [n for n in dict.fromkeys(r["culprit_nodes"] or ()) if n not in made_up]
        suspects = [n for n in dict.fromkeys(r["suspect_nodes"] or ()) if n not in made_up and n not in culprits]
        if not culprits and not suspects:
            unnamed += bool(r["culprit_nodes"] or r["suspect_nodes"])
            continue
        if culprits:
            shares = {**{n: 1.0 / len(culprits) for n in culprits}, **dict.fromkeys(suspects, bc.collateral_weight)}
        else:
            shares = {n: 1.0 / len(suspects) for n in suspects}
        age = max(0.0, (t_now - r["when"]).total_seconds())
        base = (
            float(r["confidence"] or 0.0)
            * KIND_WEIGHTS.get(r["verdict"], 0.0)
            * 0.5 ** (age / bc.fleet_half_life_seconds)
        )
        for name, share in shares.items():
            m = machines.setdefault(name, Machine(name))
            m.incidents += 1
            m.jobs.add(r["job"])
            m.culprit += name in culprits
            m.suspect += name not in culprits
            m.kinds[r["verdict"]] = m.kinds.get(r["verdict"], 0) + 1
            m.first_seen = min(filter(None, (m.first_seen, r["when"])))
            m.last_seen = max(filter(None, (m.last_seen, r["when"])))
            m.by_job.setdefault(r["job"], []).append(base * share)
    for m in machines.values():
        for contributions in m.by_job.values():
            top, *rest = sorted(contributions, reverse=True)
            m.risk += top + bc.repeat_in_job_weight * sum(rest)
        m.quarantined = m.risk > bc.quarantine_threshold
    ordered = sorted(machines.values(), key=lambda m: (-m.risk, -m.incidents, m.machine))
    return FleetView(
        ordered,
        incidents=len(rows),
        jobs=len({r["job"] for r in rows}),
        unnamed=unnamed,
        window_seconds=bc.fleet_window_seconds,
        threshold=bc.quarantine_threshold,
        now=t_now,
    )


def refresh_quarantine(store: Any, config: BatchConfig | None = None, *, now: float | None = None) -> list[Machine]:
    """Score the fleet and replace the store's quarantine list; the machines quarantined."""
    from rankscope.datasets.store.quarantine import write_quarantine

    bc = config or BatchConfig()
    view = fleet_view(store, bc, now=now)
    write_quarantine(
        store.root,
        [{k: v for k, v in m.to_dict().items() if k not in ("quarantined", "first_seen")} for m in view.quarantine],
        written=_iso(view.now),
        threshold=bc.quarantine_threshold,
        window_seconds=bc.fleet_window_seconds,
        half_life_seconds=bc.fleet_half_life_seconds,
    )
    return view.quarantine
