"""statfs on short-lived daemon threads with a per-call deadline: a hung mount never hangs the agent."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from lockstep.agent.collector import describe_error
from lockstep.agent.seams import Seam

# The simulated node replaces statvfs (real disks' figures are not deterministic) and the timer
# that measures a call; the collector uses os.statvfs and time.perf_counter otherwise.
STATVFS = Seam[Callable[[str], os.statvfs_result]]("statvfs", "statvfs(mountpoint)")
STAT_TIMER = Seam[Callable[[], float]]("stat_timer", "the monotonic timer that times a statfs")


@dataclass
class StatOutcome:
    responsive: bool
    result: os.statvfs_result | None = None
    error: str = ""
    seconds: float | None = None  # how long the call took (None while it hangs)


class _Call:
    """One statfs call on its own daemon thread."""

    def __init__(self, key: str, path: str, started: float) -> None:
        self.key = key
        self.path = path
        self.started = started
        self.returned = False
        self.result: os.statvfs_result | None = None
        self.error: OSError | None = None
        self.seconds = 0.0


class StatPool:
    """Runs ``statvfs`` on daemon threads with a per-call deadline.

    - at most ``workers`` calls run at once, not counting calls past their deadline
      (those threads are stuck in the kernel and stay so until the call returns);
    - at most one call per key (mount) exists at any time: a mount whose call has not
      returned gets no second one, so one stuck mount holds at most one thread;
    - a call that returns after its deadline frees its key; the next round calls again;
    - a thread that cannot be created (the process at its task limit) fails the round and
      registers nothing, so the next round, once threads can be created, is correct.

    Daemon threads, not a concurrent.futures pool: that one joins its threads at
    interpreter exit, and a thread stuck on a dead NFS server would hang the agent's exit.
    """

    def __init__(
        self,
        workers: int,
        timeout: float,
        statvfs: Callable[[str], os.statvfs_result] = os.statvfs,
        timer: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.workers = workers
        self.timeout = timeout
        self._statvfs = statvfs
        self._timer = timer  # times the call itself (the simulated node makes it deterministic)
        self._cond = threading.Condition()
        self._calls: dict[str, _Call] = {}  # key -> call that has not returned yet

    def in_flight(self) -> int:
        with self._cond:
            return len(self._calls)

    def stat_all(self, paths: Mapping[str, str]) -> dict[str, StatOutcome]:
        """statvfs every path (by key); returns once each has answered or passed its deadline."""
        outcomes: dict[str, StatOutcome] = {}
        mine: list[_Call] = []
        cannot_start: RuntimeError | None = None
        with self._cond:
            # A mount whose earlier call is still stuck: no second call, reported unresponsive.
            queue = [key for key in paths if key not in self._calls]
            while True:
                # Deadlines on the real clock, never the seam MONOTONIC_CLOCK: the pool waits for
                # them in real time (Condition.wait), and the simulated node's clock stands still
                # within a round, so a hung mount's deadline would never come.
                now = time.monotonic()
                running = [c for c in self._calls.values() if now - c.started < self.timeout]
                while queue and len(running) < self.workers and cannot_start is None:
                    key = queue[0]
                    call = _Call(key, paths[key], now)
                    thread = threading.Thread(target=self._run, args=(call,), name=f"statfs {paths[key]}", daemon=True)
                    try:
                        thread.start()
                    except RuntimeError as exc:  # no thread can be created now (task limit)
                        cannot_start = exc
                        break
                    # Registered only once its thread runs (a thread that never started must not
                    # hold the mount's key); _run needs the condition held here to deregister.
                    queue.pop(0)
                    self._calls[key] = call
                    mine.append(call)
                    running.append(call)
                waiting = [c for c in mine if not c.returned and now - c.started < self.timeout]
                if not waiting and (not queue or cannot_start is not None):
                    break
                # Wake when a call returns, or when the earliest running call reaches its deadline.
                next_deadline = min(c.started + self.timeout for c in running) if running else now + self.timeout
                self._cond.wait(max(0.001, next_deadline - now))
            for key in paths:
                stuck = self._calls.get(key)
                if stuck is not None and not stuck.returned:
                    outcomes[key] = StatOutcome(responsive=False)
            for done in mine:
                if done.returned:
                    if done.error is not None:
                        outcomes[done.key] = StatOutcome(True, error=describe_error(done.error), seconds=done.seconds)
                    else:
                        outcomes[done.key] = StatOutcome(True, result=done.result, seconds=done.seconds)
        if cannot_start is not None:
            # The mounts left unchecked are not known to hang: fail the round (the collector
            # reports why) rather than mark them unresponsive; nothing is left registered.
            raise RuntimeError(f"cannot start a statfs thread ({cannot_start})") from cannot_start
        return outcomes

    def _run(self, call: _Call) -> None:
        started = self._timer()
        try:
            call.result = self._statvfs(call.path)
        except OSError as exc:
            call.error = exc
        except Exception as exc:  # a broken fake or a bad path: an error for this mount, never a dead pool
            call.error = OSError(0, f"{type(exc).__name__}: {exc}", call.path)
        call.seconds = self._timer() - started
        with self._cond:
            call.returned = True
            if self._calls.get(call.key) is call:
                del self._calls[call.key]
            self._cond.notify_all()
