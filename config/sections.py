"""The analysis sections of the configuration tree: stacks, collectives, performance (with its stragglers),
crashes, inputs, and the limits every reader and report keeps to. Imports only :mod:`rankscope.spine`."""

from __future__ import annotations

from dataclasses import dataclass, field

from rankscope.spine import (
    ConfigError,
    check_fraction,
    check_int,
    check_non_negative,
    check_positive,
)


@dataclass(frozen=True, kw_only=True)
class StackConfig:
    """Stack clustering and hang localization (ByteRobust's aggregation analysis)."""

    lines: bool = False  # compare line numbers too when clustering
    dominance_fraction: float = 0.5  # a cluster at least this fraction of the largest is healthy
    max_cover_fraction: float = 0.5  # a fault domain larger than this share of nodes is no domain
    min_flag_fraction: float = 0.6  # fail-slow: degrader flagged in at least this share of rounds
    max_missing_fraction: float = 0.5  # more missing dumps than this -> inconclusive
    max_running_fraction: float = 0.2  # one snapshot with more (and >1) ranks running own code was not stuck

    def __post_init__(self) -> None:
        for name in (
            "dominance_fraction",
            "max_cover_fraction",
            "min_flag_fraction",
            "max_missing_fraction",
            "max_running_fraction",
        ):
            check_fraction(f"stacks.{name}", getattr(self, name), error=ConfigError)


@dataclass(frozen=True, kw_only=True)
class CollectivesConfig:
    """Flight Recorder analysis."""

    slow_min_score: float = 0.5  # a rank whose kernel is this much shorter than the next shortest arrived last
    slow_min_wait_fraction: float = 0.3  # fail-slow: its peers wait for it this share of the group's time
    overdue_factor: float = 20.0  # overdue (a hang): min(timeout, max(factor x group p99 latency/cadence, 5 s))
    # the dumps were written by the watchdog on a collective timeout (TORCH_NCCL_DUMP_ON_TIMEOUT, torch's
    # default): each was taken at least one timeout after the oldest op in flight (a lower-bound clock)
    dumped_on_timeout: bool = False

    def __post_init__(self) -> None:
        for name in ("slow_min_score", "slow_min_wait_fraction", "overdue_factor"):
            check = check_fraction if name.startswith("slow") else check_positive
            check(f"collectives.{name}", getattr(self, name), error=ConfigError)


@dataclass(frozen=True, kw_only=True)
class StragglerConfig:
    """Timing stragglers (ratios are durations over the peers' median; NVRx's relative score inverted)."""

    min_slowdown_ratio: float = 1.25
    min_episode_steps: int = 5  # a rank is blamed once it stayed slower for this many steps plus 3
    min_significance: float = 5.0
    intermittent_fraction: float = 0.05
    false_alarm_per_worker: float = 1e-3  # calibration of the rank test: false ranks per job and op
    max_slow_machine_fraction: float = 0.1  # more slow machines than this share (and than 2): an imbalance

    def __post_init__(self) -> None:
        where = "performance.stragglers."
        ratio = check_positive(where + "min_slowdown_ratio", self.min_slowdown_ratio, error=ConfigError)
        if ratio <= 1.0:
            raise ConfigError(f"{where}min_slowdown_ratio={ratio!r} must be above 1 (e.g. 1.2)")
        check_int(where + "min_episode_steps", self.min_episode_steps, minimum=1, error=ConfigError)
        check_positive(where + "min_significance", self.min_significance, error=ConfigError)
        if check_fraction(where + "intermittent_fraction", self.intermittent_fraction, error=ConfigError) >= 1:
            raise ConfigError(f"{where}intermittent_fraction={self.intermittent_fraction!r} must be in (0, 1)")
        check_fraction(where + "max_slow_machine_fraction", self.max_slow_machine_fraction, error=ConfigError)
        if check_fraction(where + "false_alarm_per_worker", self.false_alarm_per_worker, error=ConfigError) >= 1:
            raise ConfigError(f"{where}false_alarm_per_worker={self.false_alarm_per_worker!r} must be in (0, 1)")


