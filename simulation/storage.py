"""The simulated node's storage: mount table, NFS and Lustre client statistics, and a
checkpoint root where the training job (Slurm job 4242) saves a PyTorch DCP checkpoint
every 10 minutes.

- Mounts: / (ext4), /dev/shm, /raid (local NVMe RAID), /home (NFS v4.2), /lustre (Lustre
  client of fs "scratch"), /datasets (JuiceFS over FUSE), plus pseudo and container mounts
  the collector leaves out.  statfs figures come from a fake (the seam ``STATVFS``): the
  real disk's would differ from run to run.  Its call time is a fake too (``stat_timer``).
- Checkpoints: ``/lustre/ckpt/job=4242/step_NNNNNN/`` with 8 shards ``__R_0.distcp`` (one
  per rank, sparse files of 2 GiB: sizes without the disk space) and ``.metadata`` last.
  File mtimes and the collector's wall clock (the seam ``WALL_CLOCK``) are simulated time.

Scenarios:
- ``checkpoint-stall``: the save that began 1100 s ago wrote 7 of its 8 shards and never
  finished (the expected interval is 600 s); I/O pressure ("full") climbs.  This area
  builds after ``host`` (areas build in name order), so its /proc/pressure/io replaces the
  host's healthy one in this scenario only.
- ``nfs-server-down``: the NFS server of /home stopped answering: statfs on /home blocks
  (the mount is reported unresponsive), and its RPCs time out and retransmit.
- ``straggler-nfs`` (defined by the workloads area): the same, from that area's onset.
- ``hang-save`` (defined by the workloads area, timeline.py): a synchronous save begins at HANG_AT
  and completes PAUSE later (its shards one by one, .metadata last); no regular save begins
  during it.
- ``nccl-hang`` (defined by the NCCL area, nccl.py): no save begins after rank 13's process died
  (nccl.HANG_AT, before the demo), nor hang-save's long one: a hung job saves nothing.  Those
  saves made the hang a "twin" (a job saving a checkpoint is not hung) from t = 60 on, and
  LockstepNCCLRankStuck, pending from ~65 s, fired only when it beat them (a full run at
  01be991: it did not).  Every other scenario still saves hang-save's long save at HANG_AT (see
  _saves).
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from lockstep.agent.seams import WALL_CLOCK
from lockstep.collectors.filesystem.statpool import STAT_TIMER, STATVFS
from lockstep.simulation import Scenario
from lockstep.simulation.host import BOOT_TIME
from lockstep.simulation.nccl import HANG_AT as NCCL_HANG_AT
from lockstep.simulation.timeline import HANG_AT, PAUSE, SLOW_ONSET, slow

if TYPE_CHECKING:
    from lockstep.simulation import SimulatedNode

SCENARIOS = (
    Scenario(
        "checkpoint-stall",
        "A checkpoint save wrote its shards and never completed, for longer than the save interval; "
        "I/O pressure climbs.",
    ),
    Scenario(
        "checkpoint-overdue",
        "Job 4242 stopped saving checkpoints (its save hook fails) after the save that completed 27.5 minutes "
        "ago; training goes on.",
    ),
    Scenario(
        "shared-fs-filling",
        "/lustre has 14.5 % left and fills within 12 hours; /home (NFS) has 14 % left, steady, and one statfs "
        "on it takes 0.5 s 10 s in (slow, not hung); /refdata, an NFS export mounted read-only, is 98 % full.",
    ),
    Scenario(
        "nfs-server-down",
        "The NFS server of /home stopped answering: statfs hangs (mount unresponsive), RPCs time out.",
    ),
)

UPTIME_AT_START = 86_400  # the node has been up a day when the demo starts (as in host)
EPOCH = BOOT_TIME + UPTIME_AT_START  # Unix time at simulated t=0
GIB = 1024**3

# (mountpoint, fstype, device, mount options, superblock options)
MOUNTS = (
    ("/", "ext4", "/dev/nvme0n1p2", "rw,relatime", "rw,errors=remount-ro"),
    ("/proc", "proc", "proc", "rw,nosuid,nodev,noexec,relatime", "rw"),
    ("/sys", "sysfs", "sysfs", "rw,nosuid,nodev,noexec,relatime", "rw"),
    ("/sys/fs/cgroup", "cgroup2", "cgroup2", "rw,nosuid,nodev,noexec,relatime", "rw,nsdelegate"),
    ("/dev", "devtmpfs", "udev", "rw,nosuid,relatime", "rw,mode=755"),
    ("/dev/pts", "devpts", "devpts", "rw,nosuid,noexec,relatime", "rw,gid=5,mode=620"),
    ("/dev/shm", "tmpfs", "tmpfs", "rw,nosuid,nodev", "rw"),
    ("/boot/efi", "vfat", "/dev/nvme0n1p1", "rw,relatime", "rw,fmask=0077,dmask=0077"),
    ("/raid", "xfs", "/dev/md0", "rw,noatime", "rw,attr2,inode64,noquota"),
    ("/home", "nfs4", "nfs1:/export/home", "rw,relatime", "rw,vers=4.2,hard,proto=tcp,timeo=600,retrans=2"),
    ("/lustre", "lustre", "10.10.0.1@o2ib:/scratch", "rw,flock,lazystatfs", "rw,flock,lazystatfs"),
    ("/datasets", "fuse.juicefs", "JuiceFS:datasets", "rw,nosuid,nodev,relatime", "rw,user_id=0,group_id=0"),
    ("/var/lib/docker/overlay2/3f9a/merged", "overlay", "overlay", "rw,relatime", "rw,lowerdir=/l,upperdir=/u"),
)
# statfs per mountpoint: fragment size, blocks, free blocks, available blocks, inodes, free inodes.
STATFS = {
    "/": (4096, 234_000_000, 180_000_000, 168_000_000, 14_600_000, 13_900_000),
    "/dev/shm": (4096, 264_000_000, 263_000_000, 263_000_000, 264_000_000, 263_999_000),
    "/boot/efi": (512, 1_048_576, 1_000_000, 1_000_000, 0, 0),
    "/raid": (4096, 3_750_000_000, 2_900_000_000, 2_900_000_000, 1_500_000_000, 1_499_000_000),
    "/home": (1_048_576, 50_000_000, 21_000_000, 21_000_000, 400_000_000, 310_000_000),
    "/lustre": (4096, 1_250_000_000_000, 410_000_000_000, 400_000_000_000, 4_000_000_000, 2_700_000_000),
    "/datasets": (4096, 2**40, 2**40 - 90_000_000_000, 2**40 - 90_000_000_000, 10_000_000, 9_000_000),
}
LLITE = "scratch-ffff9c4a1e2b8000"
# shared-fs-filling: /lustre's available share at t=0 and how long it takes to fill; /home is
# steady at HOME_AVAILABLE; /refdata is a read-only NFS export of reference data, nearly full.
LUSTRE_AVAILABLE, LUSTRE_FILLS_IN = 0.145, 12 * 3600.0
HOME_AVAILABLE = 0.14
REFDATA_MOUNT = ("/refdata", "nfs4", "nfs2:/export/refdata", "ro,relatime", "ro,vers=4.2,hard,proto=tcp")
REFDATA_STATFS = (1_048_576, 20_000_000, 400_000, 400_000, 100_000_000, 60_000_000)
SLOW_STATFS_AT, SLOW_STATFS_SECONDS = 10.0, 0.5  # shared-fs-filling: within the 1-s stat timeout

CHECKPOINT_ROOT = "/lustre/ckpt/job=4242"
SAVE_INTERVAL = 600
JOB_START = EPOCH - 7200  # the job started two hours before the demo
FIRST_SAVE_OFFSET = 100  # save k begins at JOB_START + k * SAVE_INTERVAL + FIRST_SAVE_OFFSET
RANKS = 8
SHARD_BYTES = 2 * GIB
METADATA_BYTES = 1_572_864
KEEP = 3  # completed saves kept on disk (the job deletes older ones)
STALLED_SAVE = 10  # checkpoint-stall: save 10 began 1100 s before t=0 and never completes
LAST_SAVE = 9  # checkpoint-overdue: no save begins after save 9 (completed 1655 s before t=0)
STUCK_RANK = 7  # ... because rank 7's shard never finished writing


def build(node: SimulatedNode, t: float) -> None:
    now = EPOCH + t
    proc, rootfs = node.paths.procfs, node.paths.rootfs
    table = "".join(
        f"{26 + i} 1 0:{30 + i} / {mp} {opts} shared:{i + 1} - {fstype} {device} {super_opts}\n"
        for i, (mp, fstype, device, opts, super_opts) in enumerate(mounts(node.scenario))
    )
    # pid 1's mount table: what a host's (or a containerised agent's --path.procfs) shows.
    node.write(proc / "1" / "mountinfo", table)
    node.write(proc / "1" / "mountstats", mountstats(node.scenario, t))
    for mountpoint in statfs_table(node.scenario, t):
        (rootfs / mountpoint.lstrip("/")).mkdir(parents=True, exist_ok=True)
    statvfs = node.seams.get(STATVFS)
    if not isinstance(statvfs, FakeStatvfs):  # one for the node's life: collectors keep the one they were given
        statvfs = FakeStatvfs(node)
        node.seams.replace(STATVFS.replaced_by(statvfs))
    if node.scenario == "straggler-nfs" and slow(node.scenario, t):
        statvfs.hung.add("/home")  # the server went away at the workloads area's onset
    node.seams.replace(STAT_TIMER.replaced_by(lambda: 0.0))
    node.seams.replace(WALL_CLOCK.replaced_by(lambda: EPOCH + node.t))
    if node.scenario in ("nfs-server-down", "straggler-nfs"):
        # A hung statfs holds the whole demo round this long: 1 s, not the 5 s default.  Only
        # where a mount hangs: elsewhere a demo starved of CPU (25 of them beside Prometheus in
        # the e2e test, on 2 cores) reported a healthy mount hung when a thread waited 1 s.
        node.options.setdefault("filesystem", {})["stat_timeout"] = "1s"

    llite = node.paths.sysfs / "kernel" / "debug" / "lustre" / "llite" / LLITE
    node.write(llite / "stats", lustre_stats(node.scenario, t))
    node.write(node.paths.sysfs / "fs" / "lustre" / "health_check", "healthy\n")

    checkpoints(rootfs / CHECKPOINT_ROOT.lstrip("/"), node.scenario, now)
    node.options["checkpoint"] = {"roots": [{"path": "/lustre/ckpt/*", "expected_interval": "10m"}]}

    if node.scenario == "checkpoint-stall":
        io_pressure_during_stall(node, now)


def mounts(scenario: str) -> tuple[tuple[str, str, str, str, str], ...]:
    return (*MOUNTS, REFDATA_MOUNT) if scenario == "shared-fs-filling" else MOUNTS


def statfs_table(scenario: str, t: float) -> dict[str, tuple[int, int, int, int, int, int]]:
    """statfs figures per mountpoint at time t."""
    table = dict(STATFS)
    if scenario == "shared-fs-filling":
        frsize, blocks, _, _, files, ffree = STATFS["/lustre"]
        available = int(blocks * LUSTRE_AVAILABLE * (1 - t / LUSTRE_FILLS_IN))
        table["/lustre"] = (frsize, blocks, available + 10_000_000, available, files, ffree)
        frsize, blocks, _, _, files, ffree = STATFS["/home"]
        table["/home"] = (frsize, blocks, int(blocks * HOME_AVAILABLE), int(blocks * HOME_AVAILABLE), files, ffree)
        table[REFDATA_MOUNT[0]] = REFDATA_STATFS
    return table


class FakeStatvfs:
    """statvfs of the simulated mounts; a hung mount's call never returns (like a dead NFS server)."""

    def __init__(self, node: SimulatedNode) -> None:
        self.node = node
        self.hung = {"/home"} if node.scenario == "nfs-server-down" else set()
        self._never = threading.Event()
        self._slow_done = False

    def __call__(self, path: str) -> os.statvfs_result:
        relative = os.path.relpath(path, self.node.paths.rootfs)
        mountpoint = "/" if relative == "." else "/" + relative
        if mountpoint in self.hung:
            self._never.wait()
        if self.node.scenario == "shared-fs-filling" and mountpoint == "/home" and self.node.t >= SLOW_STATFS_AT:
            if not self._slow_done:
                self._slow_done = True
                time.sleep(SLOW_STATFS_SECONDS)
        table = statfs_table(self.node.scenario, self.node.t)
        if mountpoint not in table:
            raise FileNotFoundError(2, "No such file or directory", path)
        frsize, blocks, bfree, bavail, files, ffree = table[mountpoint]
        return os.statvfs_result((frsize, frsize, blocks, bfree, bavail, files, ffree, ffree, 0, 255))


