"""What the straggler rule groups cost at fleet scale: a real Prometheus evaluates the shipped rule
files on a fleet's backfilled history, at the real 15-s sample interval, with as much history as
the straggler rules read.

    .venv/bin/python bench/straggler_rules.py [--nodes 1024] [--jobs 512 256 128 ...] [--hours H]
        [--extra-rules FILE ...]

Which groups: every group whose name contains "straggler", and the alert group that holds the
LockstepTrainingStraggler* and LockstepGPUStraggler* alerts.  What it writes follows the rules,
parsed from the shipped rule files (alerts/*.rules.yml):
- the raw series: every `lockstep_*` name the straggler rules read (those groups, and of the
  alert group its straggler alerts) and the rules that record what they read (transitively,
  lockstep-training.recording's and lockstep-gpu.recording's included); each series with the
  labels the simulated node exports it with (lockstep.simulation.snapshot, relabelled per node by
  bench/fleet.py); the training counters and GPU clocks with values of their own (below), the rest
  as bench/fleet.py moves them;
- each name's history: the longest range plus offset any rule of the measured groups (or the
  recording rules they read) reads it with, capped by --hours;
- recorded series read over a range or with an offset (the change test's 6-hour median of
  `job_rank:...:ratio_to_median5m`, `... offset 1h`): a fresh Prometheus has none, so their
  history is written too, with the labels and current values the shipped rules give them (a
  first Prometheus evaluates the rules on the last minutes of their raw inputs and is asked for
  them), each value wandering by about 0.5% from sample to sample.

The fleet: --nodes nodes gpu0001.. (cluster east, scrape labels job="lockstep", instance,
cluster) of 8 ranks (8 GPUs) each, in jobs of --jobs nodes (default: half, a quarter and an
eighth of the nodes, the rest in jobs of 16, 8, 4, 2 and 1 nodes).  A rank computes 1.6 s a step
(a few % of spread between ranks), waits ~0.05 s for data, and its job steps at its slowest rank's
pace plus 0.2 s of communication (about 0.5 steps/s); in every job of at least an eighth of the
nodes one rank computes 8% slower and its GPU's SM clock runs 8% lower.

The history runs on past now by --ahead seconds (the rules run at the wall clock once building and
backfilling are done; see bench/fleet.py), is written in 2-hour slices (promtool's block length:
one block each, the disk holds one slice at a time) and backfilled with `promtool tsdb
create-blocks-from openmetrics`.  Prometheus (Debian `prometheus`) then runs on it with the
shipped rule files, unchanged, every --evaluation-interval (blocks of 2 hours at most: nothing is
compacted while it is measured), and once every group ran --rounds
times the bench prints each measured group's evaluation time (what Prometheus exports as
`prometheus_rule_group_last_duration_seconds`): the largest seen and the last (steady state),
and the slowest rules' `evaluationTime` (/api/v1/rules).  Figures only; no pass/fail.
--estimate prints the series and sample counts (and the time to write them) and stops.
tests/simulation/test_straggler_rules.py runs it on 4 nodes and 40 minutes.
"""

from __future__ import annotations

import argparse
import bisect
import functools
import math
import os
import random
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fleet  # noqa: E402  (bench/fleet.py: the simulated node's series, promtool, Prometheus)

STEP = 15  # seconds between samples: the agent's scrape interval
BLOCK = 2 * 3600  # promtool's block length: one OpenMetrics slice per block
CLUSTER = "east"
STRAGGLER_ALERTS = re.compile(r"^Lockstep(Training|GPU)Straggler")
COMPUTE = 1.6  # s a step
DATA_WAIT = 0.05
COMM = 0.2  # the least a rank waits at the collectives
RANK_SPREAD = 0.02  # relative standard deviation of ranks' compute
SLOWDOWN = 1.08  # the straggler rank's compute, and its GPU's SM clock (1/SLOWDOWN)
SM_CLOCK = 1.98e9
TRAINING_MODELLED = {
    "lockstep_training_steps_total",
    "lockstep_training_compute_seconds_total",
    "lockstep_training_comm_wait_seconds_total",
    "lockstep_training_data_wait_seconds_total",
    "lockstep_training_step_seconds_total",
    "lockstep_training_last_step_timestamp_seconds",
}

