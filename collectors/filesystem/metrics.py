"""The filesystem collector's metrics: per mount, NFS client (mountstats) and Lustre client (llite)."""

from __future__ import annotations

from lockstep.agent.collector import MetricSpec

_MOUNT = ("mountpoint", "fstype")

INFO = MetricSpec(
    "lockstep_filesystem_info",
    "gauge",
    "One series per monitored mount, valued 1, with the device (or server:/export) mounted there.",
    ("mountpoint", "fstype", "device"),
)
SIZE = MetricSpec(
    "lockstep_filesystem_size_bytes",
    "gauge",
    "Size of the filesystem (statfs blocks × fragment size).",
    _MOUNT,
    "bytes",
)
FREE = MetricSpec(
    "lockstep_filesystem_free_bytes", "gauge", "Free space, including space reserved for root.", _MOUNT, "bytes"
)
AVAILABLE = MetricSpec(
    "lockstep_filesystem_available_bytes",
    "gauge",
    "Space available to unprivileged users (what a training job can still write).",
    _MOUNT,
    "bytes",
)
FILES = MetricSpec("lockstep_filesystem_files", "gauge", "Inodes (file slots) of the filesystem.", _MOUNT)
FILES_FREE = MetricSpec("lockstep_filesystem_files_free", "gauge", "Free inodes.", _MOUNT)
READONLY = MetricSpec(
    "lockstep_filesystem_readonly",
    "gauge",
    "1 when the mount or its superblock is read-only (e.g. remounted ro after I/O errors), from mountinfo.",
    _MOUNT,
)
RESPONSIVE = MetricSpec(
    "lockstep_filesystem_responsive",
    "gauge",
    "1 when statfs on the mount answered within the deadline (stat_timeout, default 5s); 0 while a call "
    "is stuck past it: the NFS/Lustre server or FUSE daemon is not answering.",
    _MOUNT,
)
STAT_DURATION = MetricSpec(
    "lockstep_filesystem_stat_duration_seconds",
    "gauge",
    "How long the last statfs on the mount took (absent while it is unresponsive).",
    _MOUNT,
    "seconds",
)
STAT_ERROR = MetricSpec(
    "lockstep_filesystem_stat_error",
    "gauge",
    "1 when the last statfs failed with an error (e.g. the mountpoint is not visible under --path.rootfs).",
    _MOUNT,
)
STATS_IN_FLIGHT = MetricSpec(
    "lockstep_filesystem_stat_calls_in_flight",
    "gauge",
    "statfs calls started and not returned at the end of the run: threads stuck in the kernel, at most one per mount.",
)
SKIPPED_LINES = MetricSpec(
    "lockstep_filesystem_skipped_lines_total",
    "counter",
    "Lines of mountinfo, mountstats or Lustre stats that could not be parsed and were skipped.",
    ("source",),
)
_NFS = ("mountpoint", "operation")
NFS_OPERATIONS = MetricSpec(
    "lockstep_nfs_operations_total", "counter", "NFS RPC operations completed, per mount (mountstats).", _NFS
)
NFS_RETRANSMISSIONS = MetricSpec(
    "lockstep_nfs_retransmissions_total",
    "counter",
    "NFS RPC retransmissions (transmissions beyond the first of each operation).",
    _NFS,
)
NFS_MAJOR_TIMEOUTS = MetricSpec(
    "lockstep_nfs_major_timeouts_total",
    "counter",
    "NFS RPC major timeouts ('server not responding' on a hard mount).",
    _NFS,
)
NFS_SENT = MetricSpec(
    "lockstep_nfs_sent_bytes_total", "counter", "Bytes sent for NFS RPCs, headers included.", _NFS, "bytes"
)
NFS_RECEIVED = MetricSpec(
    "lockstep_nfs_received_bytes_total", "counter", "Bytes received for NFS RPCs, headers included.", _NFS, "bytes"
)
NFS_QUEUE = MetricSpec(
    "lockstep_nfs_queue_seconds_total",
    "counter",
    "Time NFS RPCs waited in the client's queue before transmission.",
    _NFS,
    "seconds",
)
NFS_RTT = MetricSpec(
    "lockstep_nfs_rtt_seconds_total",
    "counter",
    "Round-trip time of NFS RPCs, summed (mean RTT = rate(this) / rate(operations)).",
    _NFS,
    "seconds",
)
NFS_EXECUTE = MetricSpec(
    "lockstep_nfs_execute_seconds_total",
    "counter",
    "Time from queueing to completion of NFS RPCs, summed (the latency the application sees).",
    _NFS,
    "seconds",
)
NFS_ERRORS = MetricSpec(
    "lockstep_nfs_errors_total", "counter", "NFS RPCs that completed with an error status (kernels 5.3+).", _NFS
)
NFS_METRICS = (
    NFS_OPERATIONS,
    NFS_RETRANSMISSIONS,
    NFS_MAJOR_TIMEOUTS,
    NFS_SENT,
    NFS_RECEIVED,
    NFS_QUEUE,
    NFS_RTT,
    NFS_EXECUTE,
    NFS_ERRORS,
)
LUSTRE_READ = MetricSpec(
    "lockstep_lustre_read_bytes_total", "counter", "Bytes read by this client (llite stats).", ("filesystem",), "bytes"
)
LUSTRE_WRITE = MetricSpec(
    "lockstep_lustre_write_bytes_total",
    "counter",
    "Bytes written by this client (llite stats).",
    ("filesystem",),
    "bytes",
)
LUSTRE_OPERATIONS = MetricSpec(
    "lockstep_lustre_operations_total",
    "counter",
    "Client operations per type (llite stats samples: read, write, open, getattr, ...).",
    ("filesystem", "operation"),
)
LUSTRE_HEALTHY = MetricSpec(
    "lockstep_lustre_healthy",
    "gauge",
    "1 when the Lustre client's health_check says 'healthy'; 0 for 'NOT HEALTHY' or an LBUG.",
)
