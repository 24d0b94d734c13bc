"""The report's first section: which job, when (its first and last samples, found without
reading the fleet), on which agents, at which resolution; its Slurm record, ranks, hosts and GPUs."""

from __future__ import annotations

import math

from lockstep import thresholds as T
from lockstep.report.model import Job
from lockstep.report.prometheus import ReportError
from lockstep.report.scope import (
    JOB_SERIES,
    LABEL_SERIES,
    LIVE_SERIES,
    Scope,
    duration,
    natural,
)

LOOKBACK_SECONDS = 31 * 86400  # how far back a job is looked for
EDGE_BUCKETS = 500  # the lookback in buckets
EDGE_PARTS = 50  # the edge bucket in parts (107 s)
EDGE_WINDOWS = 10  # the edge part in windows (10.7 s), the last searched at 1-s resolution
INTERVAL_WINDOW = 3600.0  # the scrape interval is counted over the job's last hour
RUNNING_WITHIN = 90.0  # a job with a sample this recent is running
TIMELINE_POINTS = 240  # points of the step timeline (and of every range query)


def find_job(scope: Scope, now: float, ended: bool = False) -> None:
    """Set the scope's cluster (when one), range, resolution and agents; ReportError if unknown."""
    # Which clusters know the job: the series API reads the index, not the job's samples.
    known = scope.prom.series(scope.job_series(), now - LOOKBACK_SECONDS, now)
    clusters = sorted({s.get("cluster", "") for s in known})
    if not clusters:
        where = f" in cluster {scope.cluster}" if scope.cluster is not None else ""
        raise ReportError(f"job {scope.job_id}{where} is unknown to Prometheus at {scope.prom.url} (last 31 days)")
    if scope.cluster is None:
        if len(clusters) > 1:
            raise ReportError(f"job {scope.job_id} ran in clusters {', '.join(clusters)}: choose one with --cluster")
        scope.cluster = clusters[0] if clusters[0] else None
    # Coarse buckets over the lookback, then the first and last sample within the edge buckets.
    # The job runs while its live series exist (a checkpoint root outlives its job) and ends with
    # Slurm's record of it where there is one (an NCCL Inspector dump may outlive it too).
    bucket = LOOKBACK_SECONDS / EDGE_BUCKETS
    lookback = duration(bucket)

    def buckets(selector: str) -> list[float]:
        coarse = scope.prom.query_range(
            f"count(count_over_time({selector}[{lookback}]))", now - LOOKBACK_SECONDS, now, bucket
        )
        return sorted(t for s in coarse for t, _ in s.points)

    alive = scope.job_series(LIVE_SERIES)
    slurm = scope.job("lockstep_slurm_job_info")
    ending = buckets(slurm)
    if ending:
        # Slurm's record (a series a node) finds the job's buckets.  The job's series a rank or a
        # GPU, which counting every bucket reads in full, are read only in the bucket before
        # Slurm's first, and in those before it while they hold samples (a rank's log seen before
        # Slurm's record of the job).
        ender, first_bucket = slurm, ending[0]
        while first_bucket - bucket >= now - LOOKBACK_SECONDS and scope.prom.query(
            f"count(count_over_time({alive}[{lookback}]))", first_bucket - bucket
        ):
            first_bucket -= bucket
        points = [first_bucket, *ending]
    else:
        ender = alive
        ending = points = buckets(alive)
    if not points:
        raise ReportError(f"job {scope.job_id} has no samples in the last 31 days at {scope.prom.url}")
    first = edge_sample(scope, alive, points[0], bucket, now, last=False)
    last = edge_sample(scope, ender, ending[-1], bucket, now, last=True)
    scope.start = first if first is not None else points[0] - bucket
    scope.end = last if last is not None else ending[-1]
    if not ended and now - scope.end < RUNNING_WITHIN:
        scope.end = now
    # The scrape interval: the most samples a series of the job has in its last hour (not in its
    # whole range: that read every sample of the job once more).
    counted = min(scope.span, INTERVAL_WINDOW)
    samples = scope.prom.query(f"max(count_over_time({scope.job_series()}[{duration(counted + 1)}]))", scope.end)
    count = samples[0].value if samples else 2
    interval = counted / max(count - 1, 1)
    if ender == alive and scope.end < now:
        scope.end = last_progress(scope, interval)
    scope.step = max(scope.span / TIMELINE_POINTS, interval, 1.0)
    scope.window = max(scope.step, 4 * interval)
    scope.interval = interval
    scope.labels = scope.prom.series(scope.job_series(LABEL_SERIES), scope.start - scope.step, scope.end)
    agents = {s.get("instance", "") for s in scope.labels if s.get("__name__") in JOB_SERIES}
    scope.instances = sorted(agents - {""})


