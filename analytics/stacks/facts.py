"""Stack facts: per snapshot, the clusters and outliers (:mod:`.snapshot`), and across snapshots, progress.

Progress is read from the ranks that *wait*. In a hang no collective completes, so a rank blocked in a
wait at one snapshot is in the very same wait (the same call site, line for line) at the next; a rank
that left its wait proves that a collective or transfer completed in between. Ranks running their own
code say nothing either way (a busy culprit spinning in a loop moves without the job moving).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from rankscope.analytics.stacks.frames import PEER_WAIT_STATES, WAIT_STATES, classify, frame_key, is_native_frame
from rankscope.analytics.stacks.snapshot import SnapshotAnalysis, analyze_snapshot
from rankscope.config import Limits, StackConfig
from rankscope.datasets.domain.stacks import ProcStacks, is_launcher_frame
from rankscope.datasets.domain.topology import Topology

NOISE_GUARD = 2
"""Waiters that must leave their wait between two snapshots to count as progress (one in small jobs): a
single rank can leave a wait without any collective completing (a timeout, a mis-read stack)."""


LONG_TAIL = 5
"""Pairs of snapshots without a release after which a frozen tail may be judged against the job's rhythm."""


@dataclass(frozen=True)
class Progress:
    """Per pair of consecutive snapshots: how many ranks waited at the first, and how many of those were
    released (no longer in that wait) at the second."""

    n_snapshots: int
    waiters: tuple[int, ...]
    released: tuple[int, ...]
    guard: int = NOISE_GUARD
    returned: tuple[int, ...] = ()
    """Per pair: released waiters back at their own work, at a stack they ran before, from a wait on peers that
    other ranks sat in too (:func:`_returned`): the collective completed, so one such return is progress."""
    still_where: tuple[frozenset[tuple[int, object]], ...] = ()
    """Per pair: (rank, place) of each rank running its own code (not waiting) at the same stack in both
    snapshots."""
    peer_released: tuple[int, ...] = ()
    """Per pair: waiters released from a wait on peers (a collective, a transfer), not from their own waits."""
    same: tuple[frozenset[int], ...] = ()
    """Per pair: the ranks at the same place (state and call site) in both snapshots, waiting or not."""
    peer_waiters: tuple[int, ...] = ()
    """Per pair: the ranks waiting on peers (a collective, a transfer) at its first snapshot."""
    rejoined: tuple[frozenset[int], ...] = ()
    """Per pair: ranks of :attr:`same` in a shared wait one of its members left (a collective completes for
    every member: they are in the next one, at the same call site)."""
    leavers: tuple[frozenset[int], ...] = ()
    """Per pair: the ranks that left such a shared wait."""

    @property
    def still(self) -> tuple[frozenset[int], ...]:
        """Per pair: the ranks of :attr:`still_where`."""
        return tuple(frozenset(r for r, _ in pair) for pair in self.still_where)

    @property
    def peers_frozen(self) -> bool:
        """Three snapshots or more in which no rank ever left a wait on its peers: only ranks' own waits (a
        device sync, a sleep) came and went, the collectives never completed."""
        return (
            self.pairs >= 2
            and len(self.peer_released) == self.pairs
            and not any(self.peer_released)
            and len(self.peer_waiters) == self.pairs
            and all(self.peer_waiters)  # ranks sat in those waits throughout: none waiting proves nothing
        )

    @property
    def pairs(self) -> int:
        return len(self.released)

    def all_still(self, n_trainers: int) -> bool:
        """Three snapshots or more in which every one of ``n_trainers`` ranks sat at the very same place (state
        and call site, with lines) each time: nothing was seen to move, waiting or not."""
        return self.pairs >= 2 and len(self.same) == self.pairs and all(len(s) >= n_trainers > 0 for s in self.same)

    def _moving(self, i: int) -> bool:
        return self.released[i] >= self.guard or (i < len(self.returned) and self.returned[i] > 0)

    @property
    def moving_pairs(self) -> int:
        return sum(1 for i in range(self.pairs) if self._moving(i))

    @property
    def progressing(self) -> bool:
        """Waiters released in at least half of the pairs, the last one included; or, in the last pair, a
        waiter back at its earlier work (a slow rank caught once in the wait it makes its peers wait in).
        """
        if self.pairs == 0:
            return False
        if len(self.returned) == self.pairs and self.returned[-1] > 0:
            return True
        return 2 * self.moving_pairs >= self.pairs and self._moving(self.pairs - 1)

    @property
    def frozen(self) -> bool:
        """No waiter released between the last two snapshots, unless two earlier pairs released waiters while
        every rank that runs its own code unchanged in the last pair was unchanged there too: in this job those
        ranks at one stack in two snapshots do not stop it (a slow rank caught in its slow part every round)."""
        if not (self.pairs > 0 and self.waiters[-1] > 0 and self.released[-1] == 0):
            return False
        still = self.still
        last = still[-1] if len(still) == self.pairs else frozenset()
        # two such pairs at least: one release can be a hang spreading (a replica reaching the stuck collective)
        moved = sum(1 for i in range(self.pairs - 1) if last <= still[i] and self.released[i] > 0)
        return not (last and moved >= 2) or self.stalled_past_rhythm

    @property
    def stalled_past_rhythm(self) -> bool:
        """A frozen tail of at least :data:`LONG_TAIL` pairs, over three times the longest run of pairs without a
        release while the job was moving (at least one): a slow rank holds its peers for a while every step, so
        releases come at the job's own rhythm; a tail far past it is no step, however slow (a long capture of a
        healthy job that then stopped), when the ranks still running their own code through it sit where they
        ran while the job moved."""
        tail = self.pairs - self.frozen_since
        if tail < LONG_TAIL or self.frozen_since == 0 or len(self.still_where) != self.pairs:
            return False
        # the ranks running their own code through the tail sit where they worked while the job moved (stuck in
        # the job's own work); a place they never held then is a phase of its own (a long checkpoint): no proof
        held: Counter[tuple[int, object]] = Counter()
        for i in range(self.frozen_since - 1):  # the pair into the tail excepted: a straggler released there
            if self.released[i] > 0:
                held.update(self.still_where[i])
        if any(held[x] < 2 for x in self.still_where[-1]):  # each held in two moving pairs at least
            return False
        longest = run = 0
        for r, w in zip(self.released[: self.frozen_since], self.waiters[: self.frozen_since]):
            run = run + 1 if r == 0 and w > 0 else 0
            longest = max(longest, run)
        return tail > 3 * max(1, longest)

    @property
    def frozen_late(self) -> bool:
        """Frozen in the last pair only, after waiters were released, with no rank at one place through the last
        three snapshots: a phase of a running job caught twice (every rank waiting on rank 0's periodic
        checkpoint) looks alike, so it proves no hang. A hang that began before the capture leaves its culprit,
        or its waiters, unmoved through all three."""
        if not self.frozen or self.pairs < 2 or self.frozen_since != self.pairs - 1 or len(self.same) != self.pairs:
            return False
        sat = self.same[-1] & self.same[-2]
        if len(self.rejoined) == self.pairs and not self.leavers[-2] & self.still[-1]:
            # a rank left the wait its peers sat in and moved on through the last pair (a slow rank, not one stuck
            # after it): the peers seen in that wait again are in a later step's (a collective completes for all)
            sat -= self.rejoined[-2]
        return not sat

    @property
    def frozen_since(self) -> int:
        """The index of the first snapshot of the frozen tail (0 when frozen throughout)."""
        i = self.pairs
        while i > 0 and self.released[i - 1] == 0:
            i -= 1
        return i

    def words(self) -> str:
        pairs = ", ".join(f"{r}/{w}" for r, w in zip(self.released, self.waiters))
        return (
            f"{self.n_snapshots} snapshots: waiters released between consecutive snapshots (released/waiting): {pairs}"
        )


