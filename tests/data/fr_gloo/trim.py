"""Copy real Flight Recorder dumps SMALL into this folder: JSON, the last N entries of each rank (a smaller ring
buffer), frames dropped, and optionally the capture time a collector recorded for them.

    python3 tests/data/fr_gloo/trim.py SRC_DIR DEST_DIR [--last 60] [--dump-time-ns T | --dump-time-files PREFIX]

SRC_DIR holds ``rank_<R>`` pickles (trusted: our own captures) and/or ``*rank<R>.json`` files. The capture
time goes into the top-level ``rankscope_dump_time_ns`` key, where the rankscope hook records it.
"""

import argparse
import json
import pickle
import re
from pathlib import Path

ap = argparse.ArgumentParser()
ap.add_argument("src")
ap.add_argument("dest")
ap.add_argument("--last", type=int, default=60)
ap.add_argument("--dump-time-ns", type=int, default=None)
ap.add_argument("--dump-time-files", default=None, help="per-rank files <PREFIX><R>.txt holding epoch ns")
args = ap.parse_args()
out = Path(args.dest)
out.mkdir(parents=True, exist_ok=True)
for path in sorted(Path(args.src).iterdir()):
    m = re.search(r"rank_?(\d+)(\.json)?$", path.name)
    if not m or (path.suffix != ".json" and (Path(args.src) / (path.name + ".json")).exists()):
        continue
    r = int(m.group(1))
    d = json.loads(path.read_text()) if path.suffix == ".json" else pickle.loads(path.read_bytes())
    d = {k: v for k, v in d.items() if k != "nccl_comm_state"}
    d["entries"] = [{k: v for k, v in e.items() if k != "frames"} for e in d["entries"][-args.last :]]
    if args.dump_time_files:
        d = {"rankscope_dump_time_ns": int(Path(f"{args.dump_time_files}{r}.txt").read_text()), **d}
    elif args.dump_time_ns:
        d = {"rankscope_dump_time_ns": args.dump_time_ns, **d}
    (out / f"rank_{r}.json").write_text(json.dumps(d, default=list))
