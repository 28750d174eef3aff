"""Who waits for whom, and which groups stalled (the wavefront of a Flight Recorder analysis).

Stream-order semantics (NCCL runs each communicator's ops in order on its stream): a rank *waits in*
the ops it started and that did not complete (gloo tracks no state: the ops it enqueued and that did
not retire; NCCL without timing: the first unfinished op of each group, the only one that can run).
A started collective waits for the members that have not started it (gloo: not enqueued); a started
send/recv waits for its peer when the peer has not started the matching op (gloo: not posted): the op of the
same p2p sequence id where the link's ids are :func:`aligned`, else any open op of the other direction. A rank
inside transfers whose other end waits for someone waits behind that end. An op scheduled behind another adds no
edge: its blocker is the rank's own head op. Following the waits
across groups ends at ranks that wait for nobody: the sinks. A member without a dump that others wait
for is a sink like a live one. A group stalls where not every member reached one collective.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field

from rankscope.analytics.collectives.clock import Clock, Timing
from rankscope.analytics.collectives.groups import KIND_ORDER, GroupInfo, GroupKey
from rankscope.analytics.collectives.result import GroupStall
from rankscope.analytics.collectives.tables import ProgressTables, global_rank, link_ids
from rankscope.datasets.domain.flight_recorder import FRDump, FREntry

P2PWait = tuple[GroupKey, int, int, str]  # (group, waiting rank, peer it waits for, its op)


@dataclass(frozen=True)
class Wait:
    """One op a rank waits in: whom it waits for, and for how long."""

    rank: int
    group: GroupKey
    entry: FREntry
    blockers: tuple[int, ...]  # dumped members (or the peer) that have not started it
    no_dump: tuple[int, ...]  # members (or the peer) that left no dump
    timing: Timing

    @property
    def waited_for(self) -> tuple[int, ...]:
        """A dumped member known to be behind explains the wait before one whose state is unknown."""
        return self.blockers or self.no_dump


@dataclass
class WaitGraph:
    """Every rank's waits; ``edges`` is whom each rank waits for (over all its waits)."""

    waits: dict[int, list[Wait]] = field(default_factory=dict)
    edges: dict[int, set[int]] = field(default_factory=dict)
    p2p_waits: list[P2PWait] = field(default_factory=list)

    def all_waits(self) -> Iterable[Wait]:
        for ws in self.waits.values():
            yield from ws

    def most_specific(self) -> dict[int, tuple[int, ...]]:
        """Per waiting rank, the smallest set it waits for (for reports)."""
        out = {}
        for r, ws in self.waits.items():
            sets = [w.waited_for for w in ws if w.waited_for]
            if sets:
                out[r] = min(sets, key=len)
        return out

    def sinks_from(self, start: Iterable[Wait]) -> tuple[tuple[int, ...], set[int]]:
        """The ranks the waits starting at ``start`` end at (waited for, waiting for nobody), and every
        rank reached on the way."""
        seen: set[int] = set()
        todo = [t for w in start for t in w.waited_for]
        sinks: set[int] = set()
        while todo:
            x = todo.pop()
            if x in seen:
                continue
            seen.add(x)
            nxt = self.edges.get(x)
            if nxt:
                todo.extend(nxt)
            else:
                sinks.add(x)
        return tuple(sorted(sinks)), seen


def _heads(items: list[tuple[GroupKey, FREntry]], starts: bool, tracks: bool) -> list[tuple[GroupKey, FREntry]]:
    """The unfinished ops a rank waits in (see the module docstring)."""
    if starts:
        return [(g, e) for g, e in items if e.state == "started"]
    if not tracks:  # gloo: every op it enqueued and that did not retire
        return items
    first: dict[GroupKey, FREntry] = {}
    out = []
    for g, e in items:
        if e.is_p2p:
            out.append((g, e))
        elif g not in first:
            first[g] = e
            out.append((g, e))
    return out


