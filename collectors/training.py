"""Training collector: per-rank step telemetry from the ranks' JSON-lines metric logs.

Each rank of a training job appends records to its own log (the format of
lockstep/emitter.py and of docs/workloads.md): one JSON object per line, one
metric per line, e.g. ``{"ts": "...", "job_id": "4242", "rank": 3, "host": "node001",
"step": 120, "metric": "compute_time_sec", "value": 1.3}``.  This collector follows the
files matching ``--training.logs`` globs (agent/tail.py: watchdog events plus a sweep
every round), groups each rank's records into steps and turns them into counters, so any
scrape interval and ``rate()`` window works.

Grouping records into steps: a rank's records belong to the same step while they carry
the same ``step`` (or, without one, the same ``ts``).  A step is complete when a record
of another step arrives, when a metric repeats, when it has every metric the rank's
previous complete step had (so a steady logger's step counts at once), or when the rank
has written nothing for ``PENDING_STEP_FLUSH_SECONDS``.  Only complete steps are counted.

What each step adds (docs/workloads.md has the table):
- ``step_time_sec``: one step, and its wall time;
- compute: ``compute_time_sec``, else step time minus communication and data wait;
- communication wait: ``comm_wait_time_sec`` (or ``allreduce_time_sec``), else
  ``allreduce_time_pct`` / 100 x step time;
- data wait: ``data_time_sec``;
- tokens: ``tokens``, else ``tokens_per_sec`` x step time; samples: ``samples``, else
  ``throughput_examples_per_sec`` (or ``samples_per_sec``) x step time.
Other metrics (loss, gpu_utilization_pct, ...) are valid and ignored.
"""

from __future__ import annotations

import functools
import json
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from prometheus_client.core import Metric

from lockstep.agent.collector import Collector, CollectorContext, Families, MetricSpec, NothingHere
from lockstep.agent.config import parse_choice, parse_duration, parse_string_list
from lockstep.agent.options import option
from lockstep.agent.tail import DirectoryWatcher, FileFollower, FileId, Line

LABELS = ("job_id", "rank", "host")

STEPS = MetricSpec(
    "lockstep_training_steps_total", "counter", "Training steps the rank completed (step_time_sec records).", LABELS
)
STEP_SECONDS = MetricSpec(
    "lockstep_training_step_seconds_total",
    "counter",
    "Wall time of the rank's steps. In synchronous training every rank's is the same: "
    "compare compute time to find a straggler.",
    LABELS,
    unit="seconds",
)
COMPUTE_SECONDS = MetricSpec(
    "lockstep_training_compute_seconds_total",
    "counter",
    "Time the rank spent computing (forward, backward, optimizer): higher on a straggler than on its peers.",
    LABELS,
    unit="seconds",
)
COMM_WAIT_SECONDS = MetricSpec(
    "lockstep_training_comm_wait_seconds_total",
    "counter",
    "Time the rank spent waiting in collective communication: grows on a straggler's peers.",
    LABELS,
    unit="seconds",
)
DATA_WAIT_SECONDS = MetricSpec(
    "lockstep_training_data_wait_seconds_total",
    "counter",
    "Time the rank spent waiting for its next batch (input pipeline).",
    LABELS,
    unit="seconds",
)
TOKENS = MetricSpec(
    "lockstep_training_tokens_total", "counter", "Tokens the rank processed (for ranks that report tokens).", LABELS
)
SAMPLES = MetricSpec(
    "lockstep_training_samples_total",
    "counter",
    "Samples (examples) the rank processed (for ranks that report them).",
    LABELS,
)
LAST_STEP = MetricSpec(
    "lockstep_training_last_step_timestamp_seconds",
    "gauge",
    "Unix time (the record's ts) of the rank's last completed step.",
    LABELS,
    unit="seconds",
)
FILES = MetricSpec("lockstep_training_log_files", "gauge", "Log files being followed.")
INVALID = MetricSpec(
    "lockstep_training_log_lines_invalid_total",
    "counter",
    "Log lines skipped: not_json (not a JSON object), bad_record (no metric, value, job_id, rank "
    "or ts), bad_value (not a finite number >= 0), too_long (no newline within 64 KiB).",
    ("reason",),
)
INVALID_REASONS = ("not_json", "bad_record", "bad_value", "too_long")

# A rank's unfinished step is counted after this long without a record from the rank
# (its step's records normally end with the start of the next step, see module doc).
PENDING_STEP_FLUSH_SECONDS = 30.0
# Longest accepted label value (job_id, host): a guard against garbage making huge series.
MAX_LABEL_LENGTH = 128