def _wait_key(p: ProcStacks, cache: dict[int, tuple[str, tuple[str, ...]]]) -> tuple[str, tuple[str, ...]]:
    """The state of ``p``'s main thread and, for a wait, its call site: the frames from the one that decided
    the wait outward, with lines (a rank polling inside one wait keeps its key)."""
    frames = p.main
    hit = cache.get(id(frames))
    if hit is None:
        state, i = classify(frames)
        key = tuple(
            frame_key(f, lines=True) for f in frames[max(i, 0) :] if not is_launcher_frame(f) and not is_native_frame(f)
        )
        hit = cache[id(frames)] = (state, key)
    return hit


def _returned(
    state: str, sharing: int, now: tuple[str, tuple[str, ...]], earlier: set[tuple[str, tuple[str, ...]]]
) -> bool:
    """A return: the rank left a wait on its peers that at least two peers sat in too (the collective or
    transfer it makes them wait for), and runs its own code at a stack it ran before. Its own loops (a
    device sync, a retry around its own code) and a flicker between two waits are no return."""
    return state in PEER_WAIT_STATES and sharing >= 3 and now[0] not in WAIT_STATES and now in earlier


def progress(by_snapshot: Mapping[int, Sequence[ProcStacks]], *, guard: int | None = None) -> Progress:
    """Waiters released between consecutive snapshots (trainers with a usable stack in both)."""
    snaps = sorted(by_snapshot)
    cache: dict[int, tuple[str, tuple[str, ...]]] = {}
    prev: dict[int, tuple[str, tuple[str, ...]]] | None = None
    before: defaultdict[int, set[tuple[str, tuple[str, ...]]]] = defaultdict(set)  # stacks seen before `prev`
    waiters: list[int] = []
    released: list[int] = []
    returned: list[int] = []
    peer: list[int] = []
    same: list[frozenset[int]] = []
    peer_w: list[int] = []
    still_where: list[frozenset[tuple[int, object]]] = []
    rejoined: list[frozenset[int]] = []
    leavers: list[frozenset[int]] = []
    world = 0
    for s in snaps:
        cur = {
            p.rank: _wait_key(p, cache)
            for p in by_snapshot[s]
            if p.role == "trainer" and p.rank is not None and p.status not in ("failed", "cut") and p.main
        }
        world = max(world, len(cur))
        if prev is not None:
            w = n = back = moved = pw = 0
            shared = Counter(prev.values())
            done: set[tuple[str, tuple[str, ...]]] = set()  # shared waits a member left: completed for everyone
            left_them: set[int] = set()
            for r, (state, key) in prev.items():
                if state not in WAIT_STATES or r not in cur:
                    continue
                w += 1
                pw += state in PEER_WAIT_STATES
                if cur[r] != (state, key):
                    n += 1
                    # DDP waits for its gradient all-reduce inside the autograd engine: ranks leaving a backward
                    # that others sat in at the same site were released by peers too (a lone one: its own work)
                    left = state in PEER_WAIT_STATES or (state == "backward" and shared[(state, key)] >= 2)
                    moved += left
                    back += _returned(state, shared[(state, key)], cur[r], before[r])
                    if left and shared[(state, key)] >= 3:
                        done.add((state, key))
                        left_them.add(r)
            still_where.append(
                frozenset((r, k) for r, k in prev.items() if k[0] not in WAIT_STATES and cur.get(r) == k)
            )
            same.append(frozenset(r for r, k in prev.items() if cur.get(r) == k))
            rejoined.append(frozenset(r for r, k in prev.items() if cur.get(r) == k and k in done))
            leavers.append(frozenset(left_them))
            waiters.append(w)
            released.append(n)
            peer.append(moved)
            peer_w.append(pw)
            returned.append(back)
            for r, k in prev.items():
                before[r].add(k)
        prev = cur
    g = guard if guard is not None else (NOISE_GUARD if world >= 8 else 1)
    pairs = (
        tuple(returned),
        tuple(still_where),
        tuple(peer),
        tuple(same),
        tuple(peer_w),
        tuple(rejoined),
        tuple(leavers),
    )
    return Progress(len(snaps), tuple(waiters), tuple(released), g, *pairs)


