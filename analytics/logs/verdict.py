"""The logs' verdict: ``hang`` when watchdog timeouts prove it and a laggard is named, ``inconclusive`` when
they prove a hang but name no one, ``healthy`` when the logs show work progressing and nothing timed out.

Suspects are only the laggards' machines (the logs give no parallel groups to over-evict); a member that
merely stayed silent is named at a lower confidence, and only when the chain of waits corroborates it.
Exceptions in the logs are process exits: the crash analysis orders them, not this one.
"""

from __future__ import annotations

import time

from rankscope.analytics.logs.facts import GroupStall, LogFacts, group_name
from rankscope.analytics.verdict import Evidence, Severity, Verdict, merge_nodes, rank_ranges
from rankscope.datasets.domain.topology import Topology


def _node(rank: int, topology: Topology | None) -> str:
    if topology is not None and 0 <= rank < topology.world_size:
        return topology.node_of(rank)
    return f"rank-{rank}"


def _when(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t)) if t is not None else "an unknown time"


def _stall_words(f: LogFacts) -> list[str]:
    out = []
    for s in f.stalls[:3]:
        name = group_name(s)
        secs = f" after {s.timeout_ms / 1000:.0f} s" if s.timeout_ms else ""
        out.append(
            f"NCCL watchdog: {len(s.waiters)} of {len(s.members)} member(s) of {name} timed out{secs} in work "
            f"{s.seq} ({s.op or 'collective'}) from {_when(s.first_time)}: ranks {rank_ranges(s.waiters)}."
        )
    if len(f.stalls) > 3:
        out.append(f"... and {len(f.stalls) - 3} more process group(s) timed out after them (waiting on the first).")
    if f.gloo_timeouts:
        out.append(
            f"gloo: rank(s) {rank_ranges(f.gloo_timeouts)} timed out waiting for a peer's send/recv "
            f"(from {_when(f.first_timeout)}): the job was hung, not slow."
        )
    if f.cascade:
        out.append(
            f"rank(s) {rank_ranges(f.cascade)} then saw a peer close the connection: the cascade of the teardown, "
            "which names no one."
        )
    return out


def _details(f: LogFacts) -> dict[str, object]:
    return {
        "logs": {
            "hang_time_evidence": f.hang_evidence,
            "first_timeout": f.first_timeout,
            "stalls": [
                {
                    "group": s.group,
                    "desc": s.desc,
                    "seq": s.seq,
                    "op": s.op,
                    "waiters": rank_ranges(s.waiters),
                    "lagging": list(s.lagging),
                    "silent": list(s.silent),
                    "ops": {op: list(rs) for op, rs in s.ops},
                }
                for s in f.stalls
            ],
            "laggards": [{"rank": lg.rank, "strong": lg.strong, "why": lg.why} for lg in f.laggards],
            "unresolved_silent_ranks": list(f.unresolved),
            "last_step_time": f.last_step_time,
        }
    }


def verdict(f: LogFacts, topology: Topology | None, *, job: str = "") -> Verdict:
    """The decision the logs support (see the module docstring)."""
    if not f.hang_evidence:
        return _quiet(f, job)
    if f.stalls and f.stalls[0].ops:  # the first group to stall split over two collectives: the others wait on it
        return _desync(f, f.stalls[0], job)
    reasons = _stall_words(f)
    if not f.laggards:
        if f.unresolved:
            reasons.append(
                f"rank(s) {rank_ranges(f.unresolved)} printed no timeout while their peers did: check them, but "
                "silence "
                "alone is no proof (their log may be cut, or they may wait elsewhere)."
            )
        else:
            reasons.append("the timeouts name no member that stopped first: the logs prove a hang but not its culprit.")
            quiet = _gloo_silent(f)
            if quiet:
                reasons.append(
                    f"rank(s) {rank_ranges(quiet)} printed no gloo timeout while every other rank did: if the job "
                    "is stuck, look there first (silence alone names no one: a log may be cut, or a rank may wait "
                    "elsewhere)."
                )
        return Verdict(
            Severity.INCONCLUSIVE,
            job=job,
            confidence=0.4,
            reasons=tuple(reasons),
            sources=("logs",),
            world_size=f.world,
            details=_details(f),
        )
    nodes = merge_nodes([_node(lg.rank, topology) for lg in f.laggards])
    ranks = tuple(sorted(lg.rank for lg in f.laggards))
    strong = all(lg.strong for lg in f.laggards)
    for lg in f.laggards:
        reasons.insert(0, f"Rank {lg.rank} on {_node(lg.rank, topology)} {lg.why}.")
    evidence = tuple(
        Evidence(
            "logs",
            "never-enqueued" if lg.strong else "silent-member",
            lg.why,
            (lg.rank,),
            (_node(lg.rank, topology),),
            1.0 if lg.strong else 0.6,
        )
        for lg in f.laggards
    )
    return Verdict(
        Severity.HANG,
        job=job,
        confidence=(0.85 if strong else 0.65) if len(nodes) == 1 else 0.6,
        suspect_nodes=nodes,
        culprit_nodes=nodes,
        suspect_ranks=ranks,
        culprit_ranks=ranks,
        reasons=tuple(reasons),
        evidence=evidence,
        sources=("logs",),
        world_size=f.world,
        details=_details(f),
    )


