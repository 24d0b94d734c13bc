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

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from lockstep.agent.collector import (
    Collector,
    CollectorContext,
    Families,
    MetricSpec,
    NothingHere,
    describe_error,
)
from lockstep.agent.families import Metric
from lockstep.agent.files import read_text
from lockstep.agent.options import option, parse_duration, parse_positive_int
from lockstep.collectors.filesystem.lustre import parse_lustre_stats
from lockstep.collectors.filesystem.metrics import (
    AVAILABLE,
    FILES,
    FILES_FREE,
    FREE,
    INFO,
    LUSTRE_HEALTHY,
    LUSTRE_OPERATIONS,
    LUSTRE_READ,
    LUSTRE_WRITE,
    NFS_ERRORS,
    NFS_EXECUTE,
    NFS_MAJOR_TIMEOUTS,
    NFS_METRICS,
    NFS_OPERATIONS,
    NFS_QUEUE,
    NFS_RECEIVED,
    NFS_RETRANSMISSIONS,
    NFS_RTT,
    NFS_SENT,
    READONLY,
    RESPONSIVE,
    SIZE,
    SKIPPED_LINES,
    STAT_DURATION,
    STAT_ERROR,
    STATS_IN_FLIGHT,
)
from lockstep.collectors.filesystem.mounts import (
    DEFAULT_FSTYPES_EXCLUDE,
    DEFAULT_MOUNTPOINTS_EXCLUDE,
    matches,
    parse_patterns,
)
from lockstep.collectors.filesystem.nfs import parse_mountstats
from lockstep.collectors.filesystem.statpool import STAT_TIMER, STATVFS, StatOutcome, StatPool
from lockstep.collectors.toolkit.mounts import Mount, parse_mountinfo

SOURCES = ("mountinfo", "mountstats", "lustre")


@dataclass(frozen=True)
class FilesystemOptions:
    fstypes_exclude: tuple[str, ...] = option(
        DEFAULT_FSTYPES_EXCLUDE, parse_patterns, "filesystem types not monitored (patterns)"
    )
    fstypes_include: tuple[str, ...] = option((), parse_patterns, "if set, only these filesystem types (patterns)")
    mountpoints_exclude: tuple[str, ...] = option(
        DEFAULT_MOUNTPOINTS_EXCLUDE, parse_patterns, "mountpoints not monitored (patterns)"
    )
    mountpoints_include: tuple[str, ...] = option((), parse_patterns, "if set, only these mountpoints (patterns)")
    stat_timeout: float = option(5.0, parse_duration, "a statfs slower than this marks the mount unresponsive")
    stat_workers: int = option(4, parse_positive_int, "statfs calls run at once (stuck ones not counted)")