def mountstats(scenario: str, t: float) -> str:
    """/proc/1/mountstats: the NFS mount's per-operation RPC counters grow with time."""
    elapsed = UPTIME_AT_START + t
    # per second: operations, bytes sent per op, bytes received per op, ms queue/rtt/execute per op
    rates = {
        "READ": (40, 220, 1_048_700, 0.02, 1.8, 1.9),
        "WRITE": (6, 1_048_800, 140, 0.05, 3.1, 3.3),
        "GETATTR": (120, 180, 260, 0.01, 0.3, 0.35),
        "LOOKUP": (30, 200, 240, 0.01, 0.4, 0.45),
        "ACCESS": (25, 170, 200, 0.01, 0.3, 0.33),
    }
    lines = []
    for name, (ops_rate, sent, received, queue, rtt, execute) in rates.items():
        ops = int(ops_rate * elapsed)
        transmissions, timeouts = ops + ops // 50_000, 0
        # nfs-server-down: the server went away 10 minutes before t=0; straggler-nfs: at the
        # workloads area's onset.  Retries every 60 s (timeo=600).
        gone = {"nfs-server-down": -600.0, "straggler-nfs": SLOW_ONSET}.get(scenario)
        if gone is not None and t >= gone and name in ("READ", "GETATTR"):
            transmissions += int((t - gone) // 60) * 2
            timeouts += int((t - gone) // 60)
        numbers = (
            ops,
            transmissions,
            timeouts,
            ops * sent,
            ops * received,
            int(ops * queue),
            int(ops * rtt),
            int(ops * execute),
            0,
        )
        lines.append(f"\t{name:>12}: " + " ".join(str(n) for n in numbers))
    return (
        "device /dev/nvme0n1p2 mounted on / with fstype ext4\n"
        "device proc mounted on /proc with fstype proc\n"
        "device nfs1:/export/home mounted on /home with fstype nfs4 statvers=1.1\n"
        "\topts:\trw,vers=4.2,rsize=1048576,wsize=1048576,namlen=255,hard,proto=tcp,timeo=600,retrans=2,sec=sys\n"
        f"\tage:\t{int(elapsed)}\n"
        "\tRPC iostats version: 1.1  p/v: 100003/4 (nfs)\n"
        "\tper-op statistics\n" + "\n".join(lines) + "\n"
        "device 10.10.0.1@o2ib:/scratch mounted on /lustre with fstype lustre\n"
    )


def lustre_stats(scenario: str, t: float) -> str:
    """llite stats: the checkpoint writes and dataset reads of the job, in bytes and calls."""
    elapsed = UPTIME_AT_START + t
    reads = int(2_000 * elapsed)
    read_bytes = reads * 1_048_576
    # Checkpoints: 8 x 2 GiB every 10 minutes, in 4 MiB writes; during the stall, nothing since it began.
    written_until = elapsed if scenario != "checkpoint-stall" else UPTIME_AT_START - 1100
    write_bytes = int(RANKS * SHARD_BYTES * written_until / SAVE_INTERVAL)
    writes = write_bytes // 4_194_304
    return (
        f"snapshot_time             {EPOCH + t:.9f} secs.nsecs\n"
        f"start_time                {BOOT_TIME + 60:.9f} secs.nsecs\n"
        f"elapsed_time              {elapsed - 60:.9f} secs.nsecs\n"
        f"read_bytes                {reads} samples [bytes] 4096 1048576 {read_bytes}\n"
        f"write_bytes               {writes} samples [bytes] 4194304 4194304 {write_bytes}\n"
        f"read                      {reads} samples [usecs] 80 91234 {reads * 310}\n"
        f"write                     {writes} samples [usecs] 900 402331 {writes * 2100}\n"
        f"open                      {int(3 * elapsed)} samples [usecs] 20 9000 {int(3 * elapsed) * 95}\n"
        f"close                     {int(3 * elapsed)} samples [usecs] 10 5000 {int(3 * elapsed) * 40}\n"
        f"getattr                   {int(50 * elapsed)} samples [usecs] 2 3000 {int(50 * elapsed) * 12}\n"
    )


HANG_SAVE = 999  # hang-save: the long synchronous save's number (its directory step_999000)


def save_begin(k: int) -> float:
    if k == HANG_SAVE:
        return EPOCH + HANG_AT
    return JOB_START + k * SAVE_INTERVAL + FIRST_SAVE_OFFSET


def _shard_done(k: int, rank: int) -> float:
    if k == HANG_SAVE:
        return save_begin(k) + PAUSE * (rank + 1) / (RANKS + 1)
    return save_begin(k) + 5 + 5 * rank


def metadata_done(k: int) -> float:
    return save_begin(k) + (PAUSE if k == HANG_SAVE else 45)


def _saves(scenario: str) -> list[int]:
    """The saves of the job, in the order they begin."""
    if scenario == "nccl-hang":
        return [k for k in range(1, 1000) if k != HANG_SAVE]  # hang-save's own save is not its
    if scenario != "hang-save":
        # Every other scenario also saves hang-save's long save at HANG_AT: left as the report's
        # goldens were made (removing it changed straggler-thermal's report: a full run at add6200).
        return list(range(1, 1000))
    during = range(int(EPOCH + HANG_AT), int(EPOCH + HANG_AT + PAUSE) + 1)
    regular = [k for k in range(1, 1000) if k != HANG_SAVE and int(save_begin(k)) not in during]
    return sorted([*regular, HANG_SAVE], key=save_begin)


def checkpoints(root: Path, scenario: str, now: float) -> None:
    """The save directories as they are at ``now``: finished shards, .metadata once complete."""
    stalled = scenario == "checkpoint-stall"
    last = STALLED_SAVE if stalled else LAST_SAVE if scenario == "checkpoint-overdue" else 1000
    # The job begins no save once it hung (nccl-hang: its rank died before the demo began).
    begins_until = min(now, EPOCH + NCCL_HANG_AT) if scenario == "nccl-hang" else now
    begun = [k for k in _saves(scenario) if save_begin(k) <= begins_until and k <= last]
    complete = [k for k in begun if metadata_done(k) <= now and not (stalled and k == STALLED_SAVE)]
    keep = set(complete[-KEEP:]) | (set(begun) - set(complete))
    root.mkdir(parents=True, exist_ok=True)
    wanted = {f"step_{k * 1000:06d}" for k in keep}
    for entry in os.listdir(root):
        if entry not in wanted:
            shutil.rmtree(root / entry)  # retention: the job deletes old saves
    for k in sorted(keep):
        directory = root / f"step_{k * 1000:06d}"
        directory.mkdir(exist_ok=True)
        last_change = save_begin(k)
        for rank in range(RANKS):
            done = _shard_done(k, rank)
            if done <= now and not (stalled and k == STALLED_SAVE and rank == STUCK_RANK):
                _sparse_file(directory / f"__{rank}_0.distcp", SHARD_BYTES, done)
                last_change = done
        if k in complete:
            _sparse_file(directory / ".metadata", METADATA_BYTES, metadata_done(k))
            last_change = metadata_done(k)
        os.utime(directory, (last_change, last_change))


def _sparse_file(path: Path, size: int, mtime: float) -> None:
    """A file of ``size`` bytes that takes no disk space, modified at ``mtime``."""
    if not path.exists() or path.stat().st_size != size:
        with open(path, "wb") as f:
            f.truncate(size)
    os.utime(path, (mtime, mtime))


def io_pressure_during_stall(node: SimulatedNode, now: float) -> None:
    """/proc/pressure/io while the save is stalled: 'full' (every task stalled) at ~60 %."""
    elapsed = UPTIME_AT_START + (now - EPOCH)
    stalled_for = now - save_begin(STALLED_SAVE)
    some = int(1_500 * elapsed + 850_000 * stalled_for)  # µs, as host's healthy rates plus the stall
    full = int(700 * elapsed + 600_000 * stalled_for)
    node.write(
        node.paths.procfs / "pressure" / "io",
        f"some avg10=86.40 avg60=84.12 avg300=71.50 total={some}\n"
        f"full avg10=61.22 avg60=58.90 avg300=49.75 total={full}\n",
    )
