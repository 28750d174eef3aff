"""``rankscope plan``, ``rankscope recover`` and ``rankscope standby``: from a verdict to training again."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from rankscope.cli.console import echo, fail, handle_errors
from rankscope.cli.options import (
    DEFAULT_ORDER,
    ConfigOpt,
    Format,
    FormatOpt,
    GpusPerNodeOpt,
    JobOpt,
    LayoutOpt,
    OrderOpt,
    load_settings,
)

DEFERRED = 3
COLLECT = 4  # the plan only asks for more evidence: the agent takes another capture series
"""Exit code of ``rankscope recover`` when the cool-down deferred the plan's disruptive actions."""

SourceArg = Annotated[
    Path,
    typer.Argument(
        help="A verdict JSON file (rankscope diagnose --format json) or a situation JSON file, a rankscope store "
        "(with --job), or a dump directory (diagnosed first, as rankscope diagnose does)."
    ),
]
RulesOpt = Annotated[
    Path | None, typer.Option("--rules", help="TOML/JSON file of extra classification rules ([[rules]] tables).")
]
MachinesOpt = Annotated[
    str | None, typer.Option("--machines", help="The job's machines, comma-separated (sizes the eviction cap).")
]
StandbyOpt = Annotated[str | None, typer.Option("--standby", help="Warm standby machines, comma-separated, in order.")]
QuarantineOpt = Annotated[str | None, typer.Option("--quarantine", help="Machines never to place work on.")]
AuditOpt = Annotated[
    Path | None,
    typer.Option(
        "--audit",
        help="The audit trail: a store (its actions table) or a .jsonl file. Default: the SOURCE store, else "
        "~/.rankscope/audit.jsonl.",
    ),
]
MaxEvictOpt = Annotated[
    float | None, typer.Option("--max-evict-fraction", help="Cap on the job's machines evicted per hour (1/8).")
]
CooldownOpt = Annotated[
    float | None, typer.Option("--cooldown-seconds", help="Between disruptive actions of two incidents (300).")
]
HourlyOpt = Annotated[
    float | None, typer.Option("--hourly-window-seconds", help="The window the eviction cap counts over (3600).")
]
EscalationOpt = Annotated[
    float | None,
    typer.Option("--escalation-window-seconds", help="A failure this soon after an eviction escalates (3600)."),
]


def _names(text: str | None) -> list[str] | None:
    return None if text is None else [n.strip() for n in text.split(",") if n.strip()]


def _is_store(path: Path) -> bool:
    from rankscope.datasets.store.store import Store

    return Store.is_store(path)


def _audit(path: Path | None, source: Path) -> Any:
    """The audit trail: ``--audit`` (a store or a .jsonl file), else the SOURCE store, else ~/.rankscope."""
    from rankscope.recovery.audit import JsonlAuditLog, StoreAuditLog

    if path is None:
        path = source if _is_store(source) else Path.home() / ".rankscope" / "audit.jsonl"
    return JsonlAuditLog(path) if path.suffix == ".jsonl" else StoreAuditLog(path)


def _situation(
    source_path: Path,
    *,
    job: str | None,
    layout: str | None,
    order: str,
    gpus_per_node: int | None,
    config: Path | None,
    rules: Path | None,
    audit_path: Path | None,
    overrides: dict[str, Any],
) -> tuple[Any, Any, Any]:
    """(situation, audit log, rule table) for a SOURCE, with the audit trail's history of the job."""
    from rankscope.recovery.classify import table_with
    from rankscope.recovery.situation import Situation
    from rankscope.recovery.sources import last_applied, load_source

    table = table_with(rules)
    log = _audit(audit_path, source_path)
    records = log.records(job) if job else []
    source = load_source(
        source_path,
        job=job,
        layout=layout,
        order=order,
        gpus_per_node=gpus_per_node,
        config=load_settings(config),
        since=last_applied(records, job) if job else None,
    )
    name = source.job or job or ""
    if not records and name:
        records = log.records(name)
    obj = {**source.obj, **{k: v for k, v in overrides.items() if v is not None}}
    obj["job"] = name
    fleet = _store_quarantine(source_path, audit_path)
    if fleet:  # the fleet view's list (rankscope fleet / batch) joins --quarantine
        obj["quarantine"] = sorted({*(obj.get("quarantine") or ()), *fleet})
    obj["history"] = [*obj.get("history", []), *(r.to_dict() for r in records)]
    return Situation.from_dict(obj, table=table, where=str(source_path)), log, table


def _store_quarantine(source_path: Path, audit_path: Path | None) -> set[str]:
    """The quarantine list (``ROOT/quarantine.json``) of the store named by SOURCE or --audit, if any."""
    from rankscope.datasets.store.quarantine import load_quarantine
    from rankscope.datasets.store.store import Store

    out: set[str] = set()
    for p in (source_path, audit_path):
        if p is not None and p.is_dir() and Store.is_store(p):
            out |= load_quarantine(p)
    return out