class FilesystemCollector(Collector[FilesystemOptions]):
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
        *NFS_METRICS,
        LUSTRE_READ,
        LUSTRE_WRITE,
        LUSTRE_OPERATIONS,
        LUSTRE_HEALTHY,
        SKIPPED_LINES,  # last: its counts include the lines skipped while reading NFS and Lustre stats
    )
    options_class = FilesystemOptions

    def __init__(self, context: CollectorContext) -> None:
        super().__init__(context)
        self.pool = StatPool(
            workers=self.options.stat_workers,
            timeout=self.options.stat_timeout,
            statvfs=context.seams.get(STATVFS) or os.statvfs,
            timer=context.seams.get(STAT_TIMER) or time.perf_counter,
        )
        self.skipped = dict.fromkeys(SOURCES, 0)
        self._stat_errors_logged: set[str] = set()
        self._unresponsive: set[str] = set()

    def wanted(self, mount: Mount) -> bool:
        options = self.options
        if options.fstypes_include and not matches(mount.fstype, options.fstypes_include):
            return False
        if matches(mount.fstype, options.fstypes_exclude):
            return False
        if options.mountpoints_include and not matches(mount.mountpoint, options.mountpoints_include):
            return False
        return not matches(mount.mountpoint, options.mountpoints_exclude)

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
        families = Families(self.metrics)
        mounts = self.mounts()
        outcomes = self.pool.stat_all({m.mountpoint: self.host_path(m.mountpoint) for m in mounts})
        self._add_mounts(families, mounts, outcomes)
        families[STATS_IN_FLIGHT].add_metric([], self.pool.in_flight())
        absent: set[MetricSpec] = set()
        if not self._add_nfs(families, {m.mountpoint for m in mounts}):
            absent.update(NFS_METRICS)
        if not self._add_lustre(families):
            absent.add(LUSTRE_HEALTHY)
        for source, count in self.skipped.items():
            families[SKIPPED_LINES].add_metric([source], count)
        # Every family is exposed each round, with samples or not, except the NFS ones when
        # there is no mountstats to read and Lustre's health when there is no health_check.
        yield from (families[spec] for spec in self.metrics if spec not in absent)

    def _add_mounts(self, families: Families, mounts: list[Mount], outcomes: dict[str, StatOutcome]) -> None:
        for mount in mounts:
            labels = [mount.mountpoint, mount.fstype]
            outcome = outcomes[mount.mountpoint]
            families[INFO].add_metric([*labels, mount.device], 1)
            families[READONLY].add_metric(labels, int(mount.readonly))
            families[RESPONSIVE].add_metric(labels, int(outcome.responsive))
            self._log_responsiveness(mount, outcome)
            if not outcome.responsive:
                continue
            families[STAT_DURATION].add_metric(labels, outcome.seconds or 0.0)
            families[STAT_ERROR].add_metric(labels, int(bool(outcome.error)))
            if outcome.error:
                if mount.mountpoint not in self._stat_errors_logged:
                    self._stat_errors_logged.add(mount.mountpoint)
                    self.log.warning("statfs %s failed: %s", mount.mountpoint, outcome.error)
                continue
            self._stat_errors_logged.discard(mount.mountpoint)
            st = outcome.result
            assert st is not None
            block = st.f_frsize or st.f_bsize
            families[SIZE].add_metric(labels, st.f_blocks * block)
            families[FREE].add_metric(labels, st.f_bfree * block)
            families[AVAILABLE].add_metric(labels, st.f_bavail * block)
            families[FILES].add_metric(labels, st.f_files)
            families[FILES_FREE].add_metric(labels, st.f_ffree)

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

    def _add_nfs(self, families: Families, monitored: set[str]) -> bool:
        """The NFS client's per-operation counters; False when there is no mountstats to read."""
        try:
            text = self._read_proc("mountstats")
        except OSError:
            return False  # no mountstats (not Linux procfs, or not readable): no NFS statistics
        stats, skipped = parse_mountstats(text)
        self.skipped["mountstats"] += skipped
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
        return True

    def _lustre_dirs(self) -> list[Path]:
        """llite instances: debugfs on Lustre 2.12+ (root only), /proc on older clients."""
        for base in (self.paths.sysfs / "kernel/debug/lustre/llite", self.paths.procfs / "fs/lustre/llite"):
            try:
                return sorted(base / entry for entry in os.listdir(base))
            except OSError:
                continue
        return []

    def _add_lustre(self, families: Families) -> bool:
        """The Lustre client's llite stats and health; False when there is no health_check to read."""
        for instance in self._lustre_dirs():
            # The instance is "<fsname>-<superblock address>", e.g. scratch-ffff8f0a12345000.
            filesystem = instance.name.rsplit("-", 1)[0]
            try:
                stats, skipped = parse_lustre_stats(read_text(instance / "stats"))
            except OSError:
                continue
            self.skipped["lustre"] += skipped
            families[LUSTRE_READ].add_metric([filesystem], stats.read_bytes)
            families[LUSTRE_WRITE].add_metric([filesystem], stats.write_bytes)
            for name, count in sorted(stats.operations.items()):
                families[LUSTRE_OPERATIONS].add_metric([filesystem, name], count)
        for path in (self.paths.sysfs / "fs/lustre/health_check", self.paths.procfs / "fs/lustre/health_check"):
            try:
                text = read_text(path).strip()
            except OSError:
                continue
            families[LUSTRE_HEALTHY].add_metric([], int(text == "healthy"))
            return True
        return False