_STEP_TIME = "step_time_sec"
_KNOWN = frozenset(
    {
        _STEP_TIME,
        "compute_time_sec",
        "comm_wait_time_sec",
        "allreduce_time_sec",
        "allreduce_time_pct",
        "data_time_sec",
        "tokens",
        "tokens_per_sec",
        "samples",
        "throughput_examples_per_sec",
        "samples_per_sec",
    }
)
_JOB_IN_PATH = re.compile(r"job=([^/]+?)(?:__|/|$)")
_RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)")


class BadLine(ValueError):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Record:
    rank_key: tuple[str, str, str]  # (job_id, rank, host): the labels
    step_key: str
    metric: str
    value: float
    ts: float


# The largest value a record may carry: more than any step's seconds, tokens or samples.  A
# larger one (1e308) is not a measurement, and summed it would make a counter +Inf for good.
MAX_RECORD_VALUE = 1e15
# Unix seconds up to the year 10000: anything larger is not a time.
MAX_TIMESTAMP = 253402300800.0
MAX_RANK = 10_000_000


def _in_range(value: Any, maximum: float) -> bool:
    """A JSON number from 0 to ``maximum``; compared before any float() (a 400-digit integer
    overflows float(), and math.isfinite() of it raises)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return 0 <= value <= maximum  # False for NaN; exact for integers of any size


def parse_timestamp(value: Any) -> float:
    """'2026-01-02T00:00:01.600Z' (RFC 3339, any offset) or Unix seconds -> Unix seconds."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if not _in_range(value, MAX_TIMESTAMP):
            raise BadLine("bad_record")
        return float(value)
    if not isinstance(value, str):
        raise BadLine("bad_record")
    return _parse_timestamp_text(value)


@functools.lru_cache(maxsize=4096)  # the records of one step share their ts
def _parse_timestamp_text(value: str) -> float:
    text = value.strip()
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"  # Python 3.10's fromisoformat does not take Z
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise BadLine("bad_record") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.timestamp()


def parse_record(data: bytes, path: str) -> Record | None:
    """One log line -> a Record, None for a valid record of a metric we do not use.

    job_id and rank come from the record, else from the path (``...job=4242...`` and
    ``rank-003...``), as in the record format's file layout.
    """
    try:
        obj = json.loads(data)
    except (UnicodeDecodeError, ValueError):
        raise BadLine("not_json") from None
    if not isinstance(obj, dict):
        raise BadLine("not_json")
    metric = obj.get("metric")
    if not isinstance(metric, str) or "value" not in obj or "ts" not in obj:
        raise BadLine("bad_record")
    if metric not in _KNOWN:
        return None
    value = obj["value"]
    if not _in_range(value, MAX_RECORD_VALUE):
        raise BadLine("bad_value")
    ts = parse_timestamp(obj["ts"])
    job_id = obj.get("job_id")
    if job_id is None:
        match = _JOB_IN_PATH.search(path)
        job_id = match.group(1) if match else None
    rank = obj.get("rank")
    if rank is None:
        match = _RANK_IN_NAME.search(path.rsplit("/", 1)[-1])
        rank = int(match.group(1)) if match else None
    host = obj.get("host", "")
    if isinstance(rank, str) and rank.isdigit():
        rank = int(rank)
    if (
        not isinstance(job_id, (str, int))
        or isinstance(job_id, bool)
        or not isinstance(rank, int)
        or isinstance(rank, bool)
        or rank < 0
        or rank > MAX_RANK
        or not isinstance(host, str)
        or len(str(job_id)) > MAX_LABEL_LENGTH
        or len(host) > MAX_LABEL_LENGTH
        or str(job_id) == ""
    ):
        raise BadLine("bad_record")
    step = obj.get("step")
    step_key = f"step:{step}" if isinstance(step, (int, str)) and not isinstance(step, bool) else f"ts:{obj['ts']}"
    return Record((str(job_id), str(rank), host), step_key, metric, float(value), ts)


@dataclass
class _Step:
    key: str
    values: dict[str, float] = field(default_factory=dict)
    ts: float = 0.0