@dataclass(frozen=True)
class StackFacts:
    """What the stacks of one job say before any decision: progress across snapshots and the analysis of
    every snapshot (the rounds of a fail-slow vote; the last one for a hang)."""

    analyses: tuple[SnapshotAnalysis, ...]
    progress: Progress | None  # None with a single snapshot
    n_snapshots: int
    config: StackConfig
    limits: Limits


def facts(
    procs: Sequence[ProcStacks],
    topology: Topology,
    *,
    config: StackConfig | None = None,
    limits: Limits | None = None,
    expected: Sequence[int] | np.ndarray | None = None,
) -> StackFacts:
    """Split ``procs`` by snapshot, measure progress, and analyze every snapshot.

    ``expected``: ranks known to exist from a source independent of the dumps (see
    :func:`~rankscope.analytics.stacks.snapshot.analyze_snapshot`).
    """
    cfg = config or StackConfig()
    by_snap: dict[int, list[ProcStacks]] = defaultdict(list)
    for p in procs:
        by_snap[p.snapshot].append(p)
    snaps = sorted(by_snap)
    prog = progress(by_snap) if len(snaps) > 1 else None
    analyses = tuple(
        analyze_snapshot(
            by_snap[s], topology, snapshot=s, lines=cfg.lines, dominance=cfg.dominance_fraction, expected=expected
        )
        for s in snaps
    )
    return StackFacts(analyses, prog, len(snaps), cfg, limits or Limits())