@dataclass(frozen=True, kw_only=True)
class PerfConfig:
    """Metrics among peers (the peer-change detector, Minder's 4-minute continuity) and timing stragglers."""

    detector: str = "peer-change"  # a rankscope.models.DETECTORS name (checked where the metrics are scored)
    continuity_seconds: float = 240.0  # a change must last this long (events shorter than it name nobody)
    baseline_seconds: float = 300.0  # a machine's own earlier relation to its peers, before an onset
    min_baseline_seconds: float = 120.0
    false_alarms_per_1000_machine_hours: float = 1.0  # the per-job calibration target of peer-change
    max_named_fraction: float = 0.02  # more machines changed than this share (and than 2): not one machine's
    min_machines: int = 3
    window_seconds: float = 10.0  # the other detectors (detect --detector): window of one score
    threshold: float = 12.0  # the other detectors: peer-distance score that alerts
    stragglers: StragglerConfig = field(default_factory=StragglerConfig)

    def __post_init__(self) -> None:
        for name in (
            "continuity_seconds",
            "baseline_seconds",
            "min_baseline_seconds",
            "false_alarms_per_1000_machine_hours",
            "window_seconds",
            "threshold",
        ):
            check_positive(f"performance.{name}", getattr(self, name), error=ConfigError)
        check_fraction("performance.max_named_fraction", self.max_named_fraction, error=ConfigError)
        check_int("performance.min_machines", self.min_machines, minimum=3, error=ConfigError)


@dataclass(frozen=True, kw_only=True)
class CrashConfig:
    """Crash analysis: which exit came first, and which only followed it."""

    incident_window_seconds: float = 3600.0  # longer than any collective timeout
    tie_seconds: float = 0.1  # clocks of different hosts differ by milliseconds
    widespread_fraction: float = 0.25  # the same error on this share of the world: code, not a machine

    def __post_init__(self) -> None:
        check_positive("crashes.incident_window_seconds", self.incident_window_seconds, error=ConfigError)
        check_non_negative("crashes.tie_seconds", self.tie_seconds, error=ConfigError)
        check_fraction("crashes.widespread_fraction", self.widespread_fraction, error=ConfigError)


@dataclass(frozen=True, kw_only=True)
class InputsConfig:
    """Loading a store or a dump directory."""

    series_gap_seconds: float = 120.0  # captures further apart are separate incidents (rounds are 10 s apart)
    node_label: str = ""  # the metric label (or column) that names the machine; "" = node, Hostname, instance
    metric_format: str = "auto"  # auto | long | prometheus-text | prometheus-json (auto: from each file's content)

    def __post_init__(self) -> None:
        check_positive("inputs.series_gap_seconds", self.series_gap_seconds, error=ConfigError)
        formats = ("auto", "long", "prometheus-text", "prometheus-json")
        if self.metric_format not in formats:
            raise ConfigError(f"inputs.metric_format={self.metric_format!r} must be one of {', '.join(formats)}")


@dataclass(frozen=True, kw_only=True)
class Limits:
    """Bounds on what one diagnosis reads, keeps and reports: hostile or huge inputs must not blow up the
    reading or the output. Every reader enforces the reading limits (``rankscope.datasets.domain.bounds``);
    one that bites is one error line naming the file, the value and this field."""

    max_evidence_items: int = 100  # per-rank evidence entries listed before "N more"
    max_reported_clusters: int = 50  # stack clusters listed in a verdict
    max_file_bytes: int = 2 << 30  # one evidence file read into memory (an FR dump of a big job: ~100s of MB)
    max_json_depth: int = 64  # JSON nesting (FR, py-spy --json, the hook's files nest at most ~6 levels)
    max_files: int = 2_000_000  # files under one dump directory (100,000 ranks x a few files each)
    max_world_size: int = 1 << 22  # ranks in one job (4M: far above any job run today)
    sparse_rank_factor: int = 64  # no --layout: the largest rank may be this many times the ranks seen
    min_year: int = 1970  # timestamps in metrics, timings and records outside these years are refused
    max_year: int = 2100

    def __post_init__(self) -> None:
        check_int("limits.max_evidence_items", self.max_evidence_items, minimum=1, error=ConfigError)
        check_int("limits.max_reported_clusters", self.max_reported_clusters, minimum=1, error=ConfigError)
        check_int("limits.max_file_bytes", self.max_file_bytes, minimum=1, error=ConfigError)
        check_int("limits.max_json_depth", self.max_json_depth, minimum=4, error=ConfigError)
        check_int("limits.max_files", self.max_files, minimum=1, error=ConfigError)
        check_int("limits.max_world_size", self.max_world_size, minimum=1, error=ConfigError)
        check_int("limits.sparse_rank_factor", self.sparse_rank_factor, minimum=1, error=ConfigError)
        check_int("limits.min_year", self.min_year, minimum=1970, error=ConfigError)
        check_int("limits.max_year", self.max_year, minimum=self.min_year + 1, error=ConfigError)
