"""The series of a metric stream: global codes for names, one slot per series, and where each slot goes.

A *series* is one (machine, GPU, metric, labels) combination; the binning accumulates per series and
block (:mod:`.metric_binning`), and only at the end are series folded into the cube's units and
features (:func:`fold_plan`), when every series is known:

- the unit is the GPU for series with a ``gpu`` label, the machine otherwise;
- the feature is the metric, split by any label that distinguishes several series of one metric on one
  unit (``node_network_receive_bytes_total{device="ib0"}``), except labels that only say which machine,
  GPU or software emitted it (:data:`IDENTITY_LABELS`) and per-core or per-process labels that are
  summed over (:data:`SUMMED_LABELS`);
- several series on one unit and feature (per-core CPU counters, a pod that restarted) are pooled:
  gauges average over them, counters give the summed increase over the summed seconds.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

IDENTITY_LABELS = frozenset(
    {
        "instance",
        "job",
        "Hostname",
        "hostname",
        "UUID",
        "uuid",
        "modelName",
        "pci_bus_id",
        "DCGM_FI_DRIVER_VERSION",
        "DCGM_FI_DEV_BRAND",
        "DCGM_FI_DEV_SERIAL",
        "container",
        "namespace",
        "pod",
        "exported_pod",
        "exported_container",
        "exported_namespace",
        "exported_instance",
        "exported_job",
        "node_column",
        "cluster",
        "region",
        "zone",
        "endpoint",
        "service",
        "prometheus",
        "prometheus_replica",
        "err",
        "Hostname_1",
    }
)
"""Labels that say which machine, GPU or software emitted a series, never what it measures."""
SUMMED_LABELS = frozenset({"cpu", "core", "queue", "irq", "softirq", "pid", "rank"})
"""Per-core, per-queue and per-process labels: the unit's value pools them (sum of counters, mean of gauges)."""
DCGM_IDENTITY = frozenset({"device"})  # dcgm-exporter's device="nvidia0" repeats the gpu label


class Codes:
    """A growing dictionary of one string column: name -> dense code (``None`` has a code too, when seen)."""

    def __init__(self) -> None:
        self.index: dict[str | None, int] = {}
        self.names: list[str | None] = []
        self._set = pa.array([], pa.string())  # the non-null names, for lookups in Arrow
        self._set_codes = np.zeros(0, np.int64)

    def code(self, name: str | None) -> int:
        c = self.index.get(name)
        if c is None:
            c = self.index[name] = len(self.names)
            self.names.append(name)
        return c

    def lut(self, dictionary: pa.Array) -> np.ndarray:
        """Global codes of a chunk's dictionary values (looked up in Arrow; only new names touch Python)."""
        if len(dictionary) == 0:
            return np.zeros(0, np.int64)
        values = dictionary.cast(pa.string()) if not pa.types.is_string(dictionary.type) else dictionary
        pos = pc.index_in(values, value_set=self._set)
        if pos.null_count:
            for name in pc.filter(values, pc.is_null(pos)).to_pylist():
                self.code(name)
            named = [(n, c) for n, c in self.index.items() if n is not None]
            self._set = pa.array([n for n, _ in named], pa.string())
            self._set_codes = np.array([c for _, c in named], np.int64)
            pos = pc.index_in(values, value_set=self._set)
        return self._set_codes[np.asarray(pos.to_numpy(zero_copy_only=False), dtype=np.int64)]

    def of(self, arr: pa.DictionaryArray) -> np.ndarray:
        """Global codes (int64) of every row of a dictionary array; nulls get the code of ``None``."""
        lut = self.lut(arr.dictionary)
        if arr.null_count:
            lut = np.append(lut, self.code(None))
            idx = arr.indices.fill_null(len(arr.dictionary))
        else:
            idx = arr.indices
        return lut[idx.to_numpy(zero_copy_only=False)]


