"""Metric readers (ported from proto-metrics): long form, Prometheus text exposition, query-range JSON; counter
semantics (declared field types, the monotonic fallback, rates with resets, gaps and NaN); bad input names the
file."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from rankscope.datasets.domain.counters import counter_rates, declared_kind, looks_monotonic
from rankscope.datasets.readers.metric_files import metric_frame, open_metrics
from rankscope.datasets.readers.prometheus import read_exposition
from rankscope.spine import InputError


def _frame(src, **kw):
    return metric_frame(open_metrics(src, **kw))


# -- counters -------------------------------------------------------------------------------------


def test_declared_kinds():
    assert declared_kind("DCGM_FI_DEV_PCIE_REPLAY_COUNTER") == "counter"
    assert declared_kind("DCGM_FI_DEV_XID_ERRORS") == "gauge"  # the last Xid code, not a count
    assert declared_kind("DCGM_FI_PROF_PCIE_TX_BYTES") == "gauge"  # already bytes per second
    assert declared_kind("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION") == "counter"
    assert declared_kind("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL") == "counter"
    assert declared_kind("node_netstat_Tcp_RetransSegs") == "counter"
    assert declared_kind("node_netstat_Tcp_CurrEstab") == "gauge"
    assert declared_kind("node_network_receive_bytes_total") == "counter"
    assert declared_kind("node_cpu_seconds_total") == "counter"
    assert declared_kind("node_disk_io_time_seconds_total") == "counter"
    assert declared_kind("node_load1") == "gauge"
    assert declared_kind("instance:node_cpu_utilisation:rate1m") == "gauge"  # a recording rule holds a rate
    assert declared_kind("some_vendor_thing") is None
    assert declared_kind("my_requests", {"my_requests": "counter"}) == "counter"
    assert declared_kind("node_load1", {"node_load1": "gauge"}) == "gauge"


def test_monotonic_fallback():
    s = np.repeat(np.arange(4), 50)
    counter = np.concatenate([np.cumsum(np.random.default_rng(i).poisson(3, 50)) + 1e6 * i for i in range(4)])
    assert looks_monotonic(counter.astype(float), s)
    c2 = counter.astype(float)
    c2[120:150] -= c2[119]  # a reset to zero in one series is still a counter
    assert looks_monotonic(c2, s)
    gauge = 50 + np.random.default_rng(0).normal(0, 1, 200)
    assert not looks_monotonic(gauge, s)


def test_unknown_metric_kind_from_its_shape():
    rng = np.random.default_rng(1)
    rows = []
    for n in range(5):
        c = np.cumsum(rng.poisson(5, 400)).astype(float)
        rows.append(pl.DataFrame({"ts": np.arange(400.0), "node": f"n{n}", "metric": "weird_counter", "value": c}))
        g = rng.normal(0, 1, 400)
        rows.append(pl.DataFrame({"ts": np.arange(400.0), "node": f"n{n}", "metric": "weird_gauge", "value": g}))
    from rankscope.analytics.performance.metrics import metric_cube
    from rankscope.config import PerfConfig

    cube = metric_cube(pl.concat(rows), PerfConfig())
    assert cube.kinds() == {"weird_counter": "counter", "weird_gauge": "gauge"}
    assert any("weird_counter" in n and "counter" in n for n in cube.notes)


def test_rates_reset_gap_nan():
    ts = np.array([0, 10, 20, 30, 40, 50, 60, 400, 410.0])
    v = np.array([100, 110, 130, np.nan, 150, 5, 15, 50, 60.0])
    r = counter_rates(ts, v, np.zeros(9, dtype=np.int64), max_gap_s=300)
    assert np.isnan(r[0])  # first sample: no interval
    assert r[1] == 1.0 and r[2] == 2.0
    assert np.isnan(r[3])  # NaN sample skipped ...
    assert r[4] == 1.0  # ... the next interval spans it (20 over 20 s)
    assert np.isnan(r[5])  # a drop is a reset: unknown, never negative
    assert r[6] == 1.0
    assert np.isnan(r[7])  # a gap longer than max_gap_s is unknown
    assert r[8] == 1.0
    assert np.nanmin(r) >= 0


def test_rates_do_not_cross_series():
    r = counter_rates(
        np.array([0, 10, 0, 10.0]), np.array([1e14, 1e14 + 10, 5, 25.0]), np.array([0, 0, 1, 1]), max_gap_s=300
    )
    assert np.isnan(r[0]) and r[1] == 1.0 and np.isnan(r[2]) and r[3] == 2.0


# -- the long form ----------------------------------------------------------------------------------


def test_long_csv_with_instance_and_labels(tmp_path):
    (tmp_path / "metrics.csv").write_text(
        "ts,instance,metric,value,gpu,job\n"
        "1700000000000,10.0.0.1:9100,node_load1,3.5,,train\n"
        "1700000005000,10.0.0.1:9100,node_load1,4,,train\n"  # milliseconds, recognised by magnitude
    )
    f = _frame(tmp_path)
    assert f["node"].to_list() == ["10.0.0.1", "10.0.0.1"]
    assert f["job"].to_list() == ["train", "train"]
    assert f["ts"].to_list() == [1700000000.0, 1700000005.0]
    assert f["gpu"].null_count() == 2


def test_long_parquet_int_gpu_becomes_label(tmp_path):
    pl.DataFrame(
        {
            "ts": [1.0, 2.0],
            "node": ["a", "a"],
            "metric": ["DCGM_FI_DEV_GPU_TEMP"] * 2,
            "value": [40.0, 41.0],
            "gpu": [0, 1],
        }
    ).write_parquet(tmp_path / "metrics.parquet")
    assert _frame(tmp_path / "metrics.parquet")["gpu"].to_list() == ["0", "1"]


def test_long_bad_value_names_the_file(tmp_path):
    p = tmp_path / "metrics.csv"
    p.write_text("ts,node,metric,value\n1,a,m,1\n2,a,m,oops\n")
    with pytest.raises(InputError, match=r"metrics\.csv.*(oops.*'value'|'value'.*oops)"):
        _frame(p)


def test_long_csv_with_whole_numbers_first_and_decimals_later(tmp_path):
    """Written metric by metric, a long CSV's first 10,000+ values may all be whole numbers (utilisation, clocks)
    and decimals (power) come later: an outside tester's valid files were refused whole ("could not parse
    `587.289` as dtype `i64`"). A later row that does not fit the first rows' types (a `gpu` of "all") too."""
    rows = ["ts,node,metric,value,gpu"]
    rows += [f"{1764763200 + 30 * i},host-{i % 4},DCGM_FI_DEV_GPU_UTIL,{95 + i % 5},{i % 8}" for i in range(12_000)]
    rows += [f"{1764763200 + 30 * i},host-{i % 4},DCGM_FI_DEV_POWER_USAGE,{500 + i % 7}.375,all" for i in range(400)]
    (tmp_path / "metrics.csv").write_text("\n".join(rows) + "\n")
    f = _frame(tmp_path)
    power = f.filter(pl.col("metric") == "DCGM_FI_DEV_POWER_USAGE")
    assert f.height == 12_400 and power.height == 400 and power["value"].min() == 500.375
    assert set(f["gpu"].unique().to_list()) >= {"0", "7", "all"}


