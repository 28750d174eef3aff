"""NCCL's recorder stamps ``time_discovered_*`` when it retires an entry or dumps (``update_state`` in ``retire_id``
and ``dump_entries``): an unretired entry found started or completed carries the time of the dump itself. These
dumps were built by an outside tester from PyTorch's format, with that rule applied to them (an on-demand capture
of a running job; two jobs dumped by the watchdog on its 600 s timeout), ring buffers cut to their last 48 entries.
"""

from __future__ import annotations

import pickle
import tarfile
from pathlib import Path

import pytest

from rankscope.analytics import diagnose
from rankscope.analytics.collectives.clock import dump_pass
from rankscope.datasets.loading.inputs import load_inputs
from rankscope.datasets.readers.flight_recorder import read_fr_dir

OUTSIDE = Path(__file__).resolve().parents[1] / "data" / "outside"


def _unpacked(name: str, tmp_path: Path) -> Path:
    with tarfile.open(OUTSIDE / name) as tar:
        tar.extractall(tmp_path, filter="data")
    (case,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    return case / "dumps"


@pytest.mark.parametrize("layout", ["tp=4,pp=2,dp=4", None])
def test_an_on_demand_capture_of_a_running_job_is_healthy(tmp_path: Path, layout: str | None) -> None:
    """Every rank has ops in flight, a few ms old against the time the dump stamped: a running job. It was
    `inconclusive` ("the dumps carry no capture time"), which the dev scorer counts as a miss for a clean job."""
    v = diagnose(load_inputs(_unpacked("fr-nccl-ondemand-healthy-tp4pp2dp4.tar.xz", tmp_path), layout=layout))
    assert v.verdict.value == "healthy" and not v.suspect_nodes and not v.culprit_ranks, v.explain()
    assert any("dumps' own stamps bound" in r for r in v.reasons), v.reasons


@pytest.mark.parametrize(
    ("case", "layout", "culprit", "node"),
    [
        ("fr-nccl-timeout-compute-hang-tp8pp4dp2.tar.xz", "tp=8,pp=4,dp=2", 21, "node-2"),
        ("fr-nccl-timeout-pipeline-send-tp4pp4dp4.tar.xz", "tp=4,pp=4,dp=4", 37, "node-4"),
    ],
)
def test_watchdog_dumps_of_a_hang_name_the_rank_the_waits_end_at(
    tmp_path: Path, case: str, layout: str, culprit: int, node: str
) -> None:
    """The peers' ops were found started by the dump, 600 s after they were created: overdue without any flag."""
    v = diagnose(load_inputs(_unpacked(case, tmp_path), layout=layout, gpus_per_node=8))
    assert v.verdict.value == "hang" and v.culprit_ranks == (culprit,), v.explain()
    assert v.suspect_nodes == (node,), v.explain()


def test_a_tp_group_stuck_inside_its_collective_is_said_so(tmp_path: Path) -> None:
    """All 8 members of one TP group (one node) started an all_gather that never completed; the job backs up
    behind them. The reasons said the chain ends at ranks "which wait for nobody", and where the wavefront stops
    was a downstream DP group one of them had not reached."""
    dumps = _unpacked("fr-nccl-timeout-tp-group-stuck-inside-tp8pp4dp2.tar.xz", tmp_path)
    v = diagnose(load_inputs(dumps, layout="tp=8,pp=4,dp=2", gpus_per_node=8))
    assert v.verdict.value == "hang" and v.culprit_ranks == tuple(range(24, 32)), v.explain()
    assert v.suspect_nodes == ("node-3",), v.explain()
    assert any("ends inside pg 70 TENSOR_MODEL_PARALLEL_GROUP" in r and "none finished it" in r for r in v.reasons)
    assert not any("wavefront stops" in r for r in v.reasons), v.reasons


def test_the_pass_is_the_agreeing_newest_stamps_of_unretired_entries(tmp_path: Path) -> None:
    dumps = read_fr_dir(_unpacked("fr-nccl-ondemand-healthy-tp4pp2dp4.tar.xz", tmp_path))
    d = next(x for x in dumps if dump_pass(x) is not None)
    at = dump_pass(d)
    assert at == max(t for e in d.entries for t in (e.time_discovered_started_ns, e.time_discovered_completed_ns) if t)
    i = next(i for i, e in enumerate(d.entries) if not e.retired and e.state in ("started", "completed"))
    e = d.entries[i]

    def with_entry(x):
        return type(d)(**{**vars(d), "entries": (*d.entries[:i], x, *d.entries[i + 1 :])})

    # one entry found 5 s before the others: not one pass (stamps another recorder, or an earlier dump, wrote)
    early = e._replace(time_discovered_started_ns=at - 5_000_000_000, time_discovered_completed_ns=None)
    assert dump_pass(with_entry(early)) is None
    # an entry created after the "pass": the stamps are not the dump's time
    late = d.entries[-1]._replace(time_created_ns=at + 2_000_000_000)
    assert dump_pass(type(d)(**{**vars(d), "entries": (*d.entries[:-1], late)})) is None
    # retired entries are stamped when retired: never a pass
    retired = type(d)(**{**vars(d), "entries": tuple(x._replace(retired=True) for x in d.entries)})
    assert dump_pass(retired) is None
    # a recorder that stamps each start as it happens (retired entries' start and completion apart): no pass
    eager = tuple(
        x._replace(time_discovered_started_ns=x.time_discovered_completed_ns - 40_000_000)
        if x.retired and x.time_discovered_completed_ns
        else x
        for x in d.entries
    )
    assert dump_pass(type(d)(**{**vars(d), "entries": eager})) is None


def test_a_hang_recorded_by_a_recorder_that_stamps_starts_as_they_happen_is_never_healthy(tmp_path: Path) -> None:
    """Two outside testers wrote hung dumps whose stuck ops were stamped started when they started (PyTorch stamps
    them when it dumps). Their unretired stamps then read as the dump's time and the waits as young: such dumps
    must stay `inconclusive`, never `healthy`. Their retired entries give the recorder away."""
    src = _unpacked("fr-nccl-timeout-compute-hang-tp8pp4dp2.tar.xz", tmp_path)
    out = tmp_path / "eager"
    out.mkdir()
    for f in src.iterdir():
        raw = pickle.loads(f.read_bytes())
        seen = max(t for e in raw["entries"] for t in (e["time_created_ns"], e["time_discovered_completed_ns"]) if t)
        for e in raw["entries"]:
            if e["retired"] and e["time_discovered_completed_ns"]:
                e["time_discovered_started_ns"] = e["time_discovered_completed_ns"] - 40_000_000
            elif e["state"] == "started":  # its kernel began after all else the dump saw
                e["time_discovered_started_ns"] = seen + 200_000
        (out / f.name).write_bytes(pickle.dumps(raw, protocol=4))
    v = diagnose(load_inputs(out, layout="tp=8,pp=4,dp=2", gpus_per_node=8))
    assert v.verdict.value == "inconclusive" and not v.suspect_nodes, v.explain()


@pytest.mark.parametrize(("timeout_ms", "premise"), [(600_000, False), (3_600_000, True)])
def test_a_hang_younger_than_the_job_s_own_timeout_rests_on_a_premise(
    tmp_path: Path, timeout_ms: int, premise: bool
) -> None:
    """The peers have waited about 600 s. Against a 10-minute collective timeout that is the watchdog's own
    finding; against a 1-hour one, a long pause on rank 21 (a checkpoint, an evaluation) looks alike in one
    capture: still a hang naming rank 21, flagged `stuck_on_premise` so the executor collects more, never evicts."""
    src = _unpacked("fr-nccl-timeout-compute-hang-tp8pp4dp2.tar.xz", tmp_path)
    out = tmp_path / "dumps"
    out.mkdir()
    for f in src.iterdir():
        raw = pickle.loads(f.read_bytes())
        for e in raw["entries"]:
            e["timeout_ms"] = timeout_ms
        (out / f.name).write_bytes(pickle.dumps(raw, protocol=4))
    v = diagnose(load_inputs(out, layout="tp=8,pp=4,dp=2", gpus_per_node=8))
    assert v.verdict.value == "hang" and v.culprit_ranks == (21,), v.explain()
    assert bool(v.details.get("stuck_on_premise")) is premise, v.details
    assert any("younger than its collective timeout (3.6e+03 s)" in r for r in v.reasons) is premise, v.reasons


@pytest.mark.parametrize(
    ("case", "layout"),
    [
        ("fr-nccl-batched-p2p-stage-compute-hang-tp4pp4dp2.tar.xz", "tp=4,pp=4,dp=2"),
        ("fr-nccl-batched-cp-ring-member-stuck-tp4cp4dp2.tar.xz", "tp=4,cp=4,dp=2"),
    ],
)
def test_batched_send_recv_take_their_batch_state(tmp_path: Path, case: str, layout: str) -> None:
    """``batch_isend_irecv`` (Megatron's pipeline with ``batch_p2p_comm``, a context-parallel ring step): PyTorch
    records each op with no events, so it stays ``scheduled`` forever, and one ``nccl:coalesced`` entry of the
    same p2p sequence id carries the batch's state. Rank 9 (stage 1; a ring member) never posts its send. Read
    as written, every rank blocked in a batch waited for nobody: the whole pipeline (node-0..3), the whole ring
    (2 nodes) was named."""
    v = diagnose(load_inputs(_unpacked(case, tmp_path), layout=layout, gpus_per_node=8))
    assert v.verdict.value == "hang" and v.culprit_ranks == (9,), v.explain()
    assert v.suspect_nodes == ("node-1",), v.explain()


def test_a_batch_state_reaches_its_ops_and_only_them() -> None:
    """The reader gives each op of a batch the ``coalesced`` entry's state and times; a lone send, an op whose own
    events moved it, and a batch whose ``coalesced`` entry is not recorded yet keep theirs."""
    from rankscope.datasets.domain.flight_recorder import FREntry
    from rankscope.datasets.readers.fr_batches import with_batch_states

    def e(
        rid: int, op: str, seq: int, state: str = "scheduled", started: int | None = None, pg: str = "3", coll: int = 0
    ) -> FREntry:
        p2p = op in ("send", "recv")
        return FREntry(
            rid, pg, pg, "", coll, seq, rid, f"nccl:{op}", "nccl", op, p2p,
            0 if p2p else None, 1 if p2p else None, state, False, 1, started, None, None, 600_000,
            (), (), (), (),
        )  # fmt: skip

    entries = [
        e(0, "send", 1, "completed", 5),  # a lone send with its own events
        e(1, "send", 2),
        e(2, "all_reduce", 0, "started", 6, pg="tp", coll=9),  # another group's op in between
        e(3, "recv", 2),
        e(4, "coalesced", 2, "started", 7),
        e(5, "send", 3),  # a lone send still queued, then a collective batch's coalesced entry on its group
        e(6, "coalesced", 3, "completed", 8, coll=1),
        e(7, "send", 4),  # its batch's coalesced entry not recorded yet
    ]
    out = with_batch_states(entries)
    states = [x.state for x in out]
    assert states == ["completed", "started", "started", "started", "started", "scheduled", "completed", "scheduled"]
    assert out[1].time_discovered_started_ns == 7 and out[0].time_discovered_started_ns == 5
    assert with_batch_states(entries[:2]) == entries[:2]  # no coalesced entry: as written


def test_nccl_dumps_without_timing_name_no_machine_to_evict_on_their_own(tmp_path: Path) -> None:
    """NCCL timing off (``TORCH_NCCL_ENABLE_TIMING`` unset, the default): no op is ever ``started``, so the op a rank
    is blocked in is only inferred from the order it issued them, and a rank queued behind a transfer can look like
    where the waits end (an outside tester's dumps of a pipeline whose rank 22 left none). Without a capture time
    nothing is named; dumped on the watchdog's timeout the hang is named below the eviction floor, with why."""
    from dataclasses import replace

    from rankscope.config import Config

    dumps = _unpacked("fr-nccl-timing-off-missing-dump-tp4pp4dp2.tar.xz", tmp_path)
    inputs = load_inputs(dumps, layout="tp=4,pp=4,dp=2", gpus_per_node=8)
    v = diagnose(inputs)
    assert v.verdict.value == "inconclusive" and not v.suspect_nodes, v.explain()
    cfg = Config()
    cfg = replace(cfg, collectives=replace(cfg.collectives, dumped_on_timeout=True))
    v = diagnose(inputs, cfg)
    assert v.verdict.value == "hang" and 22 in v.culprit_ranks and "node-2" in v.suspect_nodes, v.explain()
    assert v.confidence <= 0.5 and any("No op start is recorded" in r for r in v.reasons), v.explain()
