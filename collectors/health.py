"""The agent's own health for Prometheus: ``rankscope agent --metrics-port PORT`` serves it on loopback.

Imported only when the flag is given (the lean daemon does not load prometheus_client otherwise). The
collector reads the agent's counters when scraped, so a tick costs nothing more; its registry is its own
(never prometheus_client's global one, which would add the client's process and GC metrics). Served on
127.0.0.1 only: a node's health endpoint is for the local node_exporter/Prometheus agent, not the network.

Metrics: ``rankscope_agent_capture_duration_seconds`` (histogram of capture rounds),
``rankscope_agent_captures_total``, ``rankscope_agent_rows_written_total{table}``,
``rankscope_agent_rows_dropped_total{table}``, ``rankscope_agent_write_errors_total``,
``rankscope_agent_collector_up{collector}`` (1 when that collector's last run succeeded),
``rankscope_agent_collector_failures_total{collector}``, ``rankscope_agent_ticks_total``,
``rankscope_agent_cpu_seconds_total``, ``rankscope_agent_resident_memory_bytes`` (peak),
``rankscope_agent_start_time_seconds``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

CAPTURE_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
"""Seconds: a capture of 8 ranks takes ~0.1 s, a py-spy timeout 5 s."""


class AgentCollector:
    """Reads an :class:`~rankscope.collectors.agent.Agent` when scraped."""

    def __init__(self, agent: Any) -> None:
        self.agent = agent

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        from rankscope.collectors.host_metrics import self_usage

        a = self.agent
        seconds = [c.seconds for c in list(a.captures)]
        buckets = [(str(b), float(sum(1 for s in seconds if s <= b))) for b in CAPTURE_BUCKETS]
        buckets.append(("+Inf", float(len(seconds))))
        yield HistogramMetricFamily(
            "rankscope_agent_capture_duration_seconds",
            "Seconds per capture round.",
            buckets=buckets,
            sum_value=float(sum(seconds)),
        )
        yield _counter(CounterMetricFamily, "rankscope_agent_captures", "Capture rounds.", len(seconds))
        for name, doc, values in (
            ("rankscope_agent_rows_written", "Rows written to the store.", dict(a.writer.written)),
            ("rankscope_agent_rows_dropped", "Rows dropped (full buffer or failed write).", dict(a.writer.dropped)),
        ):
            fam = CounterMetricFamily(name, doc, labels=["table"])
            for table, n in sorted(values.items()):
                fam.add_metric([table], float(n))
            yield fam
        errors = a.writer.write_errors
        yield _counter(CounterMetricFamily, "rankscope_agent_write_errors", "Failed store writes.", errors)
        up = GaugeMetricFamily(
            "rankscope_agent_collector_up", "1 when the collector's last run succeeded.", labels=["collector"]
        )
        for name, ok in sorted(dict(a.collector_ok).items()):
            up.add_metric([name], 1.0 if ok else 0.0)
        yield up
        fails = CounterMetricFamily(
            "rankscope_agent_collector_failures", "Failed runs per collector.", labels=["collector"]
        )
        for name, n in sorted(dict(a.failures).items()):
            fails.add_metric([name], float(n))
        yield fails
        yield _counter(CounterMetricFamily, "rankscope_agent_ticks", "Agent loop iterations.", a.ticks)
        cpu, rss = self_usage()
        yield _counter(CounterMetricFamily, "rankscope_agent_cpu_seconds", "CPU time of the agent.", cpu)
        for name, doc, value in (
            ("rankscope_agent_resident_memory_bytes", "Peak resident memory of the agent.", rss),
            ("rankscope_agent_start_time_seconds", "When the agent started (epoch seconds).", a._started),
        ):
            g = GaugeMetricFamily(name, doc)
            g.add_metric([], float(value))
            yield g


def _counter(cls: Any, name: str, doc: str, value: float) -> Any:
    fam = cls(name, doc)
    fam.add_metric([], float(value))
    return fam


def serve(agent: Any, port: int) -> Any:
    """Serve the agent's metrics on http://127.0.0.1:PORT/metrics (a daemon thread); the server (``.shutdown()``)."""
    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry(auto_describe=False)
    registry.register(AgentCollector(agent))
    server, _thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    return server
