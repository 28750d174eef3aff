"""Every Parquet table of the rankscope store, declared in one place.

A table is one :class:`TableSpec`: a name, an Arrow schema and the columns it is partitioned by.
Adding a table means adding one spec to :data:`TABLES`; :meth:`rankscope.datasets.store.store.Store.write`
is the writer for all of them.

Conventions: times are ``timestamp[us, UTC]``; ids from the field keep their field names (rank,
local_rank, pg_id, collective_seq_id); metric names follow Prometheus (snake_case, base units).
Frames are stored **innermost first**, as py-spy and faulthandler print them.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from rankscope.datasets.domain.stacks import ROLES
from rankscope.spine import InputError, StoreError

TIME = pa.timestamp("us", tz="UTC")

FRAME = pa.struct(
    [
        pa.field("function", pa.string()),
        pa.field("file", pa.string()),
        pa.field("line", pa.int32()),
    ]
)

__all__ = ["ROLES", "TABLES", "TableSpec", "table"]  # ROLES lives with the stacks (no pyarrow to read a role)


@dataclass(frozen=True)
class TableSpec:
    """One table: its name, its Arrow schema and its hive partition columns."""

    name: str
    schema: pa.Schema
    partition_by: tuple[str, ...] = ("job",)
    doc: str = ""

    def __post_init__(self) -> None:
        for col in self.partition_by:
            if col not in self.schema.names:
                raise StoreError(f"table {self.name}: partition column {col!r} not in schema")


STACKS = TableSpec(
    "stacks",
    pa.schema(
        [
            pa.field("job", pa.string(), nullable=False),
            pa.field("snapshot", pa.int32(), nullable=False),
            pa.field("time", TIME),
            pa.field("node", pa.string()),
            pa.field("rank", pa.int32()),
            pa.field("pid", pa.int64()),
            pa.field("role", pa.string()),
            pa.field("thread_id", pa.int64()),
            pa.field("thread_name", pa.string()),
            pa.field("is_main_thread", pa.bool_()),
            pa.field("active", pa.bool_()),
            pa.field("frames", pa.list_(FRAME)),
            pa.field("source_format", pa.string()),
            pa.field("source_file", pa.string()),
            pa.field("status", pa.string()),  # ok | partial | failed | cut (see readers.base.ProcessDump)
            pa.field("error", pa.string()),
            # optional (the agent leaves them null): why a failed capture failed, and for ingested dump
            # directories the ingest that wrote the row and the digest of the file it came from
            pa.field("failure_kind", pa.string()),
            pa.field("ingest_id", pa.string()),
            pa.field("source_digest", pa.string()),
        ]
    ),
    doc="One row per thread of one process in one snapshot; a failed dump is one row with status=failed. "
    "``time`` is when the stack was taken (the agent's capture time, or a time the dump's content gives).",
)

INGESTS = TableSpec(
    "ingests",
    pa.schema(
        [
            pa.field("job", pa.string(), nullable=False),
            pa.field("ingest_id", pa.string(), nullable=False),
            pa.field("ingest_time", TIME, nullable=False),
            pa.field("source", pa.string()),  # the directory ingested
            pa.field("source_file", pa.string()),  # one evidence file of it, as the rows name it
            pa.field("source_digest", pa.string()),  # BLAKE2b-128 of the file's bytes
            pa.field("kind", pa.string()),  # stacks | flight_recorder | metrics | timings | exits | logs
            pa.field("capture_time", TIME),  # when the incident was captured, when the content says
        ]
    ),
    doc="The ingest ledger: one row per evidence file per ingest. Ingesting a file whose digest is already "
    "here for the job adds nothing; the latest incident (capture time, else ingest time) is diagnosed.",
)

TOPOLOGY = TableSpec(
    "topology",
    pa.schema(
        [
            pa.field("job", pa.string(), nullable=False),
            pa.field("rank", pa.int32(), nullable=False),
            pa.field("node", pa.string(), nullable=False),
            pa.field("local_rank", pa.int32()),
            pa.field("tp", pa.int32()),
            pa.field("cp", pa.int32()),
            pa.field("ep", pa.int32()),
            pa.field("dp", pa.int32()),
            pa.field("pp", pa.int32()),
            pa.field("node_inferred", pa.bool_()),  # true: nobody named the machine, rankscope made node-<r // N> up
            pa.field("ingest_id", pa.string()),  # the ingest that wrote the row (null: the agent's)
        ]
    ),
    doc="One row per rank: its node and its coordinate along each parallel dimension.",
)

VERDICTS = TableSpec(
    "verdicts",
    pa.schema(
        [
            pa.field("job", pa.string(), nullable=False),
            pa.field("time", TIME),  # when the diagnosis ran
            pa.field("verdict", pa.string(), nullable=False),
            pa.field("confidence", pa.float64()),
            pa.field("suspect_nodes", pa.list_(pa.string())),
            pa.field("culprit_nodes", pa.list_(pa.string())),
            pa.field("suspect_ranks", pa.list_(pa.int32())),
            pa.field("summary", pa.string()),
            pa.field("verdict_json", pa.string()),
            pa.field("incident_time", TIME),  # when the incident happened (see rankscope.datasets.store.catalog)
            pa.field("incident_source", pa.string()),  # capture | first-failure | flight-recorder | ...
            # optional (rankscope batch fills them): which incident of the job (an ingest id, capture-<snapshot>
            # or live) and a digest of its evidence; batch writes a (job, incident_id, input_fingerprint) once
            pa.field("incident_id", pa.string()),
            pa.field("input_fingerprint", pa.string()),
        ]
    ),
    doc="One row per diagnosis: the decision, its full JSON, and when the incident it explains happened.",
)

BATCH_RUNS = TableSpec(
    "batch_runs",
    pa.schema(
        [
            pa.field("run_id", pa.string(), nullable=False),
            pa.field("started", TIME, nullable=False),
            pa.field("finished", TIME),
            pa.field("duration_seconds", pa.float64()),
            pa.field("host", pa.string()),
            pa.field("pid", pa.int64()),
            pa.field("runner", pa.string()),  # local | ray
            pa.field("workers", pa.int32()),
            pa.field("jobs_total", pa.int64()),  # jobs with evidence in the store
            pa.field("jobs_new", pa.int64()),  # jobs with evidence newer than their watermark
            pa.field("jobs_done", pa.int64()),
            pa.field("jobs_failed", pa.int64()),
            pa.field("incidents_diagnosed", pa.int64()),
            pa.field("verdicts_written", pa.int64()),
            pa.field("failures", pa.list_(pa.string())),  # "job: one-line error"
            pa.field("status", pa.string()),  # ok | failed | stopped
        ]
    ),
    partition_by=(),
    doc="One row per `rankscope batch` run: how long it took, what it did and which jobs failed (the export's "
    "batch metrics come from here).",
)

COLLECTIVES = TableSpec(
    "collectives",
    pa.schema(
        [
            pa.field("job", pa.string(), nullable=False),
            pa.field("rank", pa.int32(), nullable=False),
            pa.field("node", pa.string()),
            pa.field("source_file", pa.string()),
            pa.field("fr_version", pa.string()),
            pa.field("record_id", pa.int64()),
            pa.field("pg_id", pa.string()),
            pa.field("pg_name", pa.string()),
            pa.field("pg_desc", pa.string()),
            pa.field("collective_seq_id", pa.int64()),
            pa.field("p2p_seq_id", pa.int64()),
            pa.field("op_id", pa.int64()),
            pa.field("profiling_name", pa.string()),
            pa.field("backend", pa.string()),
            pa.field("op", pa.string()),
            pa.field("is_p2p", pa.bool_()),
            pa.field("peer", pa.int32()),
            pa.field("state", pa.string()),
            pa.field("retired", pa.bool_()),
            pa.field("time_created_ns", pa.int64()),
            pa.field("time_discovered_started_ns", pa.int64()),
            pa.field("time_discovered_completed_ns", pa.int64()),
            pa.field("duration_ms", pa.float64()),
            pa.field("timeout_ms", pa.int64()),
            pa.field("input_sizes", pa.string()),  # JSON list of shapes
            pa.field("input_dtypes", pa.list_(pa.string())),
            pa.field("output_sizes", pa.string()),
            pa.field("output_dtypes", pa.list_(pa.string())),
            pa.field("frames", pa.list_(FRAME)),
            pa.field("pg_ranks", pa.list_(pa.int32())),  # the group's members per this rank's pg_config
            pa.field("pg_last_enqueued", pa.int64()),  # this rank's pg_status for the group
            pa.field("pg_last_started", pa.int64()),
            pa.field("pg_last_completed", pa.int64()),
            pa.field("dump_time_ns", pa.int64()),  # when the dump was taken, where a collector recorded it
        ]
    ),
    doc="One row per Flight Recorder entry of one rank, plus one metadata row (record_id null) per process "
    "group of the rank with its pg_config members and pg_status (pg_id: its pg_status key).",
)

FR_DUMPS = TableSpec(
    "fr_dumps",
    pa.schema(
        [
            pa.field("job", pa.string(), nullable=False),
            pa.field("capture_time", TIME, nullable=False),  # when the agent asked for the dump
            pa.field("rank", pa.int32(), nullable=False),
            pa.field("node", pa.string()),
            pa.field("pid", pa.int64()),
            pa.field("path", pa.string(), nullable=False),  # the raw dump, relative to the store root
            pa.field("format", pa.string()),  # fr-json | fr-pickle
            pa.field("size_bytes", pa.int64()),
            pa.field("sha256", pa.string()),
        ]
    ),
    doc="Index of raw Flight Recorder dumps the agent keeps per capture (the hook's bytes, unparsed, under "
    "artifacts/fr/); diagnose reads the latest capture through the Flight Recorder reader.",
)

PROCESSES = TableSpec(
    "processes",
    pa.schema(
        [
            pa.field("job", pa.string(), nullable=False),
            pa.field("time", TIME),
            pa.field("node", pa.string()),
            pa.field("pid", pa.int64()),
            pa.field("ppid", pa.int64()),
            pa.field("role", pa.string()),
            pa.field("rank", pa.int32()),
            pa.field("local_rank", pa.int32()),
            pa.field("world_size", pa.int32()),
            pa.field("group_rank", pa.int32()),
            pa.field("master_addr", pa.string()),
            pa.field("cmdline", pa.string()),
            pa.field("comm", pa.string()),  # /proc/PID/comm (pt_data_worker, rs_checkpoint, ...)
            pa.field("trainer_pid", pa.int64()),  # for a trainer's child: the trainer it belongs to
            pa.field("is_launcher", pa.bool_()),  # torchrun / torch.distributed.run itself
        ]
    ),
    doc="The process table the agent discovered: one row per process per discovery.",
)

METRICS = TableSpec(
    "metrics",
    pa.schema(
        [
            pa.field("job", pa.string(), nullable=False),
            pa.field("ts", TIME),
            pa.field("node", pa.string()),
            pa.field("metric", pa.string()),
            pa.field("value", pa.float64()),
            pa.field("gpu", pa.int32()),
            pa.field("rank", pa.int32()),
            pa.field("pid", pa.int64()),
            pa.field("labels", pa.string()),  # JSON object of extra labels (device, port, ...)
        ]
    ),
    doc="Metrics in long form; names follow Prometheus conventions with base units.",
)

EVENTS = TableSpec(
    "events",
    pa.schema(
        [
            pa.field("job", pa.string(), nullable=False),
            pa.field("ts", TIME),
            pa.field("node", pa.string()),
            pa.field("kind", pa.string()),  # xid, nic_down, nic_flap, disk_full, fs_readonly, gpu_lost, stall, ...
            pa.field("severity", pa.string()),  # info | warning | critical
            pa.field("gpu", pa.int32()),
            pa.field("rank", pa.int32()),
            pa.field("message", pa.string()),
            pa.field("labels", pa.string()),
            pa.field("pid", pa.int64()),
            pa.field("action", pa.string()),  # evict | drain | tolerate | stop-time-check | capture | none
        ]
    ),
    doc="Health events, each with a severity the recovery policy acts on (see collectors/events.py).",
)

TIMINGS = TableSpec(
    "timings",
    pa.schema(
        [
            pa.field("job", pa.string(), nullable=False),
            pa.field("rank", pa.int32(), nullable=False),
            pa.field("step", pa.int64(), nullable=False),
            pa.field("op", pa.string(), nullable=False),
            pa.field("duration_s", pa.float64(), nullable=False),
            pa.field("start_s", pa.float64()),
            pa.field("node", pa.string()),
            pa.field("tp", pa.int32()),
            pa.field("pp", pa.int32()),
            pa.field("dp", pa.int32()),
        ]
    ),
    doc="Per-rank, per-step operation timings (Megatron timers, log_step, per-op traces).",
)

ACTIONS = TableSpec(
    "actions",
    pa.schema(
        [
            pa.field("job", pa.string(), nullable=False),
            pa.field("incident", pa.string(), nullable=False),  # the plan's idempotency key, inc-<16 hex>
            pa.field("ts", TIME, nullable=False),
            pa.field("who", pa.string()),  # user@host pid N
            # evict | restart | rollback | stop | tolerate | collect | skip
            pa.field("what", pa.string(), nullable=False),
            pa.field("nodes", pa.list_(pa.string())),
            pa.field("why", pa.string()),
            pa.field("outcome", pa.string(), nullable=False),  # dry-run | ok | failed | skipped
            pa.field("backend", pa.string()),  # local | slurm | k8s
            pa.field("dry_run", pa.bool_(), nullable=False),
            pa.field("rule", pa.string()),  # the ladder rule that decided
            pa.field("commands", pa.list_(pa.string())),  # the exact commands / API calls
            pa.field("detail", pa.string()),
            pa.field("suspect_nodes", pa.list_(pa.string())),
        ]
    ),
    doc="The recovery executor's append-only audit trail: who did what, when, why, and what came of it.",
)

TABLES: dict[str, TableSpec] = {
    spec.name: spec
    for spec in (
        STACKS,
        TOPOLOGY,
        VERDICTS,
        COLLECTIVES,
        FR_DUMPS,
        PROCESSES,
        METRICS,
        EVENTS,
        TIMINGS,
        INGESTS,
        ACTIONS,
        BATCH_RUNS,
    )
}


def table(name: str) -> TableSpec:
    """The spec of table ``name``; an unknown name lists the valid ones."""
    try:
        return TABLES[name]
    except KeyError:
        raise InputError(f"unknown table {name!r}; valid tables: {', '.join(sorted(TABLES))}") from None
