"""``rankscope demo``: a synthetic 3D-parallel job with an injected hang, dumped and diagnosed."""

from __future__ import annotations

import tempfile
from enum import Enum
from pathlib import Path

import typer

from rankscope.cli.console import echo, handle_errors


class Fault(str, Enum):
    """The faults ``rankscope.harness.synthetic.FAULTS`` injects (a test keeps the two lists equal)."""

    none = "none"
    compute_hang = "compute-hang"
    collective_hang = "collective-hang"
    p2p_hang = "p2p-hang"
    dataloader_stall = "dataloader-stall"
    checkpoint_stall = "checkpoint-stall"
    crash = "crash"
    slow_rank = "slow-rank"


class DemoFormat(str, Enum):
    text = "text"
    json = "json"


EXAMPLES = """\b
Examples:
  rankscope demo
  rankscope demo --fault slow-rank --layout tp=8,pp=4,dp=16 --out /tmp/demo-dumps
"""


def register(app: typer.Typer) -> None:
    @app.command(epilog=EXAMPLES)
    @handle_errors
    def demo(
        layout: str = typer.Option(
            "tp=8,pp=4,dp=16", "--layout", metavar="LAYOUT", help="Layout of the synthetic job (512 ranks by default)."
        ),
        gpus_per_node: int = typer.Option(8, "--gpus-per-node", metavar="N", help="Ranks per node."),
        fault: Fault = typer.Option(Fault.compute_hang, "--fault", help="Injected fault."),
        seed: int = typer.Option(7, "--seed", metavar="N", help="Random seed (picks the faulty rank)."),
        out_dir: Path = typer.Option(
            None, "--out", metavar="DIR", help="Where to write the dumps (default: a temporary directory)."
        ),
        fmt: DemoFormat = typer.Option(DemoFormat.text, "--format", help="text for people, json for machines."),
    ) -> None:
        """Generate a synthetic job with an injected fault, diagnose it, check the answer.

        The job's py-spy dumps and manifest are written like a real capture, then diagnosed as
        'rankscope diagnose' would; exit 1 when the verdict misses the injected fault.
        """
        from rankscope.analytics import diagnose
        from rankscope.datasets.loading.inputs import load_inputs
        from rankscope.harness.synthetic import generate_job
        from rankscope.reports.text import render_text

        job = generate_job(layout, gpus_per_node=gpus_per_node, fault=fault.value, seed=seed)
        with tempfile.TemporaryDirectory(prefix="rankscope-demo-") as tmp:
            root = Path(out_dir) if out_dir else Path(tmp) / "dumps"
            job.write_dir(root, fmt="mixed")
            n_files = sum(1 for p in root.rglob("*") if p.is_file())
            inputs = load_inputs(root, layout=layout, gpus_per_node=gpus_per_node, job=f"demo-{fault.value}")
            verdict = diagnose(inputs)
        t = job.truth
        if fmt is DemoFormat.json:
            echo(verdict.to_json(indent=2))
            return
        echo(
            f"synthetic job: {layout} on {len(job.topology.node_names)} nodes "
            f"({job.topology.world_size} ranks), {n_files} dump files; injected: {t.fault} on rank(s) "
            f"{', '.join(map(str, t.culprit_ranks)) or '-'} ({', '.join(t.culprit_nodes) or '-'})\n"
        )
        echo(render_text(verdict))
        ok = (
            verdict.verdict == t.expected_verdict
            and set(t.culprit_nodes) <= set(verdict.suspect_nodes)
            and (not t.culprit_nodes or bool(set(t.culprit_nodes) & set(verdict.culprit_nodes)))
        )
        echo(
            f"\nground truth: {t.expected_verdict}, culprit {', '.join(t.culprit_nodes) or '-'} -> "
            f"{'CORRECT' if ok else 'WRONG'}"
        )
        if not ok:
            raise typer.Exit(1)
