"""Filesystem collector: size and free space per mount, which mounts hang, NFS and Lustre client stats.

The mount list comes from the kernel's mountinfo.  A containerised agent gets the host's
/proc as ``--path.procfs`` and the host's / as ``--path.rootfs``: it then reads the host
init's mount table (``<procfs>/1/mountinfo``, as node_exporter does, because
``<procfs>/self`` is the agent itself, in the container's mount namespace), stats each
mount at ``<rootfs>/<mountpoint>`` and reports the host's mountpoint.  Without pid 1's
table (hidepid, a fixture tree) it falls back to ``<procfs>/self/mountinfo``.

statfs on a mount whose server is gone (NFS, Lustre, a FUSE daemon that stopped
answering) blocks in the kernel, and such a thread cannot be killed.  So the calls run on
short-lived daemon threads (``StatPool``): at most ``stat_workers`` at a time, each with a
deadline (``stat_timeout``, 5 s).  A mount whose call passes the deadline is reported
``lockstep_filesystem_responsive 0`` and gets no second call until the first one returns,
so one stuck mount never holds more than one thread; when the call returns, the mount is
stat'ed again at the next run and recovers on its own.  ``collect()`` waits for a new
call at most its deadline, and not at all for a mount already known to be stuck.
"""

from __future__ import annotations

import fnmatch
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.core import Metric

from lockstep.agent.collector import Collector, CollectorContext, MetricSpec, NothingHere, Option, describe_error
from lockstep.agent.config import parse_duration, parse_positive_int, parse_string_list
from lockstep.agent.files import read_text

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

# Pseudo and container-image filesystems: not storage anyone fills (node_exporter's list,
# plus FUSE pseudo filesystems).  FUSE network filesystems (fuse.juicefs, fuse.gcsfuse,
# fuse.s3fs, fuse.sshfs, ...) hold datasets and checkpoints: they are monitored.
DEFAULT_FSTYPES_EXCLUDE = (
    "autofs",
    "binfmt_misc",
    "bpf",
    "cgroup",
    "cgroup2",
    "configfs",
    "debugfs",
    "devpts",
    "devtmpfs",
    "efivarfs",
    "erofs",
    "fusectl",
    "fuse.lxcfs",
    "fuse.portal",
    "fuse.gvfsd-fuse",
    "fuse.snapfuse",
    "hugetlbfs",
    "iso9660",
    "mqueue",
    "nfsd",
    "nsfs",
    "overlay",
    "proc",
    "pstore",
    "ramfs",
    "rpc_pipefs",
    "securityfs",
    "selinuxfs",
    "squashfs",
    "sysfs",
    "tracefs",
)
# Kernel and container-runtime internals (per-container and per-pod mounts multiply series).
DEFAULT_MOUNTPOINTS_EXCLUDE = (
    "/proc/*",
    "/sys/*",
    "/run/credentials/*",
    "/run/user/*",
    "/run/containerd/*",
    "/run/netns/*",
    "/var/lib/docker/*",
    "/var/lib/containers/*",
    "/var/lib/kubelet/*",
    "/snap/*",
)
SOURCES = ("mountinfo", "mountstats", "lustre")


# --- parsing -------------------------------------------------------------------------------

_OCTAL_ESCAPE = re.compile(r"\\([0-7]{3})")


def unescape(field_text: str) -> str:
    r"""mountinfo escapes space, tab, newline and backslash as \040, \011, \012, \134."""
    return _OCTAL_ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field_text)


@dataclass(frozen=True)
class Mount:
    mountpoint: str  # as the mount table (the host) names it
    fstype: str
    device: str
    readonly: bool


def parse_mountinfo(text: str) -> tuple[list[Mount], int]:
    """Mounts in table order, and the number of lines that were not mountinfo lines.

    Format (proc(5)): ``36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue``:
    id, parent, dev, root, mountpoint, mount options, optional fields, "-", fstype, source, super options.
    """
    mounts, skipped = [], 0
    for line in text.splitlines():
        if not line.strip():
            continue
        fields = line.split(" ")
        try:
            separator = fields.index("-", 6)
        except ValueError:
            skipped += 1
            continue
        if len(fields) < separator + 3 or not fields[0].isdigit():
            skipped += 1
            continue
        mount_options = fields[5].split(",")
        super_options = fields[separator + 3].split(",") if len(fields) > separator + 3 else []
        mounts.append(
            Mount(
                mountpoint=unescape(fields[4]),
                fstype=fields[separator + 1],
                device=unescape(fields[separator + 2]),
                readonly="ro" in mount_options or "ro" in super_options,
            )
        )
    return mounts, skipped


