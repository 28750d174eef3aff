"""Re-capture the real 4-rank gloo Flight Recorder dumps in this folder (run once by hand; the files are kept).

    OUT=tests/data/fr_gloo MODE=hang    .venv/bin/torchrun --standalone --nproc-per-node 4 tests/data/fr_gloo/capture.py
    OUT=tests/data/fr_gloo MODE=healthy .venv/bin/torchrun --standalone --nproc-per-node 4 tests/data/fr_gloo/capture.py

Every dump goes through the rankscope hook's own ``dump_flight_recorder`` (``_dump_fr_trace_json``), so each
file carries the time it was taken (``rankscope_dump_time_ns``), as in production.

- ``hang``: the probe's job (``../shared/data/torch_gloo_hang_probe``): 3 all_reduce, a broadcast, an all_reduce on
  a 2-rank group [0, 1], a barrier; then rank 3 skips the next all_reduce and sleeps. Each rank dumps from a side
  thread ``HANG_DUMP_S`` (8 s) after reaching that point: ranks 0-2 blocked in the all_reduce, rank 3 asleep.
  Rank 3 joins after 12 s and the job ends cleanly. Files: ``hang/fr_rank<R>.json``.
- ``healthy``: the same groups, then steps of 3 all_reduce (+ one on [0, 1]) with per-rank compute of 50-200 ms;
  every rank dumps 3 s in, while training. Files: ``healthy/fr_rank<R>.json``.
"""

import os
import threading
import time
from datetime import timedelta

os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "2000")
import torch
import torch.distributed as dist

from rankscope.collectors import hook

mode = os.environ.get("MODE", "hang")
out = os.path.join(os.environ["OUT"], mode)
os.makedirs(out, exist_ok=True)
dist.init_process_group("gloo", timeout=timedelta(seconds=60))
r = dist.get_rank()
x = torch.ones(1 << 10)


def dump_after(delay: float) -> threading.Thread:
    th = threading.Thread(target=lambda: (time.sleep(delay), hook.dump_flight_recorder(f"{out}/fr_rank{r}.json")))
    th.start()
    return th


sub = dist.new_group([0, 1])
for _ in range(3):
    dist.all_reduce(x)
dist.broadcast(x, 0)
if r in (0, 1):
    dist.all_reduce(x, group=sub)
dist.barrier()
if mode == "hang":
    th = dump_after(float(os.environ.get("HANG_DUMP_S", "8")))
    if r == 3:
        time.sleep(12)
    dist.all_reduce(x)
else:
    th = dump_after(3.0)
    for _ in range(40):  # a fixed number of steps (about 6 s): every rank issues the same collectives
        for _ in range(3):
            dist.all_reduce(x)
        if r in (0, 1):
            dist.all_reduce(x, group=sub)
        time.sleep(0.05 * (1 + r))
th.join()
dist.barrier()
dist.destroy_process_group()
