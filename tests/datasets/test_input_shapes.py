"""Input shapes as users bring them: the real gloo probe (rank 3 skipped an all_reduce; py-spy text and JSON
of pids 11903-11906) re-laid in each shape a cluster or tool leaves, and the user's machine names kept.

Every shape must give the right machine or one clear refusal line; none may invent a machine name
silently (``node-<k>`` only with the "inferred" note and the verdict's ``inferred_node_names``).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from rankscope.analytics import diagnose
from rankscope.datasets.loading.inputs import load_inputs
from rankscope.spine import InputError

PIDS = {0: 11903, 1: 11904, 2: 11905, 3: 11906}
HOST = {0: "host-a", 1: "host-a", 2: "host-b", 3: "host-b"}


def _text(probe: Path, rank: int) -> str:
    return (probe / "pyspy" / "text" / f"rank{rank}.txt").read_text()


def _json(probe: Path, rank: int) -> str:
    return (probe / "pyspy" / "json" / f"rank{rank}.json").read_text()


def _verdict(root: Path, **kw):
    inputs = load_inputs(root, **kw)
    return inputs, diagnose(inputs)


def _hang_on_host_b(v) -> None:
    assert v.verdict.value == "hang", v.explain()
    assert v.culprit_nodes == ("host-b",) and v.suspect_nodes == ("host-b",), v.explain()
    assert 3 in v.culprit_ranks
    assert "inferred_node_names" not in v.details


def test_snapshot_folders_with_their_own_manifests_and_nested_host_folders(tmp_path, probe_dir):
    for snap in (0, 1):
        rows = ["file,rank,node,role,pid"]
        for r, pid in PIDS.items():
            f = tmp_path / f"snapshot-{snap}" / "stacks" / HOST[r] / f"{pid}.txt"
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_text(_text(probe_dir, r))
            rows.append(f"stacks/{HOST[r]}/{pid}.txt,{r},{HOST[r]},trainer,{pid}")
        (tmp_path / f"snapshot-{snap}" / "manifest.csv").write_text("\n".join(rows) + "\n")
    inputs, v = _verdict(tmp_path, gpus_per_node=2)
    assert sorted({(p.snapshot, p.rank) for p in inputs.procs}) == [(s, r) for s in (0, 1) for r in range(4)]
    assert inputs.expected_ranks[3].startswith("a row of snapshot-")
    _hang_on_host_b(v)


def test_host_folders_name_the_machines_without_a_manifest(tmp_path, probe_dir):
    for r in range(4):
        f = tmp_path / "snapshot-0" / HOST[r] / f"rank{r}.txt"
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(_text(probe_dir, r))
    inputs, v = _verdict(tmp_path, gpus_per_node=2)
    assert not inputs.inferred_nodes and not any("inferred" in n for n in inputs.notes)
    _hang_on_host_b(v)


def test_without_names_the_verdict_says_they_were_invented(tmp_path, probe_dir):
    for r in range(4):
        (tmp_path / f"rank{r}.txt").write_text(_text(probe_dir, r))
    inputs, v = _verdict(tmp_path, gpus_per_node=1)
    assert v.culprit_nodes == ("node-3",)
    assert v.details["inferred_node_names"] == ["node-0", "node-1", "node-2", "node-3"]
    assert any("inferred as node-<rank // 1>" in n and "add a manifest" in n for n in v.details["notes"])


def test_local_rank_files_in_host_folders_map_to_global_ranks(tmp_path, probe_dir):
    for r in range(4):
        f = tmp_path / HOST[r] / f"local_rank{r % 2}.txt"
        f.parent.mkdir(exist_ok=True)
        f.write_text(_text(probe_dir, r))
    inputs, v = _verdict(tmp_path, gpus_per_node=2)
    _hang_on_host_b(v)
    assert any("assumed from sorted host names" in n for n in inputs.notes)
    # a different process claiming rank 1 on host-a, with nothing to tell them apart: one line naming both files
    other = _text(probe_dir, 1).replace("Process 11904:", "Process 22222:").replace("Thread 11904", "Thread 22222")
    (tmp_path / "host-a" / "rank1.txt").write_text(other)
    with pytest.raises(
        InputError, match=r"rank 1 .*claimed by two processes: host-a/.*(local_rank1|rank1).* and "
    ) as e:
        load_inputs(tmp_path, gpus_per_node=2)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("fmt", ["txt", "json"])
def test_one_file_per_host_holding_every_process_is_split(tmp_path, probe_dir, fmt):
    read = _text if fmt == "txt" else _json
    for host, ranks in (("host-a", (0, 1)), ("host-b", (2, 3))):
        (tmp_path / f"{host}.{fmt}").write_text("".join(read(probe_dir, r) for r in ranks))
    inputs, v = _verdict(tmp_path, gpus_per_node=2)
    assert sorted((p.rank, p.pid) for p in inputs.procs) == sorted(PIDS.items())
    assert any("pid order" in n for n in inputs.notes)
    _hang_on_host_b(v)
    _, v = _verdict(tmp_path)  # --gpus-per-node not given: every host holds 2, so 2 per node
    _hang_on_host_b(v)
    with pytest.raises(InputError, match="gpus-per-node is 8") as e:
        load_inputs(tmp_path, gpus_per_node=8)
    assert "\n" not in str(e.value)


def test_a_manifest_names_the_processes_of_a_concatenated_dump(tmp_path, probe_dir):
    (tmp_path / "a.txt").write_text(_text(probe_dir, 1) + _text(probe_dir, 0))  # not in pid order
    (tmp_path / "b.txt").write_text(_text(probe_dir, 3) + _text(probe_dir, 2))
    rows = "".join(f"{'a' if r < 2 else 'b'}.txt,{pid},{r},{HOST[r]}\n" for r, pid in PIDS.items())
    (tmp_path / "manifest.csv").write_text("file,pid,rank,node\n" + rows)
    inputs, v = _verdict(tmp_path, gpus_per_node=1)
    assert sorted((p.rank, p.pid) for p in inputs.procs) == sorted(PIDS.items())
    _hang_on_host_b(v)


def test_a_gap_in_rank_numbers_is_not_a_missing_dump_by_itself(tmp_path, probe_dir):
    for r in (0, 2, 3):
        (tmp_path / f"rank{r}.txt").write_text(_text(probe_dir, r))
    inputs = load_inputs(tmp_path, gpus_per_node=1)
    assert 1 not in inputs.expected_ranks  # nothing independent says rank 1 exists
    inputs = load_inputs(tmp_path, gpus_per_node=1, layout="dp=4")
    assert inputs.expected_ranks[1] == "the --layout world size"


def test_log_lines_before_the_pyspy_header_do_not_make_it_json(tmp_path, probe_dir):
    for r in range(4):
        head = f"[2026-11-30 10:00:0{r},123] INFO collector: py-spy dump --pid {PIDS[r]}\n"
        (tmp_path / f"rank{r}.txt").write_text(head + head + _text(probe_dir, r))
    _, v = _verdict(tmp_path, gpus_per_node=1)
    assert v.verdict.value == "hang" and v.culprit_ranks == (3,)
    # every line prefixed (a collector that logs each line), and names that lie about the format
    for r in range(4):
        lines = _text(probe_dir, r).splitlines(keepends=True)
        (tmp_path / f"rank{r}.txt").write_text("".join(f"I1130 10:00:01.123456 4242 spy.py:12] {x}" for x in lines))
    (tmp_path / "rank2.txt").rename(tmp_path / "rank2.json")
    (tmp_path / "rank1.txt").write_text(_json(probe_dir, 1))
    inputs, v = _verdict(tmp_path, gpus_per_node=1)
    assert all(p.status == "ok" for p in inputs.procs)
    assert v.verdict.value == "hang" and v.culprit_ranks == (3,)


def test_stray_json_is_skipped_with_one_note_and_an_error_file_is_an_exit(tmp_path, probe_dir):
    for r in range(4):
        (tmp_path / f"rank{r}.json").write_text(_json(probe_dir, r))
    (tmp_path / "config.json").write_text(json.dumps({"model": {"layers": 2}, "optimizer": "adam", "rank": 0}))
    (tmp_path / "wandb-metadata.json").write_text(json.dumps({"os": "Linux", "python": "3.11", "host": "x"}))
    (tmp_path / "prometheus_query.json").write_text(
        json.dumps({"status": "success", "data": {"resultType": "matrix", "result": [{"metric": {}, "values": []}]}})
    )
    err = Path(__file__).parents[1] / "data" / "field" / "crash_mn4x2" / "logs" / "node2"
    src = next(err.rglob("attempt_0/1/error.json"))
    shutil.copy(src, tmp_path / "error.json")
    inputs, v = _verdict(tmp_path, gpus_per_node=1)
    skipped = [n for n in inputs.notes if n.startswith("skipped 2 file(s)")]
    assert len(skipped) == 1
    for name in ("config.json", "wandb-metadata.json"):
        assert name in skipped[0]
    # a Prometheus query result next to stack dumps is metrics evidence, not a broken FR dump
    assert "prometheus_query.json" not in skipped[0]
    assert inputs.metrics is not None and [p.name for p in inputs.metrics.paths] == ["prometheus_query.json"]
    assert v.verdict.value == "hang" and v.culprit_ranks == (3,), v.explain()
    assert any("error.json" in n and "no rank" in n for n in inputs.notes)  # the error file names no rank here


def test_the_same_process_dumped_twice_is_kept_once_with_a_note(tmp_path, probe_dir):
    for r in range(4):
        (tmp_path / f"rank{r}.txt").write_text(_text(probe_dir, r))
        (tmp_path / f"rank{r}.json").write_text(_json(probe_dir, r))
    inputs, v = _verdict(tmp_path, gpus_per_node=1)
    assert sorted(p.rank for p in inputs.procs) == [0, 1, 2, 3]
    assert any("dumped twice" in n for n in inputs.notes)
    assert v.culprit_ranks == (3,)


def test_symlinked_folders_inside_are_read_once_and_links_out_are_not_followed(tmp_path, probe_dir):
    root = tmp_path / "in"
    real = root / "captures" / "snap"
    real.mkdir(parents=True)
    for r in range(4):
        (real / f"rank{r}.txt").write_text(_text(probe_dir, r))
    os.symlink(real, root / "snapshot-0")  # a link inside the input: followed (its files once per real folder)
    os.symlink(root, real / "loop")  # a cycle: cut
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "rank9.txt").write_text(_text(probe_dir, 0))
    os.symlink(outside, root / "more")  # leaves the input: not followed, and said so
    inputs = load_inputs(root, gpus_per_node=1)
    assert sorted(p.rank for p in inputs.procs) == [0, 1, 2, 3]
    assert any("pointing outside the input were not followed: more" in n for n in inputs.notes)


def test_layout_gives_coordinates_and_the_timings_node_column_keeps_its_names(tmp_path):
    rows = ["rank,step,op,duration_s,node"]
    for step in range(40):
        for r in range(8):
            rows.append(f"{r},{step},step,{1.5 if r == 6 and step >= 10 else 1.0},worker-{r}")
    (tmp_path / "timings.csv").write_text("\n".join(rows) + "\n")
    for layout in (None, "dp=8"):
        inputs = load_inputs(tmp_path, layout=layout, gpus_per_node=1)
        if inputs.topology is not None:
            assert inputs.topology.node_of(6) == "worker-6"
        v = diagnose(inputs)
        assert all(n.startswith("worker-") for n in v.suspect_nodes), v.explain()


def test_refusals_are_one_line_on_stderr_with_exit_2(tmp_path, probe_dir):
    from typer.testing import CliRunner

    from rankscope.cli.main import app

    for host, ranks in (("host-a", (0, 1)), ("host-b", (2, 3))):
        (tmp_path / f"{host}.txt").write_text("".join(_text(probe_dir, r) for r in ranks))
    res = CliRunner().invoke(app, ["diagnose", str(tmp_path), "--gpus-per-node", "8"])
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert len(res.stderr.strip().splitlines()) == 1 and "host-a.txt" in res.stderr


def test_hook_identities_name_the_processes_of_concatenated_dumps_by_pid(tmp_path, probe_dir):
    (tmp_path / "dump.txt").write_text("".join(_text(probe_dir, r) for r in (2, 0, 3, 1)))
    for r, pid in PIDS.items():
        ident = {"pid": pid, "rank": r, "local_rank": r % 2, "node": HOST[r], "role": "trainer", "started": 1.0}
        (tmp_path / f"pid{pid}.json").write_text(json.dumps(ident))
    inputs, v = _verdict(tmp_path, gpus_per_node=2)
    assert sorted((p.rank, p.pid) for p in inputs.procs if p.status == "ok") == sorted(PIDS.items())
    _hang_on_host_b(v)


def test_compressed_dumps_are_named_with_how_to_read_them(tmp_path, probe_dir):
    """A collection script's ``rankN.txt.gz``: skipped with one line saying to unpack it (it read "a gz file that is
    neither metrics* nor timings*"), and a folder of nothing else is refused with the same words."""
    import gzip

    for r in range(4):
        data = (probe_dir / "pyspy" / "text" / f"rank{r}.txt").read_bytes()
        (tmp_path / f"rank{r}.txt.gz").write_bytes(gzip.compress(data))
    with pytest.raises(InputError, match=r"rank0\.txt\.gz \(compressed or an archive: unpack it first"):
        load_inputs(tmp_path, gpus_per_node=1)


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_rounds_appended_to_a_rank_file_keep_the_rank_of_its_name(tmp_path, probe_dir, fmt):
    """``<host>/rank<N>.txt|.json`` holding one process's dump three times (appended round after round), hosts
    not in rank order: the file's rank was dropped for the process dumped three times, and ranks re-derived
    from host order named rank 0 for the file that says rank 3 (the machine stayed right by luck)."""
    hosts = {0: "trn-y03", 1: "trn-y02", 2: "trn-y01", 3: "trn-y00"}
    for r, host in hosts.items():
        f = tmp_path / host / f"rank{r}.{'txt' if fmt == 'text' else 'json'}"
        f.parent.mkdir(parents=True)
        one = _text(probe_dir, r) if fmt == "text" else _json(probe_dir, r)
        f.write_text((one.rstrip("\n") + "\n") * 3)
    inputs, v = _verdict(tmp_path, gpus_per_node=1)
    assert sorted({(p.snapshot, p.rank) for p in inputs.procs}) == [(s, r) for s in range(3) for r in range(4)]
    assert v.verdict.value == "hang" and v.culprit_ranks == (3,) and v.culprit_nodes == ("trn-y00",), v.explain()


