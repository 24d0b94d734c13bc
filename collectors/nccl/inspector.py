"""The NCCL Inspector collector: follows the dump files NCCL's Inspector profiler plugin writes
(inspector_records.py has the format) and turns each rank's records into counters.

Files are found by the configured globs and followed as the training logs are
(collectors/toolkit/followed_logs.py and follow.py: rotation, truncation, a partial last line,
bounded bytes per round and files), by a sweep each round, without file events.  The plugin
writes only from a periodic dump thread: with the default
``NCCL_INSPECTOR_DUMP_THREAD_INTERVAL_MICROSECONDS`` (-1 in 2.30, 0 in 2.28) it writes nothing at
all, and what a communicator completed after the last dump before it was destroyed is never
written (docs/workloads.md, "What the Inspector's numbers cover").  A rank that stops writing is
dropped after ``idle_timeout``.  A glob that matches a directory reads the dump files in it.
Files of plugins before 2.30.3 hold samples, counted by ``coll_sn`` (``_operations_represented``).

Who a rank is:
- the Slurm job: from the dump directory's name (``nccl-inspector-<jobid>``, the plugin's
  default, or a directory named by the bare job id, as NVIDIA's sbatch example does), else,
  when the writer runs on this node, from its process's cgroup or environment
  (collectors/toolkit/procs.py), else ``unknown``;
- the GPU: when the writer runs on this node (the record's hostname), the GPU whose compute
  processes include the record's pid (the GPU collector's inventory, NVML).  A process in a
  container with its own PID namespace writes a pid the host does not know: no GPU then.
"""

from __future__ import annotations

import functools
import os
import re
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from lockstep.agent.collector import Collector, CollectorContext, Families, NothingHere
from lockstep.agent.families import Metric
from lockstep.agent.options import option, parse_positive_int, parse_string
from lockstep.agent.seams import MONOTONIC_CLOCK
from lockstep.collectors.nccl.inspector_metrics import (
    COLLECTIVE_BUS_BYTES,
    COLLECTIVE_BYTES,
    COLLECTIVE_SECONDS,
    COLLECTIVES,
    FILES,
    P2P_BYTES,
    P2P_OPERATIONS,
    P2P_SECONDS,
    RANK_INFO,
    SKIPPED,
)
from lockstep.collectors.nccl.inspector_records import INVALID_REASONS, BadLine, InspectorRecord, parse_line
from lockstep.collectors.toolkit.follow import FileFollower, FileId, Line, default_max_files
from lockstep.collectors.toolkit.followed_logs import (
    FollowedLogs,
    globs_option,
    idle_timeout_option,
    start_at_option,
)
from lockstep.collectors.toolkit.procs import slurm_job

SKIP_REASONS = (*INVALID_REASONS, "series_limit")
# The plugin's default directory name (inspector.cc genDumpDir), or a bare job id.
_JOB_DIRECTORY = re.compile(r"^(?:nccl-inspector-)?(\d{1,20})$")
# The files the plugin writes in its dump directory: "%s/%s-pid%d.log" (dump directory, host
# name, pid; NVIDIA/nccl v2.30.7-1 plugins/profiler/inspector/inspector.cc inspectorStateDumpJSON,
# the same in v2.28.3-1 ext-profiler/inspector/inspector.cc inspectorStateDump).  A glob matching a directory reads
# these in it.
DUMP_FILES = "*-pid*.log"

RankKey = tuple[str, str, int, str]  # (job_id, comm, rank, host)


@dataclass(frozen=True)
class InspectorOptions:
    dumps: tuple[str, ...] = globs_option(
        "NCCL Inspector dump files (<dump dir>/<host>-pid<pid>.log) or dump directories (their "
        "*-pid*.log files are read)",
        flag="--nccl-inspector.dumps",
    )
    start_at: str = start_at_option("dump files", flag="--nccl-inspector.start-at")
    idle_timeout: float = idle_timeout_option("a rank with no new record for this long is dropped")
    max_series: int = option(
        4096,
        parse_positive_int,
        "most (job, communicator, rank, operation) counters kept; records of more are skipped and counted",
    )
    max_files: int = option(
        1024,
        parse_positive_int,
        "most dump files followed at once (one descriptor each; at most an eighth of the open-file limit)",
    )
    max_bytes_per_round: int = option(
        32 * 1024 * 1024,
        functools.partial(parse_positive_int, maximum=1 << 34),
        "most bytes read from all dump files in one round (at most 16 MiB of them from one file); the rest "
        "is read in the next rounds",
    )
    node_name: str = option(
        "",
        parse_string,
        "this node's host name as NCCL writes it (gethostname), to tell this node's ranks; default: the kernel's",
    )