class Registry:
    """Series slots: ``slot(node, gpu, metric, labels)`` -> a dense int, assigned on first sight.

    Rows without extra labels go through a dense lookup table over (node, gpu, metric) codes (one gather
    per row); rows with labels through their label combination (``lt``, a code of the tuple of label values).
    """

    def __init__(self) -> None:
        self.nodes = Codes()
        self.metrics = Codes()
        self.gpus = Codes()
        self.gpus.code(None)  # code 0: no GPU (a machine-level series)
        self.label_names: list[str] = []
        self.label_values: dict[str, Codes] = {}
        self.label_tuples: dict[tuple[int, ...], int] = {(): 0}
        self.tuple_list: list[tuple[int, ...]] = [()]
        self._lut = np.full(0, -1, np.int64)
        self._dims = (0, 0, 0)
        self._keyed: dict[tuple[int, int, int, int], int] = {}
        self.slot_node = np.zeros(0, np.int64)
        self.slot_gpu = np.zeros(0, np.int64)
        self.slot_metric = np.zeros(0, np.int64)
        self.slot_lt = np.zeros(0, np.int64)
        self.n = 0

    def _new_slots(self, node: np.ndarray, gpu: np.ndarray, metric: np.ndarray, lt: np.ndarray) -> np.ndarray:
        k = node.size
        first = self.n
        self.n += k
        if self.n > self.slot_node.size:
            cap = max(self.n, 2 * self.slot_node.size, 1024)
            for name in ("slot_node", "slot_gpu", "slot_metric", "slot_lt"):
                arr = getattr(self, name)
                grown = np.zeros(cap, np.int64)
                grown[: arr.size] = arr
                setattr(self, name, grown)
        self.slot_node[first : self.n] = node
        self.slot_gpu[first : self.n] = gpu
        self.slot_metric[first : self.n] = metric
        self.slot_lt[first : self.n] = lt
        return np.arange(first, self.n, dtype=np.int64)

    def _grow_lut(self) -> None:
        nn, ng, nm = len(self.nodes.names), len(self.gpus.names), len(self.metrics.names)
        cn, cg, cm = self._dims
        if nn <= cn and ng <= cg and nm <= cm:
            return
        dims = (max(nn, 2 * cn, 64), max(ng, cg, 16), max(nm, cm * 2 if nm > cm else cm, 32))
        lut = np.full(dims[0] * dims[1] * dims[2], -1, np.int64)
        if self._lut.size:
            old = self._lut.reshape(self._dims)
            lut.reshape(dims)[:cn, :cg, :cm] = old
        self._lut, self._dims = lut, dims

    def slots_plain(self, node: np.ndarray, gpu: np.ndarray, metric: np.ndarray) -> np.ndarray:
        """Slots of rows without extra labels (global codes from :class:`Codes`)."""
        self._grow_lut()
        _, cg, cm = self._dims
        flat = node * cg
        flat += gpu
        flat *= cm
        flat += metric
        slot = self._lut[flat]
        missing = slot < 0
        if missing.any():
            mark = np.zeros(self._lut.size, bool)
            mark[flat[missing]] = True
            keys = np.flatnonzero(mark)
            new_node, rest = np.divmod(keys, cg * cm)
            new_gpu, new_metric = np.divmod(rest, cm)
            self._lut[keys] = self._new_slots(new_node, new_gpu, new_metric, np.zeros(keys.size, np.int64))
            slot = self._lut[flat]
        return slot

    def slots_of_chunk(
        self, node: pa.DictionaryArray, gpu: pa.DictionaryArray, metric: pa.DictionaryArray
    ) -> np.ndarray:
        """Slots of a chunk without extra labels, from its dictionary indices: one small lookup table per
        chunk (its dictionaries' product) and one gather per row."""
        parts = []
        for codes, arr in ((self.nodes, node), (self.gpus, gpu), (self.metrics, metric)):
            lut = codes.lut(arr.dictionary)
            idx = arr.indices
            if arr.null_count:
                lut = np.append(lut, codes.code(None))
                idx = idx.fill_null(len(arr.dictionary))
            parts.append((lut, np.asarray(idx.to_numpy(zero_copy_only=False))))
        (ln, xn), (lg, xg), (lm, xm) = parts
        self._grow_lut()
        _, cg, cm = self._dims
        local_lut = self._lut[((ln[:, None, None] * cg + lg[None, :, None]) * cm + lm[None, None, :]).reshape(-1)]
        dg, dm = lg.size, lm.size
        flat = xn.astype(np.int64)
        flat *= dg
        flat += xg
        flat *= dm
        flat += xm
        slot = local_lut[flat]
        if (slot < 0).any():
            mark = np.zeros(local_lut.size, bool)
            mark[flat[slot < 0]] = True
            keys = np.flatnonzero(mark)
            i_n, rest = np.divmod(keys, dg * dm)
            i_g, i_m = np.divmod(rest, dm)
            local_lut[keys] = self.slots_plain(ln[i_n], lg[i_g], lm[i_m])
            slot = local_lut[flat]
        return slot

    def label_tuple_codes(self, columns: dict[str, pa.DictionaryArray], n: int) -> np.ndarray:
        """Per row, the code of its tuple of label values over :attr:`label_names` (0 = no labels)."""
        for name in columns:
            if name not in self.label_values:
                self.label_names.append(name)
                self.label_values[name] = Codes()
                self.label_values[name].code(None)
        codes = np.zeros((n, len(self.label_names)), np.int64)
        for j, name in enumerate(self.label_names):
            if name in columns:
                codes[:, j] = self.label_values[name].of(columns[name])
        combos, inverse = np.unique(codes, axis=0, return_inverse=True)
        ids = np.empty(combos.shape[0], np.int64)
        for i, row in enumerate(combos):
            key = tuple(int(x) for x in row)
            while key and key[-1] == 0:
                key = key[:-1]
            lt = self.label_tuples.get(key)
            if lt is None:
                lt = self.label_tuples[key] = len(self.tuple_list)
                self.tuple_list.append(key)
            ids[i] = lt
        return ids[np.asarray(inverse).reshape(-1)]

    def slots_labelled(self, node: np.ndarray, gpu: np.ndarray, metric: np.ndarray, lt: np.ndarray) -> np.ndarray:
        """Slots of rows with label tuples ``lt`` (rows with ``lt == 0`` share the plain table)."""
        combo = np.stack([node, gpu, metric, lt], axis=1)
        keys, inverse = np.unique(combo, axis=0, return_inverse=True)
        slots = np.empty(keys.shape[0], np.int64)
        plain = keys[:, 3] == 0
        if plain.any():
            slots[plain] = self.slots_plain(keys[plain, 0], keys[plain, 1], keys[plain, 2])
        for i in np.flatnonzero(~plain):
            key = (int(keys[i, 0]), int(keys[i, 1]), int(keys[i, 2]), int(keys[i, 3]))
            s = self._keyed.get(key)
            if s is None:
                s = self._keyed[key] = int(self._new_slots(*(np.array([v]) for v in key))[0])
            slots[i] = s
        return slots[np.asarray(inverse).reshape(-1)]

    def labels_of(self, lt: int) -> dict[str, str]:
        """The label values of tuple code ``lt`` (labels absent from it left out)."""
        out = {}
        for j, code in enumerate(self.tuple_list[lt]):
            value = self.label_values[self.label_names[j]].names[code]
            if value is not None:
                out[self.label_names[j]] = value
        return out


