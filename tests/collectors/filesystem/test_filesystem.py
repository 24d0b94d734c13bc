"""Filesystem collector on fixture trees: mounts, filters, NFS mountstats, Lustre, hung mounts (fake statfs).

The real hanging mount (a FUSE filesystem) is in test_filesystem_fuse.py.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from lockstep.agent.collector import CollectorContext, NothingHere, Paths
from lockstep.agent.seams import Seams
from lockstep.collectors.filesystem import FilesystemCollector, FilesystemOptions
from lockstep.collectors.filesystem.lustre import parse_lustre_stats
from lockstep.collectors.filesystem.nfs import parse_mountstats
from lockstep.collectors.filesystem.statpool import STAT_TIMER, STATVFS
from lockstep.collectors.toolkit.mounts import parse_mountinfo, unescape
from tests.support import FIXTURES, collected, wait_until

PROC = FIXTURES / "storage" / "proc"
HOST = Path("/host")  # the fixture's rootfs: only the fake statvfs sees these paths


def statvfs_result(
    blocks: int, bfree: int, bavail: int, files: int, ffree: int, frsize: int = 4096
) -> os.statvfs_result:
    # f_bsize, f_frsize, f_blocks, f_bfree, f_bavail, f_files, f_ffree, f_favail, f_flag, f_namemax
    return os.statvfs_result((frsize, frsize, blocks, bfree, bavail, files, ffree, ffree, 0, 255))


class FakeStatvfs:
    """statvfs by path from a table; paths in ``hang`` block until released."""

    def __init__(self, table: dict[str, os.statvfs_result]) -> None:
        self.table = table
        self.hang: set[str] = set()
        self.released = threading.Event()
        self.calls: dict[str, int] = {}
        self.lock = threading.Lock()

    def __call__(self, path: str) -> os.statvfs_result:
        with self.lock:
            self.calls[path] = self.calls.get(path, 0) + 1
        if path in self.hang:
            self.released.wait(30)
        if path not in self.table:
            raise FileNotFoundError(2, "No such file or directory", path)
        return self.table[path]


def default_table() -> dict[str, os.statvfs_result]:
    mounts = ["/", "/dev/shm", "/raid", "/home", "/lustre", "/datasets", "/mnt/scratch space", "/mnt/twice", "/boot"]
    table = {str(HOST / m.lstrip("/")): statvfs_result(1000, 600, 500, 100, 90) for m in mounts}
    table[str(HOST / "raid")] = statvfs_result(7_500_000_000, 2_500_000_000, 2_400_000_000, 3_000_000, 2_900_000)
    table[str(HOST / "lustre")] = statvfs_result(10**12, 4 * 10**11, 4 * 10**11, 10**9, 6 * 10**8, frsize=4096)
    return table


def make(
    proc: Path = PROC,
    rootfs: Path = HOST,
    statvfs: Callable[[str], os.statvfs_result] | None = None,
    sys_: Path | None = None,
    **options: Any,
) -> FilesystemCollector:
    seams = Seams(STATVFS.replaced_by(statvfs or FakeStatvfs(default_table())), STAT_TIMER.replaced_by(lambda: 0.0))
    paths = Paths(sysfs=sys_ or proc.parent / "sys", procfs=proc, rootfs=rootfs)
    context = CollectorContext(
        paths=paths, options=FilesystemOptions(**options), log=logging.getLogger("test"), seams=seams
    )
    return FilesystemCollector(context)


def scrape(collector: FilesystemCollector) -> dict:
    return collected(collector)


def by_mount(s: dict, name: str) -> dict[str, float]:
    return {dict(labels)["mountpoint"]: v for (n, labels), v in s.items() if n == name}


def test_mounts_sizes_and_filters_from_fixture() -> None:
    s = scrape(make())
    # Pseudo filesystems, container internals and FUSE pseudo filesystems (lxcfs) are excluded;
    # the FUSE network filesystem (JuiceFS) is monitored.
    assert sorted(by_mount(s, "lockstep_filesystem_responsive")) == [
        "/",
        "/boot",
        "/datasets",
        "/dev/shm",
        "/home",
        "/lustre",
        "/mnt/scratch space",  # \040 in mountinfo
        "/mnt/twice",
        "/raid",
    ]
    raid = frozenset({("mountpoint", "/raid"), ("fstype", "xfs")})
    assert s[("lockstep_filesystem_size_bytes", raid)] == 7_500_000_000 * 4096
    assert s[("lockstep_filesystem_free_bytes", raid)] == 2_500_000_000 * 4096
    assert s[("lockstep_filesystem_available_bytes", raid)] == 2_400_000_000 * 4096
    assert s[("lockstep_filesystem_files", raid)] == 3_000_000
    assert s[("lockstep_filesystem_files_free", raid)] == 2_900_000
    assert s[("lockstep_filesystem_responsive", raid)] == 1
    assert s[("lockstep_filesystem_stat_error", raid)] == 0
    assert s[("lockstep_filesystem_stat_duration_seconds", raid)] == 0.0  # the fake timer
    assert s[("lockstep_filesystem_readonly", raid)] == 0
    info = {("mountpoint", "/lustre"), ("fstype", "lustre"), ("device", "10.0.0.1@o2ib:/scratch")}
    assert s[("lockstep_filesystem_info", frozenset(info))] == 1
    assert by_mount(s, "lockstep_filesystem_info")["/datasets"] == 1
    # Read-only per mount (mount option ro) or per superblock (super option ro).
    readonly = by_mount(s, "lockstep_filesystem_readonly")
    assert (readonly["/mnt/scratch space"], readonly["/boot"], readonly["/"]) == (1, 1, 0)
    # A mountpoint mounted twice: the later mount (tmpfs) covers the earlier (ext4).
    assert s[("lockstep_filesystem_readonly", frozenset({("mountpoint", "/mnt/twice"), ("fstype", "tmpfs")}))] == 0
    assert s[("lockstep_filesystem_stat_calls_in_flight", frozenset())] == 0
    skipped_name = "lockstep_filesystem_skipped_lines_total"
    skipped = {dict(labels)["source"]: v for (n, labels), v in s.items() if n == skipped_name}
    assert skipped == {"mountinfo": 1, "mountstats": 2, "lustre": 2}


def test_include_and_exclude_patterns() -> None:
    s = scrape(make(fstypes_include=("nfs*", "lustre", "fuse.*")))
    assert sorted(by_mount(s, "lockstep_filesystem_responsive")) == ["/datasets", "/home", "/lustre"]
    s = scrape(make(mountpoints_exclude=("/mnt/*", "/boot")))
    assert "/mnt/twice" not in by_mount(s, "lockstep_filesystem_responsive")
    assert "/boot" not in by_mount(s, "lockstep_filesystem_responsive")
    s = scrape(make(mountpoints_include=("/raid",)))
    assert list(by_mount(s, "lockstep_filesystem_responsive")) == ["/raid"]
    # Emptying the fstype excludes brings the pseudo filesystems back (the mountpoint ones still apply).
    s = scrape(make(fstypes_exclude=(), mountpoints_exclude=()))
    assert {"/proc", "/sys", "/var/lib/lxcfs", "/dev/pts"} <= set(by_mount(s, "lockstep_filesystem_responsive"))


def test_nfs_mountstats_exact_values() -> None:
    s = scrape(make())

    def nfs(name: str, op: str) -> float:
        return s[(name, frozenset({("mountpoint", "/home"), ("operation", op)}))]

    # READ: 10240 10243 2 1720320 10739040256 1531 204800 210011 0
    assert nfs("lockstep_nfs_operations_total", "READ") == 10240
    assert nfs("lockstep_nfs_retransmissions_total", "READ") == 3
    assert nfs("lockstep_nfs_major_timeouts_total", "READ") == 2
    assert nfs("lockstep_nfs_sent_bytes_total", "READ") == 1720320
    assert nfs("lockstep_nfs_received_bytes_total", "READ") == 10739040256
    assert nfs("lockstep_nfs_queue_seconds_total", "READ") == 1.531
    assert nfs("lockstep_nfs_rtt_seconds_total", "READ") == 204.8
    assert nfs("lockstep_nfs_execute_seconds_total", "READ") == 210.011
    assert nfs("lockstep_nfs_errors_total", "READ") == 0
    assert nfs("lockstep_nfs_errors_total", "WRITE") == 3
    assert nfs("lockstep_nfs_operations_total", "GETATTR") == 71209
    # An 8-field line (kernels before 5.3) has no errors series.
    assert nfs("lockstep_nfs_operations_total", "ACCESS") == 5008
    assert ("lockstep_nfs_errors_total", frozenset({("mountpoint", "/home"), ("operation", "ACCESS")})) not in s
    ops = {dict(labels)["operation"] for (n, labels) in s if n == "lockstep_nfs_operations_total"}
    # COMMIT was never used; LOOKUP's line is garbage; /mnt/oldnfs is not in the mount table.
    assert ops == {"NULL", "READ", "WRITE", "GETATTR", "ACCESS"}


def test_lustre_llite_stats_and_health() -> None:
    s = scrape(make())
    scratch = frozenset({("filesystem", "scratch")})
    assert s[("lockstep_lustre_read_bytes_total", scratch)] == 85899345920
    assert s[("lockstep_lustre_write_bytes_total", scratch)] == 21474836480
    ops = {dict(labels)["operation"]: v for (n, labels), v in s.items() if n == "lockstep_lustre_operations_total"}
    assert ops == {"read": 40960, "write": 8192, "open": 1200, "close": 1200, "getattr": 9001}
    assert s[("lockstep_lustre_healthy", frozenset())] == 1


def test_lustre_unhealthy_and_absent(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    shutil.copytree(PROC, proc)
    (proc / "fs/lustre/health_check").write_text("NOT HEALTHY\n")
    assert scrape(make(proc=proc))[("lockstep_lustre_healthy", frozenset())] == 0
    shutil.rmtree(proc / "fs")
    s = scrape(make(proc=proc))
    assert not [key for key in s if key[0].startswith("lockstep_lustre")]


def test_lustre_in_debugfs_is_preferred(tmp_path: Path) -> None:
    """Lustre 2.12+ keeps llite stats in debugfs (<sysfs>/kernel/debug) and health in sysfs."""
    sys_ = tmp_path / "sys"
    llite = sys_ / "kernel/debug/lustre/llite/work-ffff9a0000001000"
    llite.mkdir(parents=True)
    (llite / "stats").write_text("snapshot_time 1.0 secs.nsecs\nwrite_bytes 3 samples [bytes] 1 10 12\n")
    (sys_ / "fs/lustre").mkdir(parents=True)
    (sys_ / "fs/lustre/health_check").write_text("LBUG\n")
    s = scrape(make(sys_=sys_))
    assert s[("lockstep_lustre_write_bytes_total", frozenset({("filesystem", "work")}))] == 12
    assert ("lockstep_lustre_read_bytes_total", frozenset({("filesystem", "scratch")})) not in s
    assert s[("lockstep_lustre_healthy", frozenset())] == 0


def test_host_mount_table_of_pid_1_is_preferred(tmp_path: Path) -> None:
    """A containerised agent reads the host init's mount table, not its own (self)."""
    proc = tmp_path / "proc"
    (proc / "1").mkdir(parents=True)
    (proc / "self").mkdir()
    (proc / "1/mountinfo").write_text("30 22 259:1 / /raid rw - xfs /dev/md0 rw\n")
    (proc / "self/mountinfo").write_text("30 22 259:1 / /container-only rw - xfs /dev/md0 rw\n")
    assert list(by_mount(scrape(make(proc=proc)), "lockstep_filesystem_responsive")) == ["/raid"]


