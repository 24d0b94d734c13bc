"""Step assembly: a rank's records grouped into steps, and each complete step added to the
rank's counters.

Grouping records into steps: a rank's records belong to the same step while they carry
the same ``step`` (or, without one, the same ``ts``).  A step is complete when a record
of another step arrives, when a metric repeats, when it has every metric the rank's
previous complete step had (so a steady logger's step counts at once), or when the rank
has written nothing for ``PENDING_STEP_FLUSH_SECONDS``.  Only complete steps are counted.

What each step adds (docs/workloads.md has the table):
- ``step_time_sec``: one step, and its wall time;
- compute: ``compute_time_sec``, else step time minus communication and data wait;
- communication wait: ``comm_wait_time_sec`` (or ``allreduce_time_sec``), else
  ``allreduce_time_pct`` / 100 x step time;
- data wait: ``data_time_sec``;
- tokens: ``tokens``, else ``tokens_per_sec`` x step time; samples: ``samples``, else
  ``throughput_examples_per_sec`` (or ``samples_per_sec``) x step time.
Other metrics (loss, gpu_utilization_pct, ...) are valid and ignored.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lockstep.collectors.training.records import STEP_TIME, Record

# A rank's unfinished step is counted after this long without a record from the rank
# (its step's records normally end with the start of the next step, see module doc).
PENDING_STEP_FLUSH_SECONDS = 30.0


@dataclass
class _Step:
    key: str
    values: dict[str, float] = field(default_factory=dict)
    ts: float = 0.0


@dataclass
class RankState:
    """One rank's counters, its step being assembled, and the metric set of its last step."""

    steps: int = 0
    step_seconds: float = 0.0
    compute_seconds: float = 0.0
    comm_wait_seconds: float = 0.0
    data_wait_seconds: float = 0.0
    tokens: float | None = None  # None until the rank reports any
    samples: float | None = None
    last_step_ts: float | None = None
    pending: _Step | None = None
    schema: frozenset[str] = frozenset()
    last_record_at: float = 0.0  # agent's monotonic clock
    log: tuple[str, int] | None = None  # (basename, inode) of the file its records come from
    # Processes on this node holding that file open for writing, counted once the rank has
    # been idle for WRITER_CHECK_AFTER (None: not counted, or not known: see writers.py).
    writers: int | None = None
    # When a process last closed that file after writing to it (the agent's monotonic clock):
    # an inotify event, seen by an agent that cannot look at other users' processes too ...
    closed_at: float | None = None
    # ... which says the rank's process ended only if that process holds its log open across
    # its writes (lockstep.emitter's StepLog does): records came at a later time with no close
    # between them.  A writer that opens the log for each write closes it every time.
    held_open: bool = False

    def add(self, record: Record, now: float) -> None:
        if now > self.last_record_at > 0:  # a later read than the last record's: was it closed between?
            self.held_open = self.closed_at is None or self.closed_at < self.last_record_at
        self.last_record_at = now
        pending = self.pending
        if pending is not None and (pending.key != record.step_key or record.metric in pending.values):
            self.finish_step()
            pending = None
        if pending is None:
            pending = self.pending = _Step(record.step_key)
        pending.values[record.metric] = record.value
        pending.ts = max(pending.ts, record.ts)
        if self.schema and self.schema.issubset(pending.values):
            self.finish_step()

    def finish_step(self) -> None:
        step, self.pending = self.pending, None
        if step is None:
            return
        v = step.values
        wall = v.get(STEP_TIME)
        data = v.get("data_time_sec")
        comm = v.get("comm_wait_time_sec", v.get("allreduce_time_sec"))
        if comm is None and wall is not None and "allreduce_time_pct" in v:
            comm = v["allreduce_time_pct"] / 100.0 * wall
        compute = v.get("compute_time_sec")
        if compute is None and wall is not None:
            compute = max(0.0, wall - (comm or 0.0) - (data or 0.0))
        tokens = v.get("tokens")
        if tokens is None and wall is not None and "tokens_per_sec" in v:
            tokens = v["tokens_per_sec"] * wall
        samples = v.get("samples")
        rate = v.get("throughput_examples_per_sec", v.get("samples_per_sec"))
        if samples is None and wall is not None and rate is not None:
            samples = rate * wall
        if wall is not None:
            self.steps += 1
            self.step_seconds += wall
            self.last_step_ts = max(self.last_step_ts or 0.0, step.ts)
            self.schema = frozenset(v)
        self.compute_seconds += compute or 0.0
        self.comm_wait_seconds += comm or 0.0
        self.data_wait_seconds += data or 0.0
        if tokens is not None:
            self.tokens = (self.tokens or 0.0) + tokens
        if samples is not None:
            self.samples = (self.samples or 0.0) + samples
