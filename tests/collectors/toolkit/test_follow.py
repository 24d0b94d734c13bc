"""collectors/toolkit/follow.py: following files by glob, with watchdog events, on real files."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from lockstep.collectors.toolkit.follow import DirectoryWatcher, FileFollower, Line, _match, _parts
from tests.support import wait_until


@pytest.mark.parametrize(
    ("pattern", "path", "matches"),
    [
        ("/r/*/logs/rank-*.jsonl", "/r/a__job=1/logs/rank-000.jsonl", True),
        ("/r/*/logs/rank-*.jsonl", "/r/a/b/logs/rank-000.jsonl", False),  # * stays in one component
        ("/r/**/rank-*.jsonl", "/r/a/b/logs/rank-000.jsonl", True),
        ("/r/**/rank-*.jsonl", "/r/rank-000.jsonl", True),  # ** may be no directory at all
        ("/r/*.jsonl", "/r/.rank-000.jsonl", False),  # hidden files need a pattern with a dot
        ("/r/**/*.jsonl", "/r/.cache/rank-000.jsonl", False),
        ("/r/*.jsonl", "/r/rank-000.jsonl.1", False),
    ],
)
def test_patterns_match_like_glob(pattern: str, path: str, matches: bool) -> None:
    assert _match(_parts(pattern), _parts(path)) is matches


def texts(lines: list[Line]) -> list[str]:
    return [line.data.decode() for line in lines]


def test_deleted_file_is_drained_then_closed_and_its_unterminated_last_line_handed_over(tmp_path: Path) -> None:
    log = tmp_path / "a.log"
    log.write_text("one\n")
    follower = FileFollower([str(tmp_path / "*.log")], start_at_end=False)
    assert texts(follower.sweep()) == ["one"]
    with open(log, "a") as f:
        f.write("two\nthree")  # the writer died before the newline
    log.unlink()
    assert texts(follower.sweep()) == ["two"]
    assert follower.followed == 1
    assert texts(follower.sweep()) == []
    assert texts(follower.sweep()) == ["three"]  # closed after two quiet rounds
    assert follower.followed == 0


def test_over_long_line_is_dropped_without_buffering_it_all(tmp_path: Path) -> None:
    log = tmp_path / "a.log"
    follower = FileFollower([str(log)], start_at_end=False, max_line_bytes=100)
    log.write_text("x" * 150)
    assert texts(follower.sweep()) == []
    with open(log, "a") as f:
        f.write("y" * 10_000 + "\nok\n")
    assert texts(follower.sweep()) == ["ok"]
    assert follower.lines_too_long == 1
    follower.close()


def test_start_at_end_hands_over_the_last_complete_line_as_context(tmp_path: Path) -> None:
    log = tmp_path / "a.log"
    log.write_text("old\nlast\npart")
    follower = FileFollower([str(log)], start_at_end=True)
    assert [(line.data, line.context) for line in follower.sweep()] == [(b"last", True)]
    with open(log, "a") as f:
        f.write("ial\nnew\n")  # the rest of the line we started inside is dropped
    assert [(line.data, line.context) for line in follower.sweep()] == [(b"new", False)]
    follower.close()


def test_watchdog_events_read_growth_new_files_and_truncation_without_a_sweep(tmp_path: Path) -> None:
    lock = threading.Lock()
    received: list[str] = []
    follower = FileFollower([str(tmp_path / "*.log")], start_at_end=False)

    def on_path(path: str) -> None:
        with lock:
            received.extend(texts(follower.read_path(path)))

    (tmp_path / "a.log").write_text("a1\n")
    with lock:
        received.extend(texts(follower.sweep()))
    watcher = DirectoryWatcher(on_path)
    watcher.watch(follower.directories())
    try:
        assert watcher.directories == {str(tmp_path)}
        with open(tmp_path / "a.log", "a") as f:
            f.write("a2\n")
        wait_until(lambda: "a2" in received, what="the appended line via an event")
        (tmp_path / "b.log").write_text("b1\n")
        wait_until(lambda: "b1" in received, what="the new file via an event")
        os.truncate(tmp_path / "a.log", 0)
        wait_until(lambda: follower.truncations == 1, what="the truncation via an event")
        with open(tmp_path / "a.log", "a") as f:
            f.write("a3 after truncation\n")
        wait_until(lambda: "a3 after truncation" in received, what="the line after truncation")
        os.rename(tmp_path / "a.log", tmp_path / "a.log.1")
        (tmp_path / "a.log").write_text("a4 in the new file\n")
        wait_until(lambda: "a4 in the new file" in received, what="the new file after rotation")
    finally:
        watcher.stop()
        follower.close()
    assert received == ["a1", "a2", "b1", "a3 after truncation", "a4 in the new file"]


def test_a_directory_a_pattern_matches_is_read_for_its_directory_files_when_asked(tmp_path: Path) -> None:
    dump_dir = tmp_path / "nccl-inspector-4242"
    dump_dir.mkdir()
    (dump_dir / "node001-pid2200.log").write_text("a\nb\n")
    (dump_dir / "notes.txt").write_text("not a dump\n")
    pattern = str(tmp_path / "nccl-inspector-*")
    follower = FileFollower([pattern], start_at_end=False, directory_files="*-pid*.log")
    assert texts(list(follower.sweep())) == ["a", "b"]
    assert follower.matches(str(dump_dir / "node001-pid2201.log"))
    assert not follower.matches(str(dump_dir / "notes.txt"))
    # Without directory_files (the training logs) a directory is nothing to read, as before.
    plain = FileFollower([pattern], start_at_end=False)
    assert list(plain.sweep()) == []
    assert not plain.matches(str(dump_dir / "node001-pid2201.log"))


def test_why_no_files_says_what_each_pattern_matched(tmp_path: Path) -> None:
    (tmp_path / "empty-dump-dir").mkdir()
    os.mkfifo(tmp_path / "fifo.log")
    patterns = [str(tmp_path / "none" / "*.log"), str(tmp_path / "empty-*"), str(tmp_path / "fifo.log")]
    follower = FileFollower(patterns, start_at_end=True, directory_files="*-pid*.log")
    assert list(follower.sweep()) == []
    assert follower.why_no_files() == (
        f"nothing matches {tmp_path}/none/*.log; "
        f"{tmp_path}/empty-* matches directories holding no file named *-pid*.log: "
        f"1 directory ({tmp_path}/empty-dump-dir); "
        f"{tmp_path}/fifo.log matches what is not a regular file: 1 path ({tmp_path}/fifo.log)"
    )
    plain = FileFollower([str(tmp_path / "empty-*")], start_at_end=True)
    assert (
        plain.why_no_files() == f"{tmp_path}/empty-* matches only directories: 1 directory ({tmp_path}/empty-dump-dir)"
    )


@pytest.mark.skipif(os.geteuid() == 0, reason="root opens a file whatever its mode")
def test_why_no_files_names_a_file_that_cannot_be_opened(tmp_path: Path) -> None:
    (tmp_path / "node001-pid1.log").write_text("x\n")
    (tmp_path / "node001-pid1.log").chmod(0)
    follower = FileFollower([str(tmp_path / "*.log")], start_at_end=True)
    assert list(follower.sweep()) == []
    assert follower.why_no_files() == (
        f"{tmp_path}/*.log matches files that cannot be opened: 1 file ({tmp_path}/node001-pid1.log: permission denied)"
    )


def test_set_patterns_follows_new_files_from_their_start_and_drains_the_dropped(tmp_path: Path) -> None:
    """A collector that discovers its files (framework_logs) changes the patterns between sweeps:
    a file matched for the first time after the first sweep is read from its start; a file no
    longer matched is read to its end and then closed, as a rotated-away file is."""
    a, b = tmp_path / "a.log", tmp_path / "b.log"
    a.write_text("a1\n")
    follower = FileFollower([str(a)], start_at_end=True)
    assert [line.data for line in follower.sweep() if not line.context] == []
    b.write_text("b1\nb2\n")
    with open(a, "a") as out:
        out.write("a2\n")
    follower.set_patterns([str(b)])
    assert sorted(line.data for line in follower.sweep()) == [b"a2", b"b1", b"b2"]
    assert follower.followed == 2  # a is drained, not yet closed
    for _ in range(FileFollower.ORPHAN_SWEEPS):
        list(follower.sweep())
    assert follower.followed_paths() == [str(b)]
    follower.close()


def test_idle_files_give_their_descriptor_up_and_are_read_on_from_where_they_were(tmp_path: Path) -> None:
    """park_after: at max_files, a file idle that many sweeps is closed (its offset kept) for a
    file with something to read; empty files wait without a descriptor and are not skipped."""
    idle = [tmp_path / f"idle-{n}.out" for n in range(3)]
    idle[0].write_text("old line\n")
    idle[1].write_text("other line\n")
    idle[2].write_text("")
    follower = FileFollower([str(tmp_path / "*.out")], start_at_end=False, max_files=2, park_after=2)
    assert sorted(texts(list(follower.sweep()))) == ["old line", "other line"]
    assert follower.followed == 2 and follower.skipped == 0  # the third is empty: it waits unopened
    list(follower.sweep())
    (tmp_path / "live.out").write_text("step 1\n")
    assert texts(list(follower.sweep())) == ["step 1"]  # an idle file gave its descriptor up
    assert follower.followed == 2 and follower.skipped == 0
    with open(idle[0], "a") as out:
        out.write("new line\n")
    for _ in range(3):
        got = texts(list(follower.sweep()))
        if got:
            break
    assert got == ["new line"]  # read on from its offset: "old line" not again
    with open(tmp_path / "live.out", "a") as out:
        out.write("step 2\n")
    assert texts(list(follower.sweep())) == ["step 2"]
    follower.close()


def test_without_park_after_followed_files_are_never_closed_for_others(tmp_path: Path) -> None:
    for n in range(3):
        (tmp_path / f"idle-{n}.out").write_text("")
    follower = FileFollower([str(tmp_path / "*.out")], start_at_end=False, max_files=3)
    for _ in range(3):
        list(follower.sweep())
    (tmp_path / "live.out").write_text("step 1\n")
    assert texts(list(follower.sweep())) == []
    assert follower.skipped == 1
    follower.close()
