"""Hostile input, round two (issue 29, items 2, 3 and 5): what one user's log or directory can
cost the agent is bounded in bytes, objects and series, the excess is counted, and everyone
else's data stays exact.  The full-size versions run in bench/hostile_input.py."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import tracemalloc
from pathlib import Path

import pytest

from lockstep.agent.collector import CollectorContext, Paths
from lockstep.agent.seams import WALL_CLOCK, Seams
from lockstep.collectors.checkpoint import CheckpointCollector, CheckpointOptions
from lockstep.collectors.checkpoint.config import parse_roots
from lockstep.collectors.checkpoint.watch import MAX_WATCH_DEPTH
from lockstep.collectors.toolkit.follow import _CHUNK, MAX_LINES
from lockstep.collectors.training import TrainingCollector, TrainingOptions
from lockstep.collectors.training.collector import DEFAULT_MAX_RANKS
from tests.support import collected, context, wait_until


def _training(*globs: Path | str, **options: object) -> TrainingCollector:
    return TrainingCollector(
        context(options=TrainingOptions(logs=tuple(str(g) for g in globs), start_at="beginning", **options))  # type: ignore[arg-type]
    )


def _invalid(values: dict, reason: str) -> float:
    return values[("lockstep_training_log_lines_invalid_total", frozenset({("reason", reason)}))]


def _step_lines(job: str, rank: int, host: str, first: int, count: int) -> str:
    """``count`` complete steps of one rank: two records each (step and compute time)."""
    out = []
    for step in range(first, first + count):
        for metric, value in (("step_time_sec", 1.0), ("compute_time_sec", 0.5)):
            record = {"ts": 1_767_312_000 + step, "job_id": job, "rank": rank, "host": host}
            out.append(json.dumps({**record, "step": step, "metric": metric, "value": value}) + "\n")
    return "".join(out)


def _steps(values: dict, job: str, rank: int, host: str) -> float | None:
    labels = frozenset({("job_id", job), ("rank", str(rank)), ("host", host)})
    return values.get(("lockstep_training_steps_total", labels))


# --- item 2: a log of `1` lines ---


def test_a_log_of_non_records_costs_one_read_chunk_of_memory(tmp_path: Path) -> None:
    """2 MiB of 64-byte lines that are no JSON object (the issue's 16 MiB of `1` lines held one
    object per line before any parsing: 1.4 GB).  Lines are parsed as they are read, so the
    round's peak is what one read holds:
      - one chunk of the file (_CHUNK, 1 MiB: the previous chunk is released before the next read),
      - a line being assembled across two chunks and its copy (2 x max_line_bytes, 64 KiB each),
      - 64 KiB for everything else alive meanwhile (one line, the counters, the log record).
    Before the fix, the round held the 32,768 lines at once: 6 MB and more."""
    log = tmp_path / "rank-0.jsonl"
    line = b"1" * 63 + b"\n"
    log.write_bytes(line * (2 * 1024 * 1024 // len(line)))
    collector = _training(tmp_path / "*.jsonl")
    tracemalloc.start()
    try:
        values = collected(collector)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        collector.close()
    assert peak <= _CHUNK + 2 * 64 * 1024 + 64 * 1024
    assert _invalid(values, "not_json") == 32_768  # every line counted, none parsed into a record
    assert _invalid(values, "too_long") == 0


def test_a_log_of_one_byte_lines_is_read_at_most_max_lines_a_round(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """1 MiB of `1` lines (524,288 of them): each round takes MAX_LINES (200,000), so a round's
    time is bounded (the issue's collector overran its deadline), and says so in one line; the
    next rounds read the rest, and a good rank's steps written after the garbage are counted
    exactly."""
    log = tmp_path / "rank-0.jsonl"
    log.write_bytes(b"1\n" * 524_288)
    collector = _training(tmp_path / "*.jsonl")
    try:
        with caplog.at_level(logging.WARNING, logger="test"):
            counted = [_invalid(collected(collector), "not_json") for _ in range(3)]
        assert counted == [MAX_LINES, 2 * MAX_LINES, 524_288]
        assert [r.getMessage() for r in caplog.records] == [
            f"log lines skipped since the last round: not_json {n}; 0 ranks held (max_ranks 1024)"
            for n in (200_000, 200_000, 124_288)
        ]
        with log.open("a") as f:
            f.write(_step_lines("7", 0, "h", 0, 3))
        values = collected(collector)
        assert _steps(values, "7", 0, "h") == 3
        assert _invalid(values, "not_json") == 524_288
    finally:
        collector.close()


# --- item 3: 150,000 distinct ranks in one log ---


def test_ranks_beyond_max_ranks_are_refused_and_counted_and_the_others_keep_their_data(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """1,100 distinct (job, rank, host) in one log with the default max_ranks (1,024): the first
    1,024 are held (8 series each at most), the 76 others' 304 records refused and counted, and
    a rank already held keeps counting its steps.  The issue's 150,000 made 750,000 series."""
    assert DEFAULT_MAX_RANKS == 1024
    log = tmp_path / "ranks.jsonl"
    log.write_text("".join(_step_lines("9", 0, f"host{i:04d}", 0, 2) for i in range(1100)))
    collector = _training(tmp_path / "*.jsonl")
    try:
        with caplog.at_level(logging.WARNING, logger="test"):
            values = collected(collector)
            collected(collector)  # a round with no new refusal logs nothing
        held = [labels for (name, labels) in values if name == "lockstep_training_steps_total"]
        assert len(held) == 1024
        assert _steps(values, "9", 0, "host1023") == 2
        assert _steps(values, "9", 0, "host1024") is None
        assert _invalid(values, "too_many_ranks") == 76 * 4
        assert [r.getMessage() for r in caplog.records] == [
            "log lines skipped since the last round: too_many_ranks 304; 1024 ranks held (max_ranks 1024)"
        ]
        with log.open("a") as f:
            f.write(_step_lines("9", 0, "host0000", 2, 4) + _step_lines("9", 0, "host5000", 0, 1))
        values = collected(collector)
        assert _steps(values, "9", 0, "host0000") == 6  # held ranks keep their data
        assert _invalid(values, "too_many_ranks") == 76 * 4 + 2
        assert len([n for (n, _) in values if n == "lockstep_training_steps_total"]) == 1024
    finally:
        collector.close()


def test_max_ranks_is_an_option(tmp_path: Path) -> None:
    log = tmp_path / "ranks.jsonl"
    log.write_text("".join(_step_lines("9", rank, "h", 0, 2) for rank in range(5)))
    collector = _training(tmp_path / "*.jsonl", max_ranks=3)
    try:
        values = collected(collector)
        assert [_steps(values, "9", rank, "h") for rank in range(5)] == [2, 2, 2, None, None]
        assert _invalid(values, "too_many_ranks") == 2 * 4
    finally:
        collector.close()


# --- item 5: a directory 1,000 levels deep under a checkpoint root ---


def _deep_tree(top: Path, levels: int) -> None:
    """``top`` and ``levels`` directories nested under it (os.makedirs is recursive: it cannot)."""
    path = top
    path.mkdir()
    for _ in range(levels):
        path = path / "d"
        path.mkdir()


def _remove_deep_tree(top: Path) -> None:
    """Remove what _deep_tree made (shutil.rmtree, pytest's cleanup, is recursive too)."""
    path = top
    while (path / "d").is_dir():
        path = path / "d"
    while path != top.parent:
        path.rmdir()
        path = path.parent


def _save(root: Path, name: str, mtime: float) -> None:
    """A complete PyTorch DCP save: one 1,000-byte shard, then .metadata (100 bytes)."""
    (root / name).mkdir()
    for file, size, when in (("__0_0.distcp", 1000, mtime - 10), (".metadata", 100, mtime)):
        (root / name / file).write_bytes(b"x" * size)
        os.utime(root / name / file, (when, when))


def _root_values(values: dict, root: str) -> dict[str, float]:
    return {
        name.removeprefix("lockstep_checkpoint_"): v
        for (name, labels), v in values.items()
        if ("root", root) in labels and name != "lockstep_checkpoint_info"
    }


def test_a_directory_1000_levels_deep_is_not_watched_and_costs_no_root_its_data(tmp_path: Path) -> None:
    """Two roots watched with inotify; one holds a directory 1,000 levels deep from the start,
    and the other gets one after its watch started.  Watchdog's recursive watch raised
    RecursionError: the first made the collector fail every round, for both roots; the second
    stopped the agent's inotify thread, so no later save was seen.  Now each deep tree is
    watched down to MAX_WATCH_DEPTH levels, the directory at that depth counted (1: nothing
    below it is walked), and the healthy root's saves are seen through inotify with exact
    values.  Once the deep tree is removed, nothing is counted any more."""
    now = time.time()
    deep, good = tmp_path / "ckpt" / "deep", tmp_path / "ckpt" / "good"
    deep.parent.mkdir()
    _deep_tree(deep, 1000)
    good.mkdir()
    _save(good, "step_1", now - 100)
    collector = CheckpointCollector(
        CollectorContext(
            paths=Paths(rootfs=tmp_path),
            options=CheckpointOptions(roots=parse_roots([{"path": "/ckpt/*", "watch": "inotify"}])),
            log=logging.getLogger("test"),
            seams=Seams(WALL_CLOCK.replaced_by(lambda: now)),
        )
    )
    try:
        values = collected(collector)
        assert MAX_WATCH_DEPTH == 16
        assert _root_values(values, "/ckpt/deep")["skipped_directories"] == 1
        assert _root_values(values, "/ckpt/good") == {
            "saves_total": 0,
            "in_progress_seconds": 0,
            "last_success_timestamp_seconds": now - 100,
            "last_duration_seconds": 10,
            "last_size_bytes": 1100,
            "last_write_throughput_bytes_per_second": 110,
            "root_readable": 1,
            "scan_truncated": 0,
            "skipped_directories": 0,
        }
        _deep_tree(good / "attack", 1000)  # made under a live watch, level by level
        _save(good, "step_2", now - 5)
        # Seen through the watch (the collector rescans a watched root only after an event).
        values = wait_until(
            lambda: (v := collected(collector)) and _root_values(v, "/ckpt/good")["saves_total"] == 1 and v,
            timeout=10,
            what="the save made after the deep tree to be seen",
        )
        good_values = _root_values(values, "/ckpt/good")
        assert good_values["last_success_timestamp_seconds"] == now - 5
        assert good_values["last_size_bytes"] == 1100
        assert good_values["skipped_directories"] == 1
        assert [t.name for t in threading.enumerate() if t.name == "checkpoint-inotify"] == ["checkpoint-inotify"]
        _remove_deep_tree(good / "attack")
        wait_until(
            lambda: _root_values(collected(collector), "/ckpt/good")["skipped_directories"] == 0,
            timeout=10,
            what="the removed deep tree to be counted no more",
        )
    finally:
        collector.close()
        for top in (deep, good / "attack"):
            if top.exists():
                _remove_deep_tree(top)


def test_a_root_reached_through_a_symlink_is_watched(tmp_path: Path) -> None:
    """The depth-bounded watch follows the root itself when it is a symlink (as watchdog did),
    never a symlink below it."""
    now = time.time()
    (tmp_path / "real").mkdir()
    (tmp_path / "ckpt").symlink_to(tmp_path / "real")
    collector = CheckpointCollector(
        CollectorContext(
            paths=Paths(rootfs=tmp_path),
            options=CheckpointOptions(roots=parse_roots([{"path": "/ckpt", "watch": "inotify"}])),
            log=logging.getLogger("test"),
            seams=Seams(WALL_CLOCK.replaced_by(lambda: now)),
        )
    )
    try:
        values = collected(collector)
        info = [dict(labels) for (name, labels) in values if name == "lockstep_checkpoint_info"]
        assert [i["watch"] for i in info] == ["inotify"]
        _save(tmp_path / "real", "step_1", now - 5)
        got = wait_until(
            lambda: (v := _root_values(collected(collector), "/ckpt"))["saves_total"] == 1 and v,
            timeout=10,
            what="the save seen through the watch",
        )
        assert (got["last_success_timestamp_seconds"], got["last_size_bytes"]) == (now - 5, 1100)
    finally:
        collector.close()
