"""The tests of :class:`~rankscope.models.peer_change.PeerChangeDetector`: per feature, which references a
unit is compared with, and what each test yields per machine (:func:`feature_tests`).

A test is (feature, direction, level, reference). Host features are compared with the fleet
(``peers``). Per-GPU features on machines with at least 3 GPUs are compared twice: the machine's median
GPU with the other machines' (``peers``: a whole machine that changed), and each GPU with the other GPUs
of its machine (``siblings``: one GPU that changed); with fewer GPUs per machine, each GPU with the
fleet's GPUs. A machine takes its strongest unit per test, and that unit's GPU is kept as evidence.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from rankscope.datasets.domain.metrics import LevelCube, MetricCube
from rankscope.models._change import (
    Best,
    Change,
    change_statistic,
    damping_of,
    direction_of,
    moved,
    nanmedian,
    peer_z,
    raw_move,
    rides_job_change,
    shared_fraction,
    sibling_z,
    smoothing_of,
    undamp,
)

if TYPE_CHECKING:
    from rankscope.models.peer_change import PeerChangeDetector

Test = tuple[str, str, str, str]  # feature, direction, level, reference


@dataclass(frozen=True)
class Calibration:
    """Per test: Gumbel location and scale of the per-machine maxima, and how many machines."""

    feature: str
    direction: str
    loc: float
    scale: float
    machines: int
    floored: bool

    def to_dict(self) -> dict[str, Any]:
        return {
            "feature": self.feature,
            "direction": self.direction,
            "loc": round(self.loc, 3),
            "scale": round(self.scale, 3),
            "machines": self.machines,
            "scale_floored": self.floored,
        }


@dataclass(frozen=True, eq=False)
class FeatureTests:
    """Per machine x test: statistic, effect (reference MADs), onsets, GPU, shared fraction; per test the
    typical reference scale (units per MAD) and the metric's level."""

    tests: list[Test]
    stat: np.ndarray
    effect: np.ndarray
    onset: np.ndarray
    first: np.ndarray
    shared: np.ndarray
    gpu: list[list[str | None]]
    peer_scale: np.ndarray
    level: np.ndarray

    @staticmethod
    def concat(parts: list[FeatureTests], n_machines: int) -> FeatureTests:
        def cols(name: str, fill: float) -> np.ndarray:
            arrays = [getattr(p, name) for p in parts if getattr(p, name).shape[1]]
            return np.concatenate(arrays, axis=1) if arrays else np.full((n_machines, 0), fill)

        return FeatureTests(
            [t for p in parts for t in p.tests],
            cols("stat", -np.inf),
            cols("effect", 0.0),
            cols("onset", -1),
            cols("first", -1),
            cols("shared", 0.0),
            [g for p in parts for g in p.gpu],
            np.concatenate([p.peer_scale for p in parts]) if parts else np.zeros(0),
            np.concatenate([p.level for p in parts]) if parts else np.zeros(0),
        )


def window_blocks(continuity_s: float, block_s: float, quorum: float) -> int:
    """Blocks of the evidence window: an event shorter than ``continuity_s`` touches at most
    ``ceil(C/L) + 1`` blocks (partly the first and the last), so the quorum of the window must hold
    ``C/L + 2`` blocks for such an event never to fill it: ``(C/L + 2) / quorum`` blocks. (With ``+ 1``, a
    strong 213 s CPU burst starting late in a block, plus the residue of un-damping ``node_load1``, held
    9 of 12 blocks and named a machine in a generated no-fault job.)"""
    return max(2, math.ceil((continuity_s / block_s + 2) / quorum))


def threads(n_jobs: int | None) -> int:
    """scikit-learn's convention: None -> 1, -1 -> every CPU this process may use, k -> k."""
    if n_jobs is None or n_jobs == 0:
        return 1
    avail = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, avail + 1 + n_jobs if n_jobs < 0 else min(n_jobs, avail))


@dataclass(frozen=True, eq=False)
class _Ref:
    """One reference of a feature: z of each unit, each unit's machine and GPU, typical scale."""

    name: str
    z: np.ndarray
    machine: np.ndarray
    gpu: tuple[str | None, ...]
    scale: float


