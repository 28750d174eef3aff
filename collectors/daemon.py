"""The long-lived agent process: ``python -m rankscope.collectors.daemon CONFIG_JSON``.

``rankscope agent`` parses and validates its flags, environment and config file with the CLI, then
replaces itself with this module (``os.execv``: same pid, same stdout/stderr, so supervisors and
``kill`` see one process). The daemon that runs beside training for weeks therefore carries no CLI
libraries: typer, rich and pydantic cost about 17 MB of RSS, a sixth of the agent's budget.

The exec'd command line is ``python -c "<bootstrap>" CONFIG_JSON``, where the bootstrap drops the
working directory from ``sys.path`` first (``python -m`` would put it there, and a training job's
directory full of ``*.py`` files must not shadow modules in a week-long daemon); match it with
``pgrep -f rankscope.collectors.daemon``.

``CONFIG_JSON`` is an already-resolved :class:`~rankscope.config.AgentConfig` as a JSON
object (what :func:`exec_argv` writes); it is validated again here, so a hand-written one that is
wrong gets the same one-line error.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict

from rankscope.config import AgentConfig, agent_config_from_json
from rankscope.spine import ConfigError, error_edge

PROG = "rankscope agent"
USAGE = (
    "usage: python -m rankscope.collectors.daemon CONFIG_JSON\n\n"
    "Run the node agent with an already-resolved configuration (a JSON object of AgentConfig fields).\n"
    "`rankscope agent` resolves flags, environment and --config, then execs this; run that instead."
)


BOOTSTRAP = f"import sys; del sys.path[0]; from {__name__} import main; sys.exit(main())"


def exec_argv(config: AgentConfig) -> list[str]:
    """The argv that runs ``config`` in a fresh interpreter (this module, working directory off the path)."""
    return [sys.executable, "-c", BOOTSTRAP, json.dumps(asdict(config))]


def exec_daemon(config: AgentConfig) -> None:
    """Replace this process with the lean daemon running ``config``; never returns."""
    sys.stdout.flush()
    sys.stderr.flush()
    argv = exec_argv(config)
    os.execv(argv[0], argv)


REMOTE_FILESYSTEMS = ("pyarrow._s3fs", "pyarrow._gcsfs", "pyarrow._hdfs", "pyarrow._azurefs")
"""pyarrow's optional remote filesystems, which ``pyarrow.parquet`` loads on import (S3 alone maps 5 MB of
libarrow_s3); the agent writes a local store only."""


def _without_remote_filesystems() -> None:
    """Keep pyarrow's remote filesystems out of this process: an import that finds ``None`` in
    ``sys.modules`` fails, which pyarrow handles as a build without them (6 MB less resident)."""
    for name in REMOTE_FILESYSTEMS:
        sys.modules.setdefault(name, None)  # type: ignore[arg-type]


def main(argv: list[str] | None = None) -> int:
    """Run the agent until SIGTERM/SIGINT (or its own stop conditions); print its summary line.

    Errors go through the spine's one error edge, as in the CLI: one line and exit 2 for a bad
    config or an unreadable file, 130 on Ctrl-C, 1 (one line) for anything else.
    """
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    # a long-lived daemon: return freed Arrow buffers to the OS (the default pools keep them)
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")
    _without_remote_filesystems()
    with error_edge():
        if len(argv) != 1:
            raise ConfigError(
                "usage: python -m rankscope.collectors.daemon CONFIG_JSON (or run `rankscope agent --help`)"
            )
        config = agent_config_from_json(argv[0])
        from rankscope.collectors.agent import (
            Agent,  # after the config is known good: the import pulls in pyarrow
        )

        daemon = Agent(config)
        said = list(daemon.messages)  # e.g. "GPU metrics unavailable": said once, at start
        for msg in said:
            print(f"{PROG}: {msg}", file=sys.stderr, flush=True)
        report = daemon.run()
        for msg in report.messages:
            if msg not in said:
                print(f"{PROG}: {msg}", file=sys.stderr)
        print(report.explain(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
