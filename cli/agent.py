"""``rankscope agent STORE``: the per-node sidecar (see rankscope.collectors.agent)."""

from __future__ import annotations

from pathlib import Path

import typer

from rankscope.cli.console import echo, fail, handle_errors

EXAMPLES = """\b
Examples:
  rankscope agent /shared/rankscope-store --job llama70b-run3 --run-dir /dev/shm/rankscope --capture-rounds 5
  rankscope agent --run-dir /dev/shm/rankscope --trigger      # ask the running agent for a capture now
  rankscope agent /shared/rankscope-store --job llama70b-run3 --stall-seconds 600 \\
      --recover slurm --recover-args '--slurm-job-id 4242' --apply   # close the loop without a person
"""
NOT_FLAGS = frozenset(
    {"config", "trigger", "apply", "extra", "resolve_agent", "exec_daemon", "request_capture", "shlex", "fail"}
)
"""The command's locals that are not AgentConfig fields."""
PRECEDENCE = (
    "Settings: flags > RANKSCOPE_AGENT_<FIELD> environment variables > --config file (TOML/JSON, an "
    "[agent] table or top-level keys) > defaults."
)


def register(app: typer.Typer) -> None:
    @app.command(
        help="Run the node agent: metrics, health events, stacks on demand and on a stall.\n\n"
        f"With --recover, each capture's verdict leads to recovery without a person.\n\n{PRECEDENCE}",
        epilog=EXAMPLES,
    )
    @handle_errors
    def agent(
        store: str = typer.Argument(
            None, metavar="STORE", help="Store directory to write to (or RANKSCOPE_AGENT_STORE)."
        ),
        job: str = typer.Option(None, "--job", metavar="NAME", help="Job name (store partition)."),
        node: str = typer.Option(
            None, "--node", metavar="NAME", help="This node's name (default: hostname; the hook's per-rank node wins)."
        ),
        run_dir: str = typer.Option(
            None,
            "--run-dir",
            metavar="DIR",
            help="Directory shared with the in-process hook (default: RANKSCOPE_RUN_DIR, as the hook "
            "reads it, else /tmp/rankscope-run).",
        ),
        metric_interval_seconds: float = typer.Option(
            None, "--metric-interval-seconds", help="Sampling interval (default 1)."
        ),
        stall_seconds: float = typer.Option(
            None, "--stall-seconds", help="No step progress for this long fires a capture (default 600)."
        ),
        slow_factor: float = typer.Option(
            None, "--slow-factor", help="Fire on a step this many times slower than baseline (0 = off)."
        ),
        capture_rounds: int = typer.Option(None, "--capture-rounds", help="Captures per firing (5 for fail-slow)."),
        round_interval_seconds: float = typer.Option(
            None, "--round-interval-seconds", help="Seconds between rounds (default 10)."
        ),
        stack_timeout_seconds: float = typer.Option(
            None, "--stack-timeout-seconds", help="Per-process py-spy timeout."
        ),
        launcher_pid: int = typer.Option(None, "--launcher-pid", help="Watch only this launcher's process tree."),
        exit_after_captures: int = typer.Option(None, "--exit-after-captures", help="Stop after N captures (tests)."),
        max_runtime_seconds: float = typer.Option(
            None, "--max-runtime-seconds", help="Stop after this long (0 = never)."
        ),
        metrics_port: int = typer.Option(
            None, "--metrics-port", metavar="PORT", help="Serve the agent's health for Prometheus on 127.0.0.1:PORT."
        ),
        config: Path = typer.Option(
            None, "--config", metavar="FILE", help="TOML or JSON config file (or RANKSCOPE_AGENT_CONFIG)."
        ),
        trigger: bool = typer.Option(False, "--trigger", help="Ask the agent of --run-dir for a capture and exit."),
        recover: str = typer.Option(
            None,
            "--recover",
            help="Close the loop: after each capture run `rankscope recover STORE --job J --backend local|slurm|k8s` "
            "(a separate process; dry run unless --apply).",
        ),
        apply: bool = typer.Option(False, "--apply", help="With --recover: make the calls, not a dry run."),
        recover_args: str = typer.Option(
            None,
            "--recover-args",
            help="With --recover: the backend's options for rankscope recover, e.g. '--slurm-job-id 4242'.",
        ),
    ) -> None:
        """Run until SIGTERM/SIGINT; SIGUSR1 or touching RUN_DIR/trigger captures stacks now."""
        import shlex

        from rankscope.collectors.daemon import exec_daemon
        from rankscope.collectors.trigger import request_capture
        from rankscope.config import resolve_agent

        if (apply or recover_args) and not recover:
            fail("--apply and --recover-args need --recover local|slurm|k8s")
        extra = (*shlex.split(recover_args or ""), *(("--apply",) if apply else ()))
        flags = {k: v for k, v in locals().items() if k not in NOT_FLAGS}
        flags["recover_args"] = extra if recover else None
        if trigger and not store:
            flags["store"] = "(not needed to trigger)"
        cfg = resolve_agent(flags, config_file=config)
        if trigger:
            pid = running_agent(Path(cfg.run_dir))
            if pid is None:
                fail(
                    f"no agent running for {cfg.run_dir} (start one: rankscope agent STORE --run-dir {cfg.run_dir})",
                    1,
                )
            path = request_capture(cfg.run_dir, rounds=cfg.capture_rounds, trigger_file=cfg.trigger_file)
            echo(f"capture requested from the agent (pid {pid}) of {cfg.run_dir}: {path}")
            return
        # the daemon runs for weeks: replace this CLI process (same pid) with one that does not
        # carry typer, rich and pydantic (rankscope.collectors.daemon)
        exec_daemon(cfg)


def running_agent(run_dir: Path) -> int | None:
    """The pid in RUN_DIR/agent.pid when that process is alive, else None (no agent, or one that died)."""
    import os

    from rankscope.datasets.readers.runfiles import AGENT_PID

    try:
        pid = int((run_dir / AGENT_PID).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        return pid  # alive, owned by another user
    return pid