# --- The rules -----------------------------------------------------------------------------------

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_SELECTOR = re.compile(
    r"(?<![\w:])([a-zA-Z_:][\w:]*)\s*(\{[^}]*\})?\s*(?:\[(\w+)(?::\w*)?\])?(?:\s*offset\s+(-?\w+))?(?!\s*\()"
)
_DURATION = re.compile(r"(\d+)(ms|s|m|h|d|w|y)")
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}


def seconds(duration: str | None) -> float:
    """A PromQL duration (1h30m) in seconds; None is 0."""
    if not duration:
        return 0.0
    return sum(int(n) * _UNITS[unit] for n, unit in _DURATION.findall(duration.lstrip("-")))


@dataclass(frozen=True)
class Read:
    """A selector of a rule: the name it reads, and how far back (range plus offset, s)."""

    name: str
    ranged: bool
    reach: float


def reads(expr: str) -> list[Read]:
    """The series names an expression reads (lockstep_* and recorded ones), with their reach."""
    out = []
    for match in _SELECTOR.finditer(_STRING.sub('""', expr)):
        name, _, window, offset = match.groups()
        if name.startswith("lockstep_") or (":" in name and "lockstep" in name):
            out.append(Read(name, window is not None or offset is not None, seconds(window) + seconds(offset)))
    return out


@dataclass
class Rules:
    """What the measured groups read, from the shipped rule files."""

    groups: list[str]  # the measured groups, in file order
    raw: dict[str, float]  # raw name -> history to write (s)
    recorded_history: dict[str, float]  # recorded name read over a range or an offset -> history (s)
    recorded_window: float  # the longest raw range the recording of those reads (their inner window)
    recorded_inputs: set[str]  # the raw names the recording of those reads
    records: dict[str, dict[str, Any]]  # recorded name -> its (first) rule
    measured_records: list[str]  # what the measured groups record


def shipped_groups(paths: Iterable[Path] = fleet.RULE_FILES) -> list[dict[str, Any]]:
    return [group for path in paths for group in yaml.safe_load(path.read_text())["groups"]]


def rules_read(groups: list[dict[str, Any]] | None = None) -> Rules:
    groups = shipped_groups() if groups is None else groups
    records: dict[str, dict[str, Any]] = {}
    for group in groups:
        for rule in group["rules"]:
            if "record" in rule:
                records.setdefault(rule["record"], rule)

    def is_straggler_alert(rule: dict[str, Any]) -> bool:
        return bool(STRAGGLER_ALERTS.match(rule.get("alert", "")))

    measured = [g for g in groups if "straggler" in g["name"] or any(is_straggler_alert(r) for r in g["rules"])]
    # The rules whose reads decide what is written: the straggler groups', the straggler alerts',
    # and (transitively) the rules recording what those read.
    todo = [r for g in measured for r in g["rules"] if "straggler" in g["name"] or is_straggler_alert(r)]
    considered: list[dict[str, Any]] = []
    names: set[str] = set()
    while todo:
        rule = todo.pop()
        if any(rule is seen for seen in considered):
            continue
        considered.append(rule)
        for read in reads(rule["expr"]):
            names.add(read.name)
            todo.extend(r for g in groups for r in g["rules"] if r.get("record") == read.name)
    # How far back each name is read: by any rule of the measured groups or of those recording rules.
    reach: dict[str, float] = {}
    for rule in [*(r for g in measured for r in g["rules"]), *considered]:
        for read in reads(rule["expr"]):
            if read.name in names:
                reach[read.name] = max(reach.get(read.name, 0.0), read.reach)
    recorded_history: dict[str, float] = {}
    for rule in [*(r for g in measured for r in g["rules"]), *considered]:
        for read in reads(rule["expr"]):
            if read.name in records and read.name in names and read.ranged:
                recorded_history[read.name] = max(recorded_history.get(read.name, 0.0), read.reach)
    # The raw window the recording of those series reads (5m: their first samples need it), and
    # the raw names it reads.
    inner = 0.0
    inputs: set[str] = set()
    stack = list(recorded_history)
    seen: set[str] = set()
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        for read in reads(records[name]["expr"]):
            if read.name in records:
                stack.append(read.name)
            else:
                inner = max(inner, read.reach)
                inputs.add(read.name)
    raw = {name: reach.get(name, 0.0) for name in sorted(names) if name not in records}
    measured_records = sorted({r["record"] for g in measured for r in g["rules"] if "record" in r})
    return Rules([g["name"] for g in measured], raw, recorded_history, inner, inputs, records, measured_records)


