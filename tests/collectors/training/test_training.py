"""Training collector on real files appended by writer threads: exact counts and sums
through growth, partial lines, garbage, rotation, truncation and huge existing files.

Times are binary fractions (1.0, 0.5, 0.25, 0.125) so sums are exact.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import subprocess
import sys
import threading
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lockstep.agent.collector import CollectorContext, NothingHere, Paths
from lockstep.agent.seams import MONOTONIC_CLOCK, WALL_CLOCK, Seams
from lockstep.collectors.toolkit.follow import _CHUNK, MAX_LINES, FileFollower
from lockstep.collectors.training import TrainingCollector, TrainingOptions
from lockstep.collectors.training.collector import DEFAULT_MAX_RANKS
from lockstep.collectors.training.steps import PENDING_STEP_FLUSH_SECONDS
from lockstep.emitter import step_lines
from tests.support import (
    GENERATED,
    REPO,
    collected,
    context,
    lockstep,
    samples,
)
from tests.support.served import of, self_metric, served
from tests.support.training_logs import log_record, log_steps


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


def step(number: int, *, rank: int = 0, job: str = "7", ts: float | None = None, host: str = "h") -> str:
    """One step as the emitter writes it: wall 1.0 = data 0.125 + compute 0.5 + comm 0.25 + rest."""
    return step_lines(
        job_id=job,
        rank=rank,
        host=host,
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


@pytest.mark.real
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


def idle_collector(
    log: Path, procfs: Path, idle_timeout: float = 600.0, node_name: str = "h"
) -> tuple[TrainingCollector, list[float]]:
    """The collector of one log on node `node_name` (step() writes host "h"), and its clock."""
    options = TrainingOptions(logs=(str(log),), start_at="beginning", idle_timeout=idle_timeout, node_name=node_name)
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


@pytest.mark.real
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


def test_a_rank_another_node_logs_is_not_taken_for_ended_and_ends_by_idle_timeout(tmp_path: Path) -> None:
    """A log written from another node to a shared filesystem: no process of this node holds it,
    whether its rank runs, pauses for a checkpoint or ended.  So no writer found says nothing of
    it, even where the agent sees every process (as root): a pause of over a minute does not drop
    it (it did, and its counters started again from 0), it ends by idle_timeout.  Read by its own
    node's agent (its host named in full, h2.cluster.example, is node h2), it has ended.  A
    writer found here counts whatever host the records name (a Kubernetes pod's rank names its
    pod): that rank runs."""
    remote = tmp_path / "logs" / "rank-008.metrics.jsonl"
    remote.parent.mkdir()
    remote.write_text("".join(step(k, rank=8, host="h2.cluster.example") for k in range(3)))  # then closed
    pod = tmp_path / "logs" / "rank-009.metrics.jsonl"
    writer = os.open(pod, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)  # its process, alive here
    os.write(writer, "".join(step(k, rank=9, host="trainer-0") for k in range(3)).encode())
    elsewhere, t = idle_collector(tmp_path / "logs" / "rank-*.jsonl", own_procfs(tmp_path), node_name="h")
    home, t_home = idle_collector(remote, tmp_path / "proc", node_name="h2")
    try:
        assert ranks(run(elsewhere)) == [("7", "8"), ("7", "9")]
        assert ranks(run(home)) == [("7", "8")]
        t[0] += 120  # idle for two minutes: the writer check has run
        t_home[0] += 120
        s = run(elsewhere)
        assert ranks(s) == [("7", "8"), ("7", "9")]
        writers = {dict(k[1])["rank"]: v for k, v in s.items() if k[0] == "lockstep_training_log_writer_processes"}
        assert writers == {"9": 1}  # rank 8's: not known here, not exported
        assert rank(s, "steps_total", 8, host="h2.cluster.example") == 3
        assert ranks(run(home)) == []  # its node saw no process holding it: ended
        t[0] += 480  # idle_timeout since their last records: rank 9's process still holds its log
        assert ranks(run(elsewhere)) == [("7", "9")]
    finally:
        os.close(writer)
        elsewhere.close()
        home.close()


def unprivileged_procfs(tmp_path: Path) -> Path:
    """A procfs root with one process whose descriptors cannot be listed (as other users' are
    to the unprivileged agent: its `fd` is no directory here, root reads everything)."""
    procfs = tmp_path / "proc"
    (procfs / "4242").mkdir(parents=True)
    (procfs / "4242" / "fd").write_text("")
    return procfs


def wait_for_ranks(collector: TrainingCollector, wanted: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The ranks exported once they are `wanted` (the close events come from watchdog's thread), or after 10 s."""
    deadline = time.monotonic() + 10
    found = ranks(run(collector))
    while found != wanted and time.monotonic() < deadline:
        time.sleep(0.02)
        found = ranks(run(collector))
    return found