def test_long_missing_machine_column(tmp_path):
    p = tmp_path / "metrics.csv"
    p.write_text("ts,metric,value\n1,m,1\n")
    with pytest.raises(InputError, match="no machine column"):
        _frame(p)


def test_node_label_choice(tmp_path):
    p = tmp_path / "metrics.csv"
    p.write_text("ts,pod,host_ip,metric,value\n1,p1,10.0.0.1,m,1\n")
    assert _frame(p, node_label="host_ip")["node"].to_list() == ["10.0.0.1"]
    with pytest.raises(InputError, match="--node-label 'rack'"):
        _frame(p, node_label="rack")


# -- Prometheus text exposition ---------------------------------------------------------------------

SCRAPE = """# HELP node_netstat_Tcp_RetransSegs Statistic TcpRetransSegs.
# TYPE node_netstat_Tcp_RetransSegs untyped
node_netstat_Tcp_RetransSegs 12345
# TYPE node_network_receive_bytes_total counter
node_network_receive_bytes_total{device="eth0"} 1.5e+12
node_network_receive_bytes_total{device="lo"} 3.2e+06
# TYPE DCGM_FI_DEV_GPU_TEMP gauge
DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-a",Hostname="dgx-01",modelName="NVIDIA H100 80GB HBM3"} 45
DCGM_FI_DEV_GPU_TEMP{gpu="1",UUID="GPU-b",Hostname="dgx-01",note="a \\"q\\" , x"} NaN
"""