def test_rootfs_is_where_mounts_are_statted(tmp_path: Path) -> None:
    """--path.rootfs: the real statvfs of <rootfs>/<mountpoint>, reported under the host's mountpoint."""
    proc, rootfs = tmp_path / "proc", tmp_path / "host"
    (proc / "self").mkdir(parents=True)
    (proc / "self/mountinfo").write_text(
        "30 22 259:1 / /data rw - ext4 /dev/sdb1 rw\n31 22 259:2 / /gone rw - ext4 /dev/sdc1 rw\n"
    )
    (rootfs / "data").mkdir(parents=True)
    s = scrape(make(proc=proc, rootfs=rootfs, statvfs=os.statvfs))
    real = os.statvfs(rootfs / "data")
    data = frozenset({("mountpoint", "/data"), ("fstype", "ext4")})
    assert s[("lockstep_filesystem_size_bytes", data)] == real.f_blocks * real.f_frsize
    assert s[("lockstep_filesystem_files", data)] == real.f_files
    # Not visible under the rootfs: an error for that mount, not a failed run.
    gone = frozenset({("mountpoint", "/gone"), ("fstype", "ext4")})
    assert s[("lockstep_filesystem_stat_error", gone)] == 1
    assert s[("lockstep_filesystem_responsive", gone)] == 1
    assert ("lockstep_filesystem_size_bytes", gone) not in s