def _p2p_wait(
    t: ProgressTables,
    r: int,
    g: GroupKey,
    e: FREntry,
    groups: Mapping[GroupKey, GroupInfo],
    dumped: Mapping[int, FRDump],
    links: dict[tuple[GroupKey, int, int], bool],
) -> tuple[tuple[int, ...], tuple[int, ...], int | None] | None:
    """(blockers, no-dump, the peer when both ends are inside the transfer) of a send/recv, or None when its
    peer is unknown (``links``: whether each link's sequence ids are :func:`aligned`, worked out once per link)."""
    info = groups[g]
    s, d = global_rank(info, e.src), global_rank(info, e.dst)
    peer = d if e.op == "send" else s
    if peer is None or peer == r or s is None or d is None:
        return None
    if peer not in dumped:
        return (), (peer,), None
    other = "recv" if e.op == "send" else "send"
    peer_starts = t.starts.get(peer, False)  # without recorded starts, a posted op is the best known
    theirs = link_ids(t, groups, peer).get((g, s, d, other), {})
    link = (g, s, d)
    if link not in links:
        mine = link_ids(t, groups, r).get((g, s, d, e.op), {})
        links[link] = aligned(*((mine, theirs) if e.op == "send" else (theirs, mine)))
    if e.p2p_seq_id and links[link]:
        q = e.p2p_seq_id  # the peer's half of this very transfer is the op of the same sequence id
        if q > max(theirs) or (theirs.get(q) == 0 and peer_starts):
            return (peer,), (), None  # not posted yet, or queued behind the peer's own unfinished op
        if q in theirs:
            return (), (), peer if theirs[q] < 2 else None  # the peer is in it too, or past it
        if q < min(theirs):
            return (), (), None  # older than the peer's ring buffer: the peer is past it
    if any(started or not peer_starts for rank, started in t.p2p_open.get((g, s, d, other), ()) if rank == peer):
        return (), (), peer  # both sides in the transfer: stuck inside it
    return (peer,), (), None


def aligned(sends: Mapping[int, int], recvs: Mapping[int, int]) -> bool:
    """Whether one link's sends and receives carry the same p2p sequence ids, so that an id names one transfer
    on both ends. Each rank counts every send/recv it runs in the group (a ``batch_isend_irecv`` once): ranks
    that run the same steps (a context-parallel ring, two pipeline stages) count alike; a first and a middle
    pipeline stage do not. Aligned: over the ids both ring buffers still hold, the same ids on both ends (two
    at least), no receive done while its send is only queued, and the last id done on each end at most one
    apart (counters offset by ops before the ring buffers, both runs of ids unbroken, would pass the rest)."""
    if len(sends) < 2 or len(recvs) < 2:
        return False
    lo, hi = max(min(sends), min(recvs)), min(max(sends), max(recvs))
    common = {q for q in sends if lo <= q <= hi}
    if len(common) < 2 or common != {q for q in recvs if lo <= q <= hi}:
        return False
    if any(recvs[q] == 2 and sends[q] == 0 for q in common):
        return False
    sent = [q for q, done in sends.items() if done == 2]
    got = [q for q, done in recvs.items() if done == 2]
    return bool(sent and got) and abs(max(sent) - max(got)) <= 1


def wait_graph(
    t: ProgressTables,
    groups: Mapping[GroupKey, GroupInfo],
    by_rank: Mapping[int, FRDump],
    clock: Clock,
) -> WaitGraph:
    """Each rank's waits and whom they wait for (member tuples shared per collective)."""
    out = WaitGraph()
    missing: dict[tuple[GroupKey, int], tuple[tuple[int, ...], tuple[int, ...]]] = {}
    links: dict[tuple[GroupKey, int, int], bool] = {}
    inside: dict[int, set[int]] = {}  # rank -> the peers it is inside an unfinished transfer with
    for r, items in t.pending.items():
        ws: list[Wait] = []
        for g, e in _heads(items, t.starts.get(r, False), t.tracks.get(r, True)):
            if e.is_p2p:
                found = _p2p_wait(t, r, g, e, groups, by_rank, links)
                if found is None:
                    continue
                blockers, nodump, peer_inside = found
                for peer in blockers + nodump:
                    out.p2p_waits.append((g, r, peer, e.op))
                if peer_inside is not None:
                    inside.setdefault(r, set()).add(peer_inside)
            else:
                seq = e.collective_seq_id
                if seq <= t.comp[g].get(r, 0):
                    continue  # pg_status says it completed (the entry was dumped before the watchdog saw it)
                key = (g, seq)
                if key not in missing:
                    members = groups[g].ranks
                    missing[key] = (
                        tuple(m for m in members if m in by_rank and not t.reached(g, m, seq)),
                        tuple(m for m in members if m not in by_rank),
                    )
                blockers, nodump = missing[key]
            ws.append(Wait(r, g, e, blockers, nodump, clock.timing(r, g, e)))
        if ws:
            out.waits[r] = ws
            targets = {x for w in ws for x in w.waited_for}
            if targets:
                out.edges[r] = targets
    _through_transfers(out, inside)
    return out