def test_a_rank_between_dots_numbers_the_dump(tmp_path, probe_dir):
    """``pyspy.rank0.txt`` / ``dump.rank2.txt``: the rank sits between dots, before the extension. Such files
    were refused ("put rank<N> in the file name") or skipped."""
    for r in range(4):
        (tmp_path / f"{'dump' if r == 2 else 'pyspy'}.rank{r}.txt").write_text(_text(probe_dir, r))
    inputs, v = _verdict(tmp_path, gpus_per_node=1)
    assert sorted(p.rank for p in inputs.procs) == [0, 1, 2, 3]
    assert v.verdict.value == "hang" and v.culprit_ranks == (3,), v.explain()


@pytest.mark.parametrize("stamps", [False, True])
def test_py_spy_dumps_in_a_kubectl_prefix_stream_with_or_without_timestamps(tmp_path, probe_dir, stamps):
    """``kubectl logs --prefix [--timestamps]`` of a PyTorchJob's pods, one py-spy dump each: with the RFC 3339
    stamp kubectl puts after the prefix, every dump was lost ("no evidence", exit 0)."""
    out = []
    for r in range(4):
        stamp = f"2026-12-03T08:33:0{r}.123456780Z " if stamps else ""
        out += [f"[pod/llama-worker-{r}/pytorch] {stamp}{ln}" for ln in _text(probe_dir, r).splitlines()]
    (tmp_path / "pyspy-all.txt").write_text("\n".join(out) + "\n")
    inputs, v = _verdict(tmp_path, gpus_per_node=1)
    assert v.verdict.value == "hang" and v.culprit_nodes == ("llama-worker-3",), v.explain()


