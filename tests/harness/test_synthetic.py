"""The synthetic stack-dump generator: fault semantics, ground truth, and byte-compatible dump files."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from rankscope.datasets.domain.stacks import ProcessDump
from rankscope.datasets.readers.base import to_rows
from rankscope.harness.synthetic import FAULTS, SyntheticJob, generate_job
from rankscope.harness.synthetic_frames import co_name
from rankscope.spine import InputError

LAYOUT = "tp=2,pp=2,dp=4"
GPUS = 4
VERDICT = {"none": "healthy", "slow-rank": "fail-slow"}


def _job(fault: str, **kw) -> SyntheticJob:
    return generate_job(LAYOUT, gpus_per_node=GPUS, fault=fault, seed=kw.pop("seed", 7), **kw)


def _mains(job: SyntheticJob, snapshot: int = 0) -> dict[int, tuple[str, ...]]:
    """rank -> main-thread functions (co_name, innermost first) of the trainers in one snapshot."""
    out = {}
    for d in job.dumps:
        if d.role == "trainer" and d.snapshot == snapshot:
            out[d.rank] = tuple(co_name(f.function) for f in d.dump.main_thread.frames)
    return out


def _peers(job: SyntheticJob, r: int) -> list[int]:
    t = job.topology
    return [
        x
        for x in range(t.world_size)
        if t.coords["dp"][x] == t.coords["dp"][r] and t.coords["pp"][x] == t.coords["pp"][r] and x != r
    ]


@pytest.fixture(scope="module")
def jobs() -> dict[str, SyntheticJob]:
    return {f: _job(f, checkpoint_process=True) for f in FAULTS}


@pytest.mark.parametrize("fault", FAULTS)
def test_ground_truth_is_consistent(jobs, fault):
    job = jobs[fault]
    truth = job.truth
    assert truth.fault == fault
    assert truth.expected_verdict == VERDICT.get(fault, "hang")
    assert set(truth.culprit_ranks) <= set(truth.affected_ranks)
    assert truth.culprit_nodes == job.topology.nodes_of(list(truth.culprit_ranks)) if truth.culprit_ranks else True
    if fault == "none":
        assert truth.culprit_ranks == () and truth.affected_ranks == () and truth.fault_rank is None
    else:
        assert truth.culprit_ranks[0] == truth.fault_rank
    assert job.n_snapshots == (5 if fault in ("none", "slow-rank") else 1)
    assert json.loads(json.dumps(truth.to_dict()))["fault"] == fault
    assert fault in truth.explain()
    roles = {d.role for d in job.dumps}
    assert roles == {"trainer", "dataloader", "checkpoint"}


def test_compute_hang_semantics(jobs):
    job = jobs["compute-hang"]
    r = job.truth.fault_rank
    mains = _mains(job)
    t = job.topology
    assert "all_reduce" not in mains[r] and "_communicate" not in mains[r]
    assert mains[r][0] in ("forward", "forward_torch_softmax", "glu")
    for p in _peers(job, r):
        assert mains[p][0] == "all_reduce" and "_reduce" in mains[p]
    s, d = t.coords["pp"][r], t.coords["dp"][r]
    for x, fr in mains.items():
        if t.coords["dp"][x] != d:
            assert fr[0] == "reduce_scatter_tensor" and "finish_grad_sync" in fr
        elif t.coords["pp"][x] > s:
            assert "recv_forward" in fr
        elif t.coords["pp"][x] < s:
            assert "recv_backward" in fr
    assert set(job.truth.affected_ranks) == {x for x in mains if t.coords["dp"][x] == d}


def test_collective_and_p2p_hang(jobs):
    job = jobs["collective-hang"]
    r = job.truth.fault_rank
    mains = _mains(job)
    assert all(mains[p] == mains[r] for p in _peers(job, r)) and mains[r][0] == "all_reduce"

    job = jobs["p2p-hang"]
    r, peer = job.truth.culprit_ranks
    t = job.topology
    assert abs(int(t.coords["pp"][r]) - int(t.coords["pp"][peer])) == 1
    assert all(t.coords[k][r] == t.coords[k][peer] for k in ("tp", "dp"))
    mains = _mains(job)
    forward = t.coords["pp"][peer] > t.coords["pp"][r]
    assert ("send_forward" if forward else "send_backward") in mains[r]
    assert ("recv_forward" if forward else "recv_backward") in mains[peer]
    assert job.truth.culprit_nodes == t.nodes_of([r, peer])


def test_dataloader_and_checkpoint_stall(jobs):
    job = jobs["dataloader-stall"]
    r = job.truth.fault_rank
    mains = _mains(job)
    assert "__next__" in mains[r] and "get_batch" in mains[r]
    assert all("broadcast_data" in mains[p] for p in _peers(job, r))
    workers = [d for d in job.dumps if d.role == "dataloader" and d.rank == r]
    stuck = [d for d in workers if d.dump.main_thread.frames[0].function.endswith("read")]
    assert len(stuck) == 1 and "_worker_loop" in {co_name(f.function) for f in stuck[0].dump.main_thread.frames}
    others = [d for d in job.dumps if d.role == "dataloader" and d not in stuck]
    assert all(co_name(d.dump.main_thread.frames[0].function) == "select" for d in others)

    job = jobs["checkpoint-stall"]
    r = job.truth.fault_rank
    mains = _mains(job)
    assert "maybe_finalize_async_save" in mains[r]
    assert all(fr[0] == "barrier" for x, fr in mains.items() if x != r)
    ck = {d.rank: d.dump.main_thread.frames for d in job.dumps if d.role == "checkpoint"}
    assert co_name(ck[r][0].function) in ("_save", "_write_item")
    assert all(co_name(f[0].function) == "select" for x, f in ck.items() if x != r)
    assert job.truth.affected_ranks == (r,)


def test_crash_has_no_dump(jobs):
    job = jobs["crash"]
    r = job.truth.fault_rank
    assert not [d for d in job.dumps if d.rank == r]
    assert set(_mains(job)) == set(range(job.topology.world_size)) - {r}
    assert r in job.truth.affected_ranks
    assert all(_mains(job)[p][0] == "all_reduce" for p in _peers(job, r))


def test_healthy_job_progresses(jobs):
    job = jobs["none"]
    for s in range(1, job.n_snapshots):
        before = {d.rank: d.dump.main_thread.frames for d in job.snapshot(s - 1) if d.role == "trainer"}
        after = {d.rank: d.dump.main_thread.frames for d in job.snapshot(s) if d.role == "trainer"}
        assert before.keys() == after.keys()
        assert all(before[x] != after[x] for x in before)
    leaves = {fr[0] for fr in _mains(job).values()}
    assert len(leaves) >= 4  # compute and several kinds of communication


def test_slow_rank_computes_in_every_snapshot(jobs):
    job = jobs["slow-rank"]
    r = job.truth.fault_rank
    prev = None
    for s in range(job.n_snapshots):
        mains = _mains(job, s)
        assert not any(f in mains[r] for f in ("all_reduce", "_communicate", "batch_isend_irecv"))
        assert all(mains[p][0] == "all_reduce" for p in _peers(job, r))
        frames = {d.rank: d.dump.main_thread.frames for d in job.snapshot(s) if d.role == "trainer"}
        if prev is not None:  # every stack moves (another leaf, or the same functions at other lines)
            assert all(prev[x] != frames[x] for x in frames)
        prev = frames


def test_hang_snapshots_are_identical():
    job = _job("compute-hang", n_snapshots=3)
    assert job.n_snapshots == 3
    assert _mains(job, 0) == _mains(job, 1) == _mains(job, 2)


def test_same_seed_same_job_and_fault_rank_honoured():
    a, b = _job("compute-hang", seed=3), _job("compute-hang", seed=3)
    assert a.truth == b.truth and [d.dump for d in a.dumps] == [d.dump for d in b.dumps]
    assert _job("compute-hang", fault_rank=5).truth.culprit_ranks == (5,)


@pytest.mark.parametrize(
    "kwargs, what",
    [
        ({"fault": "meltdown"}, "fault='meltdown'"),
        ({"fault": "compute-hang", "fault_rank": 99}, "fault_rank=99"),
        ({"fault": "compute-hang", "n_snapshots": 0}, "n_snapshots=0"),
        ({"fault": "dataloader-stall", "dataloader_workers": 0}, "dataloader_workers"),
        ({"fault": "none", "node_format": "host-{name}"}, "node_format"),
    ],
)
def test_bad_arguments_name_the_parameter(kwargs, what):
    with pytest.raises(InputError, match=what.replace("(", r"\(")):
        generate_job(LAYOUT, gpus_per_node=GPUS, **kwargs)


def test_faults_that_need_a_dimension():
    with pytest.raises(InputError, match="pp >= 2"):
        generate_job("tp=2,dp=4", gpus_per_node=4, fault="p2p-hang")
    with pytest.raises(InputError, match="tp, cp or ep"):
        generate_job("pp=2,dp=4", gpus_per_node=4, fault="collective-hang")
    # pp=1 uses the no-pipelining schedule and still hangs sensibly
    job = generate_job("tp=4,dp=2", gpus_per_node=4, fault="compute-hang", seed=1)
    assert all("forward_backward_no_pipelining" in fr for fr in _mains(job).values())


def test_context_parallel_ranks_are_model_parallel_peers():
    job = generate_job("tp=2,cp=2,pp=2,dp=2", gpus_per_node=8, fault="compute-hang", seed=4)
    r = job.truth.fault_rank
    mains = _mains(job)
    assert len(_peers(job, r)) == 3 and all(mains[p][0] == "all_reduce" for p in _peers(job, r))
    assert "--context-parallel-size 2" in job.dumps[0].dump.cmdline


def test_install_prefixes_differ_across_nodes():
    job = generate_job(LAYOUT, gpus_per_node=2, fault="compute-hang", seed=0)
    assert len({job.env_of(n).site_dir for n in job.topology.node_names}) == 3
    plain = generate_job(LAYOUT, gpus_per_node=2, fault="compute-hang", seed=0, install_prefixes=False)
    assert len({plain.env_of(n).site_dir for n in plain.topology.node_names}) == 1


def test_generation_size_512_ranks():
    job = generate_job("tp=8,pp=4,dp=16", fault="compute-hang", seed=0)
    trainers = [d for d in job.dumps if d.role == "trainer"]
    assert len(trainers) == 512 and len(job.topology.node_names) == 64
    assert len(job.dumps) == 512 * 3
    assert len({d.dump.pid for d in job.dumps if d.node == "node-0"}) == 8 * 3  # pids unique per node


def test_to_rows_fit_the_stacks_table(tmp_path, jobs):
    from rankscope.datasets.store.store import Store

    job = jobs["slow-rank"]
    rows = job.to_rows("synth")
    assert len(rows) == sum(len(d.dump.threads) for d in job.dumps)
    first = job.dumps[0]
    assert rows[: len(first.dump.threads)] == to_rows(
        first.dump, job="synth", snapshot=0, rank=first.rank, node=first.node, role=first.role, time=rows[0]["time"]
    )
    assert {r["snapshot"] for r in rows} == set(range(5))
    Store(tmp_path / "store", create=True).write("stacks", rows)
    df = Store(tmp_path / "store").read("stacks", job="synth")
    assert df.height == len(rows)


# -- files ------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["pyspy-text", "pyspy-json", "faulthandler", "mixed"])
def test_write_dir_every_format(tmp_path, fmt):
    job = _job("dataloader-stall", n_snapshots=2, checkpoint_process=True)
    root = job.write_dir(tmp_path / "dumps", fmt=fmt)
    with open(root / "manifest.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert list(rows[0]) == ["file", "rank", "node", "role", "pid", "snapshot"]
    assert len(rows) == len(job.dumps)
    for row, d in zip(rows, job.dumps):
        assert (root / row["file"]).is_file()
        assert row["file"].startswith(f"snapshot-{d.snapshot}/")
        assert (int(row["rank"]), row["node"], row["role"], int(row["pid"])) == (d.rank, d.node, d.role, d.dump.pid)
    names = {Path(r["file"]).stem for r in rows if r["snapshot"] == "0"}
    assert {"rank0", "rank0-dataloader0", "rank0-dataloader1", "rank0-checkpoint"} <= names
    for p in root.rglob("*.json"):
        text = p.read_text()
        assert json.dumps(json.loads(text), indent=2) + "\n" == text  # exactly py-spy's layout
    texts = [p.read_text() for p in root.rglob("rank*.txt")]
    if fmt == "pyspy-text":
        assert all(t.startswith("Process ") and "\nPython v3." in t for t in texts)
    if fmt == "faulthandler":
        assert all("Current thread 0x" in t and "(most recent call first):\n" in t for t in texts)
    if fmt == "mixed":
        assert list(root.rglob("*.json")) and any(t.startswith("Process ") for t in texts)
        assert any(t.startswith(("Thread 0x", "Current thread")) for t in texts)


def test_pyspy_text_matches_the_real_sample_layout(tmp_path):
    job = _job("compute-hang", install_prefixes=False)
    root = job.write_dir(tmp_path / "d", fmt="pyspy-text", manifest=False)
    assert not (root / "manifest.csv").exists()
    lines = (root / "rank0.txt").read_text().splitlines()
    assert lines[0].startswith("Process ") and ": /opt/conda/bin/python -u pretrain_gpt.py --tensor-model" in lines[0]
    assert lines[1] == "Python v3.11.9 (/opt/conda/bin/python3.11)" and lines[2] == ""
    assert lines[3].startswith("Thread ") and lines[3].endswith('"MainThread"')
    assert lines[-1] == "    Thread._bootstrap (threading.py:1002)"
    assert "    <module> (pretrain_gpt.py:270)" in lines


def _readers():
    text = pytest.importorskip("rankscope.datasets.readers.pyspy_text")
    js = pytest.importorskip("rankscope.datasets.readers.pyspy_json")
    fh = pytest.importorskip("rankscope.datasets.readers.faulthandler")
    return text.parse_pyspy_text, js.parse_pyspy_json, fh.parse_traceback_text


@pytest.mark.parametrize("fault", ["compute-hang", "dataloader-stall"])
def test_round_trip_through_the_readers(tmp_path, fault):
    parse_text, parse_json, parse_fh = _readers()
    job = _job(fault, checkpoint_process=True)
    by_fmt = {f: job.write_dir(tmp_path / f, fmt=f) for f in ("pyspy-text", "pyspy-json", "faulthandler")}
    with open(by_fmt["pyspy-text"] / "manifest.csv", newline="") as fh:
        files = [r["file"] for r in csv.DictReader(fh)]
    for d, rel in zip(job.dumps, files):
        want: ProcessDump = d.dump
        got = parse_text((by_fmt["pyspy-text"] / rel).read_text(), rel)
        assert len(got) == 1 and got[0].status == "ok"
        assert got[0].pid == want.pid and got[0].cmdline == want.cmdline
        assert [t.frames for t in got[0].threads] == [t.frames for t in want.threads]
        assert got[0].main_thread.thread_id == want.main_thread.thread_id

        jrel = rel.rsplit(".", 1)[0] + ".json"
        got = parse_json((by_fmt["pyspy-json"] / jrel).read_text(), jrel)
        assert got[0].pid == want.pid and got[0].main_thread.thread_id == want.main_thread.thread_id
        env = job.env_of(d.node)
        assert [(f.function, f.line, f.file) for f in got[0].main_thread.frames] == [
            (f.function, f.line, env.abs_from_short(f.file)) for f in want.main_thread.frames
        ]

        got = parse_fh((by_fmt["faulthandler"] / rel).read_text(), rel)
        assert [(f.function, f.line) for f in got[0].main_thread.frames] == [
            (co_name(f.function), f.line) for f in want.main_thread.frames
        ]


def test_dump_dir_reader_recovers_roles(tmp_path):
    dumpdir = pytest.importorskip("rankscope.datasets.readers.dumpdir")
    job = _job("dataloader-stall", checkpoint_process=True)
    for manifest in (True, False):
        root = job.write_dir(tmp_path / f"m{manifest}", fmt="mixed", manifest=manifest)
        dd = dumpdir.scan_dump_dir(root, gpus_per_node=GPUS)
        assert len(dd.files) == len(job.dumps)
        roles = {}
        for p in dumpdir.from_dump_dir(dd):
            roles[p.source.rsplit("/", 1)[-1].split(".")[0]] = (p.rank, p.role)
        for d, name in ((d, _stem(d, job)) for d in job.dumps):
            assert roles[name] == (d.rank, d.role)


def _stem(d, job) -> str:
    if d.role == "trainer":
        return f"rank{d.rank}"
    if d.role == "checkpoint":
        return f"rank{d.rank}-checkpoint"
    k = [x for x in job.dumps if x.rank == d.rank and x.role == "dataloader" and x.snapshot == d.snapshot].index(d)
    return f"rank{d.rank}-dataloader{k}"


def test_write_dir_rejects_bad_targets(tmp_path):
    job = _job("crash")
    with pytest.raises(InputError, match="fmt='xml'"):
        job.write_dir(tmp_path / "x", fmt="xml")
    (tmp_path / "file").write_text("")
    with pytest.raises(InputError, match="not a directory"):
        job.write_dir(tmp_path / "file")
    with pytest.raises(InputError, match="not a node"):
        job.env_of("nowhere")