def test_no_mount_table_is_nothing_here(tmp_path: Path) -> None:
    with pytest.raises(NothingHere, match="no mount table"):
        list(make(proc=tmp_path).collect())


def test_hung_mount_one_call_prompt_runs_and_recovery() -> None:
    fake = FakeStatvfs(default_table())
    home = str(HOST / "home")
    fake.hang.add(home)
    collector = make(statvfs=fake, stat_timeout=0.3)
    labels = frozenset({("mountpoint", "/home"), ("fstype", "nfs4")})
    try:
        s = scrape(collector)
        assert s[("lockstep_filesystem_responsive", labels)] == 0
        assert ("lockstep_filesystem_size_bytes", labels) not in s
        assert ("lockstep_filesystem_stat_duration_seconds", labels) not in s
        assert s[("lockstep_filesystem_stat_calls_in_flight", frozenset())] == 1
        # The other mounts answered in the same run.
        assert s[("lockstep_filesystem_responsive", frozenset({("mountpoint", "/raid"), ("fstype", "xfs")}))] == 1
        # Later runs do not wait for the stuck mount and start no second call on it.
        for _ in range(3):
            started = time.monotonic()
            s = scrape(collector)
            print(f"run while /home hangs: {time.monotonic() - started:.4f}s")
            assert s[("lockstep_filesystem_responsive", labels)] == 0
            assert s[("lockstep_filesystem_stat_calls_in_flight", frozenset())] == 1
        assert fake.calls[home] == 1
        assert fake.calls[str(HOST / "raid")] == 4
    finally:
        fake.hang.clear()
        fake.released.set()
    wait_until(lambda: collector.pool.in_flight() == 0, timeout=10, what="the stuck call to return")
    s = scrape(collector)
    assert s[("lockstep_filesystem_responsive", labels)] == 1
    assert s[("lockstep_filesystem_size_bytes", labels)] == 1000 * 4096
    assert fake.calls[home] == 2


