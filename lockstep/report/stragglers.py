"""The stragglers section: the ranks that held the job back, from their own work per step
against their peers' (training step logs) or from their peers' wait in collectives (NCCL
Inspector).  What each straggler's node showed meanwhile is evidence.py's."""

from __future__ import annotations

import re
import statistics

from lockstep import thresholds as T
from lockstep.report.model import Straggler
from lockstep.report.prometheus import Series
from lockstep.report.scope import (
    RANK_LABELS,
    Key,
    Scope,
    agent_of_host,
    by_time,
    duration,
    quote,
    rank_rates,
    summed_by,
    with_peers,
)

MIN_STRAGGLER_POINTS = 3  # a rank flagged at fewer points of the timeline is jitter, not a straggler
# A rank's work per step is averaged over this long (on the job's clock) before it is compared
# with its peers': the 5 minutes of the alert's ratio (job_rank:...:ratio_to_peers5m).  Over the
# timeline's own window (4 scrapes) the jitter of real runs put every healthy rank of an 8-rank
# DDP run above the ratio at 3 points or more (tests/report/test_report_ddp_runs.py).
STRAGGLER_RATE_WINDOW_SECONDS = 300.0
NCCL_RANK_LABELS = (*RANK_LABELS, "comm")  # a rank in one communicator (its collectives summed)
NCCL_COUNTERS = ("lockstep_nccl_collectives_total", "lockstep_nccl_collective_seconds_total")  # ops, seconds
# What the shipped rules record of them (alerts/nccl.py), a series a rank and communicator.
NCCL_PER_OP_RECORDED = "job_comm_rank:lockstep_nccl_collective_seconds:per_op5m"
NCCL_RECORDED_LABELS = ("cluster", "job_id", "comm", "rank", "host")  # its labels


def training_stragglers(scope: Scope) -> list[Straggler]:
    """Ranks whose own work per step (compute + data wait) is above the straggler evidence
    ratio times their peers' (the job's median rank's; the one peer's in a 2-rank job).  Every
    rank's rates of its compute, data wait, step and step-seconds counters (rank_rates, each
    asked for once; a day's job shares the steps' with the timeline); its work per step, the
    job's wall time per step, the medians and the ratios are taken here (asking Prometheus for
    them evaluates every rank's rates once per use: 66 s of a 1,024-rank day's report; summing
    and dividing them there, 2.4-2.9 s).

    All are averaged over STRAGGLER_RATE_WINDOW_SECONDS (or the timeline's window, if longer),
    as the alert averages them, and judged only where that window lies within the job (a job's
    first steps, a rank's warm-up, are not a 5-minute mean: the first points of a real 2-rank
    run put its healthy rank at 1.37x its peer).  A flagged point says its window was slow: the
    rank held the job back over the union of its flagged points' windows (a rank slow from the
    first step, from the job's start)."""
    window = max(scope.window, STRAGGLER_RATE_WINDOW_SECONDS / scope.scale)
    steps = rank_rates(scope, "lockstep_training_steps_total", window)
    if not steps:
        return []
    compute = rank_rates(scope, "lockstep_training_compute_seconds_total", window)
    data = rank_rates(scope, "lockstep_training_data_wait_seconds_total", window)
    work = []
    for key, made in steps.items():
        busy, waited = compute.get(key, {}), data.get(key, {})
        per_step = [(t, (busy[t] + waited[t]) / n) for t, n in made.items() if n > 0 and t in busy and t in waited]
        work.append(Series(dict(key), sorted(per_step)))
    peers = by_time(work, lambda labels: "")
    if not peers:
        return []
    # The job's wall seconds per step: all its ranks' step seconds over all their steps.
    took: dict[float, float] = {}
    stepped: dict[float, float] = {}
    for seconds in rank_rates(scope, "lockstep_training_step_seconds_total", window).values():
        for t, v in seconds.items():
            took[t] = took.get(t, 0.0) + v
    for rates in steps.values():
        for t, v in rates.items():
            stepped[t] = stepped.get(t, 0.0) + v
    walls = {t: v / stepped[t] for t, v in took.items() if stepped.get(t, 0.0) > 0}
    flagged: dict[Key, list[tuple[float, float, float]]] = {}
    for (_, t), values in sorted(peers.items(), key=lambda item: item[0][1]):
        if t < scope.start + window:
            continue
        # As LockstepTrainingStragglerSustained: over the job's median rank's, or over its one
        # peer's in a 2-rank job (where the median is the mean of the two).
        for key, v, peer in with_peers(values, pairs=True):
            if peer > 0 and v / peer > T.TRAINING_STRAGGLER_EVIDENCE_RATIO:
                lost = (v - peer) / walls[t] if walls.get(t) else 0.0
                flagged.setdefault(key, []).append((t, v / peer, lost))
    out = []
    for key, points in flagged.items():
        if len(points) < MIN_STRAGGLER_POINTS:
            continue
        labels = dict(key)
        held = covered([(max(t - window, scope.start), t) for t, _, _ in points])
        out.append(
            Straggler(
                kind="training",
                rank=labels.get("rank", ""),
                host=labels.get("host", ""),
                node=labels.get("instance", ""),
                start=held[0][0],
                end=held[-1][1],
                seconds=round(sum(b - a for a, b in held) * scope.scale, 1),
                ratio=round(statistics.mean(r for _, r, _ in points), 3),
                share_lost=round(sum(lost for _, _, lost in points) * scope.step / scope.span, 4),
            )
        )
    return sorted(out, key=lambda s: -s.share_lost)


