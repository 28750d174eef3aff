"""``rankscope demo``: a synthetic 3D-parallel job with an injected hang, dumped and diagnosed."""

from __future__ import annotations

import tempfile
from pathlib import Path

import typer

from rankscope.cli.console import handle_errors, out


def register(app: typer.Typer) -> None:
    @app.command()
    @handle_errors
    def demo(
        layout: str = typer.Option(
            "tp=8,pp=4,dp=16", "--layout", help="Layout of the synthetic job (>= 512 ranks by default)."
        ),
        gpus_per_node: int = typer.Option(8, "--gpus-per-node", help="Ranks per node."),
        fault: str = typer.Option(
            "compute-hang", "--fault", help="Injected fault (see rankscope.harness.synthetic.FAULTS)."
        ),
        seed: int = typer.Option(7, "--seed", help="Random seed (picks the faulty rank)."),
        out_dir: Path = typer.Option(None, "--out", help="Where to write the dumps (default: a temporary directory)."),
        fmt: str = typer.Option("text", "--format", help="text or json."),
    ) -> None:
        """Generate a job, write its py-spy dumps and manifest, diagnose them, and check the answer."""
        from rankscope.analytics import diagnose
        from rankscope.datasets.loading.inputs import load_inputs
        from rankscope.harness.synthetic import generate_job
        from rankscope.reports.text import render_text

        job = generate_job(layout, gpus_per_node=gpus_per_node, fault=fault, seed=seed)
        with tempfile.TemporaryDirectory(prefix="rankscope-demo-") as tmp:
            root = Path(out_dir) if out_dir else Path(tmp) / "dumps"
            job.write_dir(root, fmt="mixed")
            n_files = sum(1 for p in root.rglob("*") if p.is_file())
            inputs = load_inputs(root, layout=layout, gpus_per_node=gpus_per_node, job=f"demo-{fault}")
            verdict = diagnose(inputs)
        t = job.truth
        if fmt == "json":
            out.print(verdict.to_json(indent=2), markup=False)
            return
        out.print(
            f"synthetic job: {layout} on {len(job.topology.node_names)} nodes "
            f"({job.topology.world_size} ranks), {n_files} dump files; injected: {t.fault} on rank(s) "
            f"{', '.join(map(str, t.culprit_ranks)) or '-'} ({', '.join(t.culprit_nodes) or '-'})\n",
            markup=False,
        )
        out.print(render_text(verdict), markup=False)
        ok = (
            verdict.verdict == t.expected_verdict
            and set(t.culprit_nodes) <= set(verdict.suspect_nodes)
            and (not t.culprit_nodes or bool(set(t.culprit_nodes) & set(verdict.culprit_nodes)))
        )
        out.print(
            f"\nground truth: {t.expected_verdict}, culprit {', '.join(t.culprit_nodes) or '-'} -> "
            f"{'CORRECT' if ok else 'WRONG'}",
            markup=False,
        )
        if not ok:
            raise typer.Exit(1)
