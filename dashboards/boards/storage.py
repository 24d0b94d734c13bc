"""The storage & checkpoints dashboard: filesystems (space, responsiveness, NFS and Lustre client, I/O
pressure) and checkpoint saves per root."""

from __future__ import annotations

from alerts.recording import EXPECTED_INTERVAL
from dashboards.board import Board
from dashboards.panels import GREEN, ORANGE, RATE, RED, SEL, Cell, above, below, table, timeseries
from lockstep import thresholds as T


def filesystems() -> list[Cell]:
    """Space left, responsiveness, statfs latency."""
    return [
        table(
            "Space left",
            [(f"mountpoint:lockstep_filesystem_available_bytes:ratio{{{SEL}}}", "")],
            "percentunit",
            f"LockstepFilesystemAlmostFull fires below {T.FILESYSTEM_AVAILABLE_CRITICAL_RATIO:.0%}, or below "
            f"{T.FILESYSTEM_AVAILABLE_PREDICT_RATIO:.0%} when filling up within a day.",
            [
                {"color": RED, "value": None},
                {"color": ORANGE, "value": T.FILESYSTEM_AVAILABLE_CRITICAL_RATIO},
                {"color": GREEN, "value": T.FILESYSTEM_AVAILABLE_PREDICT_RATIO},
            ],
        ),
        table(
            "Responsive",
            [(f"lockstep_filesystem_responsive{{{SEL}}}", "")],
            "none",
            "0: statfs on the mount did not return within the agent's deadline (LockstepFilesystemHung).",
            below(1),
        ),
        timeseries(
            "Available space",
            [(f"lockstep_filesystem_available_bytes{{{SEL}}}", "{{instance}} {{mountpoint}}")],
            "bytes",
        ),
        timeseries(
            "statfs latency",
            [(f"lockstep_filesystem_stat_duration_seconds{{{SEL}}}", "{{instance}} {{mountpoint}}")],
            "s",
        ),
    ]


def network_filesystems_and_io() -> list[Cell]:
    """NFS round trips, retransmissions and timeouts, Lustre throughput, I/O pressure."""
    return [
        timeseries(
            "NFS round-trip time",
            [
                (
                    "sum by (instance, mountpoint, operation)"
                    f" (rate(lockstep_nfs_rtt_seconds_total{{{SEL}}}[{RATE}]))"
                    " / sum by (instance, mountpoint, operation)"
                    f" (rate(lockstep_nfs_operations_total{{{SEL}}}[{RATE}]))",
                    "{{instance}} {{mountpoint}} {{operation}}",
                )
            ],
            "s",
        ),
        timeseries(
            "NFS retransmissions and major timeouts",
            [
                (
                    f"sum by (instance, mountpoint) (rate(lockstep_nfs_retransmissions_total{{{SEL}}}[{RATE}]))",
                    "{{instance}} {{mountpoint}} retransmissions",
                ),
                (
                    f"sum by (instance, mountpoint) (rate(lockstep_nfs_major_timeouts_total{{{SEL}}}[{RATE}]))",
                    "{{instance}} {{mountpoint}} major timeouts",
                ),
            ],
            "cps",
            "Major timeouts ('server not responding') fire LockstepFilesystemHung.",
        ),
        timeseries(
            "Lustre client throughput",
            [
                (f"rate(lockstep_lustre_read_bytes_total{{{SEL}}}[{RATE}])", "{{instance}} {{filesystem}} read"),
                (f"rate(lockstep_lustre_write_bytes_total{{{SEL}}}[{RATE}])", "{{instance}} {{filesystem}} write"),
            ],
            "Bps",
        ),
        timeseries(
            "I/O pressure (all tasks stalled)",
            [(f"instance:lockstep_host_io_full_pressure:ratio5m{{{SEL}}}", "{{instance}}")],
            "percentunit",
            f"LockstepIOStall fires above {T.IO_FULL_PRESSURE_RATIO:.0%} for 10 minutes.",
            above((T.IO_FULL_PRESSURE_RATIO, RED)),
        ),
    ]


def checkpoints() -> list[Cell]:
    """Save age and progress against their limits, the last save, the checkpoint roots."""
    return [
        timeseries(
            "Time since the last completed save",
            [
                (f"root:lockstep_checkpoint_last_success_timestamp_seconds:age{{{SEL}}}", "{{instance}} {{root}}"),
                (
                    f"{T.CHECKPOINT_OVERDUE_INTERVALS:g} * {EXPECTED_INTERVAL}{{{SEL}}}",
                    "{{instance}} {{root}} overdue after",
                ),
            ],
            "s",
            f"LockstepCheckpointOverdue fires when the age passes {T.CHECKPOINT_OVERDUE_INTERVALS:g} save "
            f"intervals (the 'overdue after' series) for 5 minutes; roots without an interval use "
            f"{T.CHECKPOINT_DEFAULT_INTERVAL_SECONDS} s.",
        ),
        timeseries(
            "Save in progress for",
            [
                (f"lockstep_checkpoint_in_progress_seconds{{{SEL}}}", "{{instance}} {{root}}"),
                (
                    f"{T.CHECKPOINT_STALL_INTERVALS:g} * {EXPECTED_INTERVAL}{{{SEL}}}",
                    "{{instance}} {{root}} stalled after",
                ),
            ],
            "s",
            "LockstepCheckpointStalled fires when a save stays in progress past the root's save interval for "
            "5 minutes.",
        ),
        timeseries(
            "Last save: duration",
            [(f"lockstep_checkpoint_last_duration_seconds{{{SEL}}}", "{{instance}} {{root}}")],
            "s",
            width=8,
        ),
        timeseries(
            "Last save: size",
            [(f"lockstep_checkpoint_last_size_bytes{{{SEL}}}", "{{instance}} {{root}}")],
            "bytes",
            width=8,
        ),
        timeseries(
            "Last save: write throughput",
            [(f"lockstep_checkpoint_last_write_throughput_bytes_per_second{{{SEL}}}", "{{instance}} {{root}}")],
            "Bps",
            width=8,
        ),
        table(
            "Checkpoint roots",
            [(f"lockstep_checkpoint_info{{{SEL}}}", "")],
            "none",
            hide=("Time", "__name__", "job", "Value"),
            width=24,
            height=6,
        ),
    ]


def board() -> Board:
    return Board(
        "lockstep-storage",
        "Lockstep / Storage & checkpoints",
        "Filesystems (space, responsiveness, NFS and Lustre client) and checkpoint saves per root.",
        [*filesystems(), *network_filesystems_and_io(), *checkpoints()],
    )
