"""The store: atomic append-only Parquet, lazy polars reads, DuckDB SQL, corrupt files named."""

from __future__ import annotations

import pytest

from rankscope.datasets.store.schemas import TABLES
from rankscope.datasets.store.store import Store
from rankscope.spine import InputError, StoreError


def _rows(job="j1", n=3):
    return [
        {
            "job": job,
            "snapshot": 0,
            "rank": r,
            "node": f"node-{r}",
            "role": "trainer",
            "status": "ok",
            "frames": [{"function": "all_reduce", "file": "torch/distributed/distributed_c10d.py", "line": 1}],
        }
        for r in range(n)
    ]


def test_write_read_and_sql(tmp_path):
    st = Store(tmp_path / "s", create=True)
    paths = st.write("stacks", _rows())
    st.write("stacks", _rows("j2", 2))
    assert len(paths) == 1 and paths[0].name.startswith("part-") and "job=j1" in str(paths[0])
    assert st.read("stacks").height == 5
    assert st.read("stacks", job="j2").height == 2
    assert st.jobs() == ["j1", "j2"]
    df = st.sql("SELECT job, count(*) AS n FROM stacks GROUP BY job ORDER BY job")
    assert df.to_dicts() == [{"job": "j1", "n": 3}, {"job": "j2", "n": 2}]
    lf = st.scan("stacks")
    assert lf.collect_schema()["frames"] is not None
    # no temp files left behind
    assert not list((tmp_path / "s").rglob(".tmp-*"))


def test_every_table_round_trips_an_empty_and_a_minimal_row(tmp_path):
    st = Store(tmp_path, create=True)
    for name, spec in TABLES.items():
        assert st.read(name).height == 0
        row = {f.name: None for f in spec.schema}
        for f in spec.schema:
            if not f.nullable:
                row[f.name] = "j" if f.name == "job" else ("x" if str(f.type) == "string" else 1)
        st.write(name, [row])
        assert st.read(name).height == 1, name


def test_unknown_and_missing_columns_are_rejected(tmp_path):
    st = Store(tmp_path, create=True)
    with pytest.raises(InputError, match="unknown columns"):
        st.write("stacks", [{"job": "j", "snapshot": 0, "bogus": 1}])
    with pytest.raises(InputError, match="required column 'snapshot'"):
        st.write("stacks", [{"job": "j"}])
    with pytest.raises(InputError, match="cannot name a partition"):
        st.write("stacks", [{"job": "../evil", "snapshot": 0}])
    with pytest.raises(InputError, match="unknown table"):
        st.write("nope", [])


def test_corrupt_file_is_reported_by_name(tmp_path):
    st = Store(tmp_path, create=True)
    (p,) = st.write("stacks", _rows())
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 2])
    with pytest.raises(StoreError, match=p.name):
        st.read("stacks")
    # the file itself is left as it was: nothing is lost
    assert p.stat().st_size == len(data) // 2


def test_not_a_store(tmp_path):
    with pytest.raises(StoreError, match="not a rankscope store"):
        Store(tmp_path)
    assert not Store.is_store(tmp_path)


def test_stacks_round_trip_through_the_store(tmp_path):
    from rankscope.analytics import stacks

    def diagnose_stacks(procs, topology):
        return stacks.verdict(stacks.facts(procs, topology), topology)

    from rankscope.datasets.domain.stacks import from_dumps
    from rankscope.datasets.store.stacks_table import from_table, to_table
    from rankscope.harness.synthetic import generate_job

    job = generate_job("tp=2,pp=2,dp=4", gpus_per_node=4, fault="dataloader-stall", seed=3)
    procs = from_dumps((d.dump, d.snapshot, d.rank, d.node, d.role) for d in job.dumps)
    st = Store(tmp_path, create=True)
    st.write("stacks", to_table(procs, "j"))
    back = from_table(st.read_arrow("stacks", job="j"))
    key = lambda p: (p.snapshot, p.rank, p.pid, p.role)  # noqa: E731
    assert sorted(map(key, back)) == sorted(map(key, procs))
    by = {key(p): p for p in procs}
    for p in back:
        q = by[key(p)]
        assert p.main == q.main and p.node == q.node and len(p.others) == len(q.others)
    a = diagnose_stacks(procs, job.topology)
    b = diagnose_stacks(back, job.topology)
    assert (a.verdict, a.suspect_nodes, a.culprit_nodes) == (b.verdict, b.suspect_nodes, b.culprit_nodes)


def test_latest_capture_series() -> None:
    from rankscope.datasets.loading.inputs import latest_series

    times = {1: 0.0, 2: 10.0, 3: 5000.0, 4: 5010.0, 5: 5020.0}
    assert latest_series(times) == {3, 4, 5} and latest_series({}) == set()


def test_two_incidents_in_one_job_the_latest_wins_and_ingest_is_idempotent(tmp_path, probe_dir):
    import shutil

    from rankscope.analytics import diagnose
    from rankscope.datasets.loading.ingest import ingest_path
    from rankscope.datasets.loading.inputs import load_inputs

    older, newer = tmp_path / "older", tmp_path / "newer"
    shutil.copytree(probe_dir / "pyspy" / "text", older)
    newer.mkdir()
    swap = {1: 3, 3: 1}
    for r in range(4):  # the same job hung again later, this time rank 1 stuck (ranks 1 and 3 swapped)
        shutil.copy(older / f"rank{r}.txt", newer / f"rank{swap.get(r, r)}.txt")
    st = tmp_path / "store"
    a = ingest_path(older, st, job="j", gpus_per_node=1)
    b = ingest_path(newer, st, job="j", gpus_per_node=1)
    assert a.ingest_id != b.ingest_id and a.rows["stacks"] == b.rows["stacks"]
    rows = Store(st).read("stacks", job="j").height
    again = ingest_path(newer, st, job="j", gpus_per_node=1)
    assert again.rows == {} and any("already ingested" in n for n in again.notes)
    assert Store(st).read("stacks", job="j").height == rows
    import polars as pl

    snaps = Store(st).read("stacks", job="j").group_by("ingest_id").agg(s=pl.col("snapshot").max())
    assert sorted(snaps["s"].to_list()) == [0, 1]  # snapshot ids namespaced per ingest
    inputs = load_inputs(st, job="j")
    v = diagnose(inputs)
    assert v.verdict.value == "hang" and v.culprit_ranks == (1,), v.explain()
    assert any("1 older incident(s) in the store ignored" in n for n in inputs.notes)