@dataclass
class RankState:
    """One rank's counters, its step being assembled, and the metric set of its last step."""

    steps: int = 0
    step_seconds: float = 0.0
    compute_seconds: float = 0.0
    comm_wait_seconds: float = 0.0
    data_wait_seconds: float = 0.0
    tokens: float | None = None  # None until the rank reports any
    samples: float | None = None
    last_step_ts: float | None = None
    pending: _Step | None = None
    schema: frozenset[str] = frozenset()
    last_record_at: float = 0.0  # agent's monotonic clock

    def add(self, record: Record, now: float) -> None:
        self.last_record_at = now
        pending = self.pending
        if pending is not None and (pending.key != record.step_key or record.metric in pending.values):
            self.finish_step()
            pending = None
        if pending is None:
            pending = self.pending = _Step(record.step_key)
        pending.values[record.metric] = record.value
        pending.ts = max(pending.ts, record.ts)
        if self.schema and self.schema.issubset(pending.values):
            self.finish_step()

    def finish_step(self) -> None:
        step, self.pending = self.pending, None
        if step is None:
            return
        v = step.values
        wall = v.get(_STEP_TIME)
        data = v.get("data_time_sec")
        comm = v.get("comm_wait_time_sec", v.get("allreduce_time_sec"))
        if comm is None and wall is not None and "allreduce_time_pct" in v:
            comm = v["allreduce_time_pct"] / 100.0 * wall
        compute = v.get("compute_time_sec")
        if compute is None and wall is not None:
            compute = max(0.0, wall - (comm or 0.0) - (data or 0.0))
        tokens = v.get("tokens")
        if tokens is None and wall is not None and "tokens_per_sec" in v:
            tokens = v["tokens_per_sec"] * wall
        samples = v.get("samples")
        rate = v.get("throughput_examples_per_sec", v.get("samples_per_sec"))
        if samples is None and wall is not None and rate is not None:
            samples = rate * wall
        if wall is not None:
            self.steps += 1
            self.step_seconds += wall
            self.last_step_ts = max(self.last_step_ts or 0.0, step.ts)
            self.schema = frozenset(v)
        self.compute_seconds += compute or 0.0
        self.comm_wait_seconds += comm or 0.0
        self.data_wait_seconds += data or 0.0
        if tokens is not None:
            self.tokens = (self.tokens or 0.0) + tokens
        if samples is not None:
            self.samples = (self.samples or 0.0) + samples


@dataclass(frozen=True)
class TrainingOptions:
    logs: tuple[str, ...] = option(
        (),
        parse_string_list,
        "glob of per-rank JSON-lines metric logs, on the host (under --path.rootfs), ** allowed",
        flag="--training.logs",
        repeatable=True,
    )
    start_at: str = option(
        "end",
        parse_choice(("end", "beginning")),
        "where to start reading the log files present when the agent starts: end (skip their history) or beginning",
        flag="--training.start-at",
    )
    idle_timeout: float = option(600.0, parse_duration, "a rank that has logged nothing for this long is dropped")


