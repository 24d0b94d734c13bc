"""Replaying the real DDP runs of tests/fixtures/training/ (bench/ddp_runs.py) through the real
training collector into promtool input series: at their own timestamps (`replay_as_written`,
issue 34), or stretched and looped in simulated time (`replay`, the older short runs).  The
scrapes also as OpenMetrics (`openmetrics`), to backfill a real Prometheus with them.

`replay_as_written` plays every step of every rank as the run logged it, at the time it logged
it (shifted so that the run's first record is at the replay's time 0: an origin, not a scale),
and scrapes the real collector every `scrape` seconds; nothing is stretched, looped or
reordered.  What follows is the stretching replay's description.

tests/fixtures/training/README.md says what the runs are and how a replay stretches them; in
short: every replayed step is a real step of the run, with its real phase times multiplied by
one factor per case (`stretch`) so that the run's median step lasts STEP_SECONDS, in the run's
order, the healthy steps (before the onset) looped for `healthy_minutes` and then the steps
after the onset looped for `fault_minutes`; then the job ends (its logs are closed, nothing more
is written) and the scrapes go on for `after_minutes`.  The ranks' log lines are the emitter's
(lockstep.emitter.step_lines), stamped with the simulated time, appended to one file per rank
that this process holds open for writing while the job runs (as a rank process would), and read
by the real TrainingCollector every SCRAPE seconds of simulated time.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from alerts import render
from lockstep import __version__
from lockstep.agent.collector import CollectorContext, Paths
from lockstep.agent.seams import MONOTONIC_CLOCK, WALL_CLOCK, Seams
from lockstep.collectors.training import TrainingCollector, TrainingOptions
from lockstep.emitter import step_lines
from tests.support import FIXTURES, require_promtool

TRAINING_FIXTURES = FIXTURES / "training"
STEP_SECONDS = 2.0  # a replayed step's mean duration
SCRAPE = 30  # seconds of simulated time between scrapes (and rule evaluations)
TARGET = {"cluster": "replay", "instance": "node001:12400", "job": "lockstep"}
PHASES = ("data_time_sec", "compute_time_sec", "comm_wait_time_sec")

Series = dict[frozenset[tuple[str, str]], dict[int, float]]


@dataclass(frozen=True)
class Case:
    name: str
    meta: dict[str, Any]
    steps: list[list[dict[str, float]]]  # per rank, per step: metric -> value, as logged

    @property
    def ranks(self) -> int:
        return len(self.steps)

    @property
    def onset(self) -> int | None:
        onset = self.meta.get("onset_step")
        return int(onset) if onset is not None else None

    def stretch(self, step_seconds: float = STEP_SECONDS) -> float:
        """The factor every phase time is multiplied by: the run's median step becomes step_seconds."""
        wall = sorted(step["step_time_sec"] for step in self.steps[0])
        return step_seconds / wall[len(wall) // 2]


def load_case(name: str) -> Case:
    directory = TRAINING_FIXTURES / name
    meta = json.loads((directory / "case.json").read_text())
    steps = []
    for rank in range(int(meta["ranks"])):
        by_step: dict[int, dict[str, float]] = {}
        with gzip.open(directory / f"rank-{rank:03d}.metrics.jsonl.gz", "rt") as lines:
            for line in lines:
                record = json.loads(line)
                by_step.setdefault(int(record["step"]), {})[record["metric"]] = float(record["value"])
        steps.append([by_step[number] for number in sorted(by_step)])
    return Case(name, meta, steps)


@dataclass(frozen=True)
class Segment:
    """Steps first..last-1 of the run (per rank), looped for this many simulated minutes (None:
    played once)."""

    first: int
    last: int
    minutes: float | None


def timeline(case: Case, segments: list[Segment], rank_sources: list[int] | None = None,
             offsets: list[int] | None = None, step_seconds: float = STEP_SECONDS
             ) -> Iterator[tuple[float, list[dict[str, float]]]]:  # fmt: skip
    """(end time of the step, each replayed rank's stretched values) for each replayed step.

    rank_sources[i] is the run's rank that replayed rank i takes its steps from (default: its
    own), offsets[i] how many steps into each segment it starts its loop (default 0): a job of
    more ranks than the run had is made of the run's real ranks, each copy out of phase."""
    sources = rank_sources or list(range(case.ranks))
    shifts = offsets or [0] * len(sources)
    k = case.stretch(step_seconds)
    t = 0.0
    for segment in segments:
        length = segment.last - segment.first
        end = t + segment.minutes * 60 if segment.minutes is not None else None
        i = 0
        while (t < end) if end is not None else (i < length):
            rows = []
            for source, shift in zip(sources, shifts, strict=True):
                step = case.steps[source][segment.first + (i + shift) % length]
                rows.append({metric: value * k if metric.endswith("_sec") else value for metric, value in step.items()})
            t += rows[0]["step_time_sec"]  # the job's steps end together: rank 0's clock
            i += 1
            yield t, rows


# The node the replayed job runs on, as its ranks' records name it (all of them: one node).
REPLAY_HOST = "node001"


class _ReplayedJob:
    """The replayed job's rank logs, held open for writing by this process (as the rank
    processes held theirs), and the real training collector reading them on a simulated clock."""

    def __init__(self, directory: Path, ranks: int, job_id: str, scrape: float) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.files = [
            os.open(directory / f"rank-{rank:03d}.metrics.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            for rank in range(ranks)
        ]
        # The agent on the job's node: the ranks' logs name it (their host field).
        options = TrainingOptions(
            logs=(str(directory / "rank-*.metrics.jsonl"),), start_at="beginning", node_name=REPLAY_HOST
        )
        self.now = 0.0
        seams = Seams(MONOTONIC_CLOCK.replaced_by(lambda: self.now), WALL_CLOCK.replaced_by(lambda: self.now))
        self.collector = TrainingCollector(
            CollectorContext(Paths(), options, logging.getLogger("replay.training"), seams)
        )
        self.job_id = job_id
        self.scrape_every = scrape
        self.next_scrape = 0.0
        self.series: Series = {}
        self.index = 0  # scrapes so far

    def scrape_until(self, t: float) -> None:
        """Every scrape due before simulated time t."""
        while self.next_scrape < t:
            self.now = self.next_scrape
            for labels, value in _scrape(self.collector):
                self.series.setdefault(frozenset({**labels, **TARGET}.items()), {})[self.index] = value
            self.index += 1
            self.next_scrape += self.scrape_every

    def write(self, rank: int, host: str, step: int, t: float, values: dict[str, float]) -> None:
        """One step of a rank, as lockstep.emitter writes it, stamped t."""
        text = step_lines(
            job_id=self.job_id,
            rank=rank,
            host=host,
            step=step,
            ts=t,
            step_time=values["step_time_sec"],
            compute_time=values.get("compute_time_sec"),
            comm_wait_time=values.get("comm_wait_time_sec"),
            data_time=values.get("data_time_sec"),
            samples=values.get("samples"),
        )
        os.write(self.files[rank], text.encode())

    def end(self, after_minutes: float) -> int:
        """The job ends (its ranks' processes exit: their logs close); scrapes go on for
        after_minutes.  Returns the index of the first scrape after the job's last step."""
        self.close_files()
        ended_at_index = self.index
        self.scrape_until(self.next_scrape + after_minutes * 60 + self.scrape_every / 2)
        return ended_at_index

    def close_files(self) -> None:
        for fd in self.files:
            os.close(fd)
        self.files = []

    def close(self) -> None:
        self.close_files()
        self.collector.close()


def replay(case: Case, segments: list[Segment], after_minutes: float, directory: Path,
           rank_sources: list[int] | None = None, offsets: list[int] | None = None,
           step_seconds: float = STEP_SECONDS) -> tuple[Series, int]:  # fmt: skip
    """Scrapes of the real training collector every SCRAPE seconds while the replayed job writes
    its logs, and for after_minutes after it ended.  Returns the series and the index of the
    first scrape after the job's last step."""
    sources = rank_sources or list(range(case.ranks))
    job = _ReplayedJob(directory, len(sources), case.meta["job_id"], SCRAPE)
    try:
        step_numbers = [0] * len(sources)
        for t, rows in timeline(case, segments, rank_sources, offsets, step_seconds):
            job.scrape_until(t)
            for rank, values in enumerate(rows):
                job.write(rank, REPLAY_HOST, step_numbers[rank], t, values)
                step_numbers[rank] += 1
        ended_at_index = job.end(after_minutes)
    finally:
        job.close()
    return job.series, ended_at_index


@dataclass(frozen=True)
class WrittenStep:
    ts: float  # the record's own time (seconds since the epoch)
    values: dict[str, float]  # metric -> value, as logged


def load_written(name: str, root: Path = TRAINING_FIXTURES) -> tuple[dict[str, Any], list[list[WrittenStep]]]:
    """A run's case.json and, per rank, its steps in the order logged, with their timestamps."""
    directory = root / name
    meta = json.loads((directory / "case.json").read_text())
    ranks = []
    for rank in range(int(meta["ranks"])):
        by_step: dict[int, WrittenStep] = {}
        with gzip.open(directory / f"rank-{rank:03d}.metrics.jsonl.gz", "rt") as lines:
            for line in lines:
                record = json.loads(line)
                ts = datetime.fromisoformat(record["ts"].replace("Z", "+00:00")).timestamp()
                step = by_step.setdefault(int(record["step"]), WrittenStep(ts, {}))
                step.values[record["metric"]] = float(record["value"])
        ranks.append([by_step[number] for number in sorted(by_step)])
    return meta, ranks


def onset_seconds(meta: dict[str, Any], ranks: list[list[WrittenStep]]) -> float:
    """When the straggler's first slow step began, in seconds after the run's first record (the
    replay's time 0): the end of its step before `onset_step` (0 for a rank slow from the start).
    The run decides the onset at a step (every rank's clock agrees on it), so its time is the
    log's, not case.json's `onset_seconds`, which is when the ranks were asked to begin it."""
    onset = int(meta["onset_step"])
    if onset == 0:
        return 0.0
    origin = min(steps[0].ts for steps in ranks)
    return ranks[int(meta["straggler_rank"])][onset - 1].ts - origin


def replay_as_written(name: str, directory: Path, scrape: int, after_minutes: float,
                      until: float | None = None, root: Path = TRAINING_FIXTURES,
                      ) -> tuple[Series, int, float]:  # fmt: skip
    """Scrapes of the real training collector every `scrape` seconds while the run's steps are
    written at their own times (relative to the run's first record), then for after_minutes
    after the job ended (its logs closed, as its rank processes' were when they exited).
    `until` cuts the run that many seconds after its first record (the cut is the job's end).
    Returns the series, the index of the first scrape after the job's last step, and the
    run's first record's time (the replay's origin)."""
    meta, ranks = load_written(name, root)
    origin = min(steps[0].ts for steps in ranks)
    merged = sorted(
        (step.ts - origin, rank, number, step.values)
        for rank, steps in enumerate(ranks)
        for number, step in enumerate(steps)
        if until is None or step.ts - origin <= until
    )
    job = _ReplayedJob(directory, len(ranks), meta["job_id"], scrape)
    try:
        for t, rank, number, values in merged:
            job.scrape_until(t)
            job.write(rank, REPLAY_HOST, number, t, values)
        ended_at_index = job.end(after_minutes)
    finally:
        job.close()
    return job.series, ended_at_index, origin


# The real runs' one replay each (`WrittenReplays`): scraped every WRITTEN_SCRAPE seconds, as in
# production, and for WRITTEN_AFTER_MINUTES after the job's end, the longest any test reads.
WRITTEN_SCRAPE = 15
WRITTEN_AFTER_MINUTES = 10.0


@dataclass(frozen=True)
class WrittenReplay:
    """One replay of a real run at its own timestamps (`replay_as_written`)."""

    series: Series
    ended: int  # the index of the first scrape after the job's last step
    origin: float  # the run's first record's time
    scrape: int

    def after(self, minutes: float) -> Series:
        """The series as a replay that scraped only `minutes` after the job's end made them: the
        same scrapes, the later ones left out (the replay is the same up to there)."""
        last = self.ended + round(minutes * 60 / self.scrape)
        cut = {labels: {i: v for i, v in values.items() if i <= last} for labels, values in self.series.items()}
        return {labels: values for labels, values in cut.items() if values}


class WrittenReplays:
    """Each real run replayed once for the whole test session (the conftest's `written_replays`
    fixture), whichever tests read it: tests/alerts/test_straggler_real_timing.py evaluates the
    rules over a replay, tests/report/test_report_ddp_runs.py reports on the same one."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.replays: dict[tuple[str, float | None], WrittenReplay] = {}

    def get(self, name: str, until: float | None = None) -> WrittenReplay:
        key = (name, until)
        if key not in self.replays:
            logs = self.directory / f"{name}-{until}"
            series, ended, origin = replay_as_written(name, logs, WRITTEN_SCRAPE, WRITTEN_AFTER_MINUTES, until=until)
            shutil.rmtree(logs, ignore_errors=True)  # the rank logs written: the series is what is kept
            self.replays[key] = WrittenReplay(series, ended, origin, WRITTEN_SCRAPE)
        return self.replays[key]


def openmetrics(series: Series, scrape: float, start: float, labels: dict[str, str] | None = None) -> Iterator[str]:
    """The scrapes as OpenMetrics text for `promtool tsdb create-blocks-from openmetrics`: scrape
    i stamped start + i * scrape (Unix seconds: a constant shift of the replay's clock, every
    interval kept), one series after the other, each in time order, with `labels` set on every
    series (the cluster of several runs in one Prometheus).  No metadata (every family untyped,
    as promtool accepts it), and no `# EOF`: the caller ends the text after its last run."""
    for key, values in sorted(series.items(), key=lambda item: sorted(item[0])):
        items = {**dict(key), **(labels or {})}
        name = items.pop("__name__")
        inside = ",".join(f'{k}="{_escaped(v)}"' for k, v in sorted(items.items()) if v != "")
        yield "".join(f"{name}{{{inside}}} {values[i]!r} {start + i * scrape:.3f}\n" for i in sorted(values))


def _escaped(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _scrape(collector: TrainingCollector) -> Iterator[tuple[dict[str, str], float]]:
    """One round of the collector plus what the agent adds (as tests/alerts/test_alerts_replay.py)."""
    yield {"__name__": "up"}, 1.0
    yield {"__name__": "lockstep_build_info", "version": __version__}, 1.0
    for family in collector.collect():
        for sample in family.samples:
            if not sample.name.endswith("_created"):
                yield {"__name__": sample.name, **sample.labels}, sample.value
    yield {"__name__": "lockstep_collector_up", "collector": "training"}, 1.0


def input_series(series: Series, points: int) -> list[dict[str, str]]:
    """The scrapes as promtool input series ('_' where a series had no sample)."""
    out = []
    for labels, values in sorted(series.items(), key=lambda item: sorted(item[0])):
        items = dict(labels)
        name = items.pop("__name__")
        selector = name + "{" + ", ".join(f'{k}="{v}"' for k, v in sorted(items.items()) if v != "") + "}"
        text = " ".join(repr(values[i]) if i in values else "_" for i in range(points))
        out.append({"series": selector, "values": text})
    return out


def firing_timeline(series: Series, points: int, scrape: int, rule_files: list[str], every: int,
                    tmp: Path) -> dict[int, list[str]]:  # fmt: skip
    """When each alert fired: {evaluation time (s): sorted 'alertname job_id rank' of the alerts
    firing then}, every `every` seconds, from one promtool run of the given rule files over the
    series.  promtool has no way to print a query's result, so every check expects nothing and
    the failures it reports say what was there."""
    times = list(range(0, (points - 1) * scrape + 1, every))
    expr = 'count by (alertname, job_id, rank) (ALERTS{alertstate="firing"})'
    test = {
        "rule_files": rule_files,
        "evaluation_interval": f"{scrape}s",
        "group_eval_order": render.GROUP_EVAL_ORDER,
        "tests": [
            {
                "interval": f"{scrape}s",
                "input_series": input_series(series, points),
                "promql_expr_test": [{"expr": expr, "eval_time": f"{t}s", "exp_samples": []} for t in times],
            }
        ],
    }
    path = tmp / "timeline.test.yml"
    path.write_text(yaml.safe_dump(test, width=1_000_000))
    result = subprocess.run([require_promtool(), "test", "rules", str(path)], capture_output=True, text=True,
                            timeout=600)  # fmt: skip
    timeline: dict[int, list[str]] = {t: [] for t in times}
    # A failure reads: `expr: "...", time: 1h2m30s,` then `exp: (empty)` then `got: [{...} ...]`
    for block in re.split(r"\n\s*expr: ", result.stdout + result.stderr)[1:]:
        at = re.search(r"time: ([0-9hms.]+)", block)
        got = re.search(r"got:\s*(.*)", block)
        if at is None or got is None:
            continue
        labels = re.findall(r"\{([^}]*)\}", got.group(1))
        names = []
        for text in labels:
            pairs = dict(re.findall(r'(\w+)="([^"]*)"', text))
            names.append(f"{pairs.get('alertname')} {pairs.get('job_id')} {pairs.get('rank', '')}".strip())
        timeline[_seconds(at.group(1))] = sorted(names)
    if result.returncode not in (0, 1):
        raise AssertionError((result.stdout + result.stderr)[-4000:])
    return timeline


def _seconds(duration: str) -> int:
    """promtool's Go duration (1h2m30s) in seconds."""
    total = 0.0
    for number, unit in re.findall(r"([0-9.]+)(h|m|s)", duration):
        total += float(number) * {"h": 3600, "m": 60, "s": 1}[unit]
    return int(total)
