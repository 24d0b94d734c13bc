"""The verdict and the notes: plain language, judged by the alert rules' thresholds.

A note never contradicts an alert: the all-clear is said only when no alert fired about the job
or its nodes, and every alert that fired gets a note of its own.
"""

from __future__ import annotations

import time

from lockstep import thresholds as T
from lockstep.report.model import Report, Straggler


def human(seconds: float | None) -> str:
    """A duration as people say it: 45 s, 12 min, 3 h 05 m, 2 d 04 h."""
    if seconds is None:
        return "?"
    seconds = max(0.0, seconds)
    if seconds < 90:
        return f"{seconds:.0f} s"
    minutes = seconds / 60
    if minutes < 90:
        return f"{minutes:.0f} min"
    hours, minutes = divmod(int(round(minutes)), 60)
    if hours < 48:
        return f"{hours} h {minutes:02d} m"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours:02d} h"


def clock(t: float | None) -> str:
    """A time of day in UTC (the report's times are all UTC)."""
    return "?" if t is None else time.strftime("%H:%M", time.gmtime(t))


def where(rank: str, host: str, gpu: str) -> str:
    parts = [f"rank {rank}"] if rank else []
    if host:
        parts.append(f"on {host}")
    if gpu:
        parts.append(f"GPU {gpu}")
    return " ".join(parts) or "an unknown rank"


def blame(s: Straggler) -> str:
    text = where(s.rank, s.host, s.gpu)
    if s.kind == "nccl":
        text += f" (communicator {s.comm})"
    return text


def notes_for(report: Report) -> list[str]:
    notes: list[str] = []
    for gpu in report.gpus:
        name = f"GPU {gpu.gpu} on {gpu.node}"
        if gpu.idle:
            notes.append(
                f"{name} was allocated but idle: {gpu.utilization_avg:.1%} average utilization "
                f"(idle below {T.GPU_IDLE_ACTIVITY_RATIO:.0%})."
            )
        for reason, seconds in sorted(gpu.throttle_seconds.items()):
            share = seconds / report.job.duration_seconds if report.job.duration_seconds else 0.0
            if reason in T.SUSPECT_GPU_THROTTLE_REASONS and share >= T.GPU_THROTTLE_TIME_RATIO:
                notes.append(
                    f"{name} was slowed by {reason} for {share:.0%} of the job "
                    f"(the alert's threshold: {T.GPU_THROTTLE_TIME_RATIO:.0%} of its window)."
                )
        critical = sorted(x for x in gpu.xid_errors if x.isdigit() and int(x) in T.CRITICAL_XIDS)
        if critical:
            notes.append(f"{name} reported critical XID {', '.join(critical)}: it needs attention.")
        uncorrected = {k: v for k, v in gpu.ecc_errors.items() if "uncorrect" in k}
        if uncorrected:
            notes.append(f"{name} had {sum(uncorrected.values()):.0f} uncorrectable ECC error(s).")
    for s in report.stragglers:
        if s.kind == "training":
            how = f"did {s.ratio - 1:.0%} more work per step than the median rank"
            limit = f"a straggler from {T.TRAINING_STRAGGLER_EVIDENCE_RATIO}x its peers, sustained"
        else:
            how = f"kept its peers waiting {s.ratio:.0%} of their collective time"
            limit = f"straggler above {T.NCCL_STRAGGLER_WAIT_SHARE:.0%}"
        why = f" Its node shows: {'; '.join(s.evidence)}." if s.evidence else " Nothing on its node explains it."
        notes.append(
            f"{blame(s)} {how} for {human(s.seconds)}, costing the job about {s.share_lost:.1%} of its time "
            f"({limit}).{why}"
        )
    for root in report.checkpoints:
        interval = root.expected_interval_seconds
        for stall in root.stalls:
            notes.append(
                f"A checkpoint save under {root.root} was in progress for {human(stall.seconds)}, longer than "
                f"{T.CHECKPOINT_STALL_INTERVALS:g}x its expected interval ({human(interval)})."
            )
        if interval and root.cadence_seconds and root.cadence_seconds > T.CHECKPOINT_OVERDUE_INTERVALS * interval:
            notes.append(
                f"Checkpoints under {root.root} came every {human(root.cadence_seconds)}, "
                f"against an expected {human(interval)}."
            )
        at_risk = root.work_at_risk_seconds
        if interval and at_risk is not None and at_risk > T.CHECKPOINT_OVERDUE_INTERVALS * interval:
            notes.append(
                f"{human(at_risk)} of work since the last completed save under {root.root} "
                f"(overdue after {T.CHECKPOINT_OVERDUE_INTERVALS:g}x {human(interval)})."
            )
    for stall in report.steps.stalls:
        notes.append(f"No step completed from {clock(stall.start)} for {human(stall.seconds)} (UTC).")
    if report.post_mortem is not None:
        pm = report.post_mortem
        who = where(pm.rank, pm.host, pm.gpu) if (pm.rank or pm.gpu) else "no single rank"
        notes.append(f"The job stopped making progress; first to stop: {who} ({pm.how}).")
    for name in sorted({a.alertname for a in report.alerts}):
        fired = [a for a in report.alerts if a.alertname == name]
        first = min(a.start for a in fired)
        notes.append(f"Alert {name} fired {len(fired)} time(s), first at {clock(first)} UTC: see docs/runbooks.md.")
    if not notes:
        notes.append("Nothing to report: no straggler, stall, hang, throttling, idle GPU or alert during the job.")
    return notes


def verdict_for(report: Report) -> str:
    job = report.job
    nodes = len(job.hosts) or len(job.nodes)
    verb = "running for" if job.state == "running" else "ran"
    size = f"{nodes} node{'s' if nodes != 1 else ''}"
    if job.ranks:
        size += f", {job.ranks} ranks"
    parts = [f"job {job.job_id} {verb} {human(job.duration_seconds)} on {size}"]
    for s in report.stragglers[:2]:
        why = f", {s.evidence[0]}" if s.evidence else ""
        parts.append(f"lost about {s.share_lost:.0%} to {blame(s)}{why}")
    stalls = [stall for root in report.checkpoints for stall in root.stalls]
    if stalls:
        longest = max(stall.seconds for stall in stalls)
        parts.append(f"{len(stalls)} checkpoint stall{'s' if len(stalls) > 1 else ''} (longest {human(longest)})")
    if report.post_mortem is not None:
        pm = report.post_mortem
        at = clock(report.hangs[0].start) if report.hangs else clock(pm.stopped_at)
        who = where(pm.rank, pm.host, pm.gpu) if (pm.rank or pm.gpu) else "every rank at once"
        parts.append(f"hung (named at {at} UTC), first to stop: {who}")
    idle = [g for g in report.gpus if g.idle]
    if idle:
        parts.append(f"{len(idle)} GPU{'s' if len(idle) > 1 else ''} allocated but idle")
    if len(parts) == 1:
        fired = sorted({a.alertname for a in report.alerts})
        parts.append(f"alerts fired: {', '.join(fired)}" if fired else "nothing wrong found")
    return "; ".join(parts) + "."