@dataclass
class NfsOperation:
    operations: int
    transmissions: int
    major_timeouts: int
    sent_bytes: int
    received_bytes: int
    queue_ms: int
    rtt_ms: int
    execute_ms: int
    errors: int | None  # only in kernels 5.3+ (the 9th field)


def parse_mountstats(text: str) -> tuple[dict[str, dict[str, NfsOperation]], int]:
    """Per NFS mountpoint, per operation: the RPC counters; and the number of skipped lines.

    Only the parts read here are parsed: the ``device ... mounted on ... with fstype nfs*``
    header and the lines under ``per-op statistics``, which are
    ``OP: ops transmissions major_timeouts bytes_sent bytes_received queue_ms rtt_ms execute_ms [errors]``.
    Other mounts' headers (``device proc mounted on /proc with fstype proc``) have no statistics.
    """
    stats: dict[str, dict[str, NfsOperation]] = {}
    skipped = 0
    current: dict[str, NfsOperation] | None = None
    in_per_op = False
    header = re.compile(r"^device (\S+) mounted on (\S+) with fstype (\S+)(?: (.*))?$")
    for line in text.splitlines():
        if line.startswith("device "):
            in_per_op = False
            match = header.match(line)
            if not match:
                current = None
                skipped += 1
                continue
            fstype = match.group(3)
            current = stats.setdefault(unescape(match.group(2)), {}) if fstype.startswith("nfs") else None
            continue
        if current is None:
            continue
        stripped = line.strip()
        if stripped == "per-op statistics":
            in_per_op = True
            continue
        if not in_per_op or not stripped:
            continue
        name, colon, rest = stripped.partition(":")
        values = rest.split()
        if not colon or not name or len(values) not in (8, 9) or not all(v.isdigit() for v in values):
            skipped += 1
            continue
        n = [int(v) for v in values]
        current[name] = NfsOperation(n[0], n[1], n[2], n[3], n[4], n[5], n[6], n[7], n[8] if len(n) == 9 else None)
    return {mountpoint: ops for mountpoint, ops in stats.items() if ops}, skipped


@dataclass
class LustreStats:
    read_bytes: int = 0
    write_bytes: int = 0
    operations: dict[str, int] = field(default_factory=dict)


# Lines of a Lustre stats file that are times, not counters.
_LUSTRE_TIME_LINES = ("snapshot_time", "start_time", "elapsed_time")


def parse_lustre_stats(text: str) -> tuple[LustreStats, int]:
    """llite ``stats``: ``NAME COUNT samples [UNIT] [MIN MAX SUM [SUMSQ]]`` per line.

    ``read_bytes``/``write_bytes`` carry the byte sums; every counter line's COUNT is the
    number of operations of that type (read_bytes' count is the number of reads).
    """
    stats, skipped = LustreStats(), 0
    for line in text.splitlines():
        fields = line.split()
        if not fields or fields[0] in _LUSTRE_TIME_LINES:
            continue
        if len(fields) < 4 or fields[2] != "samples" or not fields[1].isdigit() or not fields[3].startswith("["):
            skipped += 1
            continue
        name, count = fields[0], int(fields[1])
        if name in ("read_bytes", "write_bytes"):
            if len(fields) < 7 or not fields[6].isdigit():
                skipped += 1
                continue
            if name == "read_bytes":
                stats.read_bytes = int(fields[6])
            else:
                stats.write_bytes = int(fields[6])
            name = name.removesuffix("_bytes")
        stats.operations[name] = count
    return stats, skipped


# --- the bounded statfs pool ---------------------------------------------------------------


@dataclass
class StatOutcome:
    responsive: bool
    result: os.statvfs_result | None = None
    error: str = ""
    seconds: float | None = None  # how long the call took (None while it hangs)


class _Call:
    """One statfs call on its own daemon thread."""

    def __init__(self, key: str, path: str, started: float) -> None:
        self.key = key
        self.path = path
        self.started = started
        self.returned = False
        self.result: os.statvfs_result | None = None
        self.error: OSError | None = None
        self.seconds = 0.0