@dataclass
class _Counters:
    operations: int = 0
    seconds: float = 0.0
    message_bytes: int = 0
    bus_bytes: float = 0.0
    last_sn: int | None = None  # of the last sampled record (plugins before 2.30.3)


@dataclass
class _Rank:
    comm_name: str
    n_ranks: int
    nnodes: int
    pid: int
    last_record_at: float
    sampled: bool  # its plugin writes samples (before 2.30.3), not every operation
    gpu: tuple[str, str] = ("", "")  # (NVML index, UUID), empty when not known
    collectives: dict[str, _Counters] = field(default_factory=dict)
    p2p: dict[str, _Counters] = field(default_factory=dict)

    @property
    def series(self) -> int:
        return len(self.collectives) + len(self.p2p)


class InspectorCollector(Collector[InspectorOptions]):
    name = "nccl_inspector"
    help = "Per-rank NCCL collective counts, time and bytes from NCCL Inspector dump files (no change to the job)."
    default_interval = 15.0
    needs = ("gpu",)
    metrics = (
        COLLECTIVES,
        COLLECTIVE_SECONDS,
        COLLECTIVE_BYTES,
        COLLECTIVE_BUS_BYTES,
        P2P_OPERATIONS,
        P2P_SECONDS,
        P2P_BYTES,
        RANK_INFO,
        FILES,
        SKIPPED,
    )
    options_class = InspectorOptions

    def __init__(self, context: CollectorContext) -> None:
        super().__init__(context)
        # When each rank last wrote, for idle_timeout (the simulated node and tests replace the
        # clock through the seam, agent/seams.py).
        self._clock = context.seams.get(MONOTONIC_CLOCK) or time.monotonic
        # The dump files' follower and close.  Not watched, as before: the sweep each round reads
        # them; the plugin writes only from its periodic dump thread, never a line to see at once.
        self._logs = FollowedLogs(
            self.paths.rootfs,
            start_at=self.options.start_at,
            on_lines=self._ingest,
            watch=False,
            # An eighth of the open-file limit at most, whatever the option says: with the training
            # logs' quarter and the HTTP endpoint's half, the agent keeps descriptors of its own.
            max_files=min(self.options.max_files, default_max_files(share=8)),
            sweep_budget=self.options.max_bytes_per_round,
            log=self.log,
            directory_files=DUMP_FILES,
        )
        self._ranks: dict[RankKey, _Rank] = {}
        self._skipped = dict.fromkeys(SKIP_REASONS, 0)
        self._job_of_file: dict[FileId, str] = {}
        self._node = (self.options.node_name or os.uname().nodename).split(".")[0]

    def check(self) -> str:
        if not self.options.dumps:
            raise NothingHere(self._nothing_configured())
        with self._logs.probe(self.options.dumps) as follower:
            if not follower.followed:
                return f"0 Inspector dump files: {follower.why_no_files()}"
            return f"{follower.followed} Inspector dump file(s) match {', '.join(self.options.dumps)}"

    def collect(self) -> Iterator[Metric]:
        if not self.options.dumps:
            raise NothingHere(self._nothing_configured())
        # After the sweep gave _ingest the new records.
        with self._logs.swept(self.options.dumps) as follower:
            now = self._clock()
            for key, rank in list(self._ranks.items()):
                if now - rank.last_record_at >= self.options.idle_timeout:
                    del self._ranks[key]  # the job ended (or the communicator was destroyed): its series go
            if len(self._job_of_file) > 2 * self.options.max_files:
                self._job_of_file.clear()  # files come and go: looked up again for the files still written to
            self._attribute_gpus()
            families = self._families(follower)
        return iter(families)

    def close(self) -> None:
        self._logs.close()

    # --- reading ---

    def _ingest(self, lines: Iterable[Line]) -> None:
        now = self._clock()
        for line in lines:
            if line.context:
                continue  # a record read before the agent started: already counted by no one, skipped
            try:
                record = parse_line(line.data)
            except BadLine as bad:
                self._skipped[bad.reason] += 1
                continue
            job_id = self._job_of(line, record)
            key = (job_id, record.comm, record.rank, record.hostname)
            rank = self._ranks.get(key)
            if rank is None:
                rank = self._ranks[key] = _Rank(
                    record.comm_name, record.n_ranks, record.nnodes, record.pid, now, record.sampled
                )
            by_operation = rank.p2p if record.p2p else rank.collectives
            counters = by_operation.get(record.operation)
            if counters is None:
                if self._series() >= self.options.max_series:
                    self._skipped["series_limit"] += 1
                    if not rank.series:
                        del self._ranks[key]
                    continue
                counters = by_operation[record.operation] = _Counters()
            stands_for = _operations_represented(record, counters)
            counters.operations += stands_for
            counters.seconds += record.exec_seconds * stands_for
            counters.message_bytes += record.message_bytes * stands_for
            if record.bus_bytes_per_second is not None:
                counters.bus_bytes += record.bus_bytes_per_second * record.exec_seconds * stands_for
            rank.last_record_at = now
            rank.pid = record.pid
            rank.sampled = record.sampled

    def _series(self) -> int:
        return sum(rank.series for rank in self._ranks.values())

    def _job_of(self, line: Line, record: InspectorRecord) -> str:
        """The Slurm job of a dump file: its directory's name, else its writer's cgroup."""
        job = self._job_of_file.get(line.file)
        if job is None:
            match = _JOB_DIRECTORY.match(os.path.basename(os.path.dirname(line.path)))
            if match:
                job = match.group(1)
            elif self._is_local(record.hostname):
                job = slurm_job(self.paths.procfs, record.pid) or "unknown"
            else:
                job = "unknown"
            self._job_of_file[line.file] = job
        return job

    def _is_local(self, hostname: str) -> bool:
        return hostname.split(".")[0] == self._node

    def _attribute_gpus(self) -> None:
        """The GPU of each of this node's ranks: the one NVML lists the rank's process on."""
        gpus_of_pid: dict[int, list[tuple[str, str]]] = {}
        for gpu in self.context.gpu_inventory.published():
            for process in gpu.processes:
                gpus_of_pid.setdefault(process.pid, []).append((str(gpu.index), gpu.uuid))
        for (_, _, _, host), rank in self._ranks.items():
            if not self._is_local(host):
                continue
            gpus = gpus_of_pid.get(rank.pid, [])
            # A process driving several GPUs has one rank per GPU: which is which, NVML cannot say.
            rank.gpu = gpus[0] if len(gpus) == 1 else ("", "")

    # --- output ---

    def _families(self, follower: FileFollower) -> list[Metric]:
        families = Families(self.metrics)
        for key in sorted(self._ranks):
            rank = self._ranks[key]
            job_id, comm, rank_number, host = key
            labels = [job_id, comm, str(rank_number), host]
            records = "sampled" if rank.sampled else "all"
            families[RANK_INFO].add_metric(
                [*labels, rank.comm_name, str(rank.n_ranks), str(rank.nnodes), *rank.gpu, records], 1
            )
            for operation, counters in sorted(rank.collectives.items()):
                families[COLLECTIVES].add_metric([*labels, operation], counters.operations)
                families[COLLECTIVE_SECONDS].add_metric([*labels, operation], round(counters.seconds, 6))
                families[COLLECTIVE_BYTES].add_metric([*labels, operation], counters.message_bytes)
                families[COLLECTIVE_BUS_BYTES].add_metric([*labels, operation], round(counters.bus_bytes, 3))
            for operation, counters in sorted(rank.p2p.items()):
                families[P2P_OPERATIONS].add_metric([*labels, operation], counters.operations)
                families[P2P_SECONDS].add_metric([*labels, operation], round(counters.seconds, 6))
                families[P2P_BYTES].add_metric([*labels, operation], counters.message_bytes)
        families[FILES].add_metric([], follower.followed)
        self._skipped["too_long"] = follower.lines_too_long
        for reason in SKIP_REASONS:
            families[SKIPPED].add_metric([reason], self._skipped[reason])
        return families.with_samples()

    def _nothing_configured(self) -> str:
        return (
            "no NCCL Inspector dump globs configured (--nccl-inspector.dumps GLOB or collectors.nccl_inspector.dumps)"
        )


def _operations_represented(record: InspectorRecord, counters: _Counters) -> int:
    """How many of the rank's operations of this type the record stands for.

    A plugin from 2.30.3 writes one record per operation: 1.  An older one writes a sample, the
    communicator's latest collective at each dump (inspector_records.py), whose coll_sn is
    NCCL's count of the type's collectives before it: the sample stands for every collective
    since the previous sample of its type, and for all sn + 1 of them when it is the first
    one seen.  So the count is NCCL's own, exact up to the latest sample, and the seconds and
    bytes are the sampled collectives' weighted by what each stands for: their rates still
    give the time per collective, as an estimate.
    """
    if not record.sampled:
        return 1
    last, counters.last_sn = counters.last_sn, record.sn
    if last is None or record.sn < last:
        # First sample of the type, or the count started again (a new communicator with the same
        # id and rank in a process with the same pid): every collective up to this one.
        return record.sn + 1
    return record.sn - last  # 0 for the same sample read twice
