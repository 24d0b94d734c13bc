"""Training collector on real files appended by writer threads: exact counts and sums
through growth, partial lines, garbage, rotation, truncation and huge existing files.

Times are binary fractions (1.0, 0.5, 0.25, 0.125) so sums are exact.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from lockstep.agent.collector import CollectorContext, NothingHere, Paths
from lockstep.agent.seams import MONOTONIC_CLOCK, Seams
from lockstep.collectors.training import TrainingCollector, TrainingOptions
from lockstep.collectors.training.steps import PENDING_STEP_FLUSH_SECONDS
from lockstep.emitter import step_lines
from tests.support import collected, context, lockstep, samples


def make(
    *globs: Path | str,
    start_at: str = "beginning",
    idle_timeout: float = 600.0,
    clock: Callable[[], float] | None = None,
) -> TrainingCollector:
    options = TrainingOptions(logs=tuple(str(g) for g in globs), start_at=start_at, idle_timeout=idle_timeout)
    seams = Seams() if clock is None else Seams(MONOTONIC_CLOCK.replaced_by(clock))
    return TrainingCollector(dataclasses.replace(context(options=options), seams=seams))


def run(collector: TrainingCollector) -> dict:
    return collected(collector)


def rank(s: dict, name: str, rank: int, job: str = "7", host: str = "h") -> float:
    return s[(f"lockstep_training_{name}", frozenset({"job_id": job, "rank": str(rank), "host": host}.items()))]


def ranks(s: dict) -> list[tuple[str, str]]:
    return sorted((dict(k[1])["job_id"], dict(k[1])["rank"]) for k in s if k[0] == "lockstep_training_steps_total")


def invalid(s: dict) -> dict[str, float]:
    return {dict(k[1])["reason"]: v for k, v in s.items() if k[0] == "lockstep_training_log_lines_invalid_total"}


def step(number: int, *, rank: int = 0, job: str = "7", ts: float | None = None) -> str:
    """One step as the emitter writes it: wall 1.0 = data 0.125 + compute 0.5 + comm 0.25 + rest."""
    return step_lines(
        job_id=job,
        rank=rank,
        host="h",
        step=number,
        ts=1_767_312_000 + number if ts is None else ts,
        step_time=1.0,
        compute_time=0.5,
        comm_wait_time=0.25,
        data_time=0.125,
        tokens=64,
    )


def append(path: Path, text: str) -> None:
    with open(path, "a") as f:
        f.write(text)


def assert_steps(s: dict, rank_: int, steps: int) -> None:
    """The counters of a rank that completed ``steps`` steps of step()."""
    assert rank(s, "steps_total", rank_) == steps
    assert rank(s, "step_seconds_total", rank_) == steps * 1.0
    assert rank(s, "compute_seconds_total", rank_) == steps * 0.5
    assert rank(s, "comm_wait_seconds_total", rank_) == steps * 0.25
    assert rank(s, "data_wait_seconds_total", rank_) == steps * 0.125
    assert rank(s, "tokens_total", rank_) == steps * 64


def test_writer_threads_appending_while_collecting_give_exact_totals(tmp_path: Path) -> None:
    """Four ranks' writers append 400 steps each, every line in two writes (so reads see
    partial lines), while the collector collects and watchdog events read concurrently."""
    steps_per_rank, ranks_ = 400, 4
    done = threading.Event()

    def writer(r: int) -> None:
        fd = os.open(tmp_path / f"rank-{r:03d}.metrics.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        try:
            for k in range(steps_per_rank):
                for line in step(k, rank=r).splitlines(keepends=True):
                    os.write(fd, line[:20].encode())
                    os.write(fd, line[20:].encode())
        finally:
            os.close(fd)

    collector = make(tmp_path / "rank-*.metrics.jsonl")
    threads = [threading.Thread(target=writer, args=(r,)) for r in range(ranks_)]
    for thread in threads:
        thread.start()
    rounds = 0
    while any(t.is_alive() for t in threads) or rounds == 0:
        run(collector)
        rounds += 1
    done.set()
    for thread in threads:
        thread.join()
    s = run(collector)
    collector.close()
    for r in range(ranks_):
        assert_steps(s, r, steps_per_rank)
        assert rank(s, "last_step_timestamp_seconds", r) == 1_767_312_000 + steps_per_rank - 1
    assert invalid(s) == {"not_json": 0, "bad_record": 0, "bad_value": 0, "too_long": 0, "too_many_ranks": 0}
    assert s[("lockstep_training_log_files", frozenset())] == ranks_
    print(f"{rounds} collection rounds while writing")


def test_partial_last_line_waits_for_its_end(tmp_path: Path) -> None:
    log = tmp_path / "rank-000.metrics.jsonl"
    text = step(0) + step(1)
    append(log, text[:-30])  # step 1's last line (step_time_sec) cut short
    collector = make(log)
    s = run(collector)
    assert rank(s, "steps_total", 0) == 1
    append(log, text[-30:])
    s = run(collector)
    collector.close()
    assert_steps(s, 0, 2)
    assert invalid(s)["not_json"] == 0


def test_garbage_lines_are_counted_and_skipped(tmp_path: Path) -> None:
    log = tmp_path / "rank-000.metrics.jsonl"
    good = [step(k) for k in range(3)]
    lines = [
        good[0],
        "this is not json\n",
        "[1, 2, 3]\n",
        '{"metric": "step_time_sec"}\n',  # no value, no ts
        '{"ts": "yesterday", "job_id": "7", "rank": 0, "metric": "step_time_sec", "value": 1}\n',
        good[1],
        '{"ts": 1, "job_id": "7", "rank": 0, "metric": "step_time_sec", "value": -1}\n',
        '{"ts": 1, "job_id": "7", "rank": 0, "metric": "data_time_sec", "value": NaN}\n',
        '{"ts": 1, "job_id": "7", "rank": 0, "metric": "loss", "value": 2.5}\n',  # valid, not used
        "x" * 70_000 + "\n",
        "\n",
        good[2],
    ]
    log.write_bytes("".join(lines).encode() + b"\xff\xfe\n")
    collector = make(log)
    s = run(collector)
    collector.close()
    assert_steps(s, 0, 3)
    assert invalid(s) == {"not_json": 3, "bad_record": 2, "bad_value": 2, "too_long": 1, "too_many_ranks": 0}


def test_rotation_by_rename_reads_the_old_files_rest_and_the_new_file(tmp_path: Path) -> None:
    log = tmp_path / "rank-000.metrics.jsonl"
    append(log, "".join(step(k) for k in range(10)))
    collector = make(tmp_path / "rank-*.metrics.jsonl")
    assert rank(run(collector), "steps_total", 0) == 10
    with open(log, "a") as old:
        os.rename(log, tmp_path / "rank-000.metrics.jsonl.1")
        old.write("".join(step(k) for k in range(10, 12)))  # the writer has not reopened yet
        old.flush()
        append(log, "".join(step(k) for k in range(12, 17)))  # then it does
    s = run(collector)
    assert_steps(s, 0, 17)
    assert s[("lockstep_training_log_files", frozenset())] == 2  # the old one is drained a while
    for _ in range(2):
        s = run(collector)
    collector.close()
    assert s[("lockstep_training_log_files", frozenset())] == 1
    assert_steps(s, 0, 17)


def test_rotated_name_still_matching_the_glob_is_not_read_twice(tmp_path: Path) -> None:
    log = tmp_path / "rank-000.metrics.jsonl"
    append(log, "".join(step(k) for k in range(10)))
    collector = make(tmp_path / "rank-*.metrics.jsonl*")
    run(collector)
    os.rename(log, tmp_path / "rank-000.metrics.jsonl.1")
    append(log, "".join(step(k) for k in range(10, 15)))
    s = run(collector)
    collector.close()
    assert_steps(s, 0, 15)
    assert s[("lockstep_training_log_files", frozenset())] == 2


def test_truncation_in_place_starts_over_from_the_top(tmp_path: Path) -> None:
    log = tmp_path / "rank-000.metrics.jsonl"
    append(log, "".join(step(k) for k in range(10)))
    collector = make(log)
    assert rank(run(collector), "steps_total", 0) == 10
    with open(log, "r+") as f:  # copytruncate: the same file, emptied
        f.truncate(0)
    append(log, "".join(step(k) for k in range(10, 13)))
    s = run(collector)
    collector.close()
    assert_steps(s, 0, 13)


def test_huge_existing_file_is_followed_from_its_end(tmp_path: Path) -> None:
    log = tmp_path / "rank-000.metrics.jsonl"
    history = "".join(step(k) for k in range(100))
    log.write_text(history * 200)  # ~13 MB of history
    collector = make(log, start_at="end")
    s = run(collector)
    assert ranks(s) == []
    assert s[("lockstep_training_log_files", frozenset())] == 1
    append(log, "".join(step(k) for k in range(100, 103)))
    s = run(collector)
    collector.close()
    assert_steps(s, 0, 3)


def test_huge_existing_file_from_the_beginning_is_read_over_several_rounds(tmp_path: Path) -> None:
    log = tmp_path / "rank-000.metrics.jsonl"
    block = "".join(step(k) for k in range(1000))
    log.write_text("".join(block.replace('"step":', f'"step":{b}0000') for b in range(10, 50)))  # ~27 MB
    collector = make(log, start_at="beginning")
    first = rank(run(collector), "steps_total", 0)
    assert 0 < first < 40_000  # at most 16 MiB per file per round
    s = run(collector)
    collector.close()
    assert_steps(s, 0, 40_000)


def test_starting_at_the_end_in_the_middle_of_a_step_skips_that_step(tmp_path: Path) -> None:
    """A writer that writes line by line was inside step 5 (and inside a line) when the
    agent started: the rest of step 5 is not counted, the following steps are."""
    log = tmp_path / "rank-000.metrics.jsonl"
    lines = step(5).splitlines(keepends=True)
    log.write_text("".join(step(k) for k in range(5)) + "".join(lines[:2]) + lines[2][:15])
    collector = make(log, start_at="end")
    assert ranks(run(collector)) == []
    append(log, lines[2][15:] + "".join(lines[3:]) + step(6) + step(7))
    s = run(collector)
    collector.close()
    assert_steps(s, 0, 2)
    assert invalid(s)["not_json"] == 0  # the line we started inside is skipped, not garbage


def test_records_without_explicit_times_are_derived(tmp_path: Path) -> None:
    """The older record set: no step number (steps told apart by ts), step_time_sec
    first, communication as a percentage, throughput as rates; job and rank from the path."""
    log = tmp_path / "runs" / "llama__job=99__task=0" / "logs" / "rank-012.metrics.jsonl"
    log.parent.mkdir(parents=True)
    records = []
    for k in range(3):
        ts = f"2026-01-02T00:00:0{k}.500Z"
        for metric, value in (
            ("step_time_sec", 2.0),
            ("data_time_sec", 0.25),
            ("allreduce_time_pct", 25.0),
            ("tokens_per_sec", 1024.0),
            ("throughput_examples_per_sec", 4.0),
            ("gpu_utilization_pct", 97.0),
        ):
            records.append({"ts": ts, "host": "nodeA", "metric": metric, "value": value})
    log.write_text("".join(json.dumps(r) + "\n" for r in records))
    collector = make(tmp_path / "runs" / "*" / "logs" / "rank-*.metrics.jsonl")
    s = run(collector)
    collector.close()

    def v(name: str) -> float:
        return rank(s, name, 12, job="99", host="nodeA")

    assert v("steps_total") == 3
    assert v("step_seconds_total") == 6.0
    assert v("comm_wait_seconds_total") == 1.5  # 25 % of 2 s, three times
    assert v("data_wait_seconds_total") == 0.75
    assert v("compute_seconds_total") == 3.75  # 2 - 0.5 - 0.25, three times
    assert v("tokens_total") == 6144  # 1024/s x 2 s, three times
    assert v("samples_total") == 24
    assert v("last_step_timestamp_seconds") == 1_767_312_002.5


def test_explicit_times_win_over_derived_ones(tmp_path: Path) -> None:
    log = tmp_path / "rank-000.metrics.jsonl"
    records = [
        {"ts": 5, "job_id": "7", "rank": 0, "host": "h", "step": 1, "metric": m, "value": v}
        for m, v in (("allreduce_time_pct", 50.0), ("comm_wait_time_sec", 0.25), ("step_time_sec", 1.0))
    ]
    log.write_text("".join(json.dumps(r) + "\n" for r in records))
    t = [1000.0]
    collector = make(log, clock=lambda: t[0])
    s = run(collector)
    # Not yet counted: nothing says the step is complete until the next one starts ...
    assert rank(s, "steps_total", 0) == 0
    # ... or the rank has been quiet for a while.
    t[0] += PENDING_STEP_FLUSH_SECONDS
    s = run(collector)
    collector.close()
    assert rank(s, "steps_total", 0) == 1
    assert rank(s, "comm_wait_seconds_total", 0) == 0.25
    assert rank(s, "compute_seconds_total", 0) == 0.75


def test_a_repeated_metric_starts_a_new_step(tmp_path: Path) -> None:
    """Steps shorter than the timestamp's resolution share a ts: a second step_time_sec is a
    second step."""
    log = tmp_path / "rank-000.metrics.jsonl"
    record = {"ts": "2026-01-02T00:00:00Z", "job_id": "7", "rank": 0, "host": "h", "metric": "step_time_sec"}
    log.write_text("".join(json.dumps({**record, "value": 0.5}) + "\n" for _ in range(4)))
    collector = make(log)
    s = run(collector)
    collector.close()
    assert rank(s, "steps_total", 0) == 4
    assert rank(s, "step_seconds_total", 0) == 2.0


def test_finished_jobs_ranks_disappear_after_the_idle_time(tmp_path: Path) -> None:
    (tmp_path / "rank-000.metrics.jsonl").write_text("".join(step(k, rank=0) for k in range(3)))
    (tmp_path / "rank-001.metrics.jsonl").write_text("".join(step(k, rank=1, job="8") for k in range(3)))
    t = [1000.0]
    collector = make(tmp_path / "rank-*.metrics.jsonl", idle_timeout=60, clock=lambda: t[0])
    assert ranks(run(collector)) == [("7", "0"), ("8", "1")]
    t[0] += 30
    append(tmp_path / "rank-001.metrics.jsonl", step(3, rank=1, job="8"))
    assert ranks(run(collector)) == [("7", "0"), ("8", "1")]
    t[0] += 31  # rank 0 quiet for 61 s, rank 1 for 31 s
    assert ranks(run(collector)) == [("8", "1")]
    t[0] += 60
    s = run(collector)
    collector.close()
    assert ranks(s) == []
    assert s[("lockstep_training_log_files", frozenset())] == 2  # the files are still followed


def test_no_globs_is_nothing_here() -> None:
    with pytest.raises(NothingHere) as err:
        list(make().collect())
    assert str(err.value) == "no training log globs configured (--training.logs GLOB or collectors.training.logs)"


def test_globs_are_host_paths_under_the_root_file_system(tmp_path: Path) -> None:
    log = tmp_path / "scratch" / "run" / "rank-000.metrics.jsonl"
    log.parent.mkdir(parents=True)
    log.write_text(step(0) + step(1))
    collector = TrainingCollector(
        CollectorContext(
            paths=Paths(rootfs=tmp_path),
            options=TrainingOptions(
                logs=("/scratch/**/rank-*.metrics.jsonl",), start_at="beginning", idle_timeout=600.0
            ),
            log=logging.getLogger("test"),
        )
    )
    assert collector.check() == "1 log file(s) match /scratch/**/rank-*.metrics.jsonl"
    s = run(collector)
    collector.close()
    assert_steps(s, 0, 2)


def test_repeated_log_flags_end_to_end(tmp_path: Path) -> None:
    for job in ("a", "b"):
        (tmp_path / job).mkdir()
        (tmp_path / job / "rank-000.metrics.jsonl").write_text("".join(step(k, job=job) for k in range(4)))
    result = lockstep(
        "once",
        "--collector.disable-defaults",
        "--collector.training",
        "--training.logs",
        str(tmp_path / "a" / "*.jsonl"),
        "--training.logs",
        str(tmp_path / "b" / "*.jsonl"),
        "--training.start-at",
        "beginning",
    )
    assert result.returncode == 0, result.stderr
    s = samples(result.stdout)
    assert rank(s, "steps_total", 0, job="a") == 4
    assert rank(s, "steps_total", 0, job="b") == 4
    bad = lockstep("once", "--training.start-at", "middle")
    assert bad.returncode == 2
    assert bad.stderr == "lockstep: --training.start-at: expected one of end, beginning, got 'middle'\n"


# --- Ended or hung: does a process still hold the rank's log open for writing? ---------------


def own_procfs(tmp_path: Path) -> Path:
    """A procfs root holding only this test's process (a link to its real /proc/PID), so the
    writer scan reads real descriptors and is complete whatever else runs on the machine."""
    root = tmp_path / "proc"
    root.mkdir()
    (root / str(os.getpid())).symlink_to(f"/proc/{os.getpid()}")
    return root


def idle_collector(log: Path, procfs: Path, idle_timeout: float = 600.0) -> tuple[TrainingCollector, list[float]]:
    options = TrainingOptions(logs=(str(log),), start_at="beginning", idle_timeout=idle_timeout)
    t = [1000.0]
    seams = Seams(MONOTONIC_CLOCK.replaced_by(lambda: t[0]))
    collector = TrainingCollector(dataclasses.replace(context(proc=procfs, options=options), seams=seams))
    return collector, t


def test_a_hung_rank_is_kept_while_its_process_holds_its_log(tmp_path: Path) -> None:
    """A rank whose process is alive but logs nothing (blocked in a collective, stopped) is hung,
    not finished: it stays, with its writer counted, past idle_timeout; once the process has
    closed the log (exited), it is dropped at the next check."""
    log = tmp_path / "rank-000.metrics.jsonl"
    writer = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)  # as StepLog holds it
    reader = os.open(log, os.O_RDONLY)  # a reader (tail -f, the agent itself) is no writer
    try:
        os.write(writer, "".join(step(k) for k in range(3)).encode())
        collector, t = idle_collector(log, own_procfs(tmp_path))
        s = run(collector)
        assert ranks(s) == [("7", "0")]
        assert [k for k in s if k[0] == "lockstep_training_log_writer_processes"] == []  # logging: not counted
        t[0] += 59
        assert (
            "lockstep_training_log_writer_processes",
            frozenset({"job_id": "7", "rank": "0", "host": "h"}.items()),
        ) not in run(collector)
        t[0] += 1  # idle for a minute: counted
        assert rank(run(collector), "log_writer_processes", 0) == 1
        t[0] += 700  # past idle_timeout (600 s), still held open: hung, kept
        s = run(collector)
        assert ranks(s) == [("7", "0")]
        assert rank(s, "log_writer_processes", 0) == 1
        assert rank(s, "steps_total", 0) == 3
    finally:
        os.close(writer)
    t[0] += 30  # checked at most once a minute
    assert ranks(run(collector)) == [("7", "0")]
    t[0] += 30
    s = run(collector)
    collector.close()
    os.close(reader)
    assert ranks(s) == []


def test_a_finished_rank_is_dropped_a_minute_after_its_last_step(tmp_path: Path) -> None:
    """A real process writes three steps and exits: a minute later its rank is gone, not after
    idle_timeout (an hour here)."""
    log = tmp_path / "rank-000.metrics.jsonl"
    code = (
        "import os, sys; fd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644); "
        "os.write(fd, sys.stdin.read().encode())"
    )
    subprocess.run(
        [sys.executable, "-c", code, str(log)], input="".join(step(k) for k in range(3)), check=True, text=True
    )
    collector, t = idle_collector(log, Path("/proc"), idle_timeout=3600)
    assert ranks(run(collector)) == [("7", "0")]
    t[0] += 60
    s = run(collector)
    collector.close()
    assert ranks(s) == []