def feature_tests(
    det: PeerChangeDetector,
    cube: MetricCube,
    li: int,
    lv: LevelCube,
    j: int,
    order: np.ndarray,
    um: np.ndarray,
    starts: np.ndarray,
) -> FeatureTests:
    """The tests of feature ``j`` of level ``lv`` (module docstring); ``order`` sorts units by machine,
    ``um`` is the sorted units' machine and ``starts`` where each machine's units begin."""
    rng = np.random.default_rng([det.random_state, li, j])
    L = cube.block_s
    feat = lv.features[j]
    x = lv.values[order, :, j].astype(np.float64)
    tau = damping_of(feat)
    if tau > 0:
        x = undamp(x, tau, L)
    if np.isfinite(x).sum(axis=0).max(initial=0) < 3:
        return FeatureTests.concat([], len(cube.machines))
    counter = lv.kinds[j] == "counter"
    n_post = window_blocks(det.continuity_s + smoothing_of(feat), L, det.quorum)
    kw: dict[str, Any] = dict(
        n_base=max(2, math.ceil(det.baseline_s / L)),
        n_min_base=max(2, math.ceil(det.min_baseline_s / L)),
        n_post=n_post,
        coverage=det.coverage,
        quorum=det.quorum,
        noise_floor=0.05,
        stride=max(1, round(n_post / 4)),
    )
    machines = um[starts]
    per_machine = int(np.diff(np.r_[starts, um.size]).max(initial=0))
    sib = sibling_z(x, starts, counter=counter, block_s=L) if lv.level == "gpu" and per_machine >= 3 else None
    refs: list[_Ref] = []
    if sib is not None:
        zm, med, scale = peer_z(sib[2], counter=counter, block_s=L, max_peers=det.max_peers, rng=rng)
        raw_x = sib[2]
        refs.append(_Ref("peers", zm, machines, tuple(None for _ in machines), float(nanmedian(scale))))
        refs.append(_Ref("siblings", sib[0], um, tuple(lv.unit_gpu[i] for i in order), float(nanmedian(sib[1]))))
    else:
        zu, med, scale = peer_z(x, counter=counter, block_s=L, max_peers=det.max_peers, rng=rng)
        raw_x = x
        refs.append(_Ref("peers", zu, um, tuple(lv.unit_gpu[i] for i in order), float(nanmedian(scale))))
    level = float(np.nan_to_num(nanmedian(np.abs(med))))
    d = direction_of(feat, det.directions)
    out: list[FeatureTests] = []
    machine_change: Change | None = None
    for ref in refs:
        vz = np.isfinite(ref.z)
        ch = change_statistic(np.where(vz, ref.z, 0.0), vz, **kw)
        if ref.name == "peers" and sib is not None:
            machine_change = ch  # one unit per machine: the gate of the sibling test below
        for name, best in (("up", ch.up), ("down", ch.down)):
            if d in ("both", name):
                ctx = (det, cube, ref, ch, best, name, level, raw_x, med, machine_change, refs[0].scale)
                out.append(_one_test(feat, lv.level, *ctx))
    return FeatureTests.concat(out, len(cube.machines))


def _one_test(
    feat: str,
    level_name: str,
    det: PeerChangeDetector,
    cube: MetricCube,
    ref: _Ref,
    ch: Change,
    best: Best,
    direction: str,
    level: float,
    raw_x: np.ndarray,
    med: np.ndarray,
    machine_change: Change | None,
    machine_scale: float,
) -> FeatureTests:
    """One test's columns: per machine its strongest unit, and whether that change is shared."""
    n_m = len(cube.machines)
    ustarts = np.flatnonzero(np.r_[True, ref.machine[1:] != ref.machine[:-1]])
    uends = np.r_[ustarts[1:], ref.machine.size]
    umachines = ref.machine[ustarts]
    stat = np.where(np.isfinite(best.stat), best.stat, -np.inf)
    best_unit = ustarts + np.array([int(np.argmax(stat[a:b])) for a, b in zip(ustarts, uends)], dtype=np.int64)
    s_m = np.full(n_m, -np.inf)
    s_m[umachines] = best.stat[best_unit]
    e_m = np.zeros(n_m)
    e_m[umachines] = best.effect[best_unit]
    o_m = np.full(n_m, -1)
    o_m[umachines] = best.onset[best_unit]
    f_m = np.full(n_m, -1)
    f_m[umachines] = best.first[best_unit]
    g_m: list[str | None] = [None] * n_m
    for mi, i in zip(umachines, best_unit):
        g_m[mi] = ref.gpu[i]
    sh = np.zeros(n_m)
    # sharing is only worth checking where a machine could be named: the top few
    for mi in np.argsort(-np.where(np.isfinite(s_m), s_m, -np.inf))[:8]:
        if not np.isfinite(s_m[mi]) or not det.significant(e_m[mi], ref.scale, level):
            continue
        k = int(np.flatnonzero(umachines == mi)[0])
        unit, onset = int(best_unit[k]), int(best.onset[best_unit[k]])
        # the move in the metric's own units caps the z effect: a far outlier's z swings with its peers' spread
        # (a spare idle at 0 % among GPUs at 99 % as their MAD breathes), never its distance to them
        raw = raw_move(raw_x[unit], med, onset, ch.n_post, direction) if ref.name == "peers" else None
        if raw is not None:
            e_m[mi] = min(e_m[mi], raw / ref.scale)
            if not det.significant(e_m[mi], ref.scale, level):
                continue
        sh[mi] = shared_fraction(ch, unit, direction, float(e_m[mi]), np.arange(ustarts[k], uends[k]))
        if ref.name == "peers" and rides_job_change(raw_x, med, unit, onset, ch):
            sh[mi] = 1.0
        # the machine's own level moved with it, by at least half as much: sibling relations change by
        # scale alone (offsets shrink with the level) and prove nothing about one GPU
        if ref.name == "siblings" and machine_change is not None:
            mv = moved(machine_change, k, onset)
            if mv >= det.min_effect and mv * machine_scale >= 0.5 * e_m[mi] * ref.scale:
                sh[mi] = 1.0
    return FeatureTests(
        [(feat, direction, level_name, ref.name)],
        s_m[:, None],
        e_m[:, None],
        o_m[:, None],
        f_m[:, None],
        sh[:, None],
        [g_m],
        np.array([ref.scale]),
        np.array([level]),
    )
