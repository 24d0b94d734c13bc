"""collectors/toolkit/followed_logs.py: a collector's followed logs from its first round to its
close (the lock, the follower, the sweep, the watch, the close order), and the options the
collectors following logs declare alike; on real files and real inotify watches."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pytest

from lockstep.agent.options import declared_options
from lockstep.collectors.toolkit.follow import FileFollower, Line
from lockstep.collectors.toolkit.followed_logs import (
    FollowedLogs,
    globs_option,
    idle_timeout_option,
    start_at_option,
)
from tests.support import wait_until

LOG = logging.getLogger("test_followed_logs")


class Received:
    """What a FollowedLogs handed its collector, and whether its lock was held each time (an
    assertion in the watchdog thread would be caught there, not fail the test)."""

    def __init__(self) -> None:
        self.logs: FollowedLogs | None = None
        self.lines: list[tuple[str, bool]] = []  # (text, context)
        self.closed: list[str] = []
        self.locked: list[bool] = []  # one per call

    def on_lines(self, lines: Iterable[Line]) -> None:
        assert self.logs is not None
        self.locked.append(self.logs.lock.locked())
        self.lines.extend((line.data.decode(), line.context) for line in lines)

    def on_closed(self, path: str) -> None:
        assert self.logs is not None
        self.locked.append(self.logs.lock.locked())
        self.closed.append(path)

    def texts(self) -> list[str]:
        return [text for text, _ in self.lines]


def followed_logs(root: Path, received: Received, *, start_at: str = "beginning", watch: bool = True) -> FollowedLogs:
    logs = FollowedLogs(
        root, start_at=start_at, on_lines=received.on_lines, on_closed=received.on_closed, watch=watch, log=LOG
    )
    received.logs = logs
    return logs


def open_under(directory: Path) -> list[str]:
    """The files under ``directory`` this process holds open, one entry per descriptor."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # the descriptor listdir itself used, closed meanwhile
        if target.startswith(f"{directory}/"):
            found.append(target)
    return sorted(found)


def append(path: Path, text: str) -> None:
    with open(path, "a") as out:
        out.write(text)


def test_the_files_present_at_the_first_round_are_read_from_their_end_and_later_ones_from_their_start(
    tmp_path: Path,
) -> None:
    (tmp_path / "a.log").write_text("old\nlast\n")
    received = Received()
    logs = followed_logs(tmp_path, received, start_at="end", watch=False)
    pattern = "/*.log"  # a host path: under the root, tmp_path here
    assert not logs.started
    with logs.swept([pattern]) as follower:
        assert follower.followed_paths() == [str(tmp_path / "a.log")]
        assert received.lines == [("last", True)]  # context only: the history is skipped
    assert logs.started
    append(tmp_path / "a.log", "new\n")
    (tmp_path / "b.log").write_text("b1\n")
    with logs.swept([pattern]) as follower:
        assert follower.followed == 2
    assert received.lines == [("last", True), ("new", False), ("b1", False)]
    assert received.locked == [True, True]  # each sweep handed over under the lock
    logs.close()


def test_start_at_beginning_reads_the_files_present_from_their_first_line(tmp_path: Path) -> None:
    (tmp_path / "a.log").write_text("old\nlast\n")
    received = Received()
    logs = followed_logs(tmp_path, received, start_at="beginning", watch=False)
    with logs.swept(["/*.log"]):
        pass
    assert received.lines == [("old", False), ("last", False)]
    logs.close()


def test_start_at_is_end_or_beginning(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="^start_at is one of end, beginning, not 'middle'$"):
        followed_logs(tmp_path, Received(), start_at="middle")


def test_each_round_follows_that_rounds_patterns_and_drains_the_files_dropped(tmp_path: Path) -> None:
    """framework_logs finds its files anew each round: a file matched later is read from its start,
    one no longer matched is read to its end, then closed."""
    a, b = tmp_path / "a.log", tmp_path / "b.log"
    a.write_text("a1\n")
    b.write_text("b1\n")
    received = Received()
    logs = followed_logs(tmp_path, received, start_at="end", watch=False)
    with logs.swept(["/a.log"]):
        pass
    append(a, "a2\n")
    with logs.swept(["/b.log"]) as follower:
        assert sorted(follower.followed_paths()) == [str(a), str(b)]  # a is drained, not yet closed
    for _ in range(FileFollower.ORPHAN_SWEEPS):
        with logs.swept(["/b.log"]) as follower:
            pass
    assert follower.followed_paths() == [str(b)]
    assert received.lines == [("a1", True), ("a2", False), ("b1", False)]
    assert open_under(tmp_path) == [str(b)]
    logs.close()


