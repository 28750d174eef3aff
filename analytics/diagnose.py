"""One verdict from every kind of evidence a job left behind.

Stacks give the hang/fail-slow verdict (:mod:`.stack_verdict`); Flight Recorder dumps give the
collective view (:mod:`.collectives`) and are fused with the stacks (:mod:`.fusion`); metrics and
per-rank timings give the fail-slow/degraded/imbalance view (:mod:`.perf`); abnormal process exits
give the crash view (:mod:`.crashes`), which leads when present. Pure: in-memory
inputs in, a frozen :class:`~rankscope.analytics.verdict.Verdict` out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rankscope.analytics.stack_verdict import StackConfig, diagnose_stacks
from rankscope.analytics.verdict import Verdict
from rankscope.datasets.domain.exits import ProcessExit
from rankscope.datasets.domain.stacks import ProcStacks
from rankscope.datasets.domain.topology import Topology


def diagnose(procs: Sequence[ProcStacks], topology: Topology | None, *, job: str = "", fr_dumps: Sequence[Any] = (),
             metrics: Any = None, timings: Any = None, memberships: Mapping[str, Sequence[int]] | None = None,
             notes: Sequence[str] = (), config: StackConfig | None = None,
             exits: Sequence[ProcessExit] = (), snapshot_times: Mapping[int, float] | None = None) -> Verdict:
    """Diagnose one job from whatever evidence is present (at least one source).

    ``exits`` (abnormal process exits) give a ``crash`` verdict that leads: the first failure is
    the culprit and the hang the stacks show after it is its consequence (:mod:`.crashes`).
    ``snapshot_times`` (snapshot id -> wall time) let step timings overrule a stack "hang": steps
    that kept completing between the snapshots mean the job is slow, not stuck.
    """
    verdicts: list[Verdict] = []
    context: list[str] = []
    if exits:
        from rankscope.analytics.crashes import crash_verdict  # noqa: PLC0415

        anchor = max(snapshot_times.values()) if snapshot_times else None
        crash_v = crash_verdict(exits, topology, job=job, anchor=anchor)
        if crash_v is not None and crash_v.details["crash"]["n_primary"] == 0 and (procs or fr_dumps):
            # every exit reports a lost peer or a deliberate stop (a hung job torn down with SIGTERM,
            # watchdog timeouts): the stacks say more than the exits, which become context
            context.append("[events] " + " ".join(crash_v.reasons))
        elif crash_v is not None:
            verdicts.append(crash_v)
    stack_v = diagnose_stacks(procs, topology, job=job, config=config) if procs and topology is not None else None
    fr_v = None
    if fr_dumps and topology is not None:
        from rankscope.analytics.collectives import analyze_collectives, fr_verdict  # noqa: PLC0415

        analysis = analyze_collectives(list(fr_dumps), topology, memberships=memberships)
        fr_v = fr_verdict(analysis, topology, job=job)
    if stack_v is not None and fr_v is not None:
        from rankscope.analytics.fusion import fuse  # noqa: PLC0415

        verdicts.append(fuse(stack_v, fr_v))
    elif stack_v is not None or fr_v is not None:
        verdicts.append(stack_v or fr_v)  # type: ignore[arg-type]
    if stack_v is not None and verdicts and verdicts[-1].verdict == "hang" and timings is not None and snapshot_times:
        verdicts[-1] = _slow_not_hung(verdicts[-1], timings, snapshot_times)
    if metrics is not None or timings is not None:
        from rankscope.analytics.perf import diagnose_perf  # noqa: PLC0415

        if metrics is not None and topology is not None and "node" in metrics.columns:
            metrics, dropped = _job_nodes_only(metrics, topology)
            if dropped:
                notes = tuple(notes) + (f"metrics of node(s) outside the job ignored: {', '.join(dropped[:10])}",)
        perf_v = diagnose_perf(metrics, timings, topology, job=job)
        if perf_v is not None:
            verdicts.append(perf_v)
    if not verdicts:
        return Verdict("inconclusive", job=job, reasons=("no evidence: no stacks, Flight Recorder dumps, exits, "
                                                         "metrics or timings were found",) + tuple(notes),
                       world_size=topology.world_size if topology is not None else 0)
    v = _combine(verdicts)
    if context:
        v = v.with_updates(reasons=tuple(v.reasons) + tuple(context))
    if notes:
        v = v.with_updates(details={**v.details, "notes": list(notes)})
    return v


def _slow_not_hung(v: Verdict, timings: Any, snapshot_times: Mapping[int, float]) -> Verdict:
    """A "hang" over several snapshots while steps kept completing between them is fail-slow.

    Stacks sampled seconds apart can look frozen when every sample catches the same slow rank in
    the same place (a rank that sleeps or spins 2 s per step) while the job still advances; the
    step records settle it.
    """
    import polars as pl  # noqa: PLC0415

    times = sorted(t for t in snapshot_times.values() if t is not None)
    if len(times) < 2 or not {"start_s", "duration_s", "step"} <= set(timings.columns):
        return v
    t0, t1 = times[0], times[-1]
    done = timings.filter(pl.col("start_s").is_not_null()).with_columns(
        (pl.col("start_s") + pl.col("duration_s")).alias("end_s")).filter(
        (pl.col("end_s") > t0) & (pl.col("end_s") <= t1))
    if done.height == 0:
        return v
    steps = done.get_column("step").n_unique()
    reason = (f"The stacks look the same in every snapshot, but {steps} step(s) completed between the first and "
              f"the last snapshot ({t1 - t0:.0f} s apart): the job is slow, not hung; the outliers are where it "
              "waits on the slow rank(s).")
    return v.with_updates(verdict="fail-slow", reasons=(reason, *v.reasons),
                          details={**v.details, "steps_during_snapshots": steps})


def _job_nodes_only(metrics: Any, topology: Topology) -> tuple[Any, list[str]]:
    """Keep the metrics of the job's nodes (a sidecar may also report its host under another name).

    Only when some metric nodes are job nodes: with disjoint names (hostnames vs node-N) nothing
    can be matched, and every node is kept.
    """
    import polars as pl  # noqa: PLC0415

    names = set(metrics.get_column("node").unique().to_list())
    inside = names & set(topology.node_names)
    if not inside or inside == names:
        return metrics, []
    return metrics.filter(pl.col("node").is_in(sorted(inside))), sorted(str(n) for n in names - inside)


_PRIORITY = {"crash": -1, "hang": 0, "mismatch": 1, "fail-slow": 2, "degraded": 3, "imbalance": 4, "inconclusive": 5, "healthy": 6}


def _combine(verdicts: Sequence[Verdict]) -> Verdict:
    """The most severe verdict leads; the others' reasons and evidence are kept beside it."""
    ordered = sorted(verdicts, key=lambda v: _PRIORITY[v.verdict])
    lead = ordered[0]
    if len(ordered) == 1:
        return lead
    reasons = list(lead.reasons)
    evidence = list(lead.evidence)
    sources = list(lead.sources)
    for v in ordered[1:]:
        reasons.append(f"[{'/'.join(v.sources) or 'other'}] {v.verdict}: " + (v.reasons[0] if v.reasons else ""))
        reasons.extend(v.reasons[1:4])
        evidence.extend(v.evidence)
        sources.extend(s for s in v.sources if s not in sources)
    # a verdict without stacks (crash from exits, perf) still shows the clusters the stacks found
    clustered = next((v for v in ordered if v.clusters), lead)
    return lead.with_updates(reasons=tuple(reasons), evidence=tuple(evidence), sources=tuple(sources),
                             clusters=lead.clusters or clustered.clusters,
                             n_snapshots=max(v.n_snapshots for v in ordered),
                             world_size=lead.world_size or max(v.world_size for v in ordered),
                             details={**lead.details, "other_verdicts": [v.to_dict() for v in ordered[1:]]})
