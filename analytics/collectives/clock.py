"""Time evidence for a Flight Recorder analysis: how long each unfinished op has been in flight, against
what is normal for this job.

A dump of a running job always holds ops in flight, and ranks one op apart: the shape of the wavefront
alone cannot tell a hang from a healthy job. What can is time:

- **now** for a rank is the explicit time its dump was taken (the hook's ``rankscope_dump_time_ns``, the
  agent's capture time), else only a lower bound: the newest timestamp inside that rank's own dump
  (``time_created_ns``, ``time_discovered_started_ns``, ``time_discovered_completed_ns``). Never a file's
  mtime (copying a dump resets it), and never another rank's stamps (dumps of one job are taken up to
  seconds apart: a rank dumped early would look stuck for as long as the collection took).
- A dump the watchdog wrote on a collective timeout (``collectives.dumped_on_timeout``: the user says so with
  ``--dumped-on-timeout``, or a watchdog timeout line in the logs of the same input shows it) was taken at
  least one timeout after the op that timed out was created: ``now >= min(created + timeout_ms)`` over the
  ops in flight in the dumps. Still a lower bound (it proves overdue, never young).
- An op is **overdue** when ``now - created >= min(timeout, max(K x ref, 5 s))``, where ``ref`` is the
  larger of the p99 of the job's own completed-op latency in that group and the p99 of its enqueue
  cadence. A lower-bound clock can prove an op overdue, never young.
- An op is **young** (a running job) when an explicit clock puts it under ``max(3 x ref, 1 s)``;
  between the two it is *aging* (longer than usual, not yet overdue); without a clock, *unknown*.
- NCCL's recorder stamps ``time_discovered_*`` only when it retires an entry or dumps (``update_state`` runs in
  ``retire_id`` and ``dump_entries``): an entry the dump holds unretired yet discovered started or completed was
  discovered *by that dump*. Those stamps, when they agree (one pass) and are the newest in the dump, bound the
  capture time from above too (:func:`dump_pass`), and so can prove a wait young (never overdue: that stays with
  the lower bound). A rank whose dump has no such entry (every op in flight still queued) takes the latest pass
  of the same capture, when the passes of all ranks agree within :data:`CAPTURE_SPREAD_NS`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from itertools import chain
from operator import attrgetter

from rankscope.analytics.collectives.captures import Progress
from rankscope.analytics.collectives.groups import GroupInfo, GroupKey
from rankscope.analytics.collectives.tables import ProgressTables
from rankscope.config import CollectivesConfig
from rankscope.datasets.domain.flight_recorder import FRDump, FREntry

OVERDUE, YOUNG, AGING, UNKNOWN = "overdue", "young", "aging", "unknown"

OVERDUE_FLOOR_S = 5.0
"""No op is overdue before this, however fast the job's ops are (a GC pause, a slow checkpoint write)."""
YOUNG_FACTOR, YOUNG_FLOOR_S = 3.0, 1.0
"""Young: under max(YOUNG_FACTOR x the group's p99 latency/cadence, YOUNG_FLOOR_S) on an explicit clock. It only
tells healthy from inconclusive (it never names a machine), so it is not a setting."""

_SKEW_NS = 1_000_000_000
"""An explicit dump time this far before the dump's own newest stamp is not believed (wrong clock)."""
PASS_NS = 1_000_000_000
"""The stamps one ``dump_entries`` pass gives (it queries each entry's events in turn) lie within this."""
CAPTURE_SPREAD_NS = 30_000_000_000
"""Dumps of one capture (every rank asked at once) are taken within this of each other; passes further apart are
separate captures, and a rank without a pass of its own borrows none."""


SAMPLE_RANKS, SAMPLE_OPS = 16, 256
"""The job's normal latency and cadence come from the last ops of this many members (plenty for a p99)."""
_ALIKE = ("tp", "cp", "ep", "pp", "dp", "mp")
"""Group kinds whose groups all run the same schedule (recognised from the topology or the description)."""


def _reference(samples: tuple[list[float], list[float]]) -> float | None:
    refs = [x for x in (p99(samples[0]), p99(samples[1])) if x]
    return max(refs) if refs else None


def p99(xs: list[float]) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, int(0.99 * len(s)))]


def newest_stamp(d: FRDump, last: int = 16) -> int:
    """The newest timestamp among a dump's ``last`` entries (0 when none has one): a lower bound on when it
    was taken (entries are in record order: the newest stamps are at the end)."""
    return max(chain(_ZERO, filter(None, chain.from_iterable(map(_STAMPS, d.entries[-last:])))))


def dump_pass(d: FRDump, last: int = 64) -> int | None:
    """When this dump was taken, from above: the discovery stamps of its unretired entries (NCCL stamps them in the
    dump's own pass; retiring stamps and marks them retired), when they agree within :data:`PASS_NS`, none of the
    dump's stamps is newer and its retired entries show the lazy stamping (:func:`_lazy_stamps`); else None (no
    such entry, gloo, or stamps another recorder wrote)."""
    tail = d.entries[-last:]
    if not _lazy_stamps(tail):
        return None
    found = [
        t
        for e in tail
        if not e.retired and e.state in _DISCOVERED
        for t in (e.time_discovered_started_ns, e.time_discovered_completed_ns)
        if t
    ]
    if not found:
        return None
    hi, lo = max(found), min(found)
    if hi - lo > PASS_NS or newest_stamp(d, last) > hi:
        return None
    return hi