class StatPool:
    """Runs ``statvfs`` on daemon threads with a per-call deadline.

    - at most ``workers`` calls run at once, not counting calls past their deadline
      (those threads are stuck in the kernel and stay so until the call returns);
    - at most one call per key (mount) exists at any time: a mount whose call has not
      returned gets no second one, so one stuck mount holds at most one thread;
    - a call that returns after its deadline frees its key; the next round calls again.

    Daemon threads, not a concurrent.futures pool: that one joins its threads at
    interpreter exit, and a thread stuck on a dead NFS server would hang the agent's exit.
    """

    def __init__(
        self,
        workers: int,
        timeout: float,
        statvfs: Callable[[str], os.statvfs_result] = os.statvfs,
        timer: Callable[[], float] = time.perf_counter,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.workers = workers
        self.timeout = timeout
        self._statvfs = statvfs
        self._timer = timer  # times the call itself (the simulated node makes it deterministic)
        self._clock = clock  # deadlines
        self._cond = threading.Condition()
        self._calls: dict[str, _Call] = {}  # key -> call that has not returned yet

    def in_flight(self) -> int:
        with self._cond:
            return len(self._calls)

    def stat_all(self, paths: Mapping[str, str]) -> dict[str, StatOutcome]:
        """statvfs every path (by key); returns once each has answered or passed its deadline."""
        outcomes: dict[str, StatOutcome] = {}
        mine: list[_Call] = []
        with self._cond:
            # A mount whose earlier call is still stuck: no second call, reported unresponsive.
            queue = [key for key in paths if key not in self._calls]
            while True:
                now = self._clock()
                running = [c for c in self._calls.values() if now - c.started < self.timeout]
                while queue and len(running) < self.workers:
                    key = queue.pop(0)
                    call = _Call(key, paths[key], now)
                    self._calls[key] = call
                    mine.append(call)
                    running.append(call)
                    threading.Thread(target=self._run, args=(call,), name=f"statfs {paths[key]}", daemon=True).start()
                waiting = [c for c in mine if not c.returned and now - c.started < self.timeout]
                if not waiting and not queue:
                    break
                # Wake when a call returns, or when the earliest running call reaches its deadline.
                next_deadline = min(c.started + self.timeout for c in running) if running else now + self.timeout
                self._cond.wait(max(0.001, next_deadline - now))
            for key in paths:
                stuck = self._calls.get(key)
                if stuck is not None and not stuck.returned:
                    outcomes[key] = StatOutcome(responsive=False)
            for done in mine:
                if done.returned:
                    if done.error is not None:
                        outcomes[done.key] = StatOutcome(True, error=describe_error(done.error), seconds=done.seconds)
                    else:
                        outcomes[done.key] = StatOutcome(True, result=done.result, seconds=done.seconds)
        return outcomes

    def _run(self, call: _Call) -> None:
        started = self._timer()
        try:
            call.result = self._statvfs(call.path)
        except OSError as exc:
            call.error = exc
        except Exception as exc:  # a broken fake or a bad path: an error for this mount, never a dead pool
            call.error = OSError(0, f"{type(exc).__name__}: {exc}", call.path)
        call.seconds = self._timer() - started
        with self._cond:
            call.returned = True
            if self._calls.get(call.key) is call:
                del self._calls[call.key]
            self._cond.notify_all()


# --- options -------------------------------------------------------------------------------


def parse_patterns(value: Any) -> tuple[str, ...]:
    """A list of shell-style patterns (``fuse.*``, ``/var/lib/docker/*``); [] for none."""
    if value == [] or value == ():
        return ()
    return parse_string_list(value)


def matches(name: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)


# --- the collector -------------------------------------------------------------------------


class FilesystemCollector(Collector):
    name = "filesystem"
    help = "Size, free space and responsiveness per mount (hung mounts never hang the agent); NFS and Lustre client."
    default_interval = 15.0
    metrics = (
        INFO,
        SIZE,
        FREE,
        AVAILABLE,
        FILES,
        FILES_FREE,
        READONLY,
        RESPONSIVE,
        STAT_DURATION,
        STAT_ERROR,
        STATS_IN_FLIGHT,
        SKIPPED_LINES,
        NFS_OPERATIONS,
        NFS_RETRANSMISSIONS,
        NFS_MAJOR_TIMEOUTS,
        NFS_SENT,
        NFS_RECEIVED,
        NFS_QUEUE,
        NFS_RTT,
        NFS_EXECUTE,
        NFS_ERRORS,
        LUSTRE_READ,
        LUSTRE_WRITE,
        LUSTRE_OPERATIONS,
        LUSTRE_HEALTHY,
    )
    options = (
        Option("fstypes_exclude", parse_patterns, DEFAULT_FSTYPES_EXCLUDE, "filesystem types not monitored (patterns)"),
        Option("fstypes_include", parse_patterns, (), "if set, only these filesystem types (patterns)"),
        Option(
            "mountpoints_exclude", parse_patterns, DEFAULT_MOUNTPOINTS_EXCLUDE, "mountpoints not monitored (patterns)"
        ),
        Option("mountpoints_include", parse_patterns, (), "if set, only these mountpoints (patterns)"),
        Option("stat_timeout", parse_duration, 5.0, "a statfs slower than this marks the mount unresponsive"),
        Option("stat_workers", parse_positive_int, 4, "statfs calls run at once (stuck ones not counted)"),
    )

    def __init__(self, context: CollectorContext) -> None:
        super().__init__(context)
        options = context.options
        self.fstypes_exclude = options.get("fstypes_exclude", DEFAULT_FSTYPES_EXCLUDE)
        self.fstypes_include = options.get("fstypes_include", ())
        self.mountpoints_exclude = options.get("mountpoints_exclude", DEFAULT_MOUNTPOINTS_EXCLUDE)
        self.mountpoints_include = options.get("mountpoints_include", ())
        # The simulated node replaces statvfs (real disks' figures are not deterministic).
        self.pool = StatPool(
            workers=options.get("stat_workers", 4),
            timeout=options.get("stat_timeout", 5.0),
            statvfs=context.seams.statvfs or os.statvfs,
            timer=context.seams.stat_timer or time.perf_counter,
        )
        self.skipped = dict.fromkeys(SOURCES, 0)
        self._stat_errors_logged: set[str] = set()
        self._unresponsive: set[str] = set()

    def wanted(self, mount: Mount) -> bool:
        if self.fstypes_include and not matches(mount.fstype, self.fstypes_include):
            return False
        if matches(mount.fstype, self.fstypes_exclude):
            return False
        if self.mountpoints_include and not matches(mount.mountpoint, self.mountpoints_include):
            return False
        return not matches(mount.mountpoint, self.mountpoints_exclude)

    def _read_proc(self, name: str) -> str:
        """``<procfs>/1/<name>`` (the host's mount namespace), else ``<procfs>/self/<name>``."""
        try:
            return read_text(self.paths.procfs / "1" / name)
        except OSError:
            return read_text(self.paths.procfs / "self" / name)

    def mounts(self) -> list[Mount]:
        try:
            text = self._read_proc("mountinfo")
        except FileNotFoundError as exc:
            raise NothingHere(f"no mount table: {describe_error(exc)}") from None
        found, skipped = parse_mountinfo(text)
        self.skipped["mountinfo"] += skipped
        # A later mount on the same mountpoint covers the earlier one: keep the last.
        by_mountpoint = {m.mountpoint: m for m in found}
        return sorted((m for m in by_mountpoint.values() if self.wanted(m)), key=lambda m: m.mountpoint)

    def host_path(self, mountpoint: str) -> str:
        """Where this agent reaches the host's mountpoint: under --path.rootfs."""
        return str(self.paths.rootfs / mountpoint.lstrip("/"))

    def collect(self) -> Iterator[Metric]:
        mounts = self.mounts()
        outcomes = self.pool.stat_all({m.mountpoint: self.host_path(m.mountpoint) for m in mounts})
        yield from self._mount_families(mounts, outcomes)
        in_flight = STATS_IN_FLIGHT.family()
        in_flight.add_metric([], self.pool.in_flight())
        yield in_flight
        yield from self._nfs({m.mountpoint for m in mounts})
        yield from self._lustre()
        skipped = SKIPPED_LINES.family()
        for source, count in self.skipped.items():
            skipped.add_metric([source], count)
        yield skipped

    def _mount_families(self, mounts: list[Mount], outcomes: dict[str, StatOutcome]) -> Iterator[Metric]:
        info, readonly, responsive, duration, error = (
            INFO.family(),
            READONLY.family(),
            RESPONSIVE.family(),
            STAT_DURATION.family(),
            STAT_ERROR.family(),
        )
        size, free, available, files, files_free = (
            SIZE.family(),
            FREE.family(),
            AVAILABLE.family(),
            FILES.family(),
            FILES_FREE.family(),
        )
        for mount in mounts:
            labels = [mount.mountpoint, mount.fstype]
            outcome = outcomes[mount.mountpoint]
            info.add_metric([*labels, mount.device], 1)
            readonly.add_metric(labels, int(mount.readonly))
            responsive.add_metric(labels, int(outcome.responsive))
            self._log_responsiveness(mount, outcome)
            if not outcome.responsive:
                continue
            duration.add_metric(labels, outcome.seconds or 0.0)
            error.add_metric(labels, int(bool(outcome.error)))
            if outcome.error:
                if mount.mountpoint not in self._stat_errors_logged:
                    self._stat_errors_logged.add(mount.mountpoint)
                    self.log.warning("statfs %s failed: %s", mount.mountpoint, outcome.error)
                continue
            self._stat_errors_logged.discard(mount.mountpoint)
            st = outcome.result
            assert st is not None
            block = st.f_frsize or st.f_bsize
            size.add_metric(labels, st.f_blocks * block)
            free.add_metric(labels, st.f_bfree * block)
            available.add_metric(labels, st.f_bavail * block)
            files.add_metric(labels, st.f_files)
            files_free.add_metric(labels, st.f_ffree)
        yield from (info, size, free, available, files, files_free, readonly, responsive, duration, error)

    def _log_responsiveness(self, mount: Mount, outcome: StatOutcome) -> None:
        """Log a mount going unresponsive and coming back, once per change."""
        if not outcome.responsive and mount.mountpoint not in self._unresponsive:
            self._unresponsive.add(mount.mountpoint)
            self.log.warning(
                "mount %s (%s) unresponsive: statfs has not answered within %gs",
                mount.mountpoint,
                mount.fstype,
                self.pool.timeout,
            )
        elif outcome.responsive and mount.mountpoint in self._unresponsive:
            self._unresponsive.discard(mount.mountpoint)
            self.log.info("mount %s (%s) responsive again", mount.mountpoint, mount.fstype)

    def _nfs(self, monitored: set[str]) -> Iterator[Metric]:
        try:
            text = self._read_proc("mountstats")
        except OSError:
            return  # no mountstats (not Linux procfs, or not readable): no NFS statistics
        stats, skipped = parse_mountstats(text)
        self.skipped["mountstats"] += skipped
        families = {
            spec: spec.family()
            for spec in (
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
        }
        for mountpoint, operations in sorted(stats.items()):
            if mountpoint not in monitored:
                continue
            for name, op in operations.items():
                if op.operations == 0 and op.transmissions == 0:
                    continue  # never used: NFSv4 lists ~60 operations per mount
                labels = [mountpoint, name]
                families[NFS_OPERATIONS].add_metric(labels, op.operations)
                families[NFS_RETRANSMISSIONS].add_metric(labels, max(0, op.transmissions - op.operations))
                families[NFS_MAJOR_TIMEOUTS].add_metric(labels, op.major_timeouts)
                families[NFS_SENT].add_metric(labels, op.sent_bytes)
                families[NFS_RECEIVED].add_metric(labels, op.received_bytes)
                families[NFS_QUEUE].add_metric(labels, op.queue_ms / 1000)
                families[NFS_RTT].add_metric(labels, op.rtt_ms / 1000)
                families[NFS_EXECUTE].add_metric(labels, op.execute_ms / 1000)
                if op.errors is not None:
                    families[NFS_ERRORS].add_metric(labels, op.errors)
        yield from families.values()

    def _lustre_dirs(self) -> list[Path]:
        """llite instances: debugfs on Lustre 2.12+ (root only), /proc on older clients."""
        for base in (self.paths.sysfs / "kernel/debug/lustre/llite", self.paths.procfs / "fs/lustre/llite"):
            try:
                return sorted(base / entry for entry in os.listdir(base))
            except OSError:
                continue
        return []

    def _lustre(self) -> Iterator[Metric]:
        read, write, operations = LUSTRE_READ.family(), LUSTRE_WRITE.family(), LUSTRE_OPERATIONS.family()
        for instance in self._lustre_dirs():
            # The instance is "<fsname>-<superblock address>", e.g. scratch-ffff8f0a12345000.
            filesystem = instance.name.rsplit("-", 1)[0]
            try:
                stats, skipped = parse_lustre_stats(read_text(instance / "stats"))
            except OSError:
                continue
            self.skipped["lustre"] += skipped
            read.add_metric([filesystem], stats.read_bytes)
            write.add_metric([filesystem], stats.write_bytes)
            for name, count in sorted(stats.operations.items()):
                operations.add_metric([filesystem, name], count)
        yield from (read, write, operations)
        for path in (self.paths.sysfs / "fs/lustre/health_check", self.paths.procfs / "fs/lustre/health_check"):
            try:
                text = read_text(path).strip()
            except OSError:
                continue
            healthy = LUSTRE_HEALTHY.family()
            healthy.add_metric([], int(text == "healthy"))
            yield healthy
            break
