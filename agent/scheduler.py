"""Runs each collector in its own worker thread and keeps its latest snapshot.

Collectors never run on the scrape path.  A worker calls its collector's ``collect()``
every interval; a finished run publishes an immutable ``Snapshot``.  A scrape reads
``Worker.view()``, which never blocks on the collector: it takes one reference under a
short lock.

A run past its deadline is reported stuck.  The thread cannot be killed (it is blocked in
the kernel or a driver), so the worker simply does not start another run until that call
returns; a replacement worker created by a config reload waits for it too.  Snapshots
older than ``staleness_intervals`` intervals are not served.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from prometheus_client.core import Metric

from lockstep.agent.collector import Collector, NothingHere, describe_error
from lockstep.agent.samples import Rejection, checked_families


class State(enum.Enum):
    NEVER_RAN = "never_ran"
    OK = "ok"
    NOTHING_HERE = "nothing_here"  # ran fine, this machine has nothing to collect
    FAILED = "failed"
    STUCK = "stuck"  # a run is in progress past its deadline


HEALTHY_STATES = (State.OK, State.NOTHING_HERE)


@dataclass(frozen=True)
class Snapshot:
    """The metric families of one finished run, and when it finished (monotonic clock).

    ``rendered`` caches the snapshot's exposition text per format (filled by the exporter):
    a snapshot never changes, so it is rendered once, not on every scrape.  Its keys are the
    names of the exporter's SUPPORTED_FORMATS, so it holds at most that many renderings."""

    families: tuple[Metric, ...]
    finished_at: float
    rendered: dict[str, bytes] = field(default_factory=dict, compare=False, repr=False)
    # Per format, why the snapshot could not be rendered (the exporter leaves it out then).
    render_errors: dict[str, str] = field(default_factory=dict, compare=False, repr=False)


@dataclass(frozen=True)
class WorkerView:
    """What a scrape needs to know about one collector, at one instant."""

    name: str
    state: State
    reason: str  # why it failed, is stuck, or has nothing here; "" when OK
    duration_seconds: float | None  # of the last run, or the time the stuck run has taken so far
    last_success_wall_time: float | None
    errors_total: int
    runs_total: int
    cpu_seconds_total: float
    snapshot: Snapshot | None  # None when there is none or it is stale
    rejected_samples_total: int = 0
    altered_label_values_total: int = 0  # samples served with a label value made safe (agent/samples.py)


@dataclass(frozen=True)
class _Result:
    """The published state of a worker: replaced as a whole, never mutated."""

    state: State = State.NEVER_RAN
    reason: str = ""
    duration_seconds: float | None = None
    last_success_wall_time: float | None = None
    errors_total: int = 0
    runs_total: int = 0
    cpu_seconds_total: float = 0.0
    snapshot: Snapshot | None = None
    rejected_samples_total: int = 0
    altered_label_values_total: int = 0