@pytest.mark.parametrize(
    ("folder", "machine"),
    [
        ("trn-k01", "trn-k01"),
        ("hpc-gpu0115", "hpc-gpu0115"),
        ("trn-k01/pyspy-20261203-083301", "trn-k01"),  # a stamped capture folder under it is no machine
        ("job-1234", None),
        ("llama-7b", None),
        ("2026-12-01T21-00", None),
    ],
)
def test_the_lone_folder_of_a_one_node_job_is_its_machine_when_named_like_one(tmp_path, probe_dir, folder, machine):
    """``$(hostname)/rank<N>.txt`` of a one-node job: the lone folder holding every rank was always taken for the
    job's dump folder and the machine invented (``node-0``). Named like a host (a letter and a digit, no date,
    no job's word) and holding one machine's ranks, it is that machine; a job's or a time's folder is not."""
    for r in range(4):
        f = tmp_path / folder / f"rank{r}.txt"
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(_text(probe_dir, r))
    inputs, v = _verdict(tmp_path, gpus_per_node=4)
    assert v.verdict.value == "hang" and v.culprit_ranks == (3,), v.explain()
    if machine:
        assert v.culprit_nodes == (machine,) and not inputs.inferred_nodes, v.explain()
    else:
        assert v.culprit_nodes == ("node-0",) and inputs.inferred_nodes, v.explain()