def _desync(f: LogFacts, s: GroupStall, job: str) -> Verdict:
    """The members of one group time out in different collectives at the same work: they issued different calls
    (a code or data path that diverged on some ranks), a program fault, not a machine: ``mismatch``."""
    ops = sorted(s.ops, key=lambda o: -len(o[1]))
    few = tuple(sorted(r for _, rs in ops[1:] for r in rs))
    said = ", ".join(f"rank(s) {rank_ranges(rs)} in {op}" for op, rs in ops[::-1])
    reasons = [
        f"The members of {group_name(s)} time out in different collectives at work {s.seq}: {said}. The ranks "
        "issued different calls (a code or data path that diverged on some of them), a program fault, not a "
        "machine: nothing to evict. TORCH_DISTRIBUTED_DEBUG=DETAIL names the calls.",
        *_stall_words(f),
    ]
    return Verdict(
        Severity.MISMATCH,
        job=job,
        confidence=0.7,
        suspect_ranks=few,
        reasons=tuple(reasons),
        evidence=(Evidence("logs", "collective-mismatch", reasons[0][:300], few, (), 0.6),),
        sources=("logs",),
        world_size=f.world,
        details=_details(f),
    )


def _quiet(f: LogFacts, job: str) -> Verdict:
    """No hang in the logs: healthy when they show progress, else inconclusive."""
    if f.progressing_after:
        why = "timeouts were logged, but steps kept completing after them: not a hang."
    elif f.last_step_time is not None or f.periodic:
        what = (
            f"steps logged up to {_when(f.last_step_time)}"
            if f.last_step_time is not None
            else "NCCL work kept completing"
        )
        why = f"no watchdog or transport timeout in the logs; {what}."
    else:
        why = "no watchdog or transport timeout in the logs."
    sev = (
        Severity.HEALTHY
        if (f.last_step_time is not None or f.periodic) and not f.nccl_timeouts and f.quiet_before_stop is None
        else Severity.INCONCLUSIVE
    )
    if f.quiet_before_stop is not None:
        quiet, usual = f.quiet_before_stop
        why += (
            f" But no step for {quiet:.0f} s before the launchers were stopped (steps came every ~{usual:.1f} s "
            "before): the job was not stepping when it was stopped (stuck, or idle); the logs do not say who."
        )
    silent = sev is Severity.INCONCLUSIVE and f.quiet_before_stop is None and not f.nccl_timeouts
    details = {**_details(f), "silent": silent}  # the logs say nothing either way: other evidence decides
    return Verdict(sev, job=job, confidence=0.6, reasons=(why,), sources=("logs",), world_size=f.world, details=details)


def _gloo_silent(f: LogFacts) -> tuple[int, ...]:
    """Ranks that printed no gloo timeout (nor saw a peer close) while at least two others timed out and the
    silent ones are few (a quarter of the job at most): where a gloo hang's waits most likely end."""
    timed = set(f.gloo_timeouts)
    if len(timed) < 2 or f.world <= 0:
        return ()
    heard = timed | set(f.cascade)
    quiet = tuple(r for r in range(f.world) if r not in heard)
    return quiet if 0 < len(quiet) <= max(1, f.world // 4) else ()
