"""One machine slot of the local backend: ``python -m rankscope.recovery.backends.slot EXIT_FILE -- ARGV...``.

Runs ARGV (the machine's torchrun agent) and, when it ends, writes its exit status to EXIT_FILE as JSON
(``{"exit_code": N, "time": T}``, atomically), so the backend, from any process, knows how each machine's
agent ended: the supervisor outlives the backend process that launched it (an agent's ``rankscope
recover`` subprocess relaunches the job and exits). A stop signal is delivered to the whole slot by
the backend; this supervisor ignores it and waits for ARGV, so the exit status is still recorded.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

from rankscope.spine import atomic_write


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) < 3 or args[1] != "--":
        print("usage: python -m rankscope.recovery.backends.slot EXIT_FILE -- ARGV...", file=sys.stderr)
        return 2
    exit_file, cmd = args[0], args[2:]
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda signum, frame: None)  # ARGV gets it too; wait for it to end
    try:
        child = subprocess.Popen(cmd, stdin=subprocess.DEVNULL)
    except OSError as exc:
        atomic_write(exit_file, json.dumps({"exit_code": 127, "time": time.time(), "error": str(exc)}), durable=False)
        return 127
    code = child.wait()
    atomic_write(exit_file, json.dumps({"exit_code": code, "time": time.time()}), durable=False)
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main())