def test_an_unprivileged_agent_drops_a_finished_rank_when_its_writer_closes_the_log(tmp_path: Path) -> None:
    """The shipped unit runs unprivileged: other users' descriptors cannot be read, so the
    writer count is unknown.  The kernel still tells any watcher of the directory that a
    writer closed the log (IN_CLOSE_WRITE, as when the rank's process exits): a rank whose
    writer held its log open across its steps (lockstep.emitter's StepLog) is dropped a minute
    after its last step once it closed it, not after idle_timeout (an hour here).  Until the
    close, it is kept (a pause for a checkpoint save looks the same)."""
    log = tmp_path / "logs" / "rank-000.metrics.jsonl"
    log.parent.mkdir()
    writer = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(writer, step(0).encode())
    collector, t = idle_collector(log, unprivileged_procfs(tmp_path), idle_timeout=3600)
    try:
        assert ranks(run(collector)) == [("7", "0")]  # the first run also starts the watch
        t[0] += 2
        os.write(writer, (step(1) + step(2)).encode())
        assert rank(run(collector), "steps_total", 0) == 3
        t[0] += 60
        s = run(collector)
        assert ranks(s) == [("7", "0")]  # idle for a minute, writer unknown, log still open: kept
        assert [k for k in s if k[0] == "lockstep_training_log_writer_processes"] == []  # unknown: not exported
        os.close(writer)
        assert wait_for_ranks(collector, []) == []
    finally:
        collector.close()


def test_a_writer_that_reopens_its_log_for_each_write_is_not_taken_as_ended_by_its_closes(tmp_path: Path) -> None:
    """A writer that opens the log for each write (a plain `open(path, "a")` per step) closes it
    every time: past its first write the closes say nothing, and an idle rank of it is kept
    until idle_timeout, as before."""
    log = tmp_path / "logs" / "rank-000.metrics.jsonl"
    log.parent.mkdir()
    log.write_text(step(0))
    collector, t = idle_collector(log, unprivileged_procfs(tmp_path), idle_timeout=600)
    try:
        assert ranks(run(collector)) == [("7", "0")]
        for k in range(1, 4):
            t[0] += 2
            with open(log, "a") as append:
                append.write(step(k))
            time.sleep(0.2)  # its close event arrives before the next write
            run(collector)
        t[0] += 120
        assert ranks(run(collector)) == [("7", "0")]
        t[0] += 600
        assert ranks(run(collector)) == []
    finally:
        collector.close()


# --- training logs ---


def _rank_value(values: dict, name: str, rank: int = 0) -> float:
    return values[(f"lockstep_training_{name}", frozenset({("job_id", "7"), ("rank", str(rank)), ("host", "h")}))]


@pytest.mark.parametrize("bad", [1e308, 10**400, -1, "1e3"], ids=["1e308", "400 digits", "negative", "string"])
def test_a_bad_training_value_is_counted_and_costs_nothing_else(tmp_path: Path, bad: object) -> None:
    log = tmp_path / "rank-0.jsonl"
    # A bad value, then ten good steps in the same read: all ten are counted.
    log.write_text(log_steps(0, 2) + log_record(2, "step_time_sec", bad) + log_steps(3, 10))
    collector = _training(tmp_path / "*.jsonl")
    values = collected(collector)
    assert _rank_value(values, "steps_total") == 12
    assert _rank_value(values, "step_seconds_total") == 12.0
    reason = "bad_value"
    assert values[("lockstep_training_log_lines_invalid_total", frozenset({("reason", reason)}))] == 1
    assert all(math.isfinite(v) for v in values.values())


