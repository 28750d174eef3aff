"""A clock for gloo Flight Recorder dumps from the logs' gloo timeouts.

gloo has no dump on timeout: its dumps are taken on demand and say nothing of when, so on their own they can
never show a hang (every running job has ops in flight). A gloo timeout in the logs can tie them to one: a
rank that gave up after ``N`` ms ("Timed out waiting 25000ms for recv operation to complete") and failed at
``T`` (its launcher summary's or error file's time) was waiting in an op created at ``T - N``. When the oldest
op in flight in that rank's dump was created then, the dump holds the very op that timed out: it never
completed. Each such rank's dump is read as taken at ``T`` (the op is one timeout old at least; the dump may
have been taken earlier, during the wait, but the op was still in flight at ``T``).

All or nothing, so that a dump from another moment (a previous run's, taken before the hang began) never
gets a clock: every rank that timed out and has a dump must tie, two ranks at least, and the tied members of
one process group must wait in the same collective (a dump taken an op earlier, within the time window, is
one op behind its peers). ``T`` is read to the
second (torchrun's summary) and noticed up to a monitor tick late; a naive log time in another time zone is
hours off and ties nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace

from rankscope.datasets.domain.exits import ProcessExit
from rankscope.datasets.domain.flight_recorder import FRDump
from rankscope.datasets.domain.logs import GlooRecord

EARLY_S, LATE_S = 1.5, 10.0
"""The failure time may read up to EARLY_S before the op's creation + timeout (whole seconds) and up to LATE_S
after it (the launcher's monitor interval, the process's teardown)."""


def gloo_timeout_clock(
    dumps: Sequence[FRDump], gloo: Iterable[GlooRecord], exits: Iterable[ProcessExit]
) -> tuple[list[FRDump], str | None]:
    """``dumps`` with the time of the tied ranks' failures as their dump time, and a note; unchanged (and no
    note) unless every timed-out gloo rank with a dump ties."""
    waited = {g.rank: g.timeout_ms for g in gloo if g.kind == "timeout" and g.rank is not None and g.timeout_ms}
    failed: dict[int, float] = {}
    for e in exits:
        if e.rank in waited and e.timed:
            failed[e.rank] = min(failed.get(e.rank, e.time), e.time)
    tied: dict[int, float] = {}
    stuck_at: dict[str, set[int]] = {}  # group -> the collective seqs the tied ranks wait in
    for d in dumps:
        if d.rank not in waited or d.rank not in failed:
            continue
        if d.backend != "gloo" or d.dump_time_ns is not None:
            return list(dumps), None
        open_ops = [e for e in d.entries if not e.retired and e.time_created_ns]
        if not open_ops:
            return list(dumps), None  # nothing in flight: this dump is not of the wait that timed out
        oldest = min(open_ops, key=lambda e: e.time_created_ns or 0)
        lag = failed[d.rank] - ((oldest.time_created_ns or 0) / 1e9 + waited[d.rank] / 1000.0)
        if not -EARLY_S <= lag <= LATE_S:
            return list(dumps), None
        tied[d.rank] = failed[d.rank]
        stuck_at.setdefault(oldest.pg_name, set()).add(oldest.collective_seq_id)
    # members of one group that timed out waited in one collective: a dump one op behind is of another moment
    if len(tied) < 2 or any(len(seqs) > 1 for seqs in stuck_at.values()):
        return list(dumps), None
    out = [replace(d, dump_time_ns=int(tied[d.rank] * 1e9)) if d.rank in tied else d for d in dumps]
    ranks = ", ".join(map(str, sorted(tied)[:8])) + (" ..." if len(tied) > 8 else "")
    return out, (
        f"gloo timeouts in the logs: rank(s) {ranks} failed one timeout after the op in flight in their Flight "
        "Recorder dumps was created, so that op never completed; their dumps are read as of their failure times"
    )
