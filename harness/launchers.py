"""Tiny launchers for tests of the live side (the agent, the exporter): real process trees without torch.

``STUCK_TWO_RANKS`` is a ``python -c`` program that starts two hooked ranks (``RANK`` 0 and 1, one per
node); each logs 4 steps, then waits forever in ``stuck_forever``. The launcher itself sleeps 120 s: the test
stops it (and its session) when done.
"""

from __future__ import annotations

STUCK_TWO_RANKS = r"""
import os, subprocess, sys, time
WORKER = '''
import sys, time
from rankscope.collectors import hook
hook.install()
for step in range(4):
    hook.log_step(step, loss=1.0 / (step + 1))
    time.sleep(0.05)
def stuck_forever():
    while True:
        time.sleep(0.1)
stuck_forever()
'''
procs = [subprocess.Popen([sys.executable, "-c", WORKER], env={**os.environ, "RANK": str(r), "WORLD_SIZE": "2",
         "LOCAL_RANK": str(r), "RANKSCOPE_RANKS_PER_NODE": "1"}) for r in range(2)]
time.sleep(120)
"""
