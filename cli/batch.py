"""``rankscope batch`` (scheduled analysis of a store), ``rankscope fleet`` (machines blamed across jobs) and
``rankscope export`` (Prometheus textfile)."""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from typing import Any

import typer

from rankscope.cli.console import echo, handle_errors
from rankscope.cli.options import ConfigOpt, load_settings
from rankscope.cli.tables import TableFormat

BATCH_EXAMPLES = """\b
Examples:
  rankscope batch /data/rankscope                       # cron, a systemd timer, a Kubernetes CronJob
  rankscope batch /data/rankscope --every 5m --workers 2
  rankscope batch /data/rankscope --runner ray --ray-address ray://kuberay-head:10001
\b
Exit codes: 0 every job done, 1 some jobs failed (each listed; the others done), 2 bad input,
75 another run holds the store's lock (nothing done), 143/130 stopped by SIGTERM/Ctrl-C between jobs.
"""
FLEET_EXAMPLES = """\b
Examples:
  rankscope fleet /data/rankscope
  rankscope fleet /data/rankscope --window 30d --format csv > fleet.csv
"""
EXPORT_EXAMPLES = """\b
Examples:
  rankscope export /data/rankscope --textfile /var/lib/node_exporter/textfile_collector
"""
LOCK_HELD = 75  # EX_TEMPFAIL: try again later


class _Stop:
    """SIGTERM/SIGINT ask the run to stop between jobs; a second Ctrl-C interrupts at once."""

    def __init__(self) -> None:
        self.asked: int | None = None

    def __call__(self) -> bool:
        return self.asked is not None

    def handler(self, signum: int, frame: Any) -> None:
        if self.asked is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.asked = signum
        name = signal.Signals(signum).name
        print(f"rankscope: {name}: stopping after the jobs in flight", file=sys.stderr, flush=True)


def _flags(**values: Any) -> dict[str, Any]:
    return {"batch": {k: v for k, v in values.items() if v is not None}}


