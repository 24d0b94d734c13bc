"""Hostile input, round two (issue 29, items 2, 3 and 5): what one user's log or directory can
cost the agent is bounded in bytes, objects and series, the excess is counted, and everyone
else's data stays exact.  The full-size versions run in bench/hostile_input.py."""

from __future__ import annotations

import json
import logging
import tracemalloc
from pathlib import Path

import pytest

from lockstep.collectors.training import TrainingCollector, TrainingOptions
from lockstep.collectors.training.collector import DEFAULT_MAX_RANKS
from lockstep.collectors.training.tail import _CHUNK, MAX_LINES
from tests.support import collected, context


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


def test_a_log_of_one_byte_lines_is_read_at_most_max_lines_a_round(tmp_path: Path) -> None:
    """1 MiB of `1` lines (524,288 of them): each round takes MAX_LINES (200,000), so a round's
    time is bounded (the issue's collector overran its deadline); the next rounds read the
    rest, and a good rank's steps written after the garbage are counted exactly."""
    log = tmp_path / "rank-0.jsonl"
    log.write_bytes(b"1\n" * 524_288)
    collector = _training(tmp_path / "*.jsonl")
    try:
        counted = [_invalid(collected(collector), "not_json") for _ in range(3)]
        assert counted == [MAX_LINES, 2 * MAX_LINES, 524_288]
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
            "304 records of new ranks refused since the last round: 1024 ranks held (max_ranks)"
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