def test_prometheus_text_scrape_time_from_the_file_name(tmp_path):
    p = tmp_path / "dgx-01-1700000000.prom"
    p.write_text(SCRAPE)
    table, types, notes = read_exposition(p)
    assert types["node_network_receive_bytes_total"] == "counter"
    f = _frame(p)
    assert set(f["ts"].to_list()) == {1700000000.0}
    # one machine per file: the node_exporter samples without Hostname belong to the file's one machine
    assert set(f["node"].to_list()) == {"dgx-01"}
    rx = f.filter(pl.col("metric") == "node_network_receive_bytes_total")
    assert sorted(rx["device"].to_list()) == ["eth0", "lo"]
    assert any("Hostname" in n or "file name" in n for n in notes)
    assert f.filter(pl.col("gpu") == "1")["note"].to_list() == ['a "q" , x']


def test_prometheus_text_with_timestamps_and_instance(tmp_path):
    p = tmp_path / "scrape.txt"
    p.write_text('up{instance="n1:9100"} 1 1700000000000\nup{instance="n1:9100"} 1 1700000015000\n')
    f = _frame(p)
    assert f["ts"].to_list() == [1700000000.0, 1700000015.0]
    assert f["node"].unique().to_list() == ["n1"]


def test_prometheus_text_same_series_twice_without_timestamps(tmp_path):
    p = tmp_path / "n1.prom"
    p.write_text('up{instance="n1:9100"} 1\nup{instance="n1:9100"} 0\n')
    with pytest.raises(InputError, match="same series appears twice"):
        _frame(p)


def test_prometheus_text_garbage_names_the_file(tmp_path):
    p = tmp_path / "x.prom"
    p.write_text('# TYPE a gauge\na{b="c"} 1\nthis is not a sample line at all\n')
    with pytest.raises(InputError, match="x.prom"):
        _frame(p)


# -- Prometheus query results -----------------------------------------------------------------------


def test_query_range_json(tmp_path):
    doc = {
        "status": "success",
        "data": {
            "resultType": "matrix",
            "result": [
                {
                    "metric": {
                        "__name__": "DCGM_FI_DEV_SM_CLOCK",
                        "Hostname": "h1",
                        "gpu": "3",
                        "instance": "10.1.1.1:9400",
                    },
                    "values": [[1700000000, "1410"], [1700000015.5, "1395"]],
                },
                {
                    "metric": {"__name__": "DCGM_FI_DEV_SM_CLOCK", "Hostname": "h2", "gpu": "0"},
                    "values": [[1700000000, "NaN"]],
                },
            ],
        },
    }
    (tmp_path / "q.json").write_text(json.dumps(doc))
    f = _frame(tmp_path)
    assert f.height == 3
    assert set(f["node"].to_list()) == {"h1", "h2"}
    assert f.filter(pl.col("node") == "h1")["gpu"].to_list() == ["3", "3"]
    assert "instance" in f.columns


def test_query_json_error_status(tmp_path):
    p = tmp_path / "q.json"
    p.write_text(json.dumps({"status": "error", "errorType": "bad_data", "error": "parse error", "data": {}}))
    with pytest.raises(InputError, match="status 'error'"):
        _frame(p)


def test_empty_query_result_is_a_note_not_a_crash(tmp_path):
    p = tmp_path / "q.json"
    p.write_text(
        json.dumps({"status": "success", "data": {"resultType": "matrix", "result": [{"metric": {}, "values": []}]}})
    )
    assert _frame(p).height == 0