@pytest.mark.parametrize("field,bad", [("ts", 10**400), ("ts", 1e308), ("rank", 10**400)])
def test_a_bad_timestamp_or_rank_is_counted_as_a_bad_record(tmp_path: Path, field: str, bad: object) -> None:
    log = tmp_path / "rank-0.jsonl"
    record = json.loads(log_record(2, "step_time_sec", 1.0))
    record[field] = bad
    log.write_text(log_steps(0, 2) + json.dumps(record) + "\n" + log_steps(3, 10))
    values = collected(_training(tmp_path / "*.jsonl"))
    assert _rank_value(values, "steps_total") == 12
    assert values[("lockstep_training_log_lines_invalid_total", frozenset({("reason", "bad_record")}))] == 1


@pytest.mark.parametrize("future_ts", [253402300799, "9999-12-31T23:59:59Z", 1_767_312_000 + 2 + 61])
def test_a_record_stamped_in_the_future_is_refused_and_never_pins_the_last_step(
    tmp_path: Path, future_ts: object
) -> None:
    """Issue 29 item 12: one step stamped in year 9999 pinned last_step_timestamp there, so the
    rank could never be seen as hung.  The agent's wall clock is the last good step's ts + 2 s;
    past it by more than the tolerance (60 s) a record is refused."""
    log = tmp_path / "rank-0.jsonl"
    future = json.loads(log_record(2, "step_time_sec", 1.0))
    future["ts"] = future_ts
    # Steps 0 and 1 good, step 2's step time from the future, steps 3..12 good (ts up to +12).
    log.write_text(log_steps(0, 2) + json.dumps(future) + "\n" + log_steps(3, 10))
    collector = TrainingCollector(
        dataclasses.replace(
            context(options=TrainingOptions(logs=(str(tmp_path / "*.jsonl"),), start_at="beginning")),
            seams=Seams(WALL_CLOCK.replaced_by(lambda: 1_767_312_000 + 2)),
        )
    )
    values = collected(collector)
    assert _rank_value(values, "last_step_timestamp_seconds") == 1_767_312_000 + 12
    assert _rank_value(values, "steps_total") == 12
    assert values[("lockstep_training_log_lines_invalid_total", frozenset({("reason", "bad_record")}))] == 1


def test_a_double_star_glob_over_symlink_loops_ends(tmp_path: Path) -> None:
    logs = tmp_path / "logs" / "job=7"
    (logs / "a" / "b").mkdir(parents=True)
    (logs / "a" / "b" / "up").symlink_to("../..")  # a loop
    (logs / "self").symlink_to(".")  # another
    (logs / "a" / "b" / "rank-0.jsonl").write_text(log_steps(0, 3))
    collector = _training(tmp_path / "logs" / "**" / "*.jsonl")
    result: list[dict] = []
    thread = threading.Thread(target=lambda: result.append(collected(collector)), daemon=True)
    thread.start()
    thread.join(60)  # Python's glob never returned here
    assert result, "the round did not end"
    assert _rank_value(result[0], "steps_total") == 3
    assert result[0][("lockstep_training_log_files", frozenset())] == 1  # the file once, not once per loop
    collector.close()


