"""The framework_logs collector's metrics: per job what its framework printed, and the state of its reading."""

from __future__ import annotations

from lockstep.agent.collector import MetricSpec

LABELS = ("job_id", "framework")

ITERATIONS = MetricSpec(
    "lockstep_framework_iterations_total",
    "counter",
    "Training iterations the job's framework reported done (counted from its first report the agent read).",
    LABELS,
)
ITERATION_SECONDS = MetricSpec(
    "lockstep_framework_iteration_seconds_total",
    "counter",
    "Seconds of training by the framework's own timing (Megatron's elapsed time per iteration, NeMo's "
    "train_step_timing, the time between torchtitan's step lines) over the iterations counted.",
    LABELS,
    unit="seconds",
)
LAST_ITERATION = MetricSpec(
    "lockstep_framework_last_iteration_timestamp_seconds",
    "gauge",
    "Unix time the job's last step report was written: its CRI timestamp in a container's log, "
    "else its file's last change (mtime), at most when the agent read it.",
    LABELS,
    unit="seconds",
)
SECONDS_PER_ITERATION = MetricSpec(
    "lockstep_framework_iteration_duration_seconds",
    "gauge",
    "The job's time per iteration over its last report's interval, by the framework's timing.",
    LABELS,
    unit="seconds",
)
TOKENS = MetricSpec(
    "lockstep_framework_tokens_total",
    "counter",
    "Tokens processed, from the throughput the framework prints (torchtitan: tps, which is per device, "
    "times the time between its step lines).",
    LABELS,
)
SAMPLES = MetricSpec(
    "lockstep_framework_samples_total",
    "counter",
    "Samples the job consumed, from the consumed samples Megatron and NeMo print.",
    LABELS,
)
SAVES = MetricSpec(
    "lockstep_framework_checkpoint_saves_total",
    "counter",
    "Checkpoint saves the job's framework reported finished.",
    LABELS,
)
SAVE_SECONDS = MetricSpec(
    "lockstep_framework_checkpoint_save_seconds_total",
    "counter",
    "Duration of those saves (NeMo's and torchtitan's as printed; Megatron's from its start and end lines).",
    LABELS,
    unit="seconds",
)
SAVE_IN_PROGRESS = MetricSpec(
    "lockstep_framework_checkpoint_save_in_progress",
    "gauge",
    "1 while a Megatron save the job started has not reported its end, else 0.",
    LABELS,
)
STRAGGLER_SECONDS = MetricSpec(
    "lockstep_framework_straggler_iteration_seconds",
    "gauge",
    "Megatron --log-straggler: the fastest and slowest rank's time per iteration in its last report.",
    (*LABELS, "extreme"),
    unit="seconds",
)
STRAGGLER_RANK = MetricSpec(
    "lockstep_framework_straggler_rank",
    "gauge",
    "Megatron --log-straggler: which rank was the fastest and which the slowest in its last report.",
    (*LABELS, "extreme"),
)
FILES = MetricSpec("lockstep_framework_log_files", "gauge", "Output files being followed.", ("source",))
SKIPPED_FILES = MetricSpec(
    "lockstep_framework_skipped_log_files",
    "gauge",
    "Output files matching the paths or found that are not followed: at most max_files are open at once.",
)
UNREADABLE = MetricSpec(
    "lockstep_framework_unreadable_log_files",
    "gauge",
    "Output files found or matched that the agent may not open (permissions): their jobs are not seen.",
)
BYTES_READ = MetricSpec(
    "lockstep_framework_log_read_bytes_total",
    "counter",
    "Bytes of output read.",
    unit="bytes",
)
LINES = MetricSpec(
    "lockstep_framework_log_lines_matched_total",
    "counter",
    "Lines recognised, by framework (only the frameworks seen).",
    ("framework",),
)
INVALID = MetricSpec(
    "lockstep_framework_log_lines_invalid_total",
    "counter",
    "Lines skipped: bad_value (a recognised line with a field that does not parse or is out of range), "
    "no_job (a recognised line in a file no job is known for), too_long (no newline within 64 KiB), "
    "bad_cri (a line of a container log not in the CRI format), too_many_jobs (a line of a new job "
    "while max_jobs jobs are held).",
    ("reason",),
)
INVALID_REASONS = ("bad_value", "no_job", "too_long", "bad_cri", "too_many_jobs")
DISCOVERY_FAILURES = MetricSpec(
    "lockstep_framework_discovery_failures_total",
    "counter",
    "Failed scontrol show job requests (a Slurm job's StdOut/StdErr): asked again at the next discovery.",
)
