"""The steps section: the job's steps counted from its ranks' step logs (training collector) or
its framework's output (framework_logs), its time per step over time and its median, tokens per
second, and its stalls."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from lockstep import thresholds as T
from lockstep.report.model import Interval, Point, Steps
from lockstep.report.scope import Scope, duration, rank_rates

STALL_POINTS = 5  # points of the step count in a stall window (TRAINING_STALL_WINDOW)


@dataclass(frozen=True)
class StepSource:
    """Where a job's steps are counted: the training collector's step logs or, for a job without
    them, the framework_logs collector's iterations (issue 37)."""

    name: str
    steps: str
    seconds: str
    tokens: str
    per_rank: bool


STEP_SOURCES = (
    StepSource(
        "training",
        "lockstep_training_steps_total",
        "lockstep_training_step_seconds_total",
        "lockstep_training_tokens_total",
        True,
    ),
    StepSource(
        "framework",
        "lockstep_framework_iterations_total",
        "lockstep_framework_iteration_seconds_total",
        "lockstep_framework_tokens_total",
        False,
    ),
)


def step_source(scope: Scope) -> StepSource | None:
    """The job's step counters: the training collector's when the job has them, otherwise the
    framework_logs collector's iterations; None when the job logs neither."""
    for source in STEP_SOURCES:
        if scope.series_of(source.steps):
            return source
    return None


def step_time(scope: Scope, source: StepSource) -> tuple[list[tuple[float, float]], dict[float, float]]:
    """Wall seconds per step at each point of the timeline, the mean over the ranks (or, for the
    framework's iterations, the series) of seconds over steps where steps were made; and the
    mean steps per second at each point."""
    if not source.per_rank:
        w = duration(scope.window)
        steps_sel = scope.job(source.steps)
        found = scope.over_job(f"avg(rate({scope.job(source.seconds)}[{w}]) / (rate({steps_sel}[{w}]) > 0))")
        rates = {t: v for s in scope.over_job(f"avg(rate({steps_sel}[{w}]))") for t, v in s.points}
        return [(t, v) for s in found for t, v in s.points], rates
    steps, seconds = rank_rates(scope, source.steps, scope.window), rank_rates(scope, source.seconds, scope.window)
    ratios: dict[float, list[float]] = {}
    made: dict[float, list[float]] = {}
    for key, per_second in steps.items():
        took = seconds.get(key, {})
        for t, n in per_second.items():
            made.setdefault(t, []).append(n)
            if n > 0 and t in took:
                ratios.setdefault(t, []).append(took[t] / n)
    timeline = [(t, statistics.fmean(values)) for t, values in sorted(ratios.items())]
    return timeline, {t: statistics.fmean(values) for t, values in made.items()}


def steps_section(scope: Scope) -> Steps:
    source = step_source(scope)
    if source is None:
        return Steps()
    w = duration(scope.window)
    steps_sel = scope.job(source.steps)
    out = Steps(source=source.name)
    timeline, rates = step_time(scope, source)
    out.timeline = [Point(t, round(v, 4)) for t, v in timeline if math.isfinite(v)]
    if out.timeline:
        # The median step, not the median moment: each point of the timeline (evenly spaced in
        # time) weighs as many steps as the job made per second there.  Unweighted, the slow
        # stretches (more time for as many steps) pulled the median of real DDP runs 7-19 % above
        # their logs' median step (tests/report/test_report_ddp_runs.py).
        weighted = [(p.value, rates.get(p.t, 0.0)) for p in out.timeline]
        if sum(weight for _, weight in weighted) <= 0:
            weighted = [(p.value, 1.0) for p in out.timeline]
        out.median_step_seconds = round(weighted_median(weighted), 4)
    tokens = scope.over_job(f"sum(rate({scope.job(source.tokens)}[{w}]))")
    out.tokens_per_second = [Point(t, round(v / scope.scale, 1)) for s in tokens for t, v in s.points]
    # Stalls on Prometheus' clock: how long the job's step count stayed where it was, a point every
    # STALL_POINTS-th of the stall window (2 minutes; the timeline's step if finer), so that a
    # stall is measured to that and one of the stall window is not missed between two points of
    # a long job's timeline (6 minutes apart in a day's).  The most steps any rank counted in each
    # window: the windows tile the job's range (each sample read once, whatever the step), so
    # their maximum is the most it counted, with the last step's worth, which they may end before.
    every = max(min(scope.step, T.seconds(T.TRAINING_STALL_WINDOW) / STALL_POINTS), scope.interval, 1.0)
    reach = duration(max(every, 2 * scope.interval))
    count = scope.prom.query_range(f"max(max_over_time({steps_sel}[{reach}]))", scope.start, scope.end, every)
    points = [p for s in count for p in s.points]
    tail = scope.at_end(f"max(max_over_time({steps_sel}[{duration(every)}]))")
    out.steps = max([v for _, v in points] + [s.value for s in tail], default=0)
    out.stalls = flat_runs(points, scope)
    changes = [t for (t, v), (_, prev) in zip(points[1:], points[:-1]) if v != prev]
    out.last_step = changes[-1] if changes else (points[0][0] if points else None)
    return out


def weighted_median(values: list[tuple[float, float]]) -> float:
    """The median of (value, weight) pairs: the value below and above which half the weight lies
    (the mean of the two values around it when the halves meet between them, as
    statistics.median does for equal weights)."""
    ordered = sorted((v, w) for v, w in values if w > 0 and math.isfinite(w))
    half = sum(w for _, w in ordered) / 2
    below = 0.0
    for i, (v, w) in enumerate(ordered):
        below += w
        if math.isclose(below, half, rel_tol=1e-9) and i + 1 < len(ordered):
            return (v + ordered[i + 1][0]) / 2
        if below > half:
            return v
    return ordered[-1][0]


def flat_runs(points: list[tuple[float, float]], scope: Scope) -> list[Interval]:
    """Runs of an unchanged value at least TRAINING_STALL_WINDOW long (on the job's clock)."""
    window = T.seconds(T.TRAINING_STALL_WINDOW)
    stalls = []
    i = 0
    while i < len(points):
        j = i
        while j + 1 < len(points) and points[j + 1][1] == points[i][1]:
            j += 1
        end = points[j + 1][0] if j + 1 < len(points) else points[j][0]
        length = (end - points[i][0]) * scope.scale
        if length >= window:
            stalls.append(Interval(points[i][0], end, round(length, 1)))
        i = j + 1
    return stalls
