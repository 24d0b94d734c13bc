"""Runs the collectors' rounds on a shared scheduler and keeps each one's latest snapshot.

Collectors never run on the scrape path.  A worker calls its collector's ``collect()``
every interval, on the scheduler's runner thread (see Scheduler); a finished run publishes an
immutable ``Snapshot``.  A scrape reads ``Worker.view()``, which never blocks on the collector:
it takes one reference under a short lock.

A run past its deadline is reported stuck.  The thread cannot be killed (it is blocked in
the kernel or a driver), so the worker simply does not start another run until that call
returns; a replacement worker created by a config reload waits for it too.  Snapshots
older than ``staleness_intervals`` intervals are not served.
"""

from __future__ import annotations

import collections
import enum
import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from lockstep.agent.collector import Collector, NothingHere, describe_error, shared_reads
from lockstep.agent.families import Metric
from lockstep.agent.memory import release_freed_memory
from lockstep.agent.samples import Rejection, checked_families

log = logging.getLogger("lockstep.agent")


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
    """One collector's rounds and published state.  Its rounds run on a Scheduler's threads
    (the agent's, shared by every collector; without one, a scheduler of its own)."""

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
        scheduler: Scheduler | None = None,
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
        self._scheduler = scheduler if scheduler is not None else Scheduler(f"collector-{self.name}", clock=clock)
        self._stop = threading.Event()
        self._woken = False  # wake(): run at once instead of at next_due
        self._scheduled_at: float | None = None  # when start() joined the scheduler
        self._next_due = 0.0
        self._in_flight = False  # a round queued or running (never two at once)
        self._finished = threading.Event()  # stopped, its last round returned, collector closed
        self.first_run_done = threading.Event()
        self._lock = threading.Lock()
        self._result = _Result()
        self._running_since: float | None = None
        self._rejected_series: frozenset[str] = frozenset()  # what the last round left out, to log changes

    def start(self) -> bool:
        """Join the scheduler; False when its threads cannot be created now (start again later).

        Thread creation fails when the process is at its task limit (a pids cgroup such as the
        unit's TasksMax, RLIMIT_NPROC, memory): the worker then reports FAILED with the reason,
        and nothing else changes, so a later start() picks up exactly where this one failed.
        """
        if self._scheduled_at is not None:
            return True
        try:
            self._scheduler.add(self)
        except RuntimeError as exc:  # "can't start new thread"
            reason = f"cannot start the collectors' thread ({exc}); retrying"
            with self._lock:
                if self._result.reason != reason:
                    self.log.error("collector not started: %s", reason)
                self._result = replace(self._result, state=State.FAILED, reason=reason)
            return False
        return True

    @property
    def started(self) -> bool:
        return self._scheduled_at is not None

    def stop(self) -> None:
        """Ask the worker to stop after its current run; does not wait."""
        self._stop.set()
        self._scheduler.wake()

    def wake(self) -> None:
        """Run as soon as possible (e.g. after a hotplug event) instead of at the next interval.

        A run in progress is not interrupted, and a stuck one is not doubled: the wake-up
        takes effect once the current run has returned."""
        self._woken = True
        self._scheduler.wake()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the worker to end (its last run returned); True if it has (or never started)."""
        if self._scheduled_at is None:
            return True
        return self._finished.wait(timeout)

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    # --- what the scheduler asks -------------------------------------------------------------

    def _waiting_for(self, now: float) -> float | None:
        """None when a round may start now; else how long until it may (inf: until something
        else changes, e.g. a stuck predecessor returns or another worker's first round ends)."""
        if self._in_flight:
            return math.inf
        if self._predecessor is not None:
            # Never run two calls into the same collector: wait out a stuck predecessor.
            if not self._predecessor._finished.is_set():
                return 1.0  # looked at again every second (it may be another scheduler's)
            self._predecessor = None
        if not self.first_run_done.is_set():
            # Bounded: a stuck or slow producer delays this collector by its deadline at most.
            assert self._scheduled_at is not None
            waits = [
                self._scheduled_at + other.deadline - now for other in self._after if not other.first_run_done.is_set()
            ]
            if any(wait > 0 for wait in waits):
                return max(waits)
        if self._woken:
            return None
        wait = self._next_due - now
        return None if wait <= 0 else wait

    def _round(self) -> None:
        """One round, on a runner thread; then the next is due on the grid (at once if it overran)."""
        started = self._clock()
        self._woken = False
        first = not self.first_run_done.is_set()
        try:
            self._run_once(started)
        finally:
            self.first_run_done.set()
            # Runs start on a fixed grid; a run that overran starts the next one at once.
            self._next_due = max(self._next_due + self.interval, self._clock())
            self._in_flight = False
            if first:  # collectors that need this one's first round may start theirs
                self._scheduler.wake()

    def _close(self) -> None:
        try:
            self.collector.close()
        except Exception:
            self.log.exception("collector close failed")
        finally:
            self._in_flight = False
            self._finished.set()

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


# A round still running this long keeps its runner thread to itself, and the rounds due after it
# go to a new runner: a slow collector (an NFS statfs, a scontrol that waits on the controller)
# delays the others by at most this much, and a stuck one not at all after it.
HANDOFF_SECONDS = 1.0


class _Runner:
    """A thread that runs rounds one after another, in the order they became due."""

    def __init__(self, scheduler: Scheduler, name: str) -> None:
        self._scheduler = scheduler
        self._queue: collections.deque[Callable[[], None]] = collections.deque()
        self._ready = threading.Condition()
        self.running_since: float | None = None  # of the round in progress
        self.retired = False  # handed off: ends once its round in progress returns
        self.thread = threading.Thread(target=self._loop, name=name, daemon=True)

    def submit(self, job: Callable[[], None]) -> None:
        with self._ready:
            self._queue.append(job)
            self._ready.notify()

    @property
    def idle(self) -> bool:
        with self._ready:
            return not self._queue and self.running_since is None

    def retire(self) -> list[Callable[[], None]]:
        """Take back the jobs not started yet; the thread ends after its job in progress."""
        with self._ready:
            self.retired = True
            jobs = list(self._queue)
            self._queue.clear()
            self._ready.notify()
        return jobs

    def _loop(self) -> None:
        while True:
            with self._ready:
                while not self._queue and not self.retired:
                    self._ready.wait()
                if self.retired:
                    return
            # The rounds due together are one batch: what they read of the node in common (the
            # process table) is read once (agent/collector.py shared_read).
            with shared_reads():
                self._run_due()
            # What the rounds freed goes back to the kernel before the agent sleeps.
            release_freed_memory()

    def _run_due(self) -> None:
        """Run the queued rounds until none is left (or the runner is retired)."""
        while True:
            with self._ready:
                if not self._queue or self.retired:
                    return
                job = self._queue.popleft()
                self.running_since = self._scheduler.clock()
            try:
                job()
            except Exception:  # a worker's round catches its collector's errors: this is a bug
                log.exception("a collector round failed outside its collector")
            finally:
                with self._ready:
                    self.running_since = None
                    done = not self._queue
                if done:  # the rounds due are done: the scheduler looks at what is due next
                    self._scheduler.wake()


class Scheduler:
    """Runs the rounds of many workers on few threads.

    One thread waits for the next round due, whichever worker's (one wake-up per round, not one
    per collector), and hands it to a runner thread, which runs the due rounds one after another:
    collectors that ran each on its own thread woke together and took the interpreter lock from
    each other, dozens of context switches a round.  A round that takes longer than
    HANDOFF_SECONDS keeps its runner (it may be blocked in the kernel for good: a thread cannot be
    killed); the rounds queued behind it and those due next go to a new runner, and the old one
    ends when its round returns.  So a stuck collector costs one thread, as before, and the
    agent at rest runs two."""

    def __init__(
        self, name: str = "collectors", clock: Callable[[], float] = time.monotonic, handoff: float = HANDOFF_SECONDS
    ) -> None:
        self.name = name
        self.clock = clock
        self.handoff = handoff
        self._lock = threading.Lock()
        self._changed = threading.Event()
        self._workers: list[Worker] = []
        self._thread: threading.Thread | None = None
        self._runner: _Runner | None = None

    def add(self, worker: Worker) -> None:
        """Schedule the worker's rounds from now; raises RuntimeError when the scheduler's threads
        cannot be created (the process at its task limit): nothing changes then."""
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
                thread.start()  # raises RuntimeError: can't start new thread
                self._thread = thread
            if self._runner is None:
                runner = _Runner(self, f"{self.name}-runner")
                runner.thread.start()
                self._runner = runner
            now = self.clock()
            worker._scheduled_at = worker._next_due = now
            self._workers.append(worker)
        self.wake()

    def wake(self) -> None:
        """Look at the workers again now (one was woken, stopped, or finished a round)."""
        self._changed.set()

    def _loop(self) -> None:
        while True:
            self._changed.clear()
            try:
                with self._lock:
                    if self._look():
                        return
                    timeout = self._dispatch(self.clock())
            except Exception:  # a bug: every collector's rounds depend on this thread, so it goes on
                log.exception("the collectors' scheduler failed; looking again in a second")
                timeout = 1.0
            self._changed.wait(timeout)

    def _look(self) -> bool:
        """Close the workers stopped and idle; True when nothing is left to schedule (the threads
        end then, and a later add() starts them again)."""
        for worker in [w for w in self._workers if w.stopped and not w._in_flight]:
            self._workers.remove(worker)
            worker._in_flight = True
            self._submit(worker._close)
        if not self._workers and self._runner is not None and self._runner.idle:
            self._runner.retire()
            self._runner = None
            self._thread = None
            return True
        return False

    def _dispatch(self, now: float) -> float | None:
        """Submit every round due; hand off from a runner whose round overran.  Returns how long
        to wait until something is due (None: until woken)."""
        waits = []
        for worker in self._workers:
            wait = worker._waiting_for(now)
            if wait is None:
                worker._in_flight = True
                self._submit(worker._round)
            elif wait != math.inf:
                waits.append(wait)
        runner = self._runner
        if runner is not None and not runner.idle:
            # Look again when its round in progress (or the one it is about to start) overruns.
            since = runner.running_since
            overran = -self.handoff if since is None else now - since - self.handoff
            if overran >= 0:
                self._hand_off(runner)
            else:
                waits.append(-overran)
        return min(waits) if waits else None

    def _submit(self, job: Callable[[], None]) -> None:
        assert self._runner is not None
        self._runner.submit(job)

    def _hand_off(self, runner: _Runner) -> None:
        """Give the runner's queued rounds to a new runner; keep them where they are if no
        thread can be created now (they wait for the slow round, and the next look tries again)."""
        successor = _Runner(self, f"{self.name}-runner")
        try:
            successor.thread.start()
        except RuntimeError:
            return
        for job in runner.retire():
            successor.submit(job)
        self._runner = successor