@dataclass(frozen=True)
class FoldPlan:
    """Where each slot goes: level (0 gpu, 1 node), unit and feature indices within the level."""

    level: np.ndarray
    unit: np.ndarray
    feature: np.ndarray
    unit_machine: tuple[np.ndarray, np.ndarray]  # per level: machine index of each unit
    unit_gpu: tuple[tuple[str | None, ...], tuple[str | None, ...]]
    features: tuple[tuple[str, ...], tuple[str, ...]]
    feature_metric: tuple[tuple[int, ...], tuple[int, ...]]  # metric code of each feature
    machines: tuple[str, ...]


def natural(s: str | None) -> tuple[tuple[int, object], ...]:
    """Sort key that orders ``gpu-node-9`` before ``gpu-node-10``."""
    # digit runs by value without int(): a 5,000-digit name must not meet Python's digit limit
    return tuple(
        (0, (len(t.lstrip("0")), t.lstrip("0"))) if t.isdigit() else (1, t) for t in re.split(r"(\d+)", s or "")
    )


def _feature_labels(reg: Registry, slots: np.ndarray) -> dict[int, list[int]]:
    """Per metric code, the label positions that distinguish several series of it on one unit."""
    seen: dict[tuple[int, int, int], list[set[int]]] = {}
    for s in slots[reg.slot_lt[slots] > 0]:
        key = (int(reg.slot_metric[s]), int(reg.slot_node[s]), int(reg.slot_gpu[s]))
        vals = reg.tuple_list[int(reg.slot_lt[s])]
        sets = seen.setdefault(key, [set() for _ in reg.label_names])
        for j in range(len(reg.label_names)):
            sets[j].add(vals[j] if j < len(vals) else 0)
    out: dict[int, set[int]] = {}
    for (m, _, _), sets in seen.items():
        name = reg.metrics.names[m] or ""
        for j, values in enumerate(sets):
            label = reg.label_names[j]
            if len(values) < 2 or label in IDENTITY_LABELS or label in SUMMED_LABELS:
                continue
            if name.startswith("DCGM_") and label in DCGM_IDENTITY:
                continue
            out.setdefault(m, set()).add(j)
    return {m: sorted(js) for m, js in out.items()}