class Worker:
    def __init__(
        self,
        collector: Collector,
        interval: float,
        deadline: float,
        staleness_intervals: int,
        log: logging.Logger,
        predecessor: Worker | None = None,
        after: Sequence[Worker] = (),
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.collector = collector
        self.name = collector.name
        self.interval = interval
        self.deadline = deadline
        self.staleness_intervals = staleness_intervals
        self.log = log
        self._predecessor = predecessor
        self._after = tuple(after)  # workers whose first run this one's first run waits for
        self._clock = clock
        self._wall_clock = wall_clock
        self._stop = threading.Event()
        self._wake = threading.Event()  # set by stop() and wake(): ends the wait for the next run
        self.first_run_done = threading.Event()
        self._lock = threading.Lock()
        self._result = _Result()
        self._running_since: float | None = None
        self._rejected_series: frozenset[str] = frozenset()  # what the last round left out, to log changes
        self._thread: threading.Thread | None = None

    def start(self) -> bool:
        """Start the worker's thread; False when none can be created now (start again later).

        Thread creation fails when the process is at its task limit (a pids cgroup such as the
        unit's TasksMax, RLIMIT_NPROC, memory): the worker then reports FAILED with the reason,
        and nothing else changes, so a later start() picks up exactly where this one failed.
        """
        if self._thread is not None:
            return True
        thread = threading.Thread(target=self._loop, name=f"collector-{self.name}", daemon=True)
        try:
            thread.start()
        except RuntimeError as exc:  # "can't start new thread"
            reason = f"cannot start the collector's thread ({exc}); retrying"
            with self._lock:
                if self._result.reason != reason:
                    self.log.error("collector not started: %s", reason)
                self._result = replace(self._result, state=State.FAILED, reason=reason)
            return False
        self._thread = thread
        return True

    @property
    def started(self) -> bool:
        return self._thread is not None

    def stop(self) -> None:
        """Ask the worker to stop after its current run; does not wait."""
        self._stop.set()
        self._wake.set()

    def wake(self) -> None:
        """Run as soon as possible (e.g. after a hotplug event) instead of at the next interval.

        A run in progress is not interrupted, and a stuck one is not doubled: the wake-up
        takes effect once the current run has returned."""
        self._wake.set()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the worker thread to end; True if it has (or never started)."""
        if self._thread is None:
            return True
        self._thread.join(timeout)
        return not self._thread.is_alive()

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def _loop(self) -> None:
        if self._predecessor is not None:
            # Never run two calls into the same collector: wait out a stuck predecessor.
            while not self._predecessor.join(timeout=1.0):
                if self._stop.is_set():
                    return
            self._predecessor = None
        for other in self._after:
            # Bounded: a stuck or slow producer delays this collector by its deadline at most.
            other.first_run_done.wait(other.deadline)
        next_due = self._clock()
        while True:
            self._wake.wait(max(0.0, next_due - self._clock()))
            self._wake.clear()
            if self._stop.is_set():
                break
            started = self._clock()
            self._run_once(started)
            self.first_run_done.set()
            # Runs start on a fixed grid; a run that overran starts the next one at once.
            next_due = max(started + self.interval, self._clock())
        try:
            self.collector.close()
        except Exception:
            self.log.exception("collector close failed")

    def _run_once(self, started: float) -> None:
        with self._lock:
            self._running_since = started
        cpu_started = time.thread_time()
        outcome: State
        families: tuple[Metric, ...] = ()
        rejections: list[Rejection] = []
        try:
            families, rejections = checked_families(self.collector.collect())
            outcome, reason = State.OK, ""
        except NothingHere as exc:
            outcome, reason = State.NOTHING_HERE, str(exc)
        except Exception as exc:  # one failing collector never breaks the daemon
            outcome, reason = State.FAILED, describe_error(exc)
            self.log.debug("collection failed", exc_info=True)
        finished = self._clock()
        duration = finished - started
        if outcome in HEALTHY_STATES and duration > self.deadline:
            # Data gathered across a long stall is not one consistent picture: drop it.
            outcome = State.FAILED
            reason = f"run took {duration:.1f}s, past its {self.deadline:g}s deadline; result discarded"
        cpu = time.thread_time() - cpu_started
        with self._lock:
            previous = self._result
            healthy = outcome in HEALTHY_STATES
            self._result = _Result(
                state=outcome,
                reason=reason,
                duration_seconds=duration,
                last_success_wall_time=self._wall_clock() if healthy else previous.last_success_wall_time,
                errors_total=previous.errors_total + (0 if healthy else 1),
                runs_total=previous.runs_total + 1,
                cpu_seconds_total=previous.cpu_seconds_total + cpu,
                rejected_samples_total=previous.rejected_samples_total + sum(r.left_out for r in rejections),
                altered_label_values_total=previous.altered_label_values_total
                + sum(not r.left_out for r in rejections),
                # A failed run keeps the previous snapshot, which ages out on its own.
                snapshot=Snapshot(families, finished) if healthy else previous.snapshot,
            )
            self._running_since = None
        if outcome != previous.state or (outcome == State.FAILED and reason != previous.reason):
            self._log_transition(outcome, reason)
        rejected = frozenset(r.series for r in rejections)
        if rejected != self._rejected_series and outcome in HEALTHY_STATES:
            # Once per change, not per round: the same bad file would otherwise log every interval.
            self._rejected_series = rejected
            for left_out, what in (
                (True, "left out %d samples outside their domain"),
                (False, "made safe %d label values"),
            ):
                some = [r for r in rejections if r.left_out == left_out]
                if some:
                    shown = "; ".join(str(r) for r in some[:3])
                    more = f" (and {len(some) - 3} more)" if len(some) > 3 else ""
                    self.log.warning(what + ": %s%s", len(some), shown, more)

    def _log_transition(self, state: State, reason: str) -> None:
        if state == State.FAILED:
            self.log.error("collector failed: %s", reason, extra={"state": state.value})
        elif state == State.NOTHING_HERE:
            self.log.info("nothing to collect on this machine: %s", reason, extra={"state": state.value})
        else:
            self.log.info("collector ok", extra={"state": state.value})

    def view(self) -> WorkerView:
        now = self._clock()
        with self._lock:
            result = self._result
            running_since = self._running_since
        state, reason, duration = result.state, result.reason, result.duration_seconds
        if running_since is not None and now - running_since > self.deadline:
            state = State.STUCK
            duration = now - running_since
            reason = f"a run has been in progress for {duration:.1f}s, past its {self.deadline:g}s deadline"
        snapshot = result.snapshot
        if snapshot is not None and now - snapshot.finished_at > self.staleness_intervals * self.interval:
            snapshot = None
        return WorkerView(
            name=self.name,
            state=state,
            reason=reason,
            duration_seconds=duration,
            last_success_wall_time=result.last_success_wall_time,
            errors_total=result.errors_total,
            runs_total=result.runs_total,
            cpu_seconds_total=result.cpu_seconds_total,
            snapshot=snapshot,
            rejected_samples_total=result.rejected_samples_total,
            altered_label_values_total=result.altered_label_values_total,
        )
