"""The training collector's metrics: per-rank step counters, and the state of its log reading."""

from __future__ import annotations

from lockstep.agent.collector import MetricSpec

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
LOG_WRITERS = MetricSpec(
    "lockstep_training_log_writer_processes",
    "gauge",
    "Processes on this node holding the rank's log open for writing, counted once the rank has "
    "logged nothing for 60 s: 1 or more for a hung rank (its process is alive); a rank whose "
    "process is gone has ended and is dropped.",
    LABELS,
)
FILES = MetricSpec("lockstep_training_log_files", "gauge", "Log files being followed.")
SKIPPED_FILES = MetricSpec(
    "lockstep_training_skipped_log_files",
    "gauge",
    "Log files matching the globs that are not followed: the collector holds at most a quarter of "
    "the open-file limit (at most 1024) open.",
)
INVALID = MetricSpec(
    "lockstep_training_log_lines_invalid_total",
    "counter",
    "Log lines skipped: not_json (not a JSON object), bad_record (no metric, value, job_id, rank "
    "or ts, or a ts over 60 s ahead of this node's clock), bad_value (not a finite number >= 0), "
    "too_long (no newline within 64 KiB), too_many_ranks (a record of a new rank while max_ranks "
    "ranks are held).",
    ("reason",),
)
INVALID_REASONS = ("not_json", "bad_record", "bad_value", "too_long", "too_many_ranks")
