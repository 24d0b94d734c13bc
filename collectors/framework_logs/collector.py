"""The framework_logs collector: finds the jobs' output files (discovery.py), follows them
(collectors/toolkit/followed_logs.py), matches the frameworks' lines (parsers.py) and counts
them per job (jobs.py).  The package's __init__ describes the whole."""

from __future__ import annotations

import glob
import os
import re
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime

from lockstep.agent.collector import Collector, CollectorContext, Families, NothingHere
from lockstep.agent.families import Metric
from lockstep.agent.options import option, parse_bool, parse_duration, parse_positive_int, parse_string
from lockstep.agent.seams import MONOTONIC_CLOCK, WALL_CLOCK
from lockstep.collectors.framework_logs.discovery import Discovered, Discovery
from lockstep.collectors.framework_logs.jobs import JobState
from lockstep.collectors.framework_logs.metrics import (
    BYTES_READ,
    DISCOVERY_FAILURES,
    FILES,
    INVALID,
    INVALID_REASONS,
    ITERATION_SECONDS,
    ITERATIONS,
    LAST_ITERATION,
    LINES,
    SAMPLES,
    SAVE_IN_PROGRESS,
    SAVE_SECONDS,
    SAVES,
    SECONDS_PER_ITERATION,
    SKIPPED_FILES,
    STRAGGLER_RANK,
    STRAGGLER_SECONDS,
    TOKENS,
    UNREADABLE,
)
from lockstep.collectors.framework_logs.parsers import FRAMEWORKS, BadLine, parse_line, split_prefix
from lockstep.collectors.toolkit.follow import FileFollower, FileId, Line, default_max_files
from lockstep.collectors.toolkit.followed_logs import (
    FollowedLogs,
    globs_option,
    idle_timeout_option,
    start_at_option,
)
from lockstep.collectors.toolkit.scontrol import SCONTROL, run_scontrol
from lockstep.collectors.toolkit.skipped import SkippedLines

# Jobs held at once by default: a node runs a few jobs at a time, and a finished one stays
# idle_timeout longer.  14 series a job at most: 256 jobs bound the collector at about 3,600
# series, whatever the files say.
DEFAULT_MAX_JOBS = 256
# Output files followed at most (each holds a descriptor): a job has one or two (StdOut,
# StdErr), a pod's containers one each.  Never more than a sixteenth of the open-file limit.
DEFAULT_MAX_FILES = 128
# Bytes read per round over all files.  A job's output is mostly not step lines; training
# jobs print a few KB a minute, a chatty one a few MB.  A backlog (a huge file found in the
# middle of a job) is worked off over several rounds.
DEFAULT_ROUND_BYTES = 8 * 1024 * 1024
MAX_LINE_BYTES = 64 * 1024
# A followed file that gave nothing for this many rounds gives its descriptor up to a file with
# something to read, when max_files are open (follow.py, park_after): anyone may create empty
# files under a glob, and a live job's output must still be read.  Its offset is kept.
PARK_AFTER_SWEEPS = 2
# Lines of no job known, by file name: Slurm's default output names.
_SLURM_DEFAULT_NAME = re.compile(r"(?:^|/)slurm-(\d{1,12})(?:_(\d{1,9}))?\.out$")
# Container logs named by a configured glob: /var/log/pods/<namespace>_<pod>_<uid>/<container>/N.log
# and the kubelet's links /var/log/containers/<pod>_<namespace>_<container>-<id>.log.
_POD_LOG = re.compile(r"/var/log/pods/([^/_]+)_([^/_]+)_[0-9a-f-]{36}/[^/]+/[^/]+$")
_CONTAINER_LOG = re.compile(r"/var/log/containers/([^/_]+)_([^/_]+)_[^/]+\.log$")
# CRI logging format: "<RFC 3339 nano time> <stream> <F|P> <text>".
_CRI = re.compile(rb"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d{1,9})?(Z|[+-]\d\d:\d\d) (?:stdout|stderr) ([FP]) ?")
# The owner of a file whose job is not told from who wrote it (a pod's log, root's).
NO_OWNER = -1
# How far ahead of this node's clock a CRI timestamp may be before it is not believed.
MAX_FUTURE_SECONDS = 60.0


