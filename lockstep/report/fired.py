"""The alerts section (the alerts that fired about the job or its agents), the hangs among them,
and the post-mortem: which rank stopped first when the job hung."""

from __future__ import annotations

from lockstep.report.model import Alert, Hang, PostMortem, Steps
from lockstep.report.scope import Scope, duration, natural, quote

HANG_ALERTS = (
    "LockstepTrainingHung",
    "LockstepNCCLRankStuck",
    "LockstepJobEndedHung",
    "LockstepNCCLHang",
    "LockstepTrainingStalled",
)


def alert_section(scope: Scope, now: float) -> list[Alert]:
    """The alerts that fired about the job (its job_id) or its agents (node alerts, no job_id),
    from the job's start to a quarter of an hour after its end (LockstepJobEndedHung comes then)."""
    until = min(now, scope.end + 900)
    cluster = f",cluster={quote(scope.cluster)}" if scope.cluster is not None else ""
    exprs = [f'ALERTS{{alertstate="firing",job_id={quote(scope.job_id)}{cluster}}}']
    if scope.instances:
        exprs.append(scope.nodes("ALERTS", 'alertstate="firing",job_id=""'))
    found: list[Alert] = []
    for expr in exprs:
        # Firing at any time of each step, not only at its instant: an alert that fired for less
        # than a step (6 minutes of a day's job) between two instants would not show, and the
        # notes would give the all-clear.
        for s in scope.prom.query_range(
            f"max_over_time({expr}[{duration(scope.step)}])", scope.start, until, scope.step
        ):
            labels = {k: v for k, v in s.labels.items() if k not in ("__name__", "alertstate")}
            found.append(
                Alert(
                    alertname=labels.pop("alertname", ""),
                    severity=labels.pop("severity", ""),
                    start=s.points[0][0],
                    end=s.points[-1][0],
                    labels=labels,
                )
            )
    return sorted(found, key=lambda a: (a.start, a.alertname, sorted(a.labels.items())))


def post_mortem_of(scope: Scope, steps: Steps, hangs: list[Hang]) -> PostMortem | None:
    """Which rank stopped first, when the job hung: the rank furthest behind in NCCL (RAS), else
    the rank with the fewest steps, else the rank or GPU the hang alert named."""
    stalled_at_end = bool(steps.stalls) and steps.stalls[-1].end >= scope.end - scope.step
    if not hangs and not stalled_at_end:
        return None
    behind = scope.at_end(
        f"max by (rank, host, instance, gpu) (max_over_time({scope.job('lockstep_nccl_rank_collectives_behind')}"
        f"[{scope.whole}])) > 0"
    )
    if behind:
        worst = max(behind, key=lambda s: s.value)
        return PostMortem(
            rank=worst.labels.get("rank", ""),
            host=worst.labels.get("host", ""),
            gpu=worst.labels.get("gpu", "") or gpu_from_hangs(hangs, worst.labels.get("rank", "")),
            how=f"{worst.value:.0f} collective(s) behind the other ranks (NCCL RAS)",
        )
    per_rank = scope.at_end(
        f"max by (rank, host) (max_over_time({scope.job('lockstep_training_steps_total')}[{scope.whole}]))"
    )
    if len({s.value for s in per_rank}) > 1:
        first = min(per_rank, key=lambda s: (s.value, natural(s.labels.get("rank", ""))))
        rank = first.labels.get("rank", "")
        return PostMortem(
            rank=rank,
            host=first.labels.get("host", ""),
            gpu=gpu_from_hangs(hangs, rank),
            stopped_at=steps.last_step,
            how=f"stopped at step {first.value:.0f}, behind the other ranks",
        )
    named = [h for h in hangs if h.rank or h.gpu]
    if named:
        h = named[0]
        return PostMortem(rank=h.rank, host=h.host, gpu=h.gpu, stopped_at=steps.last_step, how=f"named by {h.alert}")
    return PostMortem(rank="", stopped_at=steps.last_step, how="every rank stopped at the same step")


def gpu_from_hangs(hangs: list[Hang], rank: str) -> str:
    for h in hangs:
        if h.gpu and (not h.rank or h.rank == rank):
            return h.gpu
    return ""


# Counters (increase_over_job), summed by the labels given (none: each series alone).