def edge_sample(scope: Scope, selector: str, edge: float, bucket: float, now: float, last: bool) -> float | None:
    """The first sample of ``selector`` (``last``: the last) in the coarse bucket that ends at
    ``edge``: the part (EDGE_PARTS of the bucket) that holds it, then the window of that part
    (EDGE_WINDOWS of it: 1/500 of the bucket) by count_over_time, then its timestamp by a
    subquery at 1-s resolution over that window and a second either side.  count_over_time
    counts raw samples: a series is found however briefly it lived (a job that failed at once),
    though it is stale from the first scrape that lacked it, which instant queries at the
    windows' ends would miss.  Narrowed a part first, the job's series are counted at 60 windows,
    not at the bucket's 500 (1.5 million evaluations for a 1,024-rank job's live series)."""
    kind = "max" if last else "min"
    end, length = edge, bucket
    for parts in (EDGE_PARTS, EDGE_WINDOWS):
        found, width = sampled_windows(scope, selector, end, length, parts, now)
        if not found:
            if length == bucket:
                return None
            break  # (the part held a sample: its windows, tiling it from their own phase, missed it)
        end, length = (found[-1] if last else found[0]), width
    # The subquery's points fall on whole seconds: evaluated at `now` (a report made a fraction of
    # a second after the job's only scrape, as the epilog makes it), none would be at or after
    # that scrape.  So at the next whole second, the samples after `now` left out.
    exact = scope.prom.query(
        f"{kind}({kind}_over_time((timestamp({selector}) <= {now:.3f})[{round(length * 1000) + 2000}ms:1s]))",
        min(end + 1, math.ceil(now)),
    )
    if exact:
        return exact[0].value
    return end if last else end - length


def sampled_windows(
    scope: Scope, selector: str, end: float, length: float, parts: int, now: float
) -> tuple[list[float], float]:
    """The ends of the windows (``parts`` of ``length`` seconds ending at ``end``) that hold a
    sample of the selector, and the windows' length."""
    # Whole milliseconds, counted back from the range's end (half a step late, capped at now), so
    # that the windows tile the length up to its very end: Prometheus evaluates a range from its
    # start, one step at a time, up to its end at most.
    step = math.ceil(length * 1000 / parts)
    top = int(min(now, end + step / 2000) * 1000)
    windows = scope.prom.query_range(
        f"count(count_over_time({selector}[{step}ms]))", (top - parts * step) / 1000, top / 1000, step / 1000
    )
    return sorted(t for s in windows for t, _ in s.points), step / 1000


def last_progress(scope: Scope, interval: float) -> float:
    """The end of a job that ended without Slurm's record of it: its last step, when its step
    counters stopped less than TRAINING_STEPPED_WITHIN before its series ended (the alerts'
    "still running"); else (a job that hung, then was killed) when its series ended.  The
    agent keeps a finished rank's series until it sees the rank's process gone, a minute or
    two after its last step: ended there, the real DDP runs' reports were 1.5 minutes long."""
    within = T.seconds(T.TRAINING_STEPPED_WITHIN) / scope.scale
    counters = scope.job_series(("lockstep_training_steps_total", "lockstep_framework_iterations_total"))
    resolution = max(min(interval, within) / 4, 0.001)
    found = scope.prom.query_range(f"max({counters})", scope.end - within, scope.end, resolution)
    points = [p for s in found for p in s.points]
    if not points:
        return scope.end
    most = max(v for _, v in points)
    if points[0][1] >= most:
        return scope.end  # no step for the whole window: it stalled before it ended
    # The first point of the grid that sees the last count, then the scrape that brought it: its
    # own timestamp (the grid's phase follows the series' end, which moves with when the agent
    # dropped them; the scrapes do not).
    seen = min(t for t, v in points if v >= most)
    brought = scope.prom.query(f"min(timestamp({counters}) and {counters} >= {most!r})", seen)
    return brought[0].value if brought else seen


def job_section(scope: Scope, now: float, ended: bool = False) -> Job:
    state = "ended" if ended or now - scope.end >= RUNNING_WITHIN else "running"
    job = Job(
        job_id=scope.job_id,
        cluster=scope.cluster or "",
        state=state,
        start=scope.start,
        end=scope.end,
        duration_seconds=round(scope.span * scope.scale, 1),
        nodes=list(scope.instances),
    )
    info = scope.at_end(f"last_over_time({scope.job('lockstep_slurm_job_info')}[{scope.whole}])")
    if info:
        labels = info[0].labels
        job.user, job.account = labels.get("user", ""), labels.get("account", "")
        job.partition, job.job_name = labels.get("partition", ""), labels.get("job_name", "")
    # Ranks, hosts and GPUs from the series' labels (find_job's series API answer), not their samples.
    stepping = scope.series_of("lockstep_training_steps_total", "lockstep_nccl_collectives_total")
    ranks = {s.get("rank", "") for s in stepping + scope.series_of("lockstep_nccl_ras_rank_info")}
    size = scope.at_end(
        f"max(max_over_time({scope.job('lockstep_nccl_communicator_ranks')}[{scope.whole}]))"
    )  # RAS knows every rank, not only this node's
    job.ranks = int(max([len(ranks)] + [s.value for s in size]))
    job.hosts = sorted({s["host"] for s in stepping if s.get("host")}, key=natural)
    job.gpus = len(scope.series_of("lockstep_slurm_job_gpu_info"))
    return job