# --- The fleet -----------------------------------------------------------------------------------


def default_jobs(nodes: int) -> list[int]:
    sizes = [size for size in (nodes // 2, nodes // 4, nodes // 8) if size > 0]
    rest = nodes - sum(sizes)
    small = (16, 8, 4, 2, 1)
    i = 0
    while rest > 0:
        size = min(small[i % len(small)], rest)
        sizes.append(size)
        rest -= size
        i += 1
    return sizes


@dataclass
class Job:
    job_id: str
    nodes: list[fleet.Node]
    compute: list[float]  # per rank, s a step
    data_wait: list[float]
    straggler: int | None  # the slow rank
    step: float = 0.0  # s a step: the slowest rank's own time plus communication
    began: float = 0.0  # Unix time of its first step

    @property
    def ranks(self) -> int:
        return len(self.compute)


@dataclass
class Fleet:
    nodes: list[fleet.Node] = field(default_factory=list)
    jobs: list[Job] = field(default_factory=list)


def build(nodes: int, job_sizes: list[int], start: float, seed: int = 34) -> Fleet:
    if sum(job_sizes) > nodes:
        raise SystemExit(f"--jobs hold {sum(job_sizes)} nodes, the fleet has {nodes}")
    rng = random.Random(seed)
    result = Fleet()
    index = 0
    for number, size in enumerate(job_sizes, start=1):
        job_id = str(100000 + number)
        members = [
            fleet.Node(index + i, f"gpu{index + i + 1:04d}", CLUSTER, "healthy", job_id, i, False) for i in range(size)
        ]
        index += size
        ranks = size * fleet.RANKS_PER_NODE
        compute = [COMPUTE * max(0.95, min(1.05, rng.gauss(1.0, RANK_SPREAD))) for _ in range(ranks)]
        straggler = None
        if size * 8 >= nodes:
            straggler = (size // 2) * fleet.RANKS_PER_NODE + 3  # rank 3 of the job's middle node
            compute[straggler] = COMPUTE * SLOWDOWN
        data_wait = [DATA_WAIT * max(0.5, rng.gauss(1.0, 0.2)) for _ in range(ranks)]
        job = Job(job_id, members, compute, data_wait, straggler)
        job.step = max(c + d for c, d in zip(compute, data_wait)) + COMM
        job.began = start - rng.uniform(600, 3600)
        result.jobs.append(job)
        result.nodes.extend(members)
    result.nodes.extend(
        fleet.Node(i, f"gpu{i + 1:04d}", CLUSTER, "healthy", None, 0, False) for i in range(index, nodes)
    )
    return result


Value = Callable[[float, int], float]


@dataclass(frozen=True)
class Series:
    """One series to write: its exposition prefix, from when, and how its value moves."""

    prefix: str
    start: float
    end: float
    value: Value  # (Unix time, sample number) -> value


def _training_value(name: str, job: Job, rank: int) -> Value:
    compute, data = job.compute[rank], job.data_wait[rank]
    comm = job.step - compute - data
    per_step = {
        "lockstep_training_compute_seconds_total": compute,
        "lockstep_training_data_wait_seconds_total": data,
        "lockstep_training_comm_wait_seconds_total": comm,
        "lockstep_training_step_seconds_total": job.step,
    }.get(name)

    def value(t: float, k: int) -> float:
        steps = int((t - job.began) / job.step)
        if name == "lockstep_training_steps_total":
            return float(steps)
        if name == "lockstep_training_last_step_timestamp_seconds":
            return round(job.began + steps * job.step, 3)
        assert per_step is not None
        # Each step's time varies by ~1%, and the counter never goes back.
        return round(steps * per_step + 0.01 * per_step * math.sin(steps + rank), 6)

    return value


def _gpu_value(name: str, slow: bool, gpu: int) -> Value:
    def value(t: float, k: int) -> float:
        if name == "lockstep_gpu_sm_clock_hertz":
            clock = SM_CLOCK - 15e6 * ((k + gpu) % 3)  # NVML's 15-MHz steps
            return round(clock / SLOWDOWN, -6) if slow else clock
        return (0.93, 0.97, 0.99)[(k + gpu) % 3]  # lockstep_gpu_utilization_ratio

    return value


def _fleet_value(track: fleet.Track, start: float) -> Value:
    return lambda t, k: fleet.value_at(track, t, start, k)


@functools.cache
def _simulated_node() -> list[fleet.BaseSeries]:
    return fleet.node_series("healthy")


def raw_series(plan: Fleet, histories: dict[str, float], now: float, end: float) -> tuple[list[Series], list[str]]:
    """Every raw series of the fleet the rules read, and the names no simulated series has."""
    base = _simulated_node()
    templates: dict[str, list[fleet.BaseSeries]] = {}
    for series in base:
        if series.name in histories:
            templates.setdefault(series.name, []).append(series)
    missing = sorted(set(histories) - set(templates))
    jobs = {job.job_id: job for job in plan.jobs}
    out = []
    for node in plan.nodes:
        job = jobs.get(node.job_id or "")
        for name, group in templates.items():
            start = now - histories[name]
            for series in group:
                labels = fleet.relabel(series, node)
                if labels is None or (node.job_id is None and "job_id" in labels):
                    continue  # an idle node: no job's series
                text = ",".join(f'{key}="{fleet._escape(value)}"' for key, value in sorted(labels.items()))
                prefix = f"{name}{{{text}}}"
                if name in TRAINING_MODELLED and job is not None:
                    value = _training_value(name, job, int(labels["rank"]) % job.ranks)
                elif name in ("lockstep_gpu_sm_clock_hertz", "lockstep_gpu_utilization_ratio"):
                    gpu = int(labels.get("gpu", "0"))
                    slow = job is not None and job.straggler == node.position * fleet.RANKS_PER_NODE + gpu
                    value = _gpu_value(name, slow, gpu)
                else:
                    value = _fleet_value(fleet.Track(prefix, series.kind, series.first, series.second, None), start)
                out.append(Series(prefix, start, end, value))
    return out, missing


def recorded_series(
    samples: list[dict[str, Any]], histories: dict[str, float], now: float, seed: int = 34
) -> list[Series]:
    """The history of recorded series, from their current samples (an instant query's result):
    each value wandering by about 0.5% around the current one."""
    out = []
    for number, sample in enumerate(samples):
        labels = dict(sample["metric"])
        name = labels.pop("__name__")
        text = ",".join(f'{key}="{fleet._escape(value)}"' for key, value in sorted(labels.items()))
        current = float(sample["value"][1])
        phase = random.Random(seed + number).uniform(0, 2 * math.pi)
        out.append(Series(f"{name}{{{text}}}", now - histories[name], now, _wandering(current, phase)))
    return out


def _wandering(current: float, phase: float) -> Value:
    return lambda t, k: current * (1 + 0.005 * math.sin(k / 7 + phase))


def write_slices(series: list[Series], directory: Path, tsdb: Path, log: bool = True) -> tuple[int, float, float]:
    """The series' history, each from its start to its end, written and backfilled one 2-hour
    block at a time (time-major: promtool wants each series in time order; one slice is one
    block, so no two blocks overlap).  Returns (samples, seconds writing, seconds backfilling)."""
    ordered = sorted(series, key=lambda s: s.start)
    starts = [s.start for s in ordered]
    end = max(s.end for s in ordered)
    samples, writing, backfilling = 0, 0.0, 0.0
    t = math.floor(min(starts) / STEP) * STEP
    while t <= end:
        block_end = min(end, (math.floor(t / BLOCK) + 1) * BLOCK - 0.001)
        path = directory / "slice.om.txt"
        began = time.perf_counter()
        with open(path, "w") as out:
            while t <= block_end:
                k = int(t // STEP)
                active = [s for s in ordered[: bisect.bisect_right(starts, t)] if s.end >= t]
                stamp = f"{t:.3f}"
                out.write("".join(f"{s.prefix} {s.value(t, k)!r} {stamp}\n" for s in active))
                samples += len(active)
                t += STEP
            out.write("# EOF\n")
        written = time.perf_counter()
        fleet.backfill(path, tsdb)
        path.unlink()
        writing += written - began
        backfilling += time.perf_counter() - written
        if log:
            print(
                f"  ... {samples:,} samples written ({writing:.0f} s) and backfilled ({backfilling:.0f} s)",
                file=sys.stderr,
                flush=True,
            )
    return samples, writing, backfilling


# --- The run -------------------------------------------------------------------------------------


@dataclass
class Result:
    nodes: int
    jobs: list[tuple[str, int, int | None]]  # job_id, nodes, straggler rank
    groups: list[str]  # measured
    raw_names: dict[str, float]
    missing: list[str]
    recorded: dict[str, float]
    raw_series: int
    recorded_series: int
    samples: int
    phases: dict[str, float]  # phase -> seconds
    durations: dict[str, tuple[float, float]]  # group -> (last, largest), every group
    rules: dict[str, float]  # "group / rule" -> last evaluationTime
    missed: dict[str, float]  # group -> prometheus_rule_group_iterations_missed_total
    compactions: float  # prometheus_tsdb_compactions_total while it ran
    produced: dict[str, int]  # recorded name (or "alert (state)") -> series at the end
    history_ran_out: bool
    hours: float


LOOKBACK = 300.0  # Prometheus' lookback: an instant read needs a sample in the last 5 minutes


def histories(rules: Rules, hours: float) -> tuple[dict[str, float], dict[str, float]]:
    """(raw name -> seconds of history to write, recorded name -> seconds), capped at hours."""
    cap = hours * 3600
    raw = {name: min(cap, max(reach, LOOKBACK)) + STEP for name, reach in rules.raw.items()}
    return raw, {name: min(cap, reach) for name, reach in rules.recorded_history.items()}


def estimate(plan: Fleet, rules: Rules, hours: float) -> tuple[int, int, int]:
    """(raw series, recorded series, samples up to now) before anything is written; the raw
    series write one more sample every STEP seconds past now.  Recorded series: one per rank."""
    raw_histories, recorded_histories = histories(rules, hours)
    raw = raw_series(plan, raw_histories, 0.0, 0.0)[0]
    samples = sum(int(-s.start // STEP) + 1 for s in raw)
    ranks = sum(job.ranks for job in plan.jobs)
    samples += sum(ranks * (int(reach // STEP) + 1) for reach in recorded_histories.values())
    return len(raw), ranks * len(recorded_histories), samples


# Samples a second that writing and backfilling manage together on the 2-core development machine:
# 80,000 at 64 nodes with other suites running (load average 23, the bench under nice 10).  The
# default --ahead allows for this many, 30% more time, and 10 minutes for the Prometheus starts
# and the evaluation rounds.
THROUGHPUT = 100_000
MARGIN = 1.3
SETTLING = 600.0


@dataclass
class Prepared:
    """A run's fleet and history, before anything is written."""

    rules: Rules
    longest: float  # the longest range plus offset the rules read (s)
    hours: float
    now: float
    plan: Fleet
    ahead: float
    raw_count: int
    recorded_count: int
    samples: int  # to write, the samples past now included

    def describe(self) -> str:
        ranks = sum(job.ranks for job in self.plan.jobs)
        return (
            f"{len(self.plan.nodes)} nodes, {ranks} ranks in {len(self.plan.jobs)} jobs; history {self.hours:.2f} h "
            f"(the rules read up to {self.longest / 3600:.2f} h) and {self.ahead:.0f} s past now; "
            f"{self.raw_count:,} raw series, {self.recorded_count:,} recorded, about {self.samples:,} samples to "
            f"write and backfill (~{self.samples / THROUGHPUT / 60:.0f} min at {THROUGHPUT:,} a second)"
        )


def prepare(nodes: int, job_sizes: list[int], hours: float | None, ahead: float | None) -> Prepared:
    rules = rules_read()
    longest = max([*rules.raw.values(), *rules.recorded_history.values()])
    hours = longest / 3600 if hours is None else hours
    now = float(int(time.time()) // STEP * STEP)
    plan = build(nodes, job_sizes, now - hours * 3600)
    raw_count, recorded_count, samples_to_now = estimate(plan, rules, hours)
    if ahead is None:
        # Writing and backfilling (the samples past now included), the Prometheus starts, and the
        # evaluation rounds: ahead = (samples_to_now + raw_count * ahead / STEP) / THROUGHPUT * MARGIN + SETTLING.
        slope = raw_count / STEP / THROUGHPUT * MARGIN
        if slope >= 0.8:
            raise SystemExit(f"{raw_count:,} series at {STEP} s outrun {THROUGHPUT:,} samples/s: give --ahead")
        ahead = (samples_to_now / THROUGHPUT * MARGIN + SETTLING) / (1 - slope)
    samples = samples_to_now + raw_count * int(ahead // STEP)
    return Prepared(rules, longest, hours, now, plan, ahead, raw_count, recorded_count, samples)


def run(
    nodes: int,
    job_sizes: list[int],
    hours: float | None = None,
    ahead: float | None = None,
    evaluation_interval: str = "15s",
    rounds: int = 4,
    work: Path | None = None,
    log: bool = True,
) -> Result:
    prepared = prepare(nodes, job_sizes, hours, ahead)
    if log:
        print(prepared.describe(), file=sys.stderr, flush=True)
    rules, hours, now, plan, ahead = prepared.rules, prepared.hours, prepared.now, prepared.plan, prepared.ahead
    directory = work or Path(tempfile.mkdtemp(prefix=f"lockstep-stragglers-{nodes}-"))
    phases: dict[str, float] = {}
    raw_histories, recorded_histories = histories(rules, hours)
    raw, missing = raw_series(plan, raw_histories, now, now + ahead)

    # 1. The recorded series read over a range: their labels and current values, from a first
    # Prometheus with the shipped rules on the last minutes of the raw history.
    began = time.perf_counter()
    recent = [
        Series(s.prefix, max(s.start, now - rules.recorded_window - 2 * STEP), now + 120, s.value)
        for s in raw
        if s.prefix.partition("{")[0] in rules.recorded_inputs
    ]
    first_tsdb = directory / "first"
    write_slices(recent, directory, first_tsdb, log=False)
    # Three rounds at the measured interval: a record read from another group (the peers' shares
    # read the 5-minute means) is there from the second round.
    first = fleet.Prometheus(directory, first_tsdb, evaluation_interval)
    try:
        first.wait_ready()
        first.wait_evaluated(rounds=3, timeout=600)
        current = [sample for name in rules.recorded_history for sample in first.query(name)]
    finally:
        first.stop()
    shutil.rmtree(first_tsdb, ignore_errors=True)
    phases["first Prometheus (the recorded series' labels)"] = time.perf_counter() - began
    recorded = recorded_series(current, recorded_histories, now)
    if rules.recorded_history and not recorded:
        print(f"WARNING: the first Prometheus recorded none of {', '.join(rules.recorded_history)}", file=sys.stderr)

    # 2. The whole history: the raw series on past now, the recorded ones up to now (from then on
    # the measured Prometheus records them).
    tsdb = directory / "tsdb"
    samples, writing, backfilling = write_slices([*raw, *recorded], directory, tsdb, log=log)
    phases["writing OpenMetrics"] = writing
    phases["backfilling (promtool)"] = backfilling

    # 3. The measured Prometheus.
    began = time.perf_counter()
    # Blocks of 2 hours at most: the backfilled blocks are not compacted into 6-hour ones while
    # the rules are measured (on the same cores).
    prometheus = fleet.Prometheus(directory, tsdb, evaluation_interval, ("--storage.tsdb.max-block-duration=2h",))
    try:
        prometheus.wait_ready()
        phases["Prometheus start"] = time.perf_counter() - began
        durations, rule_seconds = prometheus.wait_evaluated(rounds=rounds, timeout=1800)
        missed = {
            s["metric"].get("rule_group", "").rsplit(";", 1)[-1]: float(s["value"][1])
            for s in prometheus.query("prometheus_rule_group_iterations_missed_total")
        }
        produced = {
            s["metric"]["__name__"]: int(float(s["value"][1]))
            for s in prometheus.query(
                "count by (__name__) ({__name__=~"
                + '"'
                + "|".join(re.escape(name) for name in rules.measured_records)
                + '"})'
            )
        }
        produced.update(
            {
                f"{s['metric']['alertname']} ({s['metric']['alertstate']})": int(float(s["value"][1]))
                for s in prometheus.query(
                    'count by (alertname, alertstate) (ALERTS{alertname=~"Lockstep.*Straggler.*"})'
                )
            }
        )
        compactions = sum(float(s["value"][1]) for s in prometheus.query("prometheus_tsdb_compactions_total"))
    finally:
        prometheus.stop()
    ran_out = time.time() > now + ahead
    if work is None:
        shutil.rmtree(directory, ignore_errors=True)
    return Result(
        nodes,
        [(j.job_id, len(j.nodes), j.straggler) for j in plan.jobs],
        rules.groups,
        {name: reach - STEP for name, reach in raw_histories.items()},
        missing,
        recorded_histories,
        len(raw),
        len(recorded),
        samples,
        phases,
        durations,
        rule_seconds,
        missed,
        compactions,
        produced,
        ran_out,
        hours,
    )


def report(result: Result, slowest: int = 10) -> None:
    sizes = sorted((n for _, n, _ in result.jobs), reverse=True)
    print(
        f"straggler rules at {result.nodes} nodes ({result.nodes * fleet.RANKS_PER_NODE} ranks), "
        f"jobs of {', '.join(map(str, sizes[:6]))}{' ...' if len(sizes) > 6 else ''} nodes "
        f"({len(sizes)} jobs; a straggler rank in {sum(1 for *_, s in result.jobs if s is not None)})"
    )
    print(f"  measured groups: {', '.join(result.groups)}")
    print(f"  raw names read ({len(result.raw_names)}), history written (s, capped at {result.hours:.2f} h):")
    for name, reach in result.raw_names.items():
        print(f"    {name:<56} {min(reach, result.hours * 3600):7.0f}")
    for name in result.missing:
        print(f"    not written (the simulated node exports no such series): {name}")
    for name, reach in result.recorded.items():
        print(f"  recorded series read over a range: {name} ({min(reach, result.hours * 3600) / 3600:.2f} h)")
    print(
        f"  {result.raw_series:,} raw series, {result.recorded_series:,} recorded; "
        f"{result.samples:,} samples at {STEP} s"
    )
    for phase, spent in result.phases.items():
        print(f"  {phase}: {spent:.0f} s")
    if result.compactions:
        print(f"  Prometheus compacted blocks {result.compactions:.0f} times while it was measured (on the same cores)")
    if result.history_ran_out:
        print("  WARNING: the wall clock passed the end of the history before the last round: rerun with more --ahead")
    print("  rule group evaluation (prometheus_rule_group_last_duration_seconds): largest seen / last round")
    for name in result.groups:
        last, largest = result.durations.get(name, (float("nan"), float("nan")))
        missed = result.missed.get(name, 0.0)
        print(f"    {name:<34} {largest * 1000:9.1f} ms {last * 1000:9.1f} ms   missed iterations {missed:.0f}")
    others = [(name, d) for name, d in result.durations.items() if name not in result.groups]
    if others:
        name, (last, largest) = max(others, key=lambda item: item[1][1])
        print(f"    (the other groups, on the same cores: at most {largest * 1000:.1f} ms, {name})")
    print("  series the measured groups recorded, and straggler alerts, at the end:")
    for name, count in sorted(result.produced.items()):
        print(f"    {name:<70} {count:7d}")
    print(f"  slowest rules of those groups (evaluationTime of /api/v1/rules, last round), top {slowest}:")
    measured = [(n, s) for n, s in result.rules.items() if n.split(" / ")[0] in result.groups]
    for name, spent in sorted(measured, key=lambda item: -item[1])[:slowest]:
        print(f"    {name:<90} {spent * 1000:9.1f} ms")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1024)
    parser.add_argument(
        "--jobs", type=int, nargs="+", help="job sizes in nodes (default: 1/2, 1/4, 1/8 of the nodes, then 16..1)"
    )
    parser.add_argument(
        "--hours", type=float, help="cap on the history (default: the longest range plus offset the rules read)"
    )
    parser.add_argument("--ahead", type=float, help="seconds of history past now (default: from the sample count)")
    parser.add_argument("--evaluation-interval", default="15s")
    parser.add_argument("--rounds", type=int, default=4, help="evaluations of every group to wait for (4)")
    parser.add_argument("--estimate", action="store_true", help="print the series and sample counts and stop")
    parser.add_argument(
        "--extra-rules",
        type=Path,
        nargs="+",
        default=[],
        help="rule files evaluated beside the shipped ones (variants of a rule to compare in one run: "
        "their groups are measured when their names contain 'straggler')",
    )
    args = parser.parse_args()
    # Appended to the list every reader of the rule files uses (this module's and bench/fleet.py's).
    fleet.RULE_FILES.extend(path.resolve() for path in args.extra_rules)
    jobs = args.jobs or default_jobs(args.nodes)
    if args.estimate:
        print(prepare(args.nodes, jobs, args.hours, args.ahead).describe())
        return 0
    if not os.access(fleet.PROMETHEUS, os.X_OK):
        sys.exit("prometheus not found: apt-get install prometheus")
    report(run(args.nodes, jobs, args.hours, args.ahead, args.evaluation_interval, args.rounds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
