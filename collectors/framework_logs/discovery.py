"""Finding the jobs' output files on this node.

- Slurm: the jobs with a process here, from the processes' cgroups (``.../job_<id>/...``, set
  by slurmd), else their SLURM_JOB_ID (readable by root only); for each new one, once,
  ``scontrol -o show job <id>`` gives its ``StdOut``, ``StdErr`` and ``BatchHost``.  Only the
  batch host follows them: the batch step and every ``srun`` step launched from it write
  there, and on a shared file system every node of the job would otherwise count the same lines.
  New jobs are asked first, those of a cgroup (set by slurmd) before those of an environment
  (which any user writes: ``SLURM_JOB_ID=1 sleep``); a job id Slurm did not answer for is asked
  again after 60 s, then 120 s, ... at most every hour, after the new ones: ids that fail cannot
  take the round's calls from a real job.  /proc is scanned every round, and the directories
  slurmd makes the jobs' cgroups in (``.../slurmstepd.scope/job_<id>`` in cgroup v2, learned
  from the jobs seen, and the default one) are watched (inotify): a job that starts and ends
  between two rounds is still seen, asked about, and its output read after its end.
- Kubernetes: the pods of the processes the GPU collector found on this node's GPUs (the
  GPU inventory, agent/gpus.py), from the processes' cgroups, and their directories under
  /var/log/pods (collectors/toolkit/pods.py).

What runs here (Slurm job ids, pods' job ids) is also what keeps a quiet job's series: a job
that printed nothing for ``idle_timeout`` is dropped only when it is not seen running here.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from lockstep.agent.collector import Paths
from lockstep.agent.gpus import GpuInventory
from lockstep.collectors.toolkit.pods import pod_log_directories, pod_uid_of_process
from lockstep.collectors.toolkit.procs import process_table, slurm_job_of_cgroup, slurm_job_of_environ
from lockstep.collectors.toolkit.scontrol import parse_scontrol_record, why

# scontrol calls per discovery round at most (one per new job): a node that sees many new
# jobs at once catches up over a few rounds instead of one long one.
MAX_NEW_JOBS_PER_ROUND = 8
# A job id scontrol gave no answer for is asked again after RETRY_SECONDS, twice that after a
# second failure, ... at most every MAX_RETRY_SECONDS; failures of at most MAX_FAILED ids are kept.
RETRY_SECONDS = 60.0
MAX_RETRY_SECONDS = 3600.0
MAX_FAILED = 4096
# A Slurm job seen here stays one to ask about and to follow the files of for this long after
# its processes were last seen: a job that ended before it was asked is still asked (scontrol
# answers for MinJobAge, 300 s by default, after a job's end) and its output read to its end.
LINGER_SECONDS = 300.0
MAX_SEEN = 4096
# Where slurmd (22.05 and later, cgroup v2) makes each job's cgroup, under /sys.
DEFAULT_JOB_CGROUPS = "fs/cgroup/system.slice/slurmstepd.scope"
# A line of /proc/PID/cgroup naming a Slurm job: hierarchy, controllers, the path above job_<id>.
_JOB_CGROUP_LINE = re.compile(r"^\d+:([^:\n]*):(/[^\n]*?)/job_\d+(?:/|$)", re.MULTILINE)
_JOB_CGROUP_NAME = re.compile(r"job_(\d{1,12})")
# Directories watched for new job cgroups at most.
MAX_WATCHED = 16


class JobCgroupWatch:
    """The job cgroups slurmd makes (``job_<id>``), as inotify reports them, so that a job that
    lives less than a round is seen.  Events come from watchdog's thread; ``born`` hands them over."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._born: list[str] = []
        self._observer: Any = None
        self._watches: dict[str, Any] = {}
        self.watched: dict[str, int] = {}  # directory -> its inode when watched (or tried)

    def watch(self, directories: set[str], log: logging.Logger) -> None:
        """Watch these directories too (a directory made anew, e.g. cgroup v1's uid_<uid> after
        the user's last job ended, is watched again)."""
        for directory in sorted(directories):
            try:
                inode = os.stat(directory).st_ino
            except OSError:
                continue
            if self.watched.get(directory) == inode:
                continue
            if directory not in self.watched and len(self.watched) >= MAX_WATCHED:
                continue
            self.watched[directory] = inode
            try:
                if self._observer is None:
                    self._observer = self._start()
                old = self._watches.pop(directory, None)
                if old is not None:
                    self._observer.unschedule(old)
                self._watches[directory] = self._observer.schedule(self._handler, directory, recursive=False)
            except (OSError, KeyError, ImportError) as exc:  # the inotify limit: the scan every round remains
                log.info("cannot watch %s for new Slurm jobs: %s", directory, exc)

    def _start(self) -> Any:
        from watchdog.events import FileSystemEvent, FileSystemEventHandler
        from watchdog.observers import Observer

        born, lock = self._born, self._lock

        class Handler(FileSystemEventHandler):
            def on_created(self, event: FileSystemEvent) -> None:
                match = _JOB_CGROUP_NAME.fullmatch(os.path.basename(os.fsdecode(event.src_path)))
                if event.is_directory and match:
                    with lock:
                        if len(born) < MAX_SEEN:
                            born.append(match.group(1))

        self._handler = Handler()
        observer = Observer()
        observer.daemon = True
        observer.start()
        return observer

    def born(self) -> list[str]:
        """The jobs whose cgroup appeared since the last call."""
        with self._lock:
            born = list(self._born)
            self._born.clear()
        return born

    def stop(self) -> None:
        if self._observer is not None:
            self._observer.stop()
            self._observer.join(timeout=5)
            self._observer = None