def _lazy_stamps(tail: tuple[FREntry, ...]) -> bool:
    """Whether this recorder stamps discoveries as PyTorch's does, lazily: retiring an entry stamps its start and
    its completion in one ``update_state`` call, microseconds apart. A recorder that stamps each as it happens
    shows them apart, and its unretired entries' stamps are then their starts, not the dump's time. More than one
    retired entry in ten with the two apart is such a recorder (an earlier dump stamping a start makes the odd
    one); none with both stamps (timing off) tells nothing against it."""
    pairs = [
        (e.time_discovered_started_ns, e.time_discovered_completed_ns)
        for e in tail
        if e.retired and e.time_discovered_started_ns and e.time_discovered_completed_ns
    ]
    apart = sum(1 for t0, t1 in pairs if abs(t1 - t0) > _ONE_CALL_NS)
    return apart * 10 <= len(pairs)


_ONE_CALL_NS = 1_000_000  # one update_state call stamps both within this
_DISCOVERED = ("started", "completed")
_STAMPS = attrgetter("time_created_ns", "time_discovered_started_ns", "time_discovered_completed_ns")
_ZERO = (0,)  # (None, 0 and negative stamps count for nothing)


@dataclass(frozen=True)
class Timing:
    """How long one op has been in flight and what that means (:data:`OVERDUE`, ...)."""

    state: str
    age_s: float | None
    overdue_s: float | None  # the threshold it is measured against (None: nothing to measure it by)
    explicit: bool  # measured against an explicit capture time (else a lower bound)
    at_most: bool = False  # age_s is an upper bound (the dump's own pass, :func:`dump_pass`)

    def words(self) -> str:
        if self.age_s is None:
            return "for an unknown time"
        bound = "" if self.explicit else "at most " if self.at_most else "at least "
        limit = f" (overdue after {self.overdue_s:.3g} s)" if self.overdue_s is not None else ""
        return f"for {bound}{self.age_s:.3g} s{limit}"