@dataclass(frozen=True)
class FrameworkLogsOptions:
    paths: tuple[str, ...] = globs_option(
        "training jobs' output files",
        flag="--framework-logs.paths",
        more="; the job is taken from Slurm's default names (slurm-JOBID.out, slurm-ARRAYJOBID_TASKID.out)",
    )
    slurm: bool = option(
        True,
        parse_bool,
        "also follow the StdOut/StdErr (scontrol show job) of the Slurm jobs whose batch step runs here",
    )
    pods: bool = option(True, parse_bool, "also follow /var/log/pods of the pods whose processes use this node's GPUs")
    node_name: str = option("", parse_string, "this node's name in Slurm (default: the short hostname)")
    start_at: str = start_at_option("files")
    idle_timeout: float = idle_timeout_option(
        "a job that printed nothing for this long and is not seen running here is dropped"
    )
    discovery_interval: float = option(60.0, parse_duration, "how often to look for jobs' output files")
    scontrol_timeout: float = option(5.0, parse_duration, "time limit of one scontrol show job")
    max_jobs: int = option(DEFAULT_MAX_JOBS, parse_positive_int, "jobs held at once; lines of further jobs are counted")
    max_files: int = option(DEFAULT_MAX_FILES, parse_positive_int, "output files followed at once")
    round_bytes: int = option(
        DEFAULT_ROUND_BYTES, lambda v: parse_positive_int(v, 1 << 30), "bytes read per round, over all files"
    )