@dataclass(frozen=True)
class Discovered:
    slurm_files: dict[str, str] = field(default_factory=dict)  # host path -> job id
    pod_dirs: dict[str, str] = field(default_factory=dict)  # host directory -> job id (namespace/pod)
    running: frozenset[str] = frozenset()  # job ids seen running on this node
    unreadable: int = 0  # found files the agent may not read
    users: dict[str, int] = field(default_factory=dict)  # Slurm job id -> its user's uid, as Slurm says


_USER_ID = re.compile(r"\((\d{1,10})\)$")


@dataclass(frozen=True)
class _SlurmJob:
    files: tuple[str, ...]  # empty: its batch step runs elsewhere, or it has no file
    uid: int | None = None  # its user's (UserId=alice(1000)), None when Slurm did not say


class Discovery:
    def __init__(
        self,
        paths: Paths,
        scontrol: Callable[[list[str], float], str],
        node: str,
        gpu_inventory: GpuInventory,
        timeout: float,
        log: logging.Logger,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.paths = paths
        self.scontrol = scontrol
        self.node = node
        self.gpu_inventory = gpu_inventory
        self.timeout = timeout
        self.log = log
        self.clock = clock
        self.failures: dict[str, int] = {}
        self._slurm_jobs: dict[str, _SlurmJob] = {}
        self._failed: dict[str, tuple[int, float]] = {}  # job id -> (failures in a row, when to ask again)
        self._local: dict[str, bool] = {}  # the last scan's jobs (see _local_slurm_jobs)
        self.cgroups = JobCgroupWatch()
        self._seen: dict[str, tuple[bool, float]] = {}  # job id -> (a cgroup's?, when last seen here)
        self._scanned = False

    def scan(self) -> bool:
        """Look for the Slurm jobs with a process here (every round: one pass over /proc);
        True when one of a cgroup (slurmd's, not a user's environment) is new, to be asked now."""
        now = self.clock()
        if not self._scanned:
            self._watch_cgroups_of(None)  # the default directory, from the first round
        self._local = self._local_slurm_jobs()
        self._scanned = True
        new = False
        for job in self.cgroups.born():  # started (and maybe ended) since the last scan
            if job not in self._seen:
                self._seen[job] = (True, now)
                new = True
        for job, trusted in self._local.items():
            before = self._seen.pop(job, None)
            new = new or (trusted and before is None)
            self._seen[job] = (trusted or (before is not None and before[0]), now)
        for job in [job for job, (_, at) in self._seen.items() if now - at > LINGER_SECONDS]:
            del self._seen[job]
        while len(self._seen) > MAX_SEEN:
            del self._seen[next(iter(self._seen))]  # seen longest ago
        return new

    def run(self, slurm: bool, pods: bool) -> Discovered:
        """Ask Slurm about the jobs seen here (the last ``scan``'s and those that ended within
        LINGER_SECONDS), and find the pods' logs."""
        if not self._scanned:
            self.scan()
        local = {job: trusted for job, (trusted, _) in self._seen.items()}
        slurm_files: dict[str, str] = {}
        users: dict[str, int] = {}
        if slurm:
            self._slurm_jobs = {job: known for job, known in self._slurm_jobs.items() if job in local}
            for job in self._to_ask(local):
                known = self._ask_slurm(job)
                if known is not None:
                    self._slurm_jobs[job] = known
                    self._failed.pop(job, None)
                else:
                    self._failed_again(job)
            for job in local:
                known = self._slurm_jobs.get(job)
                if known is not None and known.uid is not None:
                    users[job] = known.uid
                for path in known.files if known is not None else ():
                    slurm_files[path] = job
        pod_dirs = {}
        if pods:
            uids = set()
            for gpu in self.gpu_inventory.published():
                for process in gpu.processes:
                    uid = pod_uid_of_process(self.paths.procfs, process.pid)
                    if uid:
                        uids.add(uid)
            for logs in pod_log_directories(self.paths.rootfs, uids):
                pod_dirs[logs.directory] = f"{logs.namespace}/{logs.pod}"
        unreadable = sum(1 for path in [*slurm_files, *pod_dirs] if self._unreadable(path))
        running = frozenset(self._local) | frozenset(pod_dirs.values())
        return Discovered(slurm_files, pod_dirs, running, unreadable, users)

    def _watch_cgroups_of(self, pid: int | None) -> None:
        """Watch the directories the job cgroups of ``pid``'s job are made in (and the default)."""
        directories = set()
        cgroup_root = self.paths.sysfs / "fs" / "cgroup"
        default = self.paths.sysfs / DEFAULT_JOB_CGROUPS
        if default.is_dir():
            directories.add(str(default))
        try:
            text = (self.paths.procfs / str(pid) / "cgroup").read_text() if pid is not None else ""
        except OSError:
            text = ""
        for controllers, parent in _JOB_CGROUP_LINE.findall(text):
            hierarchy = cgroup_root / controllers.removeprefix("name=") if controllers else cgroup_root
            directory = hierarchy / parent.lstrip("/")
            if directory.is_dir():
                directories.add(str(directory))
        self.cgroups.watch(directories, self.log)

    def _to_ask(self, local: dict[str, bool]) -> list[str]:
        """The jobs to ask Slurm about this round, at most MAX_NEW_JOBS_PER_ROUND: those never
        asked (a cgroup's before an environment's), then the failed ones due again, longest due first."""
        now = self.clock()
        new = [job for job in local if job not in self._slurm_jobs and job not in self._failed]
        new.sort(key=lambda job: (not local[job], len(job), job))
        due = [job for job in local if job not in self._slurm_jobs and job in self._failed]
        due = sorted((job for job in due if self._failed[job][1] <= now), key=lambda job: self._failed[job][1])
        return (new + due)[:MAX_NEW_JOBS_PER_ROUND]

    def _failed_again(self, job: str) -> None:
        failures = self._failed.pop(job, (0, 0.0))[0] + 1
        wait = min(MAX_RETRY_SECONDS, RETRY_SECONDS * 2 ** min(failures - 1, 16))
        self._failed[job] = (failures, self.clock() + wait)
        while len(self._failed) > MAX_FAILED:
            del self._failed[next(iter(self._failed))]  # the oldest failure: that id is new again

    def _local_slurm_jobs(self) -> dict[str, bool]:
        """The Slurm jobs with a process here -> whether a cgroup (slurmd's) says so, not only
        an environment (its user's)."""
        jobs: dict[str, bool] = {}
        # Kernel threads (half of an idle node's processes) belong to no job: their cgroup and
        # environment are not read.  The table is the one the round's other collectors read.
        pids = [pid for pid, process in process_table(self.paths.procfs).items() if not process.kernel_thread]
        for pid in pids:
            job = slurm_job_of_cgroup(self.paths.procfs, pid)
            if job:
                if job not in jobs and job not in self._seen:
                    self._watch_cgroups_of(pid)
                jobs[job] = True
                continue
            job = slurm_job_of_environ(self.paths.procfs, pid)  # its cgroup was read just above
            if job:
                jobs.setdefault(job, False)
        return jobs

    def _ask_slurm(self, job: str) -> _SlurmJob | None:
        try:
            out = self.scontrol(["-o", "show", "job", job], self.timeout)
        except (OSError, subprocess.SubprocessError) as exc:
            self.failures["slurm"] = self.failures.get("slurm", 0) + 1
            self.log.warning("scontrol show job failed", extra={"job_id": job, "error": why(exc)})
            return None
        lines = out.strip().splitlines()
        if not lines:
            return _SlurmJob(())
        record = parse_scontrol_record(lines[0])
        user = _USER_ID.search(record.get("UserId", ""))
        uid = int(user.group(1)) if user else None
        if record.get("BatchHost", "") != self.node:
            return _SlurmJob((), uid)
        files = []
        for key in ("StdOut", "StdErr"):
            path = record.get(key, "")
            # Unexpanded patterns (%j in older versions' answers) and /dev/null name no file.
            if path.startswith("/") and "%" not in path and path != "/dev/null" and path not in files:
                files.append(path)
        return _SlurmJob(tuple(files), uid)

    def _unreadable(self, host_path: str) -> bool:
        root = str(self.paths.rootfs).rstrip("/")
        path = root + host_path
        is_dir = os.path.isdir(path)
        if not is_dir and not os.path.exists(path):
            return False  # not written yet: nothing to say
        return not os.access(path, os.R_OK | (os.X_OK if is_dir else 0))