def _configs(
    max_evict: float | None, cooldown: float | None, escalation: float | None, hourly: float | None = None
) -> tuple[Any, Any]:
    from rankscope.recovery.guardrails import GuardrailConfig
    from rankscope.recovery.situation import LadderConfig

    guards = GuardrailConfig(
        max_evict_fraction=GuardrailConfig.max_evict_fraction if max_evict is None else max_evict,
        cooldown_seconds=GuardrailConfig.cooldown_seconds if cooldown is None else cooldown,
        hourly_window_seconds=GuardrailConfig.hourly_window_seconds if hourly is None else hourly,
    )
    ladder = LadderConfig(escalation_window_seconds=escalation) if escalation is not None else LadderConfig()
    return ladder, guards


PLAN_EXAMPLES = """\b
Examples:
  rankscope plan /data/rankscope --job llama70b-run3 --format json
  rankscope plan verdict.json --machines gpu-0,gpu-1,gpu-2,gpu-3 --standby gpu-9
"""
RECOVER_EXAMPLES = """\b
Examples:
  rankscope recover /data/rankscope --job llama70b-run3 --backend slurm --slurm-job-id 4242
  rankscope recover /data/rankscope --job llama70b-run3 --backend slurm --slurm-job-id 4242 --apply
"""
STANDBY_EXAMPLES = """\b
Examples:
  rankscope standby --machines 1024 --daily-failure-rate 0.0012
"""


