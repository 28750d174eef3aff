"""``rankscope detect PATH``: metric outliers and timing stragglers only (no stacks), one verdict."""

from __future__ import annotations

from enum import Enum
from pathlib import Path

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
    MetricFormatOpt,
    NodeLabelOpt,
    OrderOpt,
    metric_input_flags,
    store_topology_notes,
)

EXAMPLES = """\b
Examples:
  rankscope detect /shared/telemetry/run3            # metrics*.csv|parquet, *.prom, query-result *.json
  rankscope detect /shared/scrapes --node-label Hostname --metric-format prometheus-text
  rankscope detect /data/rankscope --job llama70b-run3 --detector peer-distance --format json
\b
Detectors (rankscope.models): peer-change (the default) names a machine whose relation to its peers
changed after an onset and persisted, with a threshold calibrated on the job itself (1 false machine per
1,000 machine-hours). The others are uncalibrated baselines for comparison (a fixed score threshold):
peer-distance (Minder-style distance to the peers) and peer-mad compare machines directly; mad, iforest
and lstm-vae (torch) learn the windows of every machine's deviation from its peers.
"""


class Detector(str, Enum):
    """``rankscope.models.DETECTORS`` (a test keeps them equal; the CLI must not import the models to list them)."""

    peer_change = "peer-change"
    peer_distance = "peer-distance"
    peer_mad = "peer-mad"
    mad = "mad"
    iforest = "iforest"
    lstm_vae = "lstm-vae"


def register(app: typer.Typer) -> None:
    @app.command("detect", epilog=EXAMPLES)
    @handle_errors
    def detect(
        ctx: typer.Context,
        path: Path = typer.Argument(
            ...,
            metavar="PATH",
            help="A store, or a directory with metric files (metrics*.csv|parquet, Prometheus *.prom scrapes or "
            "query-result JSON) and/or timings*.csv|parquet.",
        ),
        layout: LayoutOpt = None,
        order: OrderOpt = DEFAULT_ORDER,
        gpus_per_node: GpusPerNodeOpt = None,
        job: JobOpt = None,
        continuity_seconds: float = typer.Option(
            None,
            "--continuity-seconds",
            metavar="S",
            show_default="240",
            help="How long a change must last to name a machine (shorter events name nobody).",
        ),
        detector: Detector = typer.Option(
            None, "--detector", show_default="peer-change", help="Metric detector (timings are unaffected)."
        ),
        node_label: NodeLabelOpt = None,
        metric_format: MetricFormatOpt = None,
        fmt: FormatOpt = Format.text,
        config: ConfigOpt = None,
    ) -> None:
        """Find the machine unlike its peers from metrics or step timings only.

        Metrics: every machine does the same work, so one whose relation to its peers changed after an
        onset and stayed changed for the continuity window is suspect (a static offset is not). Timings: a
        rank that became slower than its symmetric peers, step after step.
        """
        from rankscope.cli.diagnose import render, run_diagnosis

        store_topology_notes(ctx, path, job)
        verdict, inputs = run_diagnosis(
            path,
            layout=layout,
            order=order,
            gpus_per_node=gpus_per_node,
            job=job,
            config=config,
            sources=("metrics", "timings"),
            flags={
                "inputs": metric_input_flags(node_label, metric_format),
                "performance": {
                    "continuity_seconds": continuity_seconds,
                    "detector": detector.value if detector is not None else None,
                },
            },
        )
        if inputs.metrics is None and inputs.timings is None:
            fail(f"{path}: no metrics or timings found (files named metrics*/timings*, or a store with those tables)")
        echo(render(verdict, fmt))