class FrameworkLogsCollector(Collector[FrameworkLogsOptions]):
    name = "framework_logs"
    help = "Iterations, step time, throughput and checkpoint saves from Megatron-LM, NeMo and torchtitan output."
    default_interval = 15.0
    needs = ("gpu",)
    metrics = (
        ITERATIONS,
        ITERATION_SECONDS,
        LAST_ITERATION,
        SECONDS_PER_ITERATION,
        TOKENS,
        SAMPLES,
        SAVES,
        SAVE_SECONDS,
        SAVE_IN_PROGRESS,
        STRAGGLER_SECONDS,
        STRAGGLER_RANK,
        FILES,
        SKIPPED_FILES,
        UNREADABLE,
        BYTES_READ,
        LINES,
        INVALID,
        DISCOVERY_FAILURES,
    )
    options_class = FrameworkLogsOptions

    def __init__(self, context: CollectorContext) -> None:
        super().__init__(context)
        self._clock = context.seams.get(MONOTONIC_CLOCK) or time.monotonic
        self._wall_clock = context.seams.get(WALL_CLOCK) or time.time
        # The output files' lock, follower, watch and close; their lines come to _ingest, under the lock.
        self._logs = FollowedLogs(
            self.paths.rootfs,
            start_at=self.options.start_at,
            on_lines=self._ingest,
            what="output",
            max_line_bytes=MAX_LINE_BYTES,
            read_budget=self.options.round_bytes,
            sweep_budget=self.options.round_bytes,
            max_files=min(self.options.max_files, default_max_files(16)),
            park_after=PARK_AFTER_SWEEPS,
            log=self.log,
        )
        self._discovery = Discovery(
            paths=self.paths,
            scontrol=context.seams.get(SCONTROL) or run_scontrol,
            node=self.options.node_name or os.uname().nodename.split(".")[0],
            gpu_inventory=context.gpu_inventory,
            timeout=self.options.scontrol_timeout,
            log=self.log,
            clock=self._clock,
        )
        self._found = Discovered()
        self._discovered_at: float | None = None
        self._followed = False  # whether a round had files to follow
        # (job id, framework, the owner of its files: a uid, or NO_OWNER where the job is not
        # told from who wrote the file): each owner's reports are counted apart (_labels).
        self._jobs: dict[tuple[str, str, int], JobState] = {}
        self._invalid = SkippedLines(INVALID_REASONS)
        self._matched = dict.fromkeys(FRAMEWORKS, 0)
        self._bytes = 0
        self._cri_too_long = 0
        self._partial: dict[FileId, bytearray] = {}  # CRI 'P' pieces of a line, per file

    def check(self) -> str:
        found = self._discover(force=True)
        if not self._patterns(found):
            raise NothingHere(self._nothing_here())
        return (
            f"{len(self.options.paths)} glob(s), {len(found.slurm_files)} Slurm output file(s), "
            f"{len(found.pod_dirs)} GPU pod(s) to follow"
        )

    def collect(self) -> Iterator[Metric]:
        now = self._clock()
        found = self._discover()
        patterns = self._patterns(found)
        if not patterns and not self._followed:
            # The follower is made at the first round all the same: a job found later (discovery
            # runs every minute) is new to it, and its output read from its first line, where a
            # follower made then would read the files present at its first sweep from their end.
            self._logs.begin()
            raise NothingHere(self._nothing_here())
        # Once files were followed, a round without patterns still drains and closes them.
        self._followed = True
        # Under the files' lock, after the sweep gave _ingest the new lines; the watch is re-armed after.
        with self._logs.swept(patterns) as follower:
            self._drop_ended(now)
            families = self._families(follower)
            self._invalid.log_new(
                self.log, "output lines", f"{len(self._jobs)} jobs held (max_jobs {self.options.max_jobs})"
            )
        return iter(families)

    def close(self) -> None:
        self._logs.close()
        self._discovery.cgroups.stop()

    # --- what to follow ---

    def _discover(self, force: bool = False) -> Discovered:
        """Every round, look for Slurm jobs with a process here (cheap); the whole discovery
        every discovery_interval, or at once when a new job (of a cgroup) appeared."""
        now = self._clock()
        new_job = self._discovery.scan() and self.options.slurm
        due = self._discovered_at is None or now - self._discovered_at >= self.options.discovery_interval
        if force or due or new_job:
            self._discovered_at = now
            self._found = self._discovery.run(slurm=self.options.slurm, pods=self.options.pods)
        return self._found

    def _patterns(self, found: Discovered) -> list[str]:
        return [
            *self.options.paths,
            *(glob.escape(path) for path in sorted(found.slurm_files)),
            *(f"{glob.escape(directory)}/*/*.log" for directory in sorted(found.pod_dirs)),
        ]

    def _host_path(self, path: str) -> str:
        """A path the follower names (under rootfs) as the host names it."""
        root = str(self.paths.rootfs)
        if root != "/" and path.startswith(root.rstrip("/") + "/"):
            return path[len(root.rstrip("/")) :]
        return path

    def _job_of(self, host_path: str) -> tuple[str, bool, bool]:
        """(job id, whether the file is a container log in the CRI format, whether it counts for
        a Slurm job, whose user must own it: see _labels); "" when no job is known."""
        job = self._found.slurm_files.get(host_path)
        if job:
            return job, False, True
        directory = host_path.rsplit("/", 2)[0]
        pod = self._found.pod_dirs.get(directory)
        if pod:
            return pod, True, False
        pod_log = _POD_LOG.search(host_path)
        if pod_log:
            return f"{pod_log.group(1)}/{pod_log.group(2)}", True, False
        container_log = _CONTAINER_LOG.search(host_path)
        if container_log:
            return f"{container_log.group(2)}/{container_log.group(1)}", True, False
        cri = "/var/log/pods/" in host_path or "/var/log/containers/" in host_path
        match = _SLURM_DEFAULT_NAME.search(host_path)
        if match:
            return (f"{match.group(1)}_{match.group(2)}" if match.group(2) else match.group(1)), cri, True
        return "", cri, False

    # --- reading ---

    def _ingest(self, lines: Iterable[Line]) -> None:
        """Under the files' lock (a round's sweep, or a file event from the watchdog thread)."""
        now = self._clock()
        read_at = self._wall_clock()
        files: dict[str, tuple[str, bool, float, int]] = {}  # path -> (job id, CRI?, when last written, owner)
        for line in lines:
            self._bytes += len(line.data) + 1
            if line.context:
                continue  # history before where reading started
            where = files.get(line.path)
            if where is None:
                job_id, cri, owned = self._job_of(self._host_path(line.path))
                written_at, owner = self._written_at(line, read_at)
                if owned and owner is None:
                    job_id = ""  # whose it is cannot be told (gone, or another file at its path now)
                where = files[line.path] = (job_id, cri, written_at, owner if owned and owner is not None else NO_OWNER)
            job_id, cri, written_at, owner = where
            data = line.data
            # A line without a time of its own was written no later than its file's last change:
            # a stalled job's history, read later, is not taken for progress now.
            stamped_at, line_time = written_at, None
            if cri:
                unwrapped = self._unwrap_cri(line.file, data, read_at)
                if unwrapped is None:
                    continue
                data, cri_time = unwrapped
                if cri_time is not None:
                    stamped_at = line_time = cri_time
            try:
                rank, text = split_prefix(data)
                event = parse_line(text)
            except BadLine as bad:
                self._invalid[bad.reason] += 1
                continue
            except Exception:  # whatever a line holds, it never costs the rest of the batch
                self._invalid["bad_value"] += 1
                continue
            if event is None:
                continue
            if not job_id:
                self._invalid["no_job"] += 1
                continue
            key = (job_id, event.framework, owner)
            job = self._jobs.get(key)
            if job is None:
                if len(self._jobs) >= self.options.max_jobs:
                    self._invalid["too_many_jobs"] += 1
                    continue
                job = self._jobs[key] = JobState()
                self._judge_owner(key, job)
            self._matched[event.framework] += 1
            job.last_line_at = now
            printed = getattr(event, "printed_at", None)
            if not job.add(event, rank, stamped_at, printed if printed is not None else line_time):
                self._invalid["bad_value"] += 1  # a report that moves the job further than a job can

    def _written_at(self, line: Line, read_at: float) -> tuple[float, int | None]:
        """(When the line's file last changed (its mtime), at most now; now if it cannot be told,
        and its owner's uid, None if it cannot be told: the file is gone from its path, or
        another file is there now, which may be another user's)."""
        try:
            st = os.stat(line.path)
        except OSError:
            return read_at, None
        if (st.st_dev, st.st_ino) != line.file:
            return min(read_at, st.st_mtime), None
        return min(read_at, st.st_mtime), st.st_uid

    def _judge_owner(self, key: tuple[str, str, int], job: JobState) -> None:
        """Once Slurm says who the job's user is, whether this owner's files are the job's."""
        uid = self._found.users.get(key[0])
        if job.owner_is_user is None and key[2] != NO_OWNER and uid is not None:
            job.owner_is_user = key[2] == uid

    def _labels(self) -> dict[tuple[str, str, int], str]:
        """Each job's job_id label.  Output found through Slurm or named slurm-JOB.out counts for
        the job only when its owner is the job's user: Slurm says who (scontrol's UserId, for the
        jobs with a process here); where Slurm does not say (slurm: false, the job runs elsewhere
        or ended before it was asked), when the job's files have one owner.  Any other owner's
        reports are counted apart, labelled JOB@uidUID: a user cannot add to another job's numbers,
        nor move its last report."""
        owners: dict[tuple[str, str], list[int]] = {}
        for job_id, framework, owner in self._jobs:
            owners.setdefault((job_id, framework), []).append(owner)
        labels = {}
        for key, job in self._jobs.items():
            job_id, framework, owner = key
            self._judge_owner(key, job)
            if owner == NO_OWNER or job.owner_is_user:
                labels[key] = job_id
            elif (
                job.owner_is_user is None and len(owners[(job_id, framework)]) == 1 and job_id not in self._found.users
            ):
                labels[key] = job_id  # Slurm does not say: the only owner's
            else:
                labels[key] = f"{job_id}@uid{owner}"
        return labels

    def _unwrap_cri(self, file: FileId, data: bytes, read_at: float) -> tuple[bytes, float | None] | None:
        """A CRI log line -> (its text, its time); None for a partial line kept for its end, or
        for a line not in the format (counted)."""
        match = _CRI.match(data)
        if match is None:
            self._invalid["bad_cri"] += 1
            return None
        text = data[match.end() :]
        if match.group(4) == b"P":
            pieces = self._partial.setdefault(file, bytearray())
            if len(pieces) + len(text) > MAX_LINE_BYTES:
                self._cri_too_long += 1
                pieces.clear()
            else:
                pieces += text
            if len(self._partial) > 4 * self.options.max_files:
                self._partial.clear()  # files gone for good; a line cut short at worst
            return None
        pieces = self._partial.pop(file, bytearray())
        if pieces:
            text = bytes(pieces) + text
        try:
            fraction = (match.group(2) or b".0")[:7].decode()
            moment = datetime.fromisoformat(
                match.group(1).decode() + fraction + match.group(3).decode().replace("Z", "+00:00")
            ).timestamp()
        except (ValueError, OverflowError):
            return text, None
        if moment > read_at + MAX_FUTURE_SECONDS:
            return text, None
        return text, moment

    def _drop_ended(self, now: float) -> None:
        """Drop the jobs idle for idle_timeout that are not seen running here."""
        running = self._found.running
        for key, job in list(self._jobs.items()):
            if now - job.last_line_at >= self.options.idle_timeout and key[0] not in running:
                del self._jobs[key]

    # --- output ---

    def _families(self, follower: FileFollower) -> list[Metric]:
        families = Families(self.metrics)
        job_ids = self._labels()
        for key in sorted(self._jobs):
            job = self._jobs[key]
            labels = [job_ids[key], key[1]]
            families[ITERATIONS].add_metric(labels, job.iterations)
            families[ITERATION_SECONDS].add_metric(labels, round(job.iteration_seconds, 6))
            if job.last_iteration_at is not None:
                families[LAST_ITERATION].add_metric(labels, round(job.last_iteration_at, 6))
            if job.seconds_per_iteration is not None:
                families[SECONDS_PER_ITERATION].add_metric(labels, round(job.seconds_per_iteration, 9))
            if job.tokens is not None:
                families[TOKENS].add_metric(labels, round(job.tokens, 3))
            if job.samples is not None:
                families[SAMPLES].add_metric(labels, job.samples)
            families[SAVES].add_metric(labels, job.saves)
            families[SAVE_SECONDS].add_metric(labels, round(job.save_seconds, 9))
            if key[1] == "megatron":
                families[SAVE_IN_PROGRESS].add_metric(labels, 1 if job.save_started_at is not None else 0)
            if job.straggler is not None:
                s = job.straggler
                families[STRAGGLER_SECONDS].add_metric([*labels, "fastest"], round(s.fastest_seconds, 9))
                families[STRAGGLER_SECONDS].add_metric([*labels, "slowest"], round(s.slowest_seconds, 9))
                families[STRAGGLER_RANK].add_metric([*labels, "fastest"], s.fastest_rank)
                families[STRAGGLER_RANK].add_metric([*labels, "slowest"], s.slowest_rank)
        sources = self._sources(follower)
        for source in ("paths", "slurm", "pods"):
            families[FILES].add_metric([source], sources.get(source, 0))
        families[SKIPPED_FILES].add_metric([], follower.skipped)
        families[UNREADABLE].add_metric([], self._found.unreadable)
        families[BYTES_READ].add_metric([], self._bytes)
        for framework in FRAMEWORKS:
            if self._matched[framework]:  # the frameworks seen: none of a node's series for the others
                families[LINES].add_metric([framework], self._matched[framework])
        self._invalid["too_long"] = follower.lines_too_long + self._cri_too_long
        for reason in INVALID_REASONS:
            families[INVALID].add_metric([reason], self._invalid[reason])
        families[DISCOVERY_FAILURES].add_metric([], self._discovery.failures.get("slurm", 0))
        return families.with_samples()

    def _sources(self, follower: FileFollower) -> dict[str, int]:
        counts: dict[str, int] = {}
        for path in follower.followed_paths():
            host = self._host_path(path)
            if host in self._found.slurm_files:
                source = "slurm"
            elif host.rsplit("/", 2)[0] in self._found.pod_dirs:
                source = "pods"
            else:
                source = "paths"
            counts[source] = counts.get(source, 0) + 1
        return counts

    def _nothing_here(self) -> str:
        return (
            "no output files to follow: no --framework-logs.paths glob, and no Slurm job's batch step "
            "or GPU pod found on this node"
        )