@pytest.mark.parametrize(
    ("path", "machine"),
    [
        # one file per scrape under a host folder, named after the exporter (an outside tester's layout)
        ("scrapes/dgx-h100-0728/node-20251201T101415Z.prom", "dgx-h100-0728"),
        ("scrapes/dgx-h100-0728/node_exporter_1733000000.prom", "dgx-h100-0728"),
        ("node-17/dcgm-exporter-1733000000.prom", "node-17"),
        ("incident/metrics.prom", "incident"),
        # one file per machine: the file names it, without the exporter's name or the time
        ("telemetry/a3-megagpu-029.prom", "a3-megagpu-029"),
        ("dcgm/gpu-node-3-dcgm.prom", "gpu-node-3"),
        ("m/gpu-node-3_node_exporter.prom", "gpu-node-3"),
        ("h/gpu-node-17-2025-12-01T10:00:00Z.prom", "gpu-node-17"),
        ("node-17.prom", "node-17"),
    ],
)
def test_a_label_less_scrape_is_named_after_its_host_not_its_exporter(path: str, machine: str) -> None:
    from rankscope.datasets.readers.prometheus import machine_from_name

    assert machine_from_name(Path("/data") / path) == machine


def _scrape(host: str, t_ms: int, util: float) -> str:
    return (
        "# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n"
        f'DCGM_FI_DEV_GPU_UTIL{{gpu="0",Hostname="{host}"}} {util} {t_ms}\n'
        f'DCGM_FI_DEV_GPU_UTIL{{gpu="1",Hostname="{host}"}} {util} {t_ms}\n'
    )


def test_one_unreadable_metric_file_loses_only_itself(tmp_path: Path) -> None:
    """An interrupted copy cuts one scrape file mid-line: it is skipped with a note naming it, the others read."""
    from rankscope.datasets.readers.metric_files import iter_chunks

    for h in range(3):
        (tmp_path / f"gpu-node-{h}.prom").write_text(
            "".join(_scrape(f"gpu-node-{h}", 1733000000000 + 15000 * i, 90) for i in range(4))
        )
    cut = tmp_path / "gpu-node-3.prom"
    cut.write_text(_scrape("gpu-node-3", 1733000000000, 90) + 'DCGM_FI_DEV_GPU_UTIL{gpu="0",Hostn')
    ms = open_metrics(tmp_path)
    chunks = list(iter_chunks(ms))
    nodes = {n for t, _, _ in chunks if t.num_rows for n in t.column("node").to_pylist()}
    notes = [n for _, _, ns in chunks for n in ns]
    assert nodes == {"gpu-node-0", "gpu-node-1", "gpu-node-2"}
    assert any("gpu-node-3.prom" in n and "skipped" in n for n in notes), notes


def test_every_metric_file_unreadable_is_the_first_ones_error(tmp_path: Path) -> None:
    from rankscope.datasets.readers.metric_files import iter_chunks
    from rankscope.spine import InputError

    for h in range(2):
        (tmp_path / f"gpu-node-{h}.prom").write_text(_scrape(f"gpu-node-{h}", 1733000000000, 90) + "DCGM_FI_DEV_GPU{")
    with pytest.raises(InputError, match=r"gpu-node-\d\.prom"):
        list(iter_chunks(open_metrics(tmp_path)))


def test_machines_named_by_ip_beside_host_names_get_a_note(tmp_path: Path) -> None:
    """dcgm-exporter's Hostname and node_exporter's instance name one machine twice: the verdict says so."""
    from rankscope.datasets.readers.metric_cube import build_cube

    for h in range(2):
        (tmp_path / f"dcgm-{h}.prom").write_text(
            "".join(_scrape(f"gpu-node-{h}", 1733000000000 + 15000 * i, 90) for i in range(4))
        )
        (tmp_path / f"node-{h}.prom").write_text(
            "# TYPE node_load1 gauge\n"
            + "".join(f'node_load1{{instance="10.0.0.{h}:9100"}} 1.5 {1733000000000 + 15000 * i}\n' for i in range(4))
        )
    cube = build_cube(open_metrics(tmp_path), block_s=15.0)
    assert any("2 machine(s) are named by IP address" in n and "--node-label" in n for n in cube.notes), cube.notes


