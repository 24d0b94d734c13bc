"""The checkpoint collector's metrics, declared once (the collector emits them in this order)."""

from __future__ import annotations

from lockstep.agent.collector import MetricSpec

INFO = MetricSpec(
    "lockstep_checkpoint_info",
    "gauge",
    "One series per checkpoint root, valued 1: the configured pattern it matched, the Slurm job it belongs to "
    "(from job=<id> or similar in its path; empty if unknown), the format of its newest save, how it is watched, "
    "and where it is (storage: local, shared for a network or FUSE filesystem, empty if unknown).",
    ("root", "pattern", "job_id", "format", "watch", "storage"),
)
SAVES = MetricSpec(
    "lockstep_checkpoint_saves_total",
    "counter",
    "Saves completed under the root since the agent started (saves already complete at start are not counted).",
    ("root",),
)
IN_PROGRESS = MetricSpec(
    "lockstep_checkpoint_in_progress_seconds",
    "gauge",
    "How long the current save has been in progress; 0 when none is.",
    ("root",),
    "seconds",
)
LAST_SUCCESS = MetricSpec(
    "lockstep_checkpoint_last_success_timestamp_seconds",
    "gauge",
    "Unix time the newest completed save finished (absent until one is known).",
    ("root",),
    "seconds",
)
LAST_DURATION = MetricSpec(
    "lockstep_checkpoint_last_duration_seconds",
    "gauge",
    "How long the newest completed save took, from its first file to its completion.",
    ("root",),
    "seconds",
)
LAST_SIZE = MetricSpec(
    "lockstep_checkpoint_last_size_bytes", "gauge", "Size of the newest completed save.", ("root",), "bytes"
)
LAST_THROUGHPUT = MetricSpec(
    "lockstep_checkpoint_last_write_throughput_bytes_per_second",
    "gauge",
    "Size of the newest completed save divided by its duration.",
    ("root",),
    "bytes_per_second",
)
EXPECTED_INTERVAL = MetricSpec(
    "lockstep_checkpoint_expected_interval_seconds",
    "gauge",
    "The configured save interval of the root (absent when not configured): alerts compare the age of the last "
    "success and the in-progress time with it.",
    ("root",),
    "seconds",
)
READABLE = MetricSpec(
    "lockstep_checkpoint_root_readable",
    "gauge",
    "1 when the last scan could list the root; 0 when it is missing or not readable (permission denied).",
    ("root",),
)
TRUNCATED = MetricSpec(
    "lockstep_checkpoint_scan_truncated",
    "gauge",
    "1 when the last scan of the root stopped at max_files: sizes and times may be partial.",
    ("root",),
)
SKIPPED_DIRECTORIES = MetricSpec(
    "lockstep_checkpoint_skipped_directories",
    "gauge",
    "Directories max_watch_depth levels below the root (default 16) that have subdirectories: those are not "
    "watched with inotify, nor anything under them (the periodic rescan still counts their files).",
    ("root",),
)
ROOTS = MetricSpec(
    "lockstep_checkpoint_roots",
    "gauge",
    "Directories the configured root pattern matches now (0: nothing to watch, e.g. the filesystem is not mounted).",
    ("pattern",),
)