def test_py_spy_dumps_behind_torchrun_worker_prefixes_are_read(tmp_path, probe_dir):
    """A worker that prints its own py-spy dump to stderr, in torchrun's console: ``[rank3]:`` names the global
    rank, ``[default1]:`` the launcher's local rank, the per-host log's name its machine. Every dump was lost
    ("no evidence", exit 0)."""
    one = tmp_path / "one"
    one.mkdir()
    lines = [f"[rank{r}]:{ln}" for r in range(4) for ln in _text(probe_dir, r).splitlines()]
    (one / "trn-s01.log").write_text("\n".join(lines) + "\n")
    _, v = _verdict(one, gpus_per_node=4)
    assert v.verdict.value == "hang" and v.culprit_ranks == (3,) and v.culprit_nodes == ("trn-s01",), v.explain()
    two = tmp_path / "two"
    two.mkdir()
    for host, ranks in (("trn-s01", (0, 1)), ("trn-s02", (2, 3))):
        lines = [f"[default{r % 2}]:{ln}" for r in ranks for ln in _text(probe_dir, r).splitlines()]
        (two / f"{host}.log").write_text("\n".join(lines) + "\n")
    _, v = _verdict(two, gpus_per_node=2)
    assert v.verdict.value == "hang" and v.culprit_ranks == (3,) and v.culprit_nodes == ("trn-s02",), v.explain()