def test_counters_read_after_every_gauge_do_not_break_the_cube(tmp_path, monkeypatch):
    """node_exporter counters whose files sort after the DCGM gauges register their series last, and a chunk
    of counters alone adds no row to the gauge grid: the cube once refused the whole input ("operands could
    not be broadcast together") on an outside tester's 64-machine Prometheus export (4 M samples: the
    gauges filled the first 2 M-row buffer; here the buffer is made small instead)."""
    from rankscope.analytics import diagnose
    from rankscope.datasets.loading.inputs import load_inputs
    from rankscope.datasets.readers import metric_binning

    monkeypatch.setattr(metric_binning, "BUFFER_ROWS", 5_000)

    rng = np.random.default_rng(3)
    hosts = [f"gpu-{k:03d}" for k in range(130)]  # 260 gauge series: past the gauge grid's first 256 rows
    errs = dict.fromkeys(hosts, 0)
    for i in range(40):
        t_ms = (1_790_000_000 + 15 * i) * 1000
        gauges = ["# TYPE DCGM_FI_DEV_GPU_TEMP gauge"] + [
            f'DCGM_FI_DEV_GPU_TEMP{{Hostname="{h}",gpu="{g}"}} {60 + rng.normal(0, 0.5):.2f} {t_ms}'
            for h in hosts
            for g in range(2)
        ]
        (tmp_path / f"dcgm-{i:03d}.prom").write_text("\n".join(gauges) + "\n")
        lines = ["# TYPE node_network_receive_errs_total counter"]
        for h in hosts:  # 260 counter series more: past the 512 rows the gauge grid doubled to
            errs[h] += int(rng.integers(0, 2))
            for dev in ("ib0", "ib1"):
                lines.append(f'node_network_receive_errs_total{{instance="{h}:9100",device="{dev}"}} {errs[h]} {t_ms}')
        (tmp_path / f"node-{i:03d}.prom").write_text("\n".join(lines) + "\n")
    v = diagnose(load_inputs(tmp_path))
    assert v.verdict == "healthy" and v.suspect_nodes == (), v.explain()


def test_clock_event_reasons_are_a_bitmask_of_slowdowns_not_a_number(tmp_path):
    """DCGM_FI_DEV_CLOCK_THROTTLE_REASONS is nvmlClocksEventReasons: a GPU that starts sitting at its software
    power cap (0x4, where every busy GPU may sit) or goes idle (0x1) jumped from 0 to 4 and read as a fault;
    only the slowdown bits (HW slowdown, SW/HW thermal, power brake) count, as 0/1."""
    from rankscope.analytics import diagnose
    from rankscope.datasets.domain.counters import slowdown_flags
    from rankscope.datasets.loading.inputs import load_inputs

    flags = slowdown_flags(np.array([0, 1, 4, 5, 8, 0x20, 0x44, 0x80, 0x100, np.nan, -1, 2.5, 2.0**60]))
    assert flags[:9].tolist() == [0, 0, 0, 0, 1, 1, 1, 1, 0] and np.isnan(flags[9:]).all()
    rng = np.random.default_rng(5)
    hosts = [f"gpu-{k:02d}" for k in range(16)]
    rows = ["ts,node,gpu,metric,value"]
    for i in range(240):
        t = 1_790_000_000 + 15 * i
        for h in hosts:
            for g in range(4):
                capped = h == "gpu-07" and g == 2 and i >= 120  # at its power cap from the middle on
                rows.append(f"{t},{h},{g},DCGM_FI_DEV_CLOCK_THROTTLE_REASONS,{4 if capped else 0}")
                rows.append(f"{t},{h},{g},DCGM_FI_DEV_GPU_TEMP,{62 + rng.normal(0, 0.4):.2f}")
                rows.append(f"{t},{h},{g},DCGM_FI_DEV_SM_CLOCK,{1980 + rng.normal(0, 5):.0f}")
    (tmp_path / "metrics.csv").write_text("\n".join(rows) + "\n")
    v = diagnose(load_inputs(tmp_path))
    assert v.verdict == "healthy" and v.suspect_nodes == (), v.explain()