def covered(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of intervals, as disjoint intervals in time order."""
    out: list[tuple[float, float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def nccl_stragglers(scope: Scope) -> list[Straggler]:
    """Ranks of a communicator whose peers wait more than NCCL_STRAGGLER_WAIT_SHARE of their
    collective time for them: 1 - (its time per collective) / (the communicator's median).

    Each rank's time per collective in each communicator (its collectives together) comes from
    what the shipped rules record, NCCL_PER_OP_RECORDED (a series a rank and communicator,
    averaged over each point's window), where Prometheus records it; else from the two counters
    (rank_rates: each read once, a series a rank, communicator and collective, summed and
    divided here).  A 3-D parallel job's rank is in 6 (communicator, collective) pairs: the
    counters of a 1,024-rank day were about 6 s of its report, the recorded series about 1 s
    (docs/performance.md).  The share of the job lost needs the flagged ranks' collectives per
    second: asked for those ranks alone when the time per collective was recorded."""
    per_op = recorded_per_op(scope)
    op_rates: dict[Key, dict[float, float]] | None = None
    if not per_op:
        per_op, op_rates = counted_per_op(scope)
    peers = by_time(per_op, lambda labels: labels.get("comm", ""))
    if not peers:
        return []
    # (t, its peers' wait share, the median's time per collective less its own)
    flagged: dict[Key, list[tuple[float, float, float]]] = {}
    for (_, t), values in sorted(peers.items(), key=lambda item: item[0][1]):
        # As LockstepNCCLStraggler: over the communicator's median rank's, in communicators of
        # more than STRAGGLER_MIN_PEERS ranks (no pairs: in two, each waits for the other).
        for key, v, median in with_peers(values, pairs=False):
            if median <= 0:
                continue
            share = 1 - v / median
            if share > T.NCCL_STRAGGLER_WAIT_SHARE:
                flagged.setdefault(key, []).append((t, share, median - v))
    flagged = {key: points for key, points in flagged.items() if len(points) >= MIN_STRAGGLER_POINTS}
    if op_rates is None:
        op_rates = flagged_op_rates(scope, list(flagged))
    # Each rank's GPU: the Inspector's rank info, else RAS's (their labels, from find_job's answer).
    gpus: dict[tuple[str, str], str] = {}
    for labels in scope.series_of("lockstep_nccl_ras_rank_info") + scope.series_of("lockstep_nccl_rank_info"):
        if labels.get("gpu") or (labels.get("comm", ""), labels.get("rank", "")) not in gpus:
            gpus[(labels.get("comm", ""), labels.get("rank", ""))] = labels.get("gpu", "")
    out = []
    for key, points in flagged.items():
        labels = dict(key)
        comm, rank, host = labels.get("comm", ""), labels.get("rank", ""), labels.get("host", "")
        # Seconds per second the median peer waits for it: (median - its time) x its op rate.
        ops = op_rates.get(key, {})
        lost = [min(behind * ops.get(t, 0.0) / scope.scale, 1.0) for t, _, behind in points]
        out.append(
            Straggler(
                kind="nccl",
                rank=rank,
                host=host,
                # The recorded series keep no agent: the one whose host the rank ran on.
                node=labels.get("instance") or agent_of_host(scope, host),
                gpu=gpus.get((comm, rank), ""),
                comm=comm,
                start=points[0][0],
                end=points[-1][0],
                seconds=round(len(points) * scope.step * scope.scale, 1),
                ratio=round(statistics.mean(r for _, r, _ in points), 3),
                share_lost=round(sum(lost) * scope.step / scope.span, 4),
            )
        )
    return sorted(out, key=lambda s: -s.share_lost)


def recorded_per_op(scope: Scope) -> list[Series]:
    """Each rank's time per collective in each communicator as the shipped rules record it,
    averaged over each point's window; [] where Prometheus does not record it."""
    return scope.over_job(f"avg_over_time({scope.job(NCCL_PER_OP_RECORDED)}[{duration(scope.window)}])")


def counted_per_op(scope: Scope) -> tuple[list[Series], dict[Key, dict[float, float]]]:
    """Each rank's time per collective in each communicator from the counters, and its
    collectives per second."""
    ops, seconds = NCCL_COUNTERS
    rates = rank_rates(scope, ops, scope.window, NCCL_RANK_LABELS)
    per_op = []
    for key, busy in rank_rates(scope, seconds, scope.window, NCCL_RANK_LABELS).items():
        at = rates.get(key, {})
        per_op.append(Series(dict(key), [(t, v / at[t]) for t, v in sorted(busy.items()) if at.get(t, 0.0) > 0]))
    return per_op, rates


def flagged_op_rates(scope: Scope, keys: list[Key]) -> dict[Key, dict[float, float]]:
    """The collectives per second of these ranks in these communicators (keys: the recorded
    series' labels), their collectives summed: one query for those ranks alone."""
    if not keys:
        return {}
    wanted = [dict(key) for key in keys]
    ranks = "|".join(sorted({re.escape(k.get("rank", "")) for k in wanted}))
    comms = "|".join(sorted({re.escape(k.get("comm", "")) for k in wanted}))
    selector = scope.job(NCCL_COUNTERS[0], f"rank=~{quote(ranks)},comm=~{quote(comms)}")
    rates = summed_by(scope.over_job(f"rate({selector}[{duration(scope.window)}])"), NCCL_RECORDED_LABELS)
    return {key: rates.get(key, {}) for key in keys}