def test_many_hung_mounts_stay_within_the_worker_bound() -> None:
    """Hung calls do not count against stat_workers; healthy mounts still get stat'ed."""
    table = default_table()
    fake = FakeStatvfs(table)
    fake.hang = {path for path in table if not path.endswith("raid")}
    collector = make(statvfs=fake, stat_timeout=0.2, stat_workers=2)
    # Threads of this test's pool only: a simulated node elsewhere in the run may still hold one
    # of its own statfs threads in this process (its hung NFS mount is never released).
    earlier = set(threading.enumerate())
    try:
        s = scrape(collector)
        responsive = by_mount(s, "lockstep_filesystem_responsive")
        assert responsive.pop("/raid") == 1
        assert set(responsive.values()) == {0}
        assert s[("lockstep_filesystem_stat_calls_in_flight", frozenset())] == 8
        threads = [t for t in threading.enumerate() if t.name.startswith("statfs ") and t not in earlier]
        assert len(threads) == 8  # one per hung mount, none for the healthy one
        s = scrape(collector)
        assert s[("lockstep_filesystem_stat_calls_in_flight", frozenset())] == 8
        assert max(count for path, count in fake.calls.items() if path in fake.hang) == 1
    finally:
        fake.released.set()
    wait_until(lambda: collector.pool.in_flight() == 0, timeout=10, what="the stuck calls to return")


def test_statvfs_raising_non_oserror_is_an_error_not_a_dead_pool() -> None:
    def broken(path: str) -> os.statvfs_result:
        raise ValueError("embedded null byte")

    s = scrape(make(statvfs=broken))
    assert set(by_mount(s, "lockstep_filesystem_stat_error").values()) == {1}


def test_parsers_directly() -> None:
    assert unescape(r"/mnt/a\040b\011c\134d") == "/mnt/a b\tc\\d"
    mounts, skipped = parse_mountinfo("1 2 3:4 / /x rw - ext4 /dev/x rw\n\nshort line\n1 2 3 4 5 6 7\n")
    assert [(m.mountpoint, m.fstype, m.device, m.readonly) for m in mounts] == [("/x", "ext4", "/dev/x", False)]
    assert skipped == 2
    stats, skipped = parse_mountstats("device a:/b mounted on /b with fstype nfs statvers=1.1\n")
    assert (stats, skipped) == ({}, 0)
    lustre, skipped = parse_lustre_stats("read_bytes 2 samples [bytes]\nopen 5 samples [usecs]\n")
    assert (lustre.read_bytes, lustre.operations, skipped) == (0, {"open": 5}, 1)
