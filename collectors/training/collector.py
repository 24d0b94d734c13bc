"""The training collector: follows the ranks' logs (collectors/toolkit/followed_logs.py), turns
their lines into records (records.py) and steps (steps.py), and exposes each rank's counters
(metrics.py).  The package's __init__ describes the whole."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from lockstep.agent.collector import Collector, CollectorContext, Families, NothingHere
from lockstep.agent.families import Metric
from lockstep.agent.options import option, parse_positive_int, parse_string
from lockstep.agent.seams import MONOTONIC_CLOCK, WALL_CLOCK
from lockstep.collectors.toolkit.follow import FileFollower, FileId, Line
from lockstep.collectors.toolkit.followed_logs import (
    FollowedLogs,
    globs_option,
    idle_timeout_option,
    start_at_option,
)
from lockstep.collectors.toolkit.skipped import SkippedLines
from lockstep.collectors.training.metrics import (
    COMM_WAIT_SECONDS,
    COMPUTE_SECONDS,
    DATA_WAIT_SECONDS,
    FILES,
    INVALID,
    INVALID_REASONS,
    LAST_STEP,
    LOG_WRITERS,
    SAMPLES,
    SKIPPED_FILES,
    STEP_SECONDS,
    STEPS,
    TOKENS,
)
from lockstep.collectors.training.records import BadLine, parse_record
from lockstep.collectors.training.steps import PENDING_STEP_FLUSH_SECONDS, RankState
from lockstep.collectors.training.writers import scan_writers

# How far ahead of this node's clock a record's ts may be.  A rank's last step time is the
# largest ts seen, so one record stamped in year 9999 would pin it there and the rank could
# never be seen as hung.  60 s is far above the skew of NTP-synced hosts (milliseconds) that
# write to a shared log directory, and far below the 10-minute window of the stall alert: a
# record stamped ahead within the tolerance delays a hung verdict by a minute at most.
MAX_FUTURE_SECONDS = 60.0
# A rank that has logged nothing for this long is looked for among this node's processes (a
# writer of its log: writers.py), then again every WRITER_CHECK_EVERY while it stays idle.  A
# rank of this node without one has ended (its process exited) and is dropped at once; a rank
# with one is hung, not finished, and is kept past idle_timeout for as long as its process
# lives.  Longer than a step, shorter than the stall alert's 10 minutes.
WRITER_CHECK_AFTER = 60.0
WRITER_CHECK_EVERY = 60.0

# Ranks (job_id, rank, host) held at once by default.  A node runs a few jobs of up to 8 ranks
# (one per GPU), and a finished job's ranks stay idle_timeout (10 min) longer: 1,024 is far
# above that, and bounds the collector's series at about 8,200 (8 per rank) and its memory at
# about 6 MB (their state and one round's families), whatever a log says (150,000 distinct
# ranks in one log made 750,000 series).
DEFAULT_MAX_RANKS = 1024


@dataclass(frozen=True)
class TrainingOptions:
    logs: tuple[str, ...] = globs_option("per-rank JSON-lines metric logs", flag="--training.logs")
    start_at: str = start_at_option("log files", flag="--training.start-at")
    idle_timeout: float = idle_timeout_option("a rank that has logged nothing for this long is dropped")
    node_name: str = option(
        "",
        parse_string,
        "this node's host name as the logs write it (their host field), to tell this node's ranks from "
        "those another node logs to a shared filesystem; default: the kernel's, short",
    )
    max_ranks: int = option(
        DEFAULT_MAX_RANKS,
        parse_positive_int,
        "ranks (job_id, rank, host) held at once; records of further ranks are refused and counted",
    )


class TrainingCollector(Collector[TrainingOptions]):
    name = "training"
    help = "Per-rank training step, compute, communication-wait and data-wait time from JSON-lines logs."
    default_interval = 15.0
    metrics = (
        STEPS,
        STEP_SECONDS,
        COMPUTE_SECONDS,
        COMM_WAIT_SECONDS,
        DATA_WAIT_SECONDS,
        TOKENS,
        SAMPLES,
        LAST_STEP,
        LOG_WRITERS,
        FILES,
        SKIPPED_FILES,
        INVALID,
    )
    options_class = TrainingOptions

    def __init__(self, context: CollectorContext) -> None:
        super().__init__(context)
        # Idle and flush times on the monotonic clock, records' ts checked against the wall clock;
        # the simulated node and tests replace them through the seams (agent/seams.py).
        self._clock = context.seams.get(MONOTONIC_CLOCK) or time.monotonic
        self._wall_clock = context.seams.get(WALL_CLOCK) or time.time
        # The logs' lock, follower, watch and close; their lines come to _ingest, under the lock,
        # and the closes of their writers to _on_file_closed.
        self._logs = FollowedLogs(
            self.paths.rootfs,
            start_at=self.options.start_at,
            on_lines=self._ingest,
            on_closed=self._on_file_closed,
            what="log",
            log=self.log,
        )
        self._ranks: dict[tuple[str, str, str], RankState] = {}
        self._invalid = SkippedLines(INVALID_REASONS)
        # Files first read from their end: the step already under way there (the step of
        # the line before the starting point), whose remaining records are not counted:
        # its beginning was never read.
        self._under_way: dict[FileId, str] = {}
        self._writers_checked_at: float | None = None
        self._node = (self.options.node_name or os.uname().nodename).split(".")[0]

    def check(self) -> str:
        if not self.options.logs:
            raise NothingHere(self._nothing_configured())
        with self._logs.probe(self.options.logs) as follower:
            return f"{follower.followed} log file(s) match {', '.join(self.options.logs)}"

    def collect(self) -> Iterator[Metric]:
        if not self.options.logs:
            raise NothingHere(self._nothing_configured())
        # Under the logs' lock, after the sweep gave _ingest the new lines; the watch is re-armed after.
        with self._logs.swept(self.options.logs) as follower:
            now = self._clock()
            self._count_writers(now)
            for key, rank in list(self._ranks.items()):
                if rank.writers == 0 or self._closed_since_last_record(rank, now):
                    del self._ranks[key]  # its process exited: the job ended (or the rank moved)
                elif now - rank.last_record_at >= self.options.idle_timeout and not rank.writers:
                    del self._ranks[key]  # nothing says it still runs: drop its series
                elif rank.pending is not None and now - rank.last_record_at >= PENDING_STEP_FLUSH_SECONDS:
                    rank.finish_step()
            families = self._families(follower)
            self._invalid.log_new(
                self.log, "log lines", f"{len(self._ranks)} ranks held (max_ranks {self.options.max_ranks})"
            )
        return iter(families)

    def close(self) -> None:
        self._logs.close()

    def _count_writers(self, now: float) -> None:
        """Count the writers of the logs of ranks idle for WRITER_CHECK_AFTER (writers.py).  A
        writer found says the rank runs (hung, or paused), whatever host its records name (a
        Kubernetes pod's rank names its pod).  None found says it ended only for a rank of this
        node: a rank whose records name another host may write from that node, to a shared
        filesystem, where no process of this node holds its log whether it runs, pauses or
        ended.  Its count is then unknown (None), as where some processes could not be looked
        at, and it ends by its closes or idle_timeout.  (Taken as 0, a root agent dropped such
        a rank after a minute without a record, a checkpoint save's pause.)"""
        idle = {
            key: rank
            for key, rank in self._ranks.items()
            if rank.log is not None and now - rank.last_record_at >= WRITER_CHECK_AFTER
        }
        if not idle or (self._writers_checked_at is not None and now - self._writers_checked_at < WRITER_CHECK_EVERY):
            return
        self._writers_checked_at = now
        scan = scan_writers(self.paths.procfs, {r.log for r in idle.values() if r.log is not None})
        for (_job, _rank, host), rank in idle.items():
            assert rank.log is not None
            found = scan.writers[rank.log]
            this_node = not host or host.split(".")[0] == self._node
            # None found where some processes could not be looked at, or for another node's rank,
            # proves nothing.
            rank.writers = found if found or (scan.complete and this_node) else None

    @staticmethod
    def _closed_since_last_record(rank: RankState, now: float) -> bool:
        """Its log was closed by a writer that held it open across its writes, after its last
        record; it has been idle since for WRITER_CHECK_AFTER; and no count of this node's
        processes says a writer still holds it (writers None: not counted, or not countable by
        an unprivileged agent).  The rank's process exited (the kernel closes its files) or
        closed its log: either way it logs no more.  A writer that opens the log for each
        write (the simulated node does) closes it every time: its closes say nothing, and its
        rank ends by the writer count or idle_timeout as before."""
        return (
            rank.held_open
            and rank.closed_at is not None
            and rank.closed_at >= rank.last_record_at
            and now - rank.last_record_at >= WRITER_CHECK_AFTER
            and not rank.writers
        )

    # --- reading ---

    def _on_file_closed(self, path: str) -> None:
        """From the watchdog thread, under the logs' lock: a process closed ``path`` after
        writing to it."""
        try:
            inode = os.stat(path).st_ino
        except OSError:
            return  # gone: its ranks end by the sweep, the writer count or idle_timeout
        log = (os.path.basename(path), inode)
        now = self._clock()
        for rank in self._ranks.values():
            if rank.log == log:
                rank.closed_at = now

    def _ingest(self, lines: Iterable[Line]) -> None:
        """Parse each line as the follower hands it over: nothing holds the round's lines.  Under
        the logs' lock (a round's sweep, or a file event from the watchdog thread)."""
        now = self._clock()
        latest_believable_ts = self._wall_clock() + MAX_FUTURE_SECONDS
        for line in lines:
            if not line.data.lstrip().startswith(b"{"):
                # Not a JSON object: refused before any parsing, the cheapest way there is (a
                # log of `1` lines is millions of them).  parse_record would say the same.
                if not line.context:
                    self._invalid["not_json"] += 1
                continue
            try:
                record = parse_record(line.data, line.path)
            except BadLine as bad:
                if not line.context:  # context was read before; its garbage is not news
                    self._invalid[bad.reason] += 1
                continue
            except Exception:  # whatever a line holds, it never costs the rest of the batch
                if not line.context:
                    self._invalid["bad_record"] += 1
                continue
            if record is None:
                continue
            if record.ts > latest_believable_ts:  # a step from the future is no step: refused
                if not line.context:
                    self._invalid["bad_record"] += 1
                continue
            if line.context:
                self._under_way[line.file] = record.step_key
                continue
            if line.file in self._under_way:
                if self._under_way[line.file] == record.step_key:
                    continue  # the rest of a step whose beginning was before we started
                del self._under_way[line.file]
            rank = self._ranks.get(record.rank_key)
            if rank is None:
                if len(self._ranks) >= self.options.max_ranks:
                    self._invalid["too_many_ranks"] += 1  # the ranks held keep their data
                    continue
                rank = self._ranks[record.rank_key] = RankState()
            rank.add(record, now)
            rank.log = (line.path.rsplit("/", 1)[-1], line.file[1])
            rank.writers = None  # it logs: nothing to count

    # --- output ---

    def _families(self, follower: FileFollower) -> list[Metric]:
        families = Families(self.metrics)
        for key in sorted(self._ranks, key=lambda k: (k[0], int(k[1]), k[2])):
            rank = self._ranks[key]
            labels = list(key)
            # Rounded to the nanosecond: sums of decimal step times carry binary noise
            # (299.19999999999993) that is no information.
            families[STEPS].add_metric(labels, rank.steps)
            families[STEP_SECONDS].add_metric(labels, round(rank.step_seconds, 9))
            families[COMPUTE_SECONDS].add_metric(labels, round(rank.compute_seconds, 9))
            families[COMM_WAIT_SECONDS].add_metric(labels, round(rank.comm_wait_seconds, 9))
            families[DATA_WAIT_SECONDS].add_metric(labels, round(rank.data_wait_seconds, 9))
            if rank.tokens is not None:
                families[TOKENS].add_metric(labels, round(rank.tokens, 6))
            if rank.samples is not None:
                families[SAMPLES].add_metric(labels, round(rank.samples, 6))
            if rank.last_step_ts is not None:
                families[LAST_STEP].add_metric(labels, rank.last_step_ts)
            if rank.writers is not None:
                families[LOG_WRITERS].add_metric(labels, rank.writers)
        families[FILES].add_metric([], follower.followed)
        families[SKIPPED_FILES].add_metric([], follower.skipped)
        self._invalid["too_long"] = follower.lines_too_long
        for reason in INVALID_REASONS:
            families[INVALID].add_metric([reason], self._invalid[reason])
        return families.with_samples()

    def _nothing_configured(self) -> str:
        return "no training log globs configured (--training.logs GLOB or collectors.training.logs)"