def register(app: typer.Typer) -> None:
    @app.command(epilog=BATCH_EXAMPLES)
    @handle_errors
    def batch(
        store: Path = typer.Argument(..., metavar="STORE", help="Store root (the agents' and ingest's store)."),
        since: str = typer.Option(
            None, "--since", metavar="DURATION", help="Leave incidents older than this alone (e.g. 1d; default: all)."
        ),
        runner: str = typer.Option(None, "--runner", metavar="local|ray", help="Engine (default local)."),
        workers: int = typer.Option(
            None,
            "--workers",
            metavar="N",
            help="local: worker processes (default 1: this process); ray: CPUs of the local instance (default all).",
        ),
        every: str = typer.Option(
            None, "--every", metavar="DURATION", help="Run again every DURATION (e.g. 5m) until SIGTERM."
        ),
        ray_address: str = typer.Option(
            None, "--ray-address", metavar="ADDR", help="Join this Ray cluster (ray://head:10001, auto)."
        ),
        retry_failed: bool = typer.Option(
            False, "--retry-failed", help="Diagnose again jobs that failed before at the same evidence."
        ),
        config: ConfigOpt = None,
    ) -> None:
        """Diagnose every job of a store with new evidence, once per incident, and keep the verdicts.

        Jobs whose evidence is newer than their watermark are diagnosed, each incident once (an ingest, a
        capture series of the agent); verdicts go to the store's verdicts table keyed by (job, incident,
        input fingerprint), so running again adds nothing. One run at a time per store (a lock); SIGKILL
        leaves no partial rows and the next run finishes the work.
        """
        from rankscope.batch.run import run_batch, run_every
        from rankscope.batch.state import LockHeld
        from rankscope.config import parse_duration

        flags = _flags(
            runner=runner,
            workers=workers,
            ray_address=ray_address,
            since_seconds=parse_duration("--since", since) if since is not None else None,
            every_seconds=parse_duration("--every", every) if every is not None else None,
        )
        cfg = load_settings(config, flags)
        stop = _Stop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, stop.handler)
        if cfg.batch.every_seconds > 0:
            raise typer.Exit(
                run_every(
                    store, cfg, every_seconds=cfg.batch.every_seconds, say=echo, stop=stop, retry_failed=retry_failed
                )
            )
        try:
            report = run_batch(store, cfg, retry_failed=retry_failed, stop=stop)
        except LockHeld as exc:
            print(f"rankscope: busy: {exc}", file=sys.stderr)
            raise typer.Exit(LOCK_HELD) from None
        for line in report.lines():
            echo(line)
        if report.stopped and stop.asked == signal.SIGINT:
            raise typer.Exit(130)
        raise typer.Exit(report.exit_code)

    @app.command(epilog=FLEET_EXAMPLES)
    @handle_errors
    def fleet(
        store: Path = typer.Argument(..., metavar="STORE", help="Store root."),
        window: str = typer.Option(None, "--window", metavar="DURATION", help="Verdicts this recent (default 7d)."),
        fmt: TableFormat = typer.Option(
            TableFormat.text, "--format", help="text (aligned table), csv, json or markdown."
        ),
        threshold: float = typer.Option(
            None, "--threshold", metavar="X", help="Quarantine machines whose risk is above X (default 1.5)."
        ),
        no_quarantine: bool = typer.Option(
            False, "--no-quarantine", help="Show the view only; leave STORE/quarantine.json as it is."
        ),
        config: ConfigOpt = None,
    ) -> None:
        """Machines blamed across jobs: how often, in which verdicts, a risk score, and the quarantine list.

        Risk = sum over distinct incidents of confidence x kind weight x blame share x 0.5^(age / half-life)
        (see README, "Batch and fleet"). Machines above the threshold are written to STORE/quarantine.json,
        which the recovery executor consults before placing a job or a standby on a machine.
        """
        from rankscope.batch.fleet import fleet_view, refresh_quarantine
        from rankscope.cli.tables import render
        from rankscope.config import parse_duration
        from rankscope.datasets.store.store import Store

        flags = _flags(
            fleet_window_seconds=parse_duration("--window", window) if window is not None else None,
            quarantine_threshold=threshold,
        )
        cfg = load_settings(config, flags).batch
        st = Store(store)
        view = refresh_quarantine(st, cfg) if not no_quarantine else None
        v = fleet_view(st, cfg)
        items = [m.to_dict() for m in v.machines]
        cols = ["machine", "risk", "quarantined", "incidents", "jobs", "culprit", "suspect", "kinds", "last_seen"]
        if fmt in (TableFormat.text, TableFormat.markdown):
            for i in items:
                i["kinds"] = ", ".join(f"{k}:{n}" for k, n in i["kinds"].items())
                i["last_seen"] = (i["last_seen"] or "").replace("T", " ").removesuffix("Z") or None
                i["quarantined"] = "yes" if i["quarantined"] else ""
        echo(render(cols, [[i[c] for c in cols] for i in items], fmt))
        if fmt is TableFormat.text:
            span = window or _days(cfg.fleet_window_seconds)
            echo(
                f"{v.incidents} incident(s) of {v.jobs} job(s) in the last {span}; "
                f"{len(v.quarantine)} machine(s) above {cfg.quarantine_threshold:g}"
                + (f"; quarantine list: {st.root / 'quarantine.json'}" if view is not None else "")
                + (f"; {v.unnamed} incident(s) named only made-up machine names (not scored)" if v.unnamed else "")
            )

    @app.command(epilog=EXPORT_EXAMPLES)
    @handle_errors
    def export(
        store: Path = typer.Argument(..., metavar="STORE", help="Store root."),
        textfile: Path = typer.Option(
            ..., "--textfile", metavar="DIR", help="node_exporter's --collector.textfile.directory."
        ),
        name: str = typer.Option(
            "rankscope", "--name", metavar="NAME", help="File name in DIR: NAME.prom (one per store)."
        ),
        config: ConfigOpt = None,
    ) -> None:
        """Write the store's verdicts, fleet and batch health for Prometheus (node_exporter textfile).

        Latest verdict per job, machines named per job, machines' blame counts and risk, batch run duration
        and failures; written atomically with prometheus_client's write_to_textfile.
        """
        from rankscope.datasets.store.store import Store
        from rankscope.reports.prometheus import write_textfile

        cfg = load_settings(config).batch
        path = write_textfile(Store(store), textfile, name=name, config=cfg)
        echo(f"wrote {path}")


def _days(seconds: float) -> str:
    return f"{seconds / 86400:g}d" if seconds >= 86400 else f"{seconds / 3600:g}h"