@pytest.mark.real
def test_the_files_followed_stay_within_a_quarter_of_the_descriptor_limit(tmp_path: Path) -> None:
    """200 ranks' logs, 64 descriptors: the collector follows 16 (a quarter of the limit), says
    once that the others are left unread, and the ones followed are never closed and read again
    from the start (the issue saw steps_total 4 for ranks that logged one step)."""
    for rank in range(200):
        (tmp_path / f"rank-{rank}.jsonl").write_text(log_steps(0, 2, rank=rank))
    script = (
        "import json, logging, resource, sys\n"
        "from pathlib import Path\n"
        "from tests.support import collected, context\n"
        "from lockstep.collectors.training import TrainingCollector, TrainingOptions\n"
        "logging.basicConfig(level=logging.WARNING, format='%(levelname)s %(message)s')\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))\n"
        "c = TrainingCollector(context(options=TrainingOptions(logs=(sys.argv[1],), start_at='beginning')))\n"
        "rounds = [collected(c) for _ in range(4)]\n"
        "steps = [sorted(v for (n, _), v in r.items() if n == 'lockstep_training_steps_total') for r in rounds]\n"
        "skipped = [r[('lockstep_training_skipped_log_files', frozenset())] for r in rounds]\n"
        "print(json.dumps([steps, skipped]))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "*.jsonl")], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert result.returncode == 0, result.stderr
    rounds, skipped = json.loads(result.stdout)
    assert [len(steps) for steps in rounds] == [16] * 4
    assert all(set(steps) == {2} for steps in rounds)  # never more than the two steps logged
    assert skipped == [184] * 4
    errors = [line for line in result.stderr.splitlines() if line.startswith("ERROR")]
    assert errors == [
        "ERROR some log files cannot be followed: 200 files match; following 16 at most (max_files), 184 left unread"
    ]


@pytest.mark.real
def test_running_out_of_file_descriptors_is_loud_and_never_rereads(tmp_path: Path) -> None:
    """200 ranks' logs, 64 descriptors of which something else took all but 10 (fewer than the
    collector's 16): the files that cannot be opened are reported as an error, and the ones
    followed are never closed and read again from the start (the issue saw steps_total 4 for
    ranks that logged one step)."""
    for rank in range(200):
        (tmp_path / f"rank-{rank}.jsonl").write_text(log_steps(0, 2, rank=rank))
    script = (
        "import json, logging, os, resource, sys\n"
        "from pathlib import Path\n"
        "from tests.support import collected, context\n"
        "from lockstep.collectors.training import TrainingCollector, TrainingOptions\n"
        "logging.basicConfig(level=logging.WARNING, format='%(levelname)s %(message)s')\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))\n"
        "c = TrainingCollector(context(options=TrainingOptions(logs=(sys.argv[1],), start_at='beginning')))\n"
        "taken = []\n"
        "try:\n"
        "    while True:\n"
        "        taken.append(os.open(os.devnull, os.O_RDONLY))\n"
        "except OSError:\n"
        "    pass\n"
        "for fd in taken[:10]:\n"
        "    os.close(fd)\n"
        "rounds = [collected(c) for _ in range(4)]\n"
        "steps = [sorted(v for (n, _), v in r.items() if n == 'lockstep_training_steps_total') for r in rounds]\n"
        "print(json.dumps(steps))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "*.jsonl")], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert result.returncode == 0, result.stderr
    rounds = json.loads(result.stdout)
    assert all(steps and set(steps) == {2} for steps in rounds)  # never more than the two steps logged
    assert len(rounds[-1]) < 16  # not even the collector's share could be followed
    errors = [line for line in result.stderr.splitlines() if line.startswith("ERROR")]
    # Once per change (opening failed; then listing the directory did too), not per file or round.
    assert 1 <= len(errors) <= 2
    assert "out of file descriptors: " in errors[0]
    assert all("out of file descriptors" in e or "too many open files" in e for e in errors)


def test_more_matching_files_than_max_files_are_reported_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    for rank in range(8):
        (tmp_path / f"rank-{rank}.jsonl").write_text(log_steps(0, 1, rank=rank))
    follower = FileFollower([str(tmp_path / "*.jsonl")], start_at_end=False, max_files=5, log=logging.getLogger("t"))
    with caplog.at_level(logging.ERROR, logger="t"):
        for _ in range(3):
            list(follower.sweep())
    assert follower.followed == 5
    assert follower.skipped == 3
    assert [r.getMessage() for r in caplog.records] == [
        "some log files cannot be followed: 8 files match; following 5 at most (max_files), 3 left unread"
    ]
    follower.close()


json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(10**400), max_value=10**400), st.floats(), st.text(max_size=8)
)


