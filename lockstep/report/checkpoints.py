"""The checkpoints section: each checkpoint root of the job, its saves, cadence, durations, work
at risk and stalled saves."""

from __future__ import annotations

import math
import re
import statistics

from lockstep import thresholds as T
from lockstep.report.model import CheckpointRoot, Interval
from lockstep.report.scope import Scope, duration, host_of_instance, quote


def checkpoint_section(scope: Scope) -> list[CheckpointRoot]:
    roots = scope.series_of("lockstep_checkpoint_info")
    if not roots:
        return []
    hosts = host_of_instance(scope)
    wanted = {(s.get("instance", ""), s.get("root", "")) for s in roots}
    root_re = "|".join(re.escape(r) for _, r in sorted(wanted))
    instance_re = "|".join(re.escape(i) for i, _ in sorted(wanted))
    matchers = [f"root=~{quote(root_re)}", f"instance=~{quote(instance_re)}"]
    if scope.cluster is not None:
        matchers.append(f"cluster={quote(scope.cluster)}")
    inside = ",".join(matchers)

    def ranged(expr: str) -> dict[tuple[str, str], list[tuple[float, float]]]:
        return {(s.labels.get("instance", ""), s.labels.get("root", "")): s.points for s in scope.over_job(expr)}

    def at_end(expr: str) -> dict[tuple[str, str], float]:
        return {(s.labels.get("instance", ""), s.labels.get("root", "")): s.value for s in scope.at_end(expr)}

    success = ranged(f"lockstep_checkpoint_last_success_timestamp_seconds{{{inside}}}")
    durations = ranged(f"lockstep_checkpoint_last_duration_seconds{{{inside}}}")
    # A save's time in progress at its longest in each step (not at the step's instant, a step
    # before the save ends at worst: a save stalled a little past its limit would not show).
    progress = ranged(f"max_over_time(lockstep_checkpoint_in_progress_seconds{{{inside}}}[{duration(scope.step)}])")
    interval = at_end(f"max_over_time(lockstep_checkpoint_expected_interval_seconds{{{inside}}}[{scope.whole}])")
    saves = at_end(f"increase(lockstep_checkpoint_saves_total{{{inside}}}[{scope.whole}])")
    out = []
    for key in sorted(wanted):
        root = CheckpointRoot(root=key[1], node=hosts.get(key[0], key[0]))
        root.expected_interval_seconds = interval.get(key)
        root.saves = round(saves.get(key, 0))
        points = success.get(key, [])
        completed = [(t, v) for (t, v), prev in zip(points, [(0.0, math.nan), *points]) if v != prev[1] and v > 0]
        values = sorted({v for _, v in completed})
        if len(values) >= 2:
            root.cadence_seconds = round(statistics.median(b - a for a, b in zip(values, values[1:])), 1)
        duration_at = dict(durations.get(key, []))
        root.durations_seconds = [round(duration_at[t], 1) for t, _ in completed if t in duration_at]
        if points:
            root.last_success = points[-1][1] or None
            seen_change = [t for t, _ in completed if t > points[0][0]]
            if seen_change:
                root.work_at_risk_seconds = round((scope.end - seen_change[-1]) * scope.scale, 1)
            elif points[-1][1] > 0 and 0 <= scope.end - points[-1][1] <= scope.span * scope.scale + 86400:
                root.work_at_risk_seconds = round(scope.end - points[-1][1], 1)
        limit = T.CHECKPOINT_STALL_INTERVALS * (root.expected_interval_seconds or T.CHECKPOINT_DEFAULT_INTERVAL_SECONDS)
        root.stalls = stalled_saves(progress.get(key, []), limit)
        out.append(root)
    return out


def stalled_saves(points: list[tuple[float, float]], limit: float) -> list[Interval]:
    """Saves in progress for longer than limit (in_progress_seconds is on the node's clock)."""
    stalls: list[Interval] = []
    run: list[tuple[float, float]] = []
    for t, v in [*points, (math.inf, 0.0)]:
        if v > 0 and (not run or v >= run[-1][1]):
            run.append((t, v))
            continue
        if run and run[-1][1] > limit:
            stalls.append(Interval(run[0][0], run[-1][0], round(run[-1][1], 1)))
        run = [(t, v)] if v > 0 else []
    return stalls