def _feature_names(reg: Registry, slots: np.ndarray) -> tuple[list[str], np.ndarray]:
    """Feature names and each slot's index into them: the metric, or metric{label="value",...} for the
    labels that distinguish series (:func:`_feature_labels`)."""
    flabels = _feature_labels(reg, slots)
    metric = reg.slot_metric[slots]
    names: list[str] = [str(n) for n in reg.metrics.names]
    idx = metric.copy()
    by_name: dict[str, int] = {}
    for i in np.flatnonzero(np.isin(metric, list(flabels))) if flabels else ():
        m = int(metric[i])
        vals = reg.tuple_list[int(reg.slot_lt[slots[i]])]
        parts = []
        for j in flabels[m]:
            value = reg.label_values[reg.label_names[j]].names[vals[j] if j < len(vals) else 0]
            parts.append(f'{reg.label_names[j]}="{value or ""}"')
        name = f"{names[m]}{{{','.join(parts)}}}"
        if name not in by_name:
            by_name[name] = len(names)
            names.append(name)
        idx[i] = by_name[name]
    return names, idx


def fold_plan(reg: Registry, slots: np.ndarray) -> FoldPlan:
    """Units and features of the slots in ``slots`` (the ones that hold data), see the module docstring."""
    node_codes = np.unique(reg.slot_node[slots])
    order = sorted(range(node_codes.size), key=lambda i: natural(reg.nodes.names[int(node_codes[i])]))
    machine_of = np.zeros(len(reg.nodes.names), np.int64)
    machine_of[node_codes[order]] = np.arange(node_codes.size)
    gpu_rank = np.zeros(len(reg.gpus.names), np.int64)
    gpu_rank[sorted(range(len(reg.gpus.names)), key=lambda g: natural(reg.gpus.names[g]))] = np.arange(
        len(reg.gpus.names)
    )
    fnames, fidx_all = _feature_names(reg, slots)
    machine = machine_of[reg.slot_node[slots]]
    gcode = reg.slot_gpu[slots]
    level = (gcode == 0).astype(np.int64)
    unit = np.zeros(slots.size, np.int64)
    feature = np.zeros(slots.size, np.int64)
    unit_machine, unit_gpu, features, feature_metric = [], [], [], []
    n_g = max(len(reg.gpus.names), 1)
    for lv in (0, 1):
        sel = np.flatnonzero(level == lv)
        used = np.unique(fidx_all[sel])
        used = used[np.argsort([fnames[int(f)] for f in used], kind="stable")]
        lut = np.zeros(len(fnames), np.int64)
        lut[used] = np.arange(used.size)
        feature[sel] = lut[fidx_all[sel]]
        key = machine[sel] * n_g + (gpu_rank[gcode[sel]] if lv == 0 else 0)
        ukeys, inverse = np.unique(key, return_inverse=True)
        unit[sel] = np.asarray(inverse).reshape(-1)
        gnames = {int(gpu_rank[g]): reg.gpus.names[g] for g in range(len(reg.gpus.names))}
        unit_machine.append(ukeys // n_g)
        unit_gpu.append(tuple(gnames[int(k % n_g)] if lv == 0 else None for k in ukeys))
        features.append(tuple(fnames[int(f)] for f in used))
        metric_of = np.zeros(len(fnames), np.int64)
        metric_of[fidx_all[sel]] = reg.slot_metric[slots[sel]]
        feature_metric.append(tuple(int(metric_of[int(f)]) for f in used))
    return FoldPlan(
        level,
        unit,
        feature,
        (unit_machine[0], unit_machine[1]),
        (unit_gpu[0], unit_gpu[1]),
        (features[0], features[1]),
        (feature_metric[0], feature_metric[1]),
        tuple(str(reg.nodes.names[int(node_codes[i])]) for i in order),
    )