@GENERATED
@given(st.lists(st.fixed_dictionaries({"value": json_scalars, "ts": json_scalars, "rank": json_scalars}), max_size=8))
def test_any_training_record_costs_only_itself(tmp_path_factory: pytest.TempPathFactory, bad: list[dict]) -> None:
    directory = tmp_path_factory.mktemp("gen")
    lines = []
    for record in bad:
        full = {"job_id": "7", "host": "h", "step": 1000, "metric": "step_time_sec", **record}
        lines.append(json.dumps(full) + "\n")
    (directory / "rank-0.jsonl").write_text(log_steps(0, 3) + "".join(lines) + log_steps(2000, 3))
    collector = _training(directory / "*.jsonl")
    first = collected(collector)
    assert _rank_value(first, "steps_total") >= 5  # the good steps around the generated ones
    assert all(math.isfinite(v) for v in first.values())
    with open(directory / "rank-0.jsonl", "a") as log:
        log.write(log_steps(3000, 2))
    second = collected(collector)
    for key, value in first.items():
        if key[0].endswith("_total") and key in second:
            assert second[key] >= value  # counters only grow
    collector.close()


# --- item 4: characters UTF-8 cannot encode ---


def test_a_surrogate_job_id_costs_nothing_of_a_healthy_job(tmp_path: Path) -> None:
    lines = [log_record(n, "step_time_sec", 2.0, job=job) for n in range(3) for job in ("7", "\ud800")]
    (tmp_path / "ranks.jsonl").write_text("".join(lines))
    opts = TrainingOptions(logs=(str(tmp_path / "*.jsonl"),), start_at="beginning")
    result = served(TrainingCollector(context(options=opts)))
    for values in (result.text, result.openmetrics):
        healthy = {"job_id": "7", "rank": "0", "host": "h"}
        assert of(values, "lockstep_training_steps_total", **healthy) == 3
        assert of(values, "lockstep_training_step_seconds_total", **healthy) == 6.0
        # The bad job is served too, its id backslash-escaped (six ASCII characters).
        bad = {"job_id": "\\ud800", "rank": "0", "host": "h"}
        assert of(values, "lockstep_training_steps_total", **bad) == 3
    bad_series = [labels for name, labels in result.text if ("job_id", "\\ud800") in labels]
    assert self_metric(result, "up", "training") == 1
    assert self_metric(result, "altered_label_values_total", "training") == len(bad_series) == 6
    assert self_metric(result, "rejected_samples_total", "training") == 0


def _training(*globs: Path | str, **options: object) -> TrainingCollector:
    return TrainingCollector(
        context(options=TrainingOptions(logs=tuple(str(g) for g in globs), start_at="beginning", **options))  # type: ignore[arg-type]
    )


def _invalid(values: dict, reason: str) -> float:
    return values[("lockstep_training_log_lines_invalid_total", frozenset({("reason", reason)}))]


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
            f.write(log_steps(0, 3))
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
    log.write_text("".join(log_steps(0, 2, job="9", rank=0, host=f"host{i:04d}") for i in range(1100)))
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
            f.write(log_steps(2, 4, job="9", host="host0000") + log_steps(0, 1, job="9", host="host5000"))
        values = collected(collector)
        assert _steps(values, "9", 0, "host0000") == 6  # held ranks keep their data
        assert _invalid(values, "too_many_ranks") == 76 * 4 + 2
        assert len([n for (n, _) in values if n == "lockstep_training_steps_total"]) == 1024
    finally:
        collector.close()


def test_max_ranks_is_an_option(tmp_path: Path) -> None:
    log = tmp_path / "ranks.jsonl"
    log.write_text("".join(log_steps(0, 2, job="9", rank=rank, host="h") for rank in range(5)))
    collector = _training(tmp_path / "*.jsonl", max_ranks=3)
    try:
        values = collected(collector)
        assert [_steps(values, "9", rank, "h") for rank in range(5)] == [2, 2, 2, None, None]
        assert _invalid(values, "too_many_ranks") == 2 * 4
    finally:
        collector.close()
