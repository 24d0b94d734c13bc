"""The collector framework: failures, stuck runs, nothing-here, staleness, replacement."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator

import pytest

from lockstep.agent.collector import Collector, MetricSpec, NothingHere
from lockstep.agent.exporter import SnapshotExporter
from lockstep.agent.families import Metric
from lockstep.agent.scheduler import Scheduler, State, Worker
from tests.support import context, samples, wait_until

TOY = MetricSpec("lockstep_toy_value", "gauge", "A toy value.")


class Toy(Collector):
    """Behaves as told: return a value, raise, find nothing, or block until released."""

    name = "toy"
    metrics = (TOY,)

    def __init__(self, ctx, behaviour: str = "ok") -> None:  # type: ignore[no-untyped-def]
        super().__init__(ctx)
        self.behaviour = behaviour
        self.calls = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.release = threading.Event()
        self._lock = threading.Lock()

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            self.calls += 1
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.behaviour == "raise":
                raise RuntimeError("sensor on fire")
            if self.behaviour == "nothing":
                raise NothingHere("no toys on this machine")
            if self.behaviour == "block":
                self.release.wait(30)
            family = TOY.family()
            family.add_metric([], self.calls)
            return iter([family])
        finally:
            with self._lock:
                self.in_flight -= 1


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def worker(collector: Collector, interval: float = 0.05, deadline: float = 1.0, **kw) -> Worker:  # type: ignore[no-untyped-def]
    return Worker(collector, interval, deadline, staleness_intervals=3, log=logging.getLogger("test"), **kw)


def scrape(*workers: Worker) -> dict:
    body, _ = SnapshotExporter(lambda: [w.view() for w in workers]).render()
    return samples(body.decode())


def test_ok_run_publishes_snapshot_and_self_metrics() -> None:
    w = worker(Toy(context()))
    w.start()
    w.first_run_done.wait(5)
    w.stop()
    s = scrape(w)
    assert s[("lockstep_toy_value", frozenset())] >= 1
    assert s[("lockstep_collector_up", frozenset({("collector", "toy")}))] == 1
    assert s[("lockstep_collector_state", frozenset({("collector", "toy"), ("state", "ok")}))] == 1
    assert s[("lockstep_collector_errors_total", frozenset({("collector", "toy")}))] == 0
    assert ("lockstep_collector_last_success_timestamp_seconds", frozenset({("collector", "toy")})) in s


def test_raising_collector_is_down_and_counted_while_others_serve() -> None:
    bad, good = worker(Toy(context(), "raise")), worker(Toy(context()))
    bad.collector.name = "bad"  # type: ignore[misc]
    bad.name = "bad"
    for w in (bad, good):
        w.start()
        w.first_run_done.wait(5)
    wait_until(lambda: bad.view().errors_total >= 2, what="two failed runs")
    bad.stop()
    good.stop()
    view = bad.view()
    assert view.state == State.FAILED
    assert view.reason == "RuntimeError: sensor on fire"
    s = scrape(bad, good)
    assert s[("lockstep_collector_up", frozenset({("collector", "bad")}))] == 0
    assert s[("lockstep_collector_up", frozenset({("collector", "toy")}))] == 1
    assert s[("lockstep_collector_errors_total", frozenset({("collector", "bad")}))] == view.errors_total
    assert ("lockstep_collector_last_success_timestamp_seconds", frozenset({("collector", "bad")})) not in s
    assert s[("lockstep_toy_value", frozenset())] >= 1  # the good one still serves


def test_nothing_here_is_quiet_not_a_failure() -> None:
    w = worker(Toy(context(), "nothing"))
    w.start()
    w.first_run_done.wait(5)
    w.stop()
    view = w.view()
    assert (view.state, view.reason, view.errors_total) == (State.NOTHING_HERE, "no toys on this machine", 0)
    s = scrape(w)
    assert s[("lockstep_collector_up", frozenset({("collector", "toy")}))] == 1
    assert s[("lockstep_collector_state", frozenset({("collector", "toy"), ("state", "nothing_here")}))] == 1
    assert ("lockstep_toy_value", frozenset()) not in s


def test_blocked_collector_is_stuck_scrape_answers_and_no_second_call_piles_up() -> None:
    toy = Toy(context(), "block")
    w = worker(toy, interval=0.01, deadline=0.2)
    w.start()
    wait_until(lambda: w.view().state == State.STUCK, timeout=5, what="the stuck state")
    started = time.monotonic()
    s = scrape(w)
    assert time.monotonic() - started < 1.0  # answered while the collector is blocked
    assert s[("lockstep_collector_up", frozenset({("collector", "toy")}))] == 0
    assert s[("lockstep_collector_state", frozenset({("collector", "toy"), ("state", "stuck")}))] == 1
    assert s[("lockstep_collector_duration_seconds", frozenset({("collector", "toy")}))] > 0.2
    time.sleep(0.3)  # many intervals: a naive scheduler would start more calls now
    assert (toy.calls, toy.max_in_flight) == (1, 1)
    # A reload replaces the worker: the new one waits for the stuck call to return.
    w.stop()
    successor = worker(toy, interval=0.01, deadline=0.2, predecessor=w)
    successor.start()
    time.sleep(0.3)
    assert toy.calls == 1
    toy.behaviour = "ok"
    toy.release.set()
    wait_until(lambda: successor.view().state == State.OK, timeout=5, what="recovery after the stuck call returned")
    successor.stop()
    assert toy.max_in_flight == 1
    # The overrunning run itself was counted as an error and its result discarded.
    assert w.view().errors_total == 1
    assert w.view().reason.startswith("run took ")


def test_snapshot_older_than_staleness_window_is_not_served() -> None:
    clock = FakeClock()
    toy = Toy(context())
    w = worker(toy, interval=10, deadline=5, clock=clock)
    w._run_once(clock())  # one run, driven by hand on the fake clock
    assert scrape(w)[("lockstep_toy_value", frozenset())] == 1
    toy.behaviour = "raise"
    clock.now += 10
    w._run_once(clock())  # failed: the previous snapshot stays while fresh
    assert scrape(w)[("lockstep_toy_value", frozenset())] == 1
    clock.now += 20.5  # 30.5 s after the snapshot: past 3 intervals of 10 s
    s = scrape(w)
    assert ("lockstep_toy_value", frozenset()) not in s
    assert s[("lockstep_collector_up", frozenset({("collector", "toy")}))] == 0


def test_nothing_here_after_data_drops_old_data_at_once() -> None:
    clock = FakeClock()
    toy = Toy(context())
    w = worker(toy, interval=10, deadline=5, clock=clock)
    w._run_once(clock())
    toy.behaviour = "nothing"  # e.g. the device was unplugged
    clock.now += 10
    w._run_once(clock())
    assert ("lockstep_toy_value", frozenset()) not in scrape(w)


def test_wake_runs_at_once_instead_of_waiting_for_the_interval() -> None:
    toy = Toy(context())
    w = worker(toy, interval=3600)
    w.start()
    w.first_run_done.wait(5)
    assert toy.calls == 1
    w.wake()
    wait_until(lambda: toy.calls == 2, timeout=5, what="a second run after wake()")
    w.stop()


class Named(Toy):
    """A toy that notes which thread ran each of its rounds."""

    def __init__(self, ctx, name: str, behaviour: str = "ok") -> None:  # type: ignore[no-untyped-def]
        super().__init__(ctx, behaviour)
        self.name = name
        self.threads: list[str] = []

    def collect(self) -> Iterator[Metric]:
        self.threads.append(threading.current_thread().name)
        return super().collect()


def scheduler_threads(name: str) -> list[str]:
    return sorted(t.name for t in threading.enumerate() if t.name.startswith(name))


def test_the_collectors_of_a_scheduler_run_on_one_runner_thread_one_after_another() -> None:
    scheduler = Scheduler("t-shared")
    toys = [Named(context(), f"toy{i}") for i in range(3)]
    workers = [worker(toy, interval=0.05, scheduler=scheduler) for toy in toys]
    for w in workers:
        assert w.start()
    try:
        wait_until(lambda: all(toy.calls >= 3 for toy in toys), what="three rounds of each")
        assert {name for toy in toys for name in toy.threads} == {"t-shared-runner"}
        assert scheduler_threads("t-shared") == ["t-shared", "t-shared-runner"]
        assert max(toy.max_in_flight for toy in toys) == 1
    finally:
        for w in workers:
            w.stop()
        assert all(w.join(5) for w in workers)
    # Nothing left to schedule: its threads end.
    wait_until(lambda: scheduler_threads("t-shared") == [], timeout=5, what="the scheduler's threads to end")


def test_a_stuck_collector_keeps_its_runner_to_itself_and_the_others_go_on() -> None:
    scheduler = Scheduler("t-handoff", handoff=0.1)
    stuck, other = Named(context(), "stuck", "block"), Named(context(), "other")
    workers = [
        worker(stuck, interval=0.05, deadline=0.2, scheduler=scheduler),
        worker(other, interval=0.05, scheduler=scheduler),
    ]
    for w in workers:
        w.start()
    try:
        wait_until(lambda: workers[0].view().state == State.STUCK, what="the stuck state")
        calls = other.calls
        wait_until(lambda: other.calls >= calls + 5, what="the other collector's rounds going on")
        # The stuck round's runner, the new runner, the scheduler: one thread more, not one per round.
        assert scheduler_threads("t-handoff") == ["t-handoff", "t-handoff-runner", "t-handoff-runner"]
        assert (stuck.calls, stuck.max_in_flight) == (1, 1)
        stuck.behaviour = "ok"
        stuck.release.set()
        wait_until(lambda: workers[0].view().state == State.OK, what="the stuck collector's next round")
        wait_until(
            lambda: scheduler_threads("t-handoff") == ["t-handoff", "t-handoff-runner"], what="the old runner to end"
        )
    finally:
        stuck.release.set()
        for w in workers:
            w.stop()
        assert all(w.join(5) for w in workers)


def test_a_failure_of_the_scheduler_itself_is_logged_and_the_rounds_go_on(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every collector's rounds depend on the scheduler's thread: a bug in it must not end it."""
    scheduler = Scheduler("t-bug")
    toy = Named(context(), "toy")
    w = worker(toy, interval=0.05, scheduler=scheduler)
    real = Worker._waiting_for
    failed: list[float] = []

    def fails_once(self: Worker, now: float) -> float | None:
        if not failed:
            failed.append(now)
            raise RuntimeError("a bug")
        return real(self, now)

    monkeypatch.setattr(Worker, "_waiting_for", fails_once)
    with caplog.at_level(logging.ERROR, logger="lockstep.agent"):
        w.start()
        wait_until(lambda: toy.calls >= 2, what="rounds after the failed look")
    w.stop()
    assert w.join(5)
    logged = [r.getMessage() for r in caplog.records if r.name == "lockstep.agent"]
    assert logged == ["the collectors' scheduler failed; looking again in a second"]