def test_a_compressed_rank_dump_stands_for_its_rank_as_a_capture_not_read(tmp_path, probe_dir):
    """``rank3.txt.gz`` beside the others' plain dumps: skipped with a note to unpack it, the three waiting
    ranks read as a healthy job (0.55). The rank it names gave no evidence: inconclusive, rank 3 named in words.
    Beside its own plain copy it changes nothing; with every dump compressed, the input is refused."""
    import gzip

    for r in range(3):
        (tmp_path / f"rank{r}.txt").write_text(_text(probe_dir, r))
    (tmp_path / "rank3.txt.gz").write_bytes(gzip.compress(_text(probe_dir, 3).encode()))
    _, v = _verdict(tmp_path, gpus_per_node=1)
    assert v.verdict.value == "inconclusive" and not v.suspect_nodes, v.explain()
    assert "rank 3: capture failed: compressed, not read" in v.explain(), v.explain()
    (tmp_path / "rank3.txt").write_text(_text(probe_dir, 3))
    _, v = _verdict(tmp_path, gpus_per_node=1)
    assert v.verdict.value == "hang" and v.culprit_ranks == (3,), v.explain()
    for r in range(4):
        (tmp_path / f"rank{r}.txt").unlink()
        (tmp_path / f"rank{r}.txt.gz").write_bytes(gzip.compress(_text(probe_dir, r).encode()))
    with pytest.raises(InputError, match="unpack it first"):
        load_inputs(tmp_path, gpus_per_node=1)


@pytest.mark.parametrize("prefix", ["[rank{r}]: ", "[default{r}]:[rank{r}]:", "[trainer{r}]:"])
def test_torchrun_worker_prefixes_read_as_the_logs_read_them(tmp_path, probe_dir, prefix):
    """torch's ``[rank3]: `` (a space before the line), both prefixes at once, and a launcher's ``--role``: the
    worker prefixes as the log reader takes them (``[rank<N>]`` a global rank, any other role a local rank)."""
    lines = [prefix.format(r=r) + ln for r in range(4) for ln in _text(probe_dir, r).splitlines()]
    (tmp_path / "trn-s01.log").write_text("\n".join(lines) + "\n")
    _, v = _verdict(tmp_path, gpus_per_node=4)
    assert v.verdict.value == "hang" and v.culprit_ranks == (3,) and v.culprit_nodes == ("trn-s01",), v.explain()