def _through_transfers(graph: WaitGraph, inside: Mapping[int, set[int]]) -> None:
    """A rank that waits for nobody, inside transfers whose other end waits for someone, waits behind that end:
    the transfer cannot finish while the other end's stream (or its ``batch_isend_irecv``, which completes as
    one) is held up elsewhere (a context-parallel ring's step stuck on one member). Both ends waiting for
    nobody stay sinks: the transfer itself (the link) is stuck. No edge closes a cycle (an end whose waits lead
    back to the rank explains nothing); ranks are taken in order until none gains an edge, so the result does not
    depend on the order of the dumps."""
    todo = sorted(r for r in inside if r not in graph.edges)
    while todo:  # until no rank gains an edge: a ring's members learn it from each other
        left = []
        for r in todo:
            held = {p for p in sorted(inside[r]) if graph.edges.get(p) and not _reaches(graph.edges, p, r)}
            if held:
                graph.edges[r] = held
            else:
                left.append(r)
        if len(left) == len(todo):
            break
        todo = left


def _reaches(edges: Mapping[int, set[int]], start: int, goal: int) -> bool:
    """Whether following ``edges`` from ``start`` leads to ``goal``."""
    seen, todo = {start}, [start]
    while todo:
        for x in edges.get(todo.pop(), ()):
            if x == goal:
                return True
            if x not in seen:
                seen.add(x)
                todo.append(x)
    return False


def group_stalls(
    t: ProgressTables,
    groups: Mapping[GroupKey, GroupInfo],
    by_rank: Mapping[int, FRDump],
    graph: WaitGraph,
) -> list[GroupStall]:
    """Groups whose members did not all reach a collective (or are stuck in one), model-parallel first."""
    waiting: dict[GroupKey, dict[int, list[int]]] = defaultdict(lambda: defaultdict(list))
    for w in graph.all_waits():
        if not w.entry.is_p2p:
            waiting[w.group][w.entry.collective_seq_id].append(w.rank)
    stalls = []
    for g, e in t.enq.items():
        info = groups[g]
        dumped = [m for m in info.ranks if m in by_rank]
        if not e or not dumped:
            continue
        if g in waiting:
            seq = min(waiting[g])
        else:
            lo, hi = min(e.get(m, 0) for m in dumped), max(e.values())
            if lo >= hi:
                continue
            seq = lo + 1
        st_g, co_g = t.started[g], t.comp[g]
        stalls.append(
            GroupStall(
                info.name,
                info.desc,
                info.kind,
                info.index,
                seq,
                t.ops_at.get((g, seq), ""),
                info.ranks,
                tuple(m for m in dumped if not t.reached(g, m, seq)),
                tuple(m for m in info.ranks if m not in by_rank),
                tuple(sorted(waiting.get(g, {}).get(seq, ()))),
                info.source,
                {m: (e.get(m, 0), st_g.get(m, 0), co_g.get(m, 0)) for m in dumped},
                starts=all(t.starts.get(m, False) for m in dumped),
            )
        )
    stalls.sort(key=lambda s: (KIND_ORDER.get(s.kind, 5), len(s.members), s.pg))
    return stalls


SKEW_NS = 10_000_000
"""Two ranks' last activities closer than this are not ordered (clocks of different machines drift)."""


def unrecorded_p2p_victims(
    graph: WaitGraph,
    sinks: tuple[int, ...],
    stuck: Collection[int],
    no_dump: Collection[int],
    last_active: Mapping[int, int],
    neighbors: Callable[[int], tuple[int, ...]],
) -> dict[int, int]:
    """Sinks most likely blocked in a send/recv the dumps cannot show (gloo records no p2p): sink -> the
    adjacent pipeline stage it waits for.

    A live sink with no op in flight went quiet at its last recorded activity. If an adjacent pipeline stage
    was already stuck then (a sink, or a rank in an overdue wait, quiet since earlier), the sink is most
    likely blocked sending to or receiving from it: a rank cannot be blocked by a neighbour that was still
    running when it went quiet. Never returns every sink."""
    stopped = set(sinks) | set(stuck)
    victims: dict[int, int] = {}
    for b in sinks:
        if b in no_dump or b in graph.waits or b not in last_active:
            continue
        for p in neighbors(b):
            if p in stopped and p in last_active and last_active[p] < last_active[b] - SKEW_NS:
                victims[b] = p
                break
    return victims if len(victims) < len(sinks) else {}