class TrainingCollector(Collector[TrainingOptions]):
    name = "training"
    help = "Per-rank training step, compute, communication-wait and data-wait time from JSON-lines logs."
    default_interval = 15.0
    metrics = (
        STEPS,
        STEP_SECONDS,
        COMPUTE_SECONDS,
        COMM_WAIT_SECONDS,
        DATA_WAIT_SECONDS,
        TOKENS,
        SAMPLES,
        LAST_STEP,
        FILES,
        INVALID,
    )
    options_class = TrainingOptions

    def __init__(self, context: CollectorContext) -> None:
        super().__init__(context)
        self.clock = time.monotonic  # tests replace it
        self._lock = threading.Lock()  # the watchdog thread and collect() both read files
        self._follower: FileFollower | None = None
        self._watcher: DirectoryWatcher | None = None
        self._ranks: dict[tuple[str, str, str], RankState] = {}
        self._invalid = dict.fromkeys(INVALID_REASONS, 0)
        # Files first read from their end: the step already under way there (the step of
        # the line before the starting point), whose remaining records are not counted:
        # its beginning was never read.
        self._under_way: dict[FileId, str] = {}
        self._watch_problems: list[str] = []

    def check(self) -> str:
        if not self.options.logs:
            raise NothingHere(self._nothing_configured())
        follower = FileFollower(self.options.logs, self.paths.rootfs, start_at_end=True, log=self.log)
        try:
            follower.sweep()
            return f"{follower.followed} log file(s) match {', '.join(self.options.logs)}"
        finally:
            follower.close()

    def collect(self) -> Iterator[Metric]:
        if not self.options.logs:
            raise NothingHere(self._nothing_configured())
        with self._lock:
            if self._follower is None:
                self._follower = FileFollower(
                    self.options.logs, self.paths.rootfs, start_at_end=self.options.start_at == "end", log=self.log
                )
            self._ingest(self._follower.sweep())
            now = self.clock()
            for key, rank in list(self._ranks.items()):
                if now - rank.last_record_at >= self.options.idle_timeout:
                    del self._ranks[key]  # the job finished (or the rank moved): drop its series
                elif rank.pending is not None and now - rank.last_record_at >= PENDING_STEP_FLUSH_SECONDS:
                    rank.finish_step()
            directories = self._follower.directories()
            families = self._families()
        # Outside our lock: watchdog's dispatcher holds its own lock while it calls
        # _on_file_event, which takes ours.
        self._watch(directories)
        return iter(families)

    def close(self) -> None:
        with self._lock:
            watcher, self._watcher = self._watcher, None
            follower, self._follower = self._follower, None  # events from now on read nothing
        if watcher is not None:
            watcher.stop()  # not under our lock, see collect()
        if follower is not None:
            follower.close()

    # --- reading ---

    def _on_file_event(self, path: str) -> None:
        """From the watchdog thread: read the file now (growth, rotation, truncation)."""
        with self._lock:
            if self._follower is None:
                return
            try:
                self._ingest(self._follower.read_path(path))
            except Exception as exc:  # never let one file kill the event thread; the sweep retries
                self.log.debug("reading %s after an event failed: %s", path, exc)

    def _watch(self, directories: set[str]) -> None:
        """Point the watcher at ``directories``.  Called from the collector's own thread
        only (collect, then close at the end), never with our lock held."""
        try:
            if self._watcher is None:
                self._watcher = DirectoryWatcher(self._on_file_event)
            problems = self._watcher.watch(directories)
        except OSError as exc:
            problems = [str(exc)]
        # e.g. the inotify watch limit: the sweep every round still reads everything.
        if problems and problems != self._watch_problems:
            self.log.warning("cannot watch log directories, reading them every round only: %s", "; ".join(problems))
        self._watch_problems = problems

    def _ingest(self, lines: list[Line]) -> None:
        now = self.clock()
        for line in lines:
            try:
                record = parse_record(line.data, line.path)
            except BadLine as bad:
                if not line.context:  # context was read before; its garbage is not news
                    self._invalid[bad.reason] += 1
                continue
            except Exception:  # whatever a line holds, it never costs the rest of the batch
                if not line.context:
                    self._invalid["bad_record"] += 1
                continue
            if record is None:
                continue
            if line.context:
                self._under_way[line.file] = record.step_key
                continue
            if line.file in self._under_way:
                if self._under_way[line.file] == record.step_key:
                    continue  # the rest of a step whose beginning was before we started
                del self._under_way[line.file]
            rank = self._ranks.get(record.rank_key)
            if rank is None:
                rank = self._ranks[record.rank_key] = RankState()
            rank.add(record, now)

    # --- output ---

    def _families(self) -> list[Metric]:
        families = Families(self.metrics)
        for key in sorted(self._ranks, key=lambda k: (k[0], int(k[1]), k[2])):
            rank = self._ranks[key]
            labels = list(key)
            # Rounded to the nanosecond: sums of decimal step times carry binary noise
            # (299.19999999999993) that is no information.
            families[STEPS].add_metric(labels, rank.steps)
            families[STEP_SECONDS].add_metric(labels, round(rank.step_seconds, 9))
            families[COMPUTE_SECONDS].add_metric(labels, round(rank.compute_seconds, 9))
            families[COMM_WAIT_SECONDS].add_metric(labels, round(rank.comm_wait_seconds, 9))
            families[DATA_WAIT_SECONDS].add_metric(labels, round(rank.data_wait_seconds, 9))
            if rank.tokens is not None:
                families[TOKENS].add_metric(labels, round(rank.tokens, 6))
            if rank.samples is not None:
                families[SAMPLES].add_metric(labels, round(rank.samples, 6))
            if rank.last_step_ts is not None:
                families[LAST_STEP].add_metric(labels, rank.last_step_ts)
        assert self._follower is not None
        families[FILES].add_metric([], self._follower.followed)
        self._invalid["too_long"] = self._follower.lines_too_long
        for reason in INVALID_REASONS:
            families[INVALID].add_metric([reason], self._invalid[reason])
        return families.with_samples()

    def _nothing_configured(self) -> str:
        return "no training log globs configured (--training.logs GLOB or collectors.training.logs)"
