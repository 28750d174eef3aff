"""The windowed detectors on the metric cube, chosen only by ``rankscope detect --detector NAME`` (or
``performance.detector`` in the configuration); ``diagnose`` uses ``peer-change`` unless told otherwise.

Why they stay selectable: they are the baselines the peer-change detector is measured against (the README's
figures), and the temporal ones (``mad``, ``iforest``, ``lstm-vae``) are what a user with a model of their
own fleet's normal windows wants to try. They are not calibrated per job (a fixed score threshold) and see
static offsets as faults, so they are never run beside peer-change on the same job: one job, one detector.

``peer-distance`` (Minder-style distance to the peers) and ``peer-mad`` compare units directly; ``mad``,
``iforest`` and ``lstm-vae`` learn the windows of every unit's deviation from its peers. They see the
same cube as the default detector (counters as rates, one value per block), each level on its own
(GPUs among GPUs, machines among machines), and an alert needs the same unit on top for the continuity
window. They are not calibrated per job: their threshold is a fixed score.
"""

from __future__ import annotations

from rankscope.analytics.performance.metrics import MetricAlert
from rankscope.config import PerfConfig
from rankscope.datasets.domain.metrics import MetricCube
from rankscope.models.registry import make_peer_detector


def level_alerts(cube: MetricCube, cfg: PerfConfig) -> tuple[list[MetricAlert], float, int]:
    """(alerts of every level, the detector's threshold, units compared)."""
    alerts: list[MetricAlert] = []
    threshold = float(cfg.threshold)
    n_units = 0
    L = cube.block_s
    for lv in cube.levels:
        n, t = lv.values.shape[:2]
        if n < cfg.min_machines or t * L < max(cfg.window_seconds, L):
            continue
        n_units += n
        det = make_peer_detector(
            cfg.detector,
            window_s=max(cfg.window_seconds, L),
            continuity_s=cfg.continuity_seconds,
            sample_interval_s=L,
            threshold=cfg.threshold if cfg.detector == "peer-distance" else None,
        )
        threshold = float(det.threshold)
        found = det.fit(lv.values).detect(lv.values)
        for i in found.alerted:
            node = cube.machines[int(lv.unit_machine[i])]
            gpu = lv.unit_gpu[i]
            alerts.append(
                MetricAlert(
                    f"{node}/gpu{gpu}" if gpu is not None else node,
                    node,
                    float(found.scores[i]),
                    cube.t0_s + found.onset_index[i] * L,
                    cube.t0_s + found.alert_index[i] * L,
                    tuple(lv.features[j] for j in found.drivers(int(i))),
                    lv.level,
                )
            )
    return alerts, threshold, n_units