class Clock:
    """Per-rank capture times and per-group references; :meth:`timing` judges one op."""

    def __init__(
        self,
        by_rank: Mapping[int, FRDump],
        t: ProgressTables,
        groups: Mapping[GroupKey, GroupInfo],
        keys: Mapping[int, Mapping[str, GroupKey]],
        cfg: CollectivesConfig,
    ) -> None:
        self.cfg = cfg
        self._by_rank, self._groups, self._keys = by_rank, groups, keys
        self.now: dict[int, tuple[int, bool]] = {}  # rank -> (now ns, explicit)
        self.last_active: dict[int, int] = {}  # rank -> the newest stamp in its dump (its last recorded activity)
        self.notes: list[str] = []
        bad = []
        for r, d in by_rank.items():
            own = newest_stamp(d)
            if own:
                self.last_active[r] = own
            explicit = d.dump_time_ns
            if explicit is not None and explicit < own - _SKEW_NS:
                bad.append(r)
                explicit = None
            if explicit is not None:
                self.now[r] = (max(explicit, own), True)
            elif own:
                self.now[r] = (own, False)
        self.watchdog = False  # now is the watchdog's bound (an assumption a later capture can refute)
        if cfg.dumped_on_timeout:
            self._watchdog_clock(by_rank)
        if bad:
            self.notes.append(
                f"the recorded dump time of rank(s) {', '.join(map(str, bad[:8]))} is older than entries inside "
                "the dump: not used as a clock"
            )
        self.explicit = bool(self.now) and all(ex for _, ex in self.now.values())
        self.upper = {} if cfg.dumped_on_timeout or self.explicit else self._upper_bounds(by_rank)
        """rank -> a capture time it was taken no later than (:func:`dump_pass`): what can prove a wait young."""
        self._ref: dict[str, float | None] = {}
        self._job_ref: tuple[float] | None = None
        self._t = t
        self.progress: Progress | None = None  # set when an earlier capture exists

    def _upper_bounds(self, by_rank: Mapping[int, FRDump]) -> dict[int, int]:
        """Each rank's :func:`dump_pass` bound; ranks without one take the latest, when every pass is of one
        capture (within :data:`CAPTURE_SPREAD_NS`) and their own stamps are not newer."""
        own = {r: b for r, d in by_rank.items() if (b := dump_pass(d)) is not None}
        if not own or max(own.values()) - min(own.values()) > CAPTURE_SPREAD_NS:
            return own
        latest = max(own.values())
        for r in by_rank:
            if r not in own and self.last_active.get(r, 0) <= latest:
                own[r] = latest
        return own

    def _watchdog_clock(self, by_rank: Mapping[int, FRDump]) -> None:
        """Dumps written on a timeout: each was taken no earlier than the first op in flight could time out."""
        due = [
            e.time_created_ns + e.timeout_ms * 1_000_000
            for d in by_rank.values()
            for e in d.entries[-SAMPLE_OPS:]
            if e.state != "completed" and e.time_created_ns and e.timeout_ms and e.timeout_ms > 0
        ]
        if not due:
            self.notes.append("--dumped-on-timeout: no op in flight carries its creation time and timeout: no clock")
            return
        bound = min(due)
        self.watchdog = True
        for r in by_rank:
            ns, explicit = self.now.get(r, (0, False))
            if not explicit:
                self.now[r] = (max(ns, bound), False)
        self.notes.append(
            "taken as dumps the watchdog wrote on a timeout (--dumped-on-timeout, or a timeout in the logs): each "
            "was taken at least one timeout after the oldest op in flight was created (a lower bound on the capture "
            "time)"
        )

    def _since_previous(self, r: int, e: FREntry) -> float | None:
        """Seconds the op has been unfinished at least: the interval since an earlier capture that showed
        it unfinished too (both captures with explicit times), else None."""
        p = self.progress
        if p is None or r not in p.interval_s or e.record_id not in p.pending_before.get(r, ()):
            return None
        return p.interval_s[r]

    def ref(self, g: GroupKey) -> float | None:
        """The larger of the p99 latency and the p99 enqueue cadence of group ``g`` (seconds), from a sample of
        its members' recent ops (groups of one parallel kind run the same schedule: they share one sample);
        for a group with no completed op yet (its first collective), the slowest kind's."""
        info = self._groups[g]
        key = info.kind if info.kind in _ALIKE else g
        if key not in self._ref:
            self._ref[key] = _reference(self._samples(key, g))
        own = self._ref[key]
        if own is not None:
            return own
        if self._job_ref is None:
            for k in {x.kind if x.kind in _ALIKE else x.key for x in self._groups.values()}:
                if k not in self._ref:
                    self._ref[k] = _reference(self._samples(k, k))
            refs = [x for x in self._ref.values() if x]
            self._job_ref = (max(refs) if refs else 0.0,)
        return self._job_ref[0] or None

    def _samples(self, key: str, g: GroupKey) -> tuple[list[float], list[float]]:
        """(latencies, enqueue gaps) in seconds of the recent ops of up to :data:`SAMPLE_RANKS` dumped members of
        the groups ``key`` stands for."""
        members: list[int] = []
        for info in self._groups.values():
            if (info.kind == key) if key in _ALIKE else (info.key == g):
                members += [m for m in info.ranks if m in self._by_rank][: SAMPLE_RANKS - len(members)]
            if len(members) >= SAMPLE_RANKS:
                break
        lat: list[float] = []
        cad: list[float] = []
        for m in members:
            names = {
                n for n, gk in self._keys[m].items() if (self._groups[gk].kind == key if key in _ALIKE else gk == g)
            }
            last: dict[str, int] = {}
            tracks = self._t.tracks.get(m, True)
            for e in self._by_rank[m].entries[-SAMPLE_OPS:]:
                if e.pg_name not in names:
                    continue
                t0 = e.time_created_ns
                if t0:
                    prev = last.get(e.pg_name)
                    if prev is not None and t0 >= prev:
                        cad.append((t0 - prev) / 1e9)
                    last[e.pg_name] = t0
                if e.state == "completed" or (e.retired and not tracks):
                    t1 = e.time_discovered_completed_ns
                    if t0 and t1 and t1 >= t0:
                        lat.append((t1 - t0) / 1e9)
                    elif e.duration_ms is not None:
                        lat.append(e.duration_ms / 1e3)
        return lat, cad

    def timing(self, r: int, g: GroupKey, e: FREntry) -> Timing:
        now = self.now.get(r)
        t0 = e.time_created_ns or e.time_discovered_started_ns
        ref = self.ref(g)
        cfg = self.cfg
        timeout = e.timeout_ms / 1e3 if e.timeout_ms and e.timeout_ms > 0 else None
        overdue: float | None
        if ref is not None:
            overdue = max(cfg.overdue_factor * ref, OVERDUE_FLOOR_S)
            overdue = min(overdue, timeout) if timeout is not None else overdue
        else:  # no completed op to compare with: only the job's own timeout says "stuck"
            overdue = timeout
        since = self._since_previous(r, e)
        if now is None or not t0:
            if since is not None and overdue is not None and since >= overdue:
                return Timing(OVERDUE, since, overdue, False)
            return Timing(UNKNOWN, since, overdue, False)
        ns, explicit = now
        age = max(0.0, (ns - t0) / 1e9, since or 0.0)
        if overdue is not None and age >= overdue:
            return Timing(OVERDUE, age, overdue, explicit)
        young = max(YOUNG_FACTOR * (ref or 0.0), YOUNG_FLOOR_S)
        if overdue is not None:
            young = min(young, overdue)
        if not explicit:
            upper = self.upper.get(r)
            if upper is not None and since is None and (upper - t0) / 1e9 <= young:
                return Timing(YOUNG, max(0.0, (upper - t0) / 1e9), overdue, False, at_most=True)
            return Timing(UNKNOWN, age, overdue, False)
        return Timing(YOUNG if age <= young else AGING, age, overdue, True)