def test_the_watch_is_rearmed_each_round_and_an_event_reads_its_file_at_once(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    (runs / "run1").mkdir(parents=True)
    (runs / "run1" / "rank.log").write_text("r1 a\n")
    received = Received()
    logs = followed_logs(tmp_path, received)
    pattern = "/runs/*/rank.log"
    try:
        assert logs.watched == set()  # nothing before the first round
        with logs.swept([pattern]):
            assert logs.watched == set()  # armed after the round's work, outside the lock
        assert logs.watched == {str(runs), str(runs / "run1")}
        append(runs / "run1" / "rank.log", "r1 b\n")
        wait_until(lambda: "r1 b" in received.texts(), what="the appended line via an event")
        # A new run directory: the next round's sweep finds its file, and the watch takes it in.
        (runs / "run2").mkdir()
        (runs / "run2" / "rank.log").write_text("r2 a\n")
        with logs.swept([pattern]):
            pass
        assert logs.watched == {str(runs), str(runs / "run1"), str(runs / "run2")}
        append(runs / "run2" / "rank.log", "r2 b\n")
        wait_until(lambda: "r2 b" in received.texts(), what="the new run's line via an event")
    finally:
        logs.close()
    assert received.texts() == ["r1 a", "r1 b", "r2 a", "r2 b"]
    assert set(received.locked) == {True}


def test_a_writers_close_reaches_on_closed_under_the_lock(tmp_path: Path) -> None:
    log = tmp_path / "rank.log"
    log.write_text("one\n")
    received = Received()
    logs = followed_logs(tmp_path, received)
    try:
        with logs.swept(["/rank.log"]):
            pass
        append(log, "two\n")  # opened, written and closed: IN_CLOSE_WRITE
        wait_until(lambda: received.closed, what="the close after the write")
    finally:
        logs.close()
    assert received.closed[0] == str(log)
    assert received.texts() == ["one", "two"]
    assert set(received.locked) == {True}


def test_close_waits_for_the_event_being_read_then_stops_the_watch_and_closes_the_files(tmp_path: Path) -> None:
    log = tmp_path / "rank.log"
    log.write_text("one\n")
    reading, release = threading.Event(), threading.Event()
    received = Received()

    def on_lines(lines: Iterable[Line]) -> None:
        received.on_lines(lines)
        if "block" in received.texts() and not release.is_set():
            reading.set()
            release.wait(10)  # an event's read still under way when the collector closes

    logs = FollowedLogs(tmp_path, start_at="beginning", on_lines=on_lines, log=LOG)
    received.logs = logs
    with logs.swept(["/rank.log"]):
        pass
    assert logs.watched == {str(tmp_path)}
    assert open_under(tmp_path) == [str(log)]
    append(log, "block\n")
    assert reading.wait(10), "no event read the appended line"
    closing = threading.Thread(target=logs.close)
    closing.start()
    closing.join(0.2)
    assert closing.is_alive()  # the event holds the lock: close takes the follower away after it
    release.set()
    closing.join(10)
    assert not closing.is_alive()
    assert not logs.started
    assert logs.watched == set()
    assert open_under(tmp_path) == []
    assert received.texts() == ["one", "block"]


def test_without_watching_the_sweep_alone_reads_the_files(tmp_path: Path) -> None:
    log = tmp_path / "dump.log"
    log.write_text("one\n")
    received = Received()
    logs = followed_logs(tmp_path, received, watch=False)
    with logs.swept(["/dump.log"]):
        pass
    assert logs.watched == set()
    append(log, "two\n")
    with logs.swept(["/dump.log"]):
        pass
    assert received.texts() == ["one", "two"]
    logs.close()
    assert open_under(tmp_path) == []


def test_a_probe_follows_the_files_present_on_its_own_and_closes_them(tmp_path: Path) -> None:
    (tmp_path / "a.log").write_text("a1\n")
    (tmp_path / "b.log").write_text("b1\n")
    received = Received()
    logs = followed_logs(tmp_path, received, watch=False)
    with logs.swept(["/a.log"]):
        pass
    with logs.probe(["/*.log"]) as probe:
        assert probe.followed == 2
        assert open_under(tmp_path) == [str(tmp_path / "a.log"), str(tmp_path / "a.log"), str(tmp_path / "b.log")]
    assert open_under(tmp_path) == [str(tmp_path / "a.log")]  # the rounds' follower, as it was
    assert received.texts() == ["a1"]  # a probe hands nothing over
    logs.close()


def test_the_shared_options_are_declared_with_one_wording_default_and_parser() -> None:
    @dataclass(frozen=True)
    class Options:
        logs: tuple[str, ...] = globs_option("test logs", flag="--test.logs", more="; one per rank")
        start_at: str = start_at_option("test files", flag="--test.start-at")
        idle_timeout: float = idle_timeout_option("a test that logged nothing for this long is dropped")

    logs, start_at, idle_timeout = declared_options(Options)
    assert (logs.name, logs.default, logs.help, logs.flag, logs.repeatable) == (
        "logs",
        (),
        "glob of test logs, on the host (under --path.rootfs), ** allowed; one per rank",
        "--test.logs",
        True,
    )
    assert logs.parse(["/a/*.log", "/b/*.log"]) == ("/a/*.log", "/b/*.log")
    assert (start_at.name, start_at.default, start_at.help, start_at.flag, start_at.repeatable) == (
        "start_at",
        "end",
        "where to start reading the test files present when the agent starts: end (skip their history) or beginning",
        "--test.start-at",
        False,
    )
    assert start_at.parse("beginning") == "beginning"
    with pytest.raises(ValueError):
        start_at.parse("middle")
    assert (idle_timeout.name, idle_timeout.default, idle_timeout.help, idle_timeout.flag) == (
        "idle_timeout",
        600.0,
        "a test that logged nothing for this long is dropped",
        None,
    )
    assert idle_timeout.parse("2m") == 120.0