def register(app: typer.Typer) -> None:
    @app.command(
        help="Decide what to do about an incident: evict, restart, roll back, stop.\n\n"
        "The decision ladder, then the guardrails: evict, restart, roll back, stop, tolerate or collect, each "
        "with its reason. Changes nothing.",
        epilog=PLAN_EXAMPLES,
    )
    @handle_errors
    def plan(
        source: SourceArg,
        job: JobOpt = None,
        layout: LayoutOpt = None,
        order: OrderOpt = DEFAULT_ORDER,
        gpus_per_node: GpusPerNodeOpt = None,
        config: ConfigOpt = None,
        fmt: FormatOpt = Format.text,
        rules: RulesOpt = None,
        machines: MachinesOpt = None,
        standby: StandbyOpt = None,
        quarantine: QuarantineOpt = None,
        audit: AuditOpt = None,
        now: str | None = typer.Option(None, "--now", help="Decide as of this time (epoch seconds or ISO-8601)."),
        max_evict_fraction: MaxEvictOpt = None,
        cooldown_seconds: CooldownOpt = None,
        escalation_window_seconds: EscalationOpt = None,
        hourly_window_seconds: HourlyOpt = None,
    ) -> None:
        """Same input, same plan (the plan decides at the newest time in its inputs unless --now is given)."""
        from rankscope.recovery.planner import make_plan

        overrides = {
            "machines": _names(machines),
            "standby": _names(standby),
            "quarantine": _names(quarantine),
            "now": now,
        }
        s, _, table = _situation(
            source,
            job=job,
            layout=layout,
            order=order,
            gpus_per_node=gpus_per_node,
            config=config,
            rules=rules,
            audit_path=audit,
            overrides=overrides,
        )
        ladder, guards = _configs(
            max_evict_fraction, cooldown_seconds, escalation_window_seconds, hourly_window_seconds
        )
        p = make_plan(s, ladder=ladder, guards=guards, table=table)
        echo(p.to_json().rstrip() if fmt is Format.json else p.explain())

    @app.command(
        help="Carry a plan out: local torchrun, Slurm or Kubernetes (dry run by default).\n\n"
        "Plan, then carry the plan out through a backend. DRY RUN unless --apply: prints the exact commands or "
        "API calls; --apply makes them, one executor per job (a lock), each action recorded in the audit trail. "
        "Exit 1 when an applied step failed, 3 when a guardrail deferred the actions (the cool-down: the plan "
        "says until when; run it again then), 4 when the plan only asks for more evidence (collect: the agent's "
        "--recover takes another capture series and plans again).",
        epilog=RECOVER_EXAMPLES,
    )
    @handle_errors
    def recover(
        source: SourceArg,
        backend: str = typer.Option(..., "--backend", help="local, slurm or k8s."),
        apply: bool = typer.Option(False, "--apply", help="Make the calls (default: dry run, nothing changes)."),
        job: JobOpt = None,
        layout: LayoutOpt = None,
        order: OrderOpt = DEFAULT_ORDER,
        gpus_per_node: GpusPerNodeOpt = None,
        config: ConfigOpt = None,
        fmt: FormatOpt = Format.text,
        rules: RulesOpt = None,
        machines: MachinesOpt = None,
        standby: StandbyOpt = None,
        quarantine: QuarantineOpt = None,
        audit: AuditOpt = None,
        lock_dir: Path | None = typer.Option(None, "--lock-dir", help="Where the per-job executor lock lives."),
        local_run_dir: Path | None = typer.Option(
            None, "--local-run-dir", help="local: the run directory of a job launched by the local backend."
        ),
        slurm_job_id: str | None = typer.Option(None, "--slurm-job-id", help="slurm: the job to act on."),
        slurm_mode: str = typer.Option(
            "auto", "--slurm-mode", help="slurm: auto (drain, else requeue), drain, requeue."
        ),
        namespace: str | None = typer.Option(None, "--namespace", help="k8s: the job's namespace."),
        pod_selector: str = typer.Option("", "--pod-selector", help="k8s: label selector of the job's pods."),
        k8s_job: str = typer.Option("", "--k8s-job", help="k8s: the Job to suspend on a stop."),
        max_evict_fraction: MaxEvictOpt = None,
        cooldown_seconds: CooldownOpt = None,
        escalation_window_seconds: EscalationOpt = None,
        hourly_window_seconds: HourlyOpt = None,
    ) -> None:
        """Dry run by default everywhere; --apply acts."""
        import json

        from rankscope.recovery.backends import BACKENDS, make_backend
        from rankscope.recovery.backends.local import LocalBackend
        from rankscope.recovery.executor import recover as run

        options: dict[str, Any]
        if backend == "local":
            if local_run_dir is None:
                fail("--backend local needs --local-run-dir (the run directory the local backend launched)")
            options = {"run_dir": local_run_dir}
        elif backend == "slurm":
            if not slurm_job_id:
                fail("--backend slurm needs --slurm-job-id")
            options = {"job_id": slurm_job_id, "mode": slurm_mode}
        elif backend == "k8s":
            if not namespace:
                fail("--backend k8s needs --namespace")
            options = {"namespace": namespace, "pod_selector": pod_selector, "job_name": k8s_job}
        else:
            fail(f"--backend {backend!r} is not one of {', '.join(BACKENDS)}")
        be = make_backend(backend, **options)
        overrides: dict[str, Any] = {
            "machines": _names(machines),
            "standby": _names(standby),
            "quarantine": _names(quarantine),
        }
        if isinstance(be, LocalBackend):  # the local cluster knows its machines, standby, quarantine, checkpoints
            overrides = {**be.situation(), **{k: v for k, v in overrides.items() if v is not None}}
        s, log, table = _situation(
            source,
            job=job,
            layout=layout,
            order=order,
            gpus_per_node=gpus_per_node,
            config=config,
            rules=rules,
            audit_path=audit,
            overrides=overrides,
        )
        if lock_dir is None:
            lock_dir = source / ".recovery-locks" if _is_store(source) else Path.home() / ".rankscope" / "locks"
        ladder, guards = _configs(
            max_evict_fraction, cooldown_seconds, escalation_window_seconds, hourly_window_seconds
        )
        rep = run(s, be, audit=log, lock_dir=lock_dir, apply=apply, ladder=ladder, guards=guards, table=table)
        if fmt is Format.json:
            echo(json.dumps({"plan": rep.plan.to_dict(), "execution": rep.to_dict()}, indent=2))
        else:
            echo(rep.plan.explain() + "\n\n" + rep.explain())
        if not rep.ok:
            raise typer.Exit(1)
        if any(g.decision == "deferred" for g in rep.plan.guardrails):
            raise typer.Exit(DEFERRED)
        if rep.plan.actions and all(a.kind == "collect" for a in rep.plan.actions):
            raise typer.Exit(COLLECT)

    @app.command(
        help="Size the warm standby pool for a job (machines to keep ready).\n\n"
        "The spare machines that cover the given quantile of concurrent failures within the restart window "
        "(binomial, as in ByteRobust).",
        epilog=STANDBY_EXAMPLES,
    )
    @handle_errors
    def standby(
        machines: int = typer.Option(..., "--machines", help="Machines in the job."),
        daily_failure_rate: float = typer.Option(
            ..., "--daily-failure-rate", help="Chance that one machine fails within a day (0.0012 = 0.12%)."
        ),
        window_hours: float = typer.Option(24.0, "--window-hours", help="How long the pool must last (hours)."),
        quantile: float = typer.Option(0.99, "--quantile", help="Share of windows the pool must cover."),
        fmt: FormatOpt = Format.text,
    ) -> None:
        """The standby count, the expected failures and the coverage."""
        import json

        from rankscope.recovery.standby import standby_count

        s = standby_count(machines, daily_failure_rate, window_hours=window_hours, quantile=quantile)
        echo(json.dumps(s.to_dict()) if fmt is Format.json else s.explain())
