"""A job's report from Prometheus: find the job's time range, then ask for its series only.

Every query names the job (`job_id`, and `cluster` when given) or the agents that saw it
(`instance=~...`), and every range is the job's own: the cost follows the job's size and length,
never the fleet's (bench/report.py measures a 1,024-rank, 24-hour job).

Durations measured on Prometheus' clock are multiplied by `time_scale` (1 in production; the
demo's --speed in the end-to-end tests, where the simulated node's clock runs faster).
"""

from __future__ import annotations

import json
import math
import re
import statistics
import time
import urllib.parse
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from lockstep.agent.report import thresholds as T
from lockstep.agent.report.model import (
    Alert,
    CheckpointRoot,
    Event,
    Gpu,
    Hang,
    Interval,
    Job,
    Point,
    PostMortem,
    Report,
    Steps,
    Straggler,
)
from lockstep.agent.report.notes import notes_for, verdict_for
from lockstep.agent.report.prometheus import Prometheus, ReportError, Sample, Series, unswept

# The series whose job_id label finds a job: Slurm's, the training logs', NCCL's, checkpoints'.
JOB_SERIES = (
    "lockstep_slurm_job_info",
    "lockstep_slurm_job_gpu_info",
    "lockstep_training_steps_total",
    "lockstep_framework_iterations_total",
    "lockstep_nccl_collectives_total",
    "lockstep_nccl_ras_rank_info",
    "lockstep_checkpoint_info",
)
# Those that exist only while the job runs.
LIVE_SERIES = tuple(name for name in JOB_SERIES if name != "lockstep_checkpoint_info")
# The series whose labels alone say who took part (ranks, hosts, GPUs, agents, checkpoint roots):
# asked for once through the series API, which reads the index and no sample.
LABEL_SERIES = (*JOB_SERIES, "lockstep_nccl_rank_info")
# Clock event reasons that cost the job no work: the GPU had none (idle), a display's clocks.
NOT_THROTTLING_REASONS = ("idle", "display_clock_setting")
SECTIONS_ALONGSIDE = 2  # the sections asking their queries beside the steps' (make_report)
LOOKBACK_SECONDS = 31 * 86400  # how far back a job is looked for
EDGE_BUCKETS = 500  # the lookback in buckets
EDGE_PARTS = 50  # the edge bucket in parts (107 s)
EDGE_WINDOWS = 10  # the edge part in windows (10.7 s), the last searched at 1-s resolution
INTERVAL_WINDOW = 3600.0  # the scrape interval is counted over the job's last hour
RUNNING_WITHIN = 90.0  # a job with a sample this recent is running
TIMELINE_POINTS = 240  # points of the step timeline (and of every range query)
HANG_ALERTS = (
    "LockstepTrainingHung",
    "LockstepNCCLRankStuck",
    "LockstepJobEndedHung",
    "LockstepNCCLHang",
    "LockstepTrainingStalled",
)
MIN_STRAGGLER_POINTS = 3  # a rank flagged at fewer points of the timeline is jitter, not a straggler
# A rank's work per step is averaged over this long (on the job's clock) before it is compared
# with its peers': the 5 minutes of the alert's ratio (job_rank:...:ratio_to_peers5m).  Over the
# timeline's own window (4 scrapes) the jitter of real runs put every healthy rank of an 8-rank
# DDP run above the ratio at 3 points or more (tests/agent/report/test_report_ddp_runs.py).
STRAGGLER_RATE_WINDOW_SECONDS = 300.0
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


Key = tuple[tuple[str, str], ...]
RANK_LABELS = ("cluster", "instance", "job_id", "rank", "host")  # a training rank's series
NCCL_RANK_LABELS = (*RANK_LABELS, "comm")  # a rank in one communicator (its collectives summed)
NCCL_COUNTERS = ("lockstep_nccl_collectives_total", "lockstep_nccl_collective_seconds_total")  # ops, seconds
# What the shipped rules record of them (alerts/nccl.py), a series a rank and communicator.
NCCL_PER_OP_RECORDED = "job_comm_rank:lockstep_nccl_collective_seconds:per_op5m"
NCCL_RECORDED_LABELS = ("cluster", "job_id", "comm", "rank", "host")  # its labels


def quote(value: str) -> str:
    return json.dumps(value)


def duration(seconds: float) -> str:
    """A PromQL range of at least a second, in milliseconds."""
    return f"{max(1000, int(math.ceil(seconds * 1000)))}ms"


@dataclass
class Scope:
    """The job as the queries see it: who, when, on which agents."""

    prom: Prometheus
    job_id: str
    cluster: str | None
    start: float = 0.0
    end: float = 0.0
    step: float = 60.0
    window: float = 60.0  # rate() window of the range queries
    interval: float = 60.0  # between two samples of a series (the scrape interval)
    instances: list[str] = field(default_factory=list)
    scale: float = 1.0
    labels: list[dict[str, str]] = field(default_factory=list)  # LABEL_SERIES' series over the job's range
    hosts: dict[str, str] | None = None  # host_of_instance's answer, asked once
    rates: dict[tuple[str, float], dict[Key, dict[float, float]]] = field(default_factory=dict)  # rank_rates'
    exported: dict[str, list[dict[str, str]]] = field(default_factory=dict)  # exported_on_nodes'

    def series_of(self, *names: str) -> list[dict[str, str]]:
        """The job's series of these names (from the one series API answer find_job keeps)."""
        return [labels for labels in self.labels if labels.get("__name__") in names]

    def job(self, name: str = "", matchers: str = "", **extra: str) -> str:
        """The job's series of this name, these matchers first (as PromQL: `rank=~"3|5"`)."""
        labels = {"job_id": self.job_id, **extra}
        if self.cluster is not None:
            labels["cluster"] = self.cluster
        inside = ",".join([*([matchers] if matchers else []), *(f"{k}={quote(v)}" for k, v in labels.items())])
        return f"{name}{{{inside}}}"

    def job_series(self, names: tuple[str, ...] = ()) -> str:
        """Every series that names the job (JOB_SERIES), or those of the names given."""
        return self.job(matchers="__name__=~" + quote("|".join(names or JOB_SERIES)))

    def nodes(self, name: str, matchers: str = "") -> str:
        parts = [f"instance=~{quote('|'.join(re.escape(i) for i in self.instances))}"]
        if self.cluster is not None:
            parts.append(f"cluster={quote(self.cluster)}")
        if matchers:
            parts.append(matchers)
        return f"{name}{{{','.join(parts)}}}"

    @property
    def span(self) -> float:
        return max(self.end - self.start, 1.0)

    @property
    def whole(self) -> str:
        """The job's whole range, for *_over_time and increase at its end."""
        return duration(self.span + self.step)

    def at_end(self, expr: str) -> list[Sample]:
        return self.prom.query(expr, self.end)

    def exported_on_nodes(self, name: str) -> list[dict[str, str]]:
        """The label sets of a metric's series on the job's nodes in its range (the series API,
        no sample read), asked once a report."""
        if name not in self.exported:
            self.exported[name] = self.prom.series(self.nodes(name), self.start - self.step, self.end)
        return self.exported[name]

    def over_job(self, expr: str) -> list[Series]:
        return self.prom.query_range(expr, self.start, self.end, self.step)


def increase_over_job(scope: Scope, name: str) -> list[Sample]:
    """A counter's increase over the job on its nodes, per series (labels without __name__),
    from its two edges: its value at the job's end less its value at the job's start.  Two
    lookups read a chunk each, where increase() over a day decodes every sample (a 1,024-GPU
    day's clock event counters: 0.13 s against 1.74 s).  Meant for counters that reset only with
    their driver or device, which cannot reload under a running job (NVML's clock event time and
    ECC counts, the InfiniBand and NIC port counters, NFS's per-mount statistics).  A series the
    edges miss (begun or ended inside the job) or that went down (reset) is asked for again with
    increase() over the whole range, on its node only."""
    selector = scope.nodes(name)
    at_start = f"{max(1, int(scope.span * 1000))}ms"  # rounded down: the job's first sample is in it
    by_labels = {tuple(sorted(s.labels.items())): s for s in scope.at_end(f"{selector} - {selector} offset {at_start}")}
    again = {
        labels.get("instance", "")
        for labels in scope.exported_on_nodes(name)
        if (edges := by_labels.get(tuple(sorted((k, v) for k, v in labels.items() if k != "__name__")))) is None
        or edges.value < 0
    }
    if again:
        nodes = f"instance=~{quote('|'.join(re.escape(i) for i in sorted(again)))}"
        selector = scope.nodes(name, nodes)
        for s in scope.at_end(f"increase({selector}[{scope.whole}])"):
            by_labels[tuple(sorted(s.labels.items()))] = s
    return [s for s in by_labels.values() if s.value >= 0]


def build_report(
    prom: Prometheus,
    job_id: str,
    cluster: str | None = None,
    *,
    now: float | None = None,
    time_scale: float = 1.0,
    grafana_url: str = T.GRAFANA_URL,
    ended: bool = False,
) -> Report:
    """The job's report as Prometheus has it at ``now``.  ``ended``: the caller knows the job has
    ended (the Slurm epilog, `--save`): it ends at its last sample, however recent; otherwise a
    job with a sample in the last RUNNING_WITHIN seconds is running."""
    with unswept():  # (a report is millions of small objects, none in a cycle: see unswept)
        return make_report(prom, job_id, cluster, time.time() if now is None else now, time_scale, grafana_url, ended)


def make_report(
    prom: Prometheus,
    job_id: str,
    cluster: str | None,
    now: float,
    time_scale: float,
    grafana_url: str,
    ended: bool,
) -> Report:
    scope = Scope(prom, job_id, cluster, scale=time_scale)
    find_job(scope, now, ended)
    job = job_section(scope, now, ended)
    host_of_instance(scope)  # asked once, before the sections that share it run side by side
    # Prometheus evaluates each query on one core, so the sections that read different series
    # ask theirs side by side: SECTIONS_ALONGSIDE of them beside the steps and the training
    # stragglers (which share rank_rates' answers, so they stay in one thread, in order).  On 2
    # cores that took a 1,024-rank day's report, its NCCL counters read, from 17.8 s to 11.4-13.4 s
    # (docs/performance.md).
    with ThreadPoolExecutor(SECTIONS_ALONGSIDE, thread_name_prefix="report") as pool:
        nccl = pool.submit(nccl_stragglers, scope)  # first: the largest reads
        gpus_asked = pool.submit(gpu_section, scope)
        events_asked = pool.submit(event_section, scope)
        checkpoints_asked = pool.submit(checkpoint_section, scope)
        alerts_asked = pool.submit(alert_section, scope, now)
        steps = steps_section(scope)
        stragglers = training_stragglers(scope) + nccl.result()
        gpus, events = gpus_asked.result(), events_asked.result()
        checkpoints, alerts = checkpoints_asked.result(), alerts_asked.result()
    for straggler in stragglers:
        straggler.evidence = evidence(scope, straggler)
    hangs = [
        Hang(a.alertname, a.start, a.labels.get("rank", ""), a.labels.get("host", ""), a.labels.get("gpu", ""))
        for a in alerts
        if a.alertname in HANG_ALERTS
    ]
    post_mortem = post_mortem_of(scope, steps, hangs)
    report = Report(
        job=job,
        verdict="",
        generated_at=now,
        prometheus=prom.url,
        grafana_url=grafana_link(grafana_url, job),
        gpus=gpus,
        steps=steps,
        stragglers=stragglers,
        checkpoints=checkpoints,
        hangs=hangs,
        post_mortem=post_mortem,
        alerts=alerts,
        events=events,
    )
    report.notes = notes_for(report)
    report.verdict = verdict_for(report)
    return report


# --- the job and its range ---------------------------------------------------------------------


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


def natural(text: str) -> tuple[object, ...]:
    """Sort key that puts rank 10 after rank 9 and node010 after node009."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", text))


def agent_of_host(scope: Scope, host: str) -> str:
    """The agent (instance) whose host is this one ("" for none, or no host given)."""
    found = [instance for instance, name in host_of_instance(scope).items() if host and name == host]
    return found[-1] if found else ""


def host_of_instance(scope: Scope) -> dict[str, str]:
    """Each agent's host name (Slurm's node name, else the Kubernetes node, else the address)."""
    if scope.hosts is not None:
        return scope.hosts
    names = {i: i.rsplit(":", 1)[0] for i in scope.instances}
    if not scope.instances:
        return names
    for s in scope.at_end(f"last_over_time({scope.nodes('lockstep_slurm_node_info')}[{scope.whole}])"):
        if s.labels.get("slurm_node"):
            names[s.labels["instance"]] = s.labels["slurm_node"]
    scope.hosts = names
    return names


# --- GPUs --------------------------------------------------------------------------------------


def gpu_section(scope: Scope) -> list[Gpu]:
    if not scope.instances:
        return []
    hosts = host_of_instance(scope)
    gpus: dict[tuple[str, str], Gpu] = {}
    for labels in scope.series_of("lockstep_slurm_job_gpu_info"):
        key = (labels.get("instance", ""), labels.get("uuid", ""))
        gpus[key] = Gpu(node=hosts.get(key[0], key[0]), gpu=labels.get("gpu", ""), uuid=key[1])
    if not gpus:
        return []
    whole = scope.whole

    def each(expr: str, put: Callable[[Gpu, Sample], object]) -> None:
        for sample in scope.at_end(expr):
            gpu = gpus.get((sample.labels.get("instance", ""), sample.labels.get("uuid", "")))
            if gpu is not None:
                put(gpu, sample)

    def setter(name: str) -> Callable[[Gpu, Sample], None]:
        return lambda g, s: setattr(g, name, s.value)

    each(f"avg_over_time({scope.nodes('lockstep_gpu_utilization_ratio')}[{whole}])", setter("utilization_avg"))
    each(f"max_over_time({scope.nodes('lockstep_gpu_memory_used_bytes')}[{whole}])", setter("memory_peak_bytes"))
    each(f"max_over_time({scope.nodes('lockstep_gpu_memory_total_bytes')}[{whole}])", setter("memory_total_bytes"))

    def increased(name: str, label: str, into: Callable[[Gpu], dict[str, float]], digits: int | None) -> None:
        for sample in increase_over_job(scope, name):
            gpu = gpus.get((sample.labels.get("instance", ""), sample.labels.get("uuid", "")))
            if gpu is not None and sample.value > 0:
                into(gpu)[sample.labels.get(label, "?")] = round(sample.value, digits)

    each(f"avg_over_time({scope.nodes('lockstep_gpu_power_watts')}[{whole}])", setter("power_avg_watts"))
    each(f"max_over_time({scope.nodes('lockstep_gpu_power_watts')}[{whole}])", setter("power_max_watts"))
    increased("lockstep_gpu_clock_event_seconds_total", "reason", lambda g: g.throttle_seconds, 1)
    increased("lockstep_gpu_ecc_errors_total", "type", lambda g: g.ecc_errors, None)
    # The agent's own XID count starts again with the agent (a restart inside the job is a
    # reset the edges would not see); its series exist only on GPUs that had one, so increase()
    # reads few samples.
    each(
        f"increase({scope.nodes('lockstep_gpu_xid_errors_total')}[{whole}]) > 0",
        lambda g, s: g.xid_errors.__setitem__(s.labels.get("xid", "?"), round(s.value)),
    )
    # Reasons without a time counter (NVML has none for hw_slowdown, and older drivers none at
    # all): the share of samples active, read only for the reasons that some GPU of the job does
    # not count the time of, and that cost work (4 of the 11 an H100 reports: reading all 11
    # GPU by GPU over a day's samples was the report's slowest read).
    unread = sorted(reasons_timed_everywhere(scope, set(gpus)) | set(NOT_THROTTLING_REASONS))
    untimed = f"reason!~{quote('|'.join(unread))}"
    each(
        f"avg_over_time({scope.nodes('lockstep_gpu_clock_event_active', untimed)}[{whole}]) > 0",
        lambda g, s: g.throttle_seconds.setdefault(
            s.labels.get("reason", "?"), round(s.value * scope.span * scope.scale, 1)
        ),
    )
    out = sorted(gpus.values(), key=lambda g: (natural(g.node), natural(g.gpu)))
    for gpu in out:
        for name in ("utilization_avg", "power_avg_watts", "power_max_watts"):
            value = getattr(gpu, name)
            if value is not None:
                setattr(gpu, name, round(value, 3))
        gpu.idle = gpu.utilization_avg is not None and gpu.utilization_avg < T.GPU_IDLE_ACTIVITY_RATIO
    return out


def reasons_timed_everywhere(scope: Scope, gpus: set[tuple[str, str]]) -> set[str]:
    """The clock event reasons whose time every one of the job's GPUs (instance, uuid) counts,
    from the series API (no sample read)."""
    counted: dict[tuple[str, str], set[str]] = {gpu: set() for gpu in gpus}
    for labels in scope.exported_on_nodes("lockstep_gpu_clock_event_seconds_total"):
        gpu = (labels.get("instance", ""), labels.get("uuid", ""))
        if gpu in counted:
            counted[gpu].add(labels.get("reason", ""))
    return set.intersection(*counted.values()) if counted else set()


# --- steps -------------------------------------------------------------------------------------


def step_source(scope: Scope) -> StepSource | None:
    """The job's step counters: the training collector's when the job has them, otherwise the
    framework_logs collector's iterations; None when the job logs neither."""
    for source in STEP_SOURCES:
        if scope.series_of(source.steps):
            return source
    return None


def rank_rates(
    scope: Scope, name: str, window: float, labels: tuple[str, ...] = RANK_LABELS
) -> dict[Key, dict[float, float]]:
    """Each rank's rate of a counter at every point of the timeline, by its labels (as `sum by`):
    one range query of rate() alone, asked once a report.  Summing or dividing the ranks' rates
    in Prometheus makes it build every rank's labels again at every point: a rank's work per step
    so took 2.4-2.9 s of a 1,024-rank day's report, a counter's rates alone 0.3 s."""
    if (name, window) not in scope.rates:
        scope.rates[name, window] = summed_by(scope.over_job(f"rate({scope.job(name)}[{duration(window)}])"), labels)
    return scope.rates[name, window]


def summed_by(series: list[Series], labels: tuple[str, ...]) -> dict[Key, dict[float, float]]:
    """The series' points summed by these labels, as `sum by` would (a rank's series of other
    labels: its collectives, its logs), each key's points by time."""
    out: dict[Key, dict[float, float]] = {}
    for s in series:
        at = out.setdefault(tuple(sorted((k, v) for k, v in s.labels.items() if k in labels)), {})
        for t, v in s.points:
            at[t] = at.get(t, 0.0) + v
    return out


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
        # their logs' median step (tests/agent/report/test_report_ddp_runs.py).
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


# --- stragglers --------------------------------------------------------------------------------


def by_time(series: Iterable[Series], group: Callable[[dict[str, str]], str]) -> dict[tuple[str, float], list]:
    """Each point of each series under (its group, its time): the peers it is compared with."""
    out: dict[tuple[str, float], list[tuple[Key, float]]] = {}
    for s in series:
        key, peers = tuple(sorted(s.labels.items())), group(s.labels)
        for t, v in s.points:
            if math.isfinite(v):
                out.setdefault((peers, t), []).append((key, v))
    return out


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
        if len(values) < T.STRAGGLER_MIN_PEERS or t < scope.start + window:
            continue
        median = statistics.median(v for _, v in values)
        for key, v in values:
            # As LockstepTrainingStragglerSustained: over the job's median rank's, or over its
            # one peer's in a 2-rank job (where the median is the mean of the two).
            peer = median if len(values) > 2 else next(p for k, p in values if k != key)
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
        if len(values) <= 2:
            continue
        median = statistics.median(v for _, v in values)
        if median <= 0:
            continue
        for key, v in values:
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


def evidence(scope: Scope, straggler: Straggler) -> list[str]:
    """What else the straggler's node (and its GPUs of the job) shows while it straggled: the
    straggler rules' suspects, by their thresholds."""
    # The rank's host may be another agent's node (its logs read elsewhere): that agent's series.
    instance = agent_of_host(scope, straggler.host) or straggler.node
    if not instance:
        return []
    length = max(straggler.end - straggler.start, 0) + scope.window
    w = duration(length)
    node = f"instance={quote(instance)}" + (f",cluster={quote(scope.cluster)}" if scope.cluster is not None else "")
    prom = scope.prom
    found: list[str] = []

    def ask(expr: str) -> list[Sample]:
        return prom.query(expr, straggler.end)

    reasons = "|".join(T.SUSPECT_GPU_THROTTLE_REASONS)
    job_gpus = {
        labels.get("uuid", ""): labels.get("gpu", "")
        for labels in scope.series_of("lockstep_slurm_job_gpu_info")
        if labels.get("instance") == instance
    }
    for s in ask(f'avg_over_time(lockstep_gpu_clock_event_active{{{node},reason=~"{reasons}"}}[{w}])'):
        share = s.value
        gpu = job_gpus.get(s.labels.get("uuid", ""))
        if gpu is not None and share >= T.SUSPECT_GPU_THROTTLE_SHARE:
            found.append(f"GPU {gpu} throttled ({s.labels.get('reason')}) {share:.0%} of the time")
            if not straggler.gpu and straggler.kind == "training":
                straggler.gpu = gpu
    for s in ask(f"rate(lockstep_pfc_pause_seconds_total{{{node}}}[{w}])"):
        share = s.value / scope.scale
        if share > T.SUSPECT_PFC_PAUSE_RATIO:
            where = f"{s.labels.get('interface', '?')} priority {s.labels.get('priority', '?')}"
            found.append(f"PFC pause on {where} {share:.0%} of the time ({s.labels.get('direction', '')})")
    ib_errors = (
        "lockstep_ib_port_symbol_errors_total",
        "lockstep_ib_port_link_error_recovery_total",
        "lockstep_ib_port_link_downed_total",
        "lockstep_ib_port_receive_errors_total",
    )
    for name in ib_errors:
        for s in ask(f"increase({name}{{{node}}}[{w}]) > 0"):
            what = name.removeprefix("lockstep_ib_port_").removesuffix("_total").replace("_", " ")
            found.append(f"IB {s.labels.get('device')}/{s.labels.get('port')}: {s.value:.0f} {what}")
    for s in ask(f"min_over_time(lockstep_ib_port_state{{{node}}}[{w}]) < 4"):
        found.append(f"IB {s.labels.get('device')}/{s.labels.get('port')} down")
    wait = f"rate(lockstep_ib_port_transmit_wait_total{{{node}}}[{w}])"
    words = f"rate(lockstep_ib_port_transmitted_bytes_total{{{node}}}[{w}]) / 4"
    for s in ask(f"{wait} / ({wait} + {words} > 0) > {T.SUSPECT_IB_TRANSMIT_WAIT_RATIO}"):
        found.append(f"IB {s.labels.get('device')}/{s.labels.get('port')} congested ({s.value:.0%} transmit wait)")
    responsive = f"lockstep_filesystem_responsive{{{node}}}[{w}]"
    for s in ask(f"count_over_time({responsive}) - sum_over_time({responsive}) >= 2"):
        found.append(f"mount {s.labels.get('mountpoint')} hung")
    for s in ask(f"sum by (mountpoint) (increase(lockstep_nfs_major_timeouts_total{{{node}}}[{w}])) > 0"):
        found.append(f"NFS {s.labels.get('mountpoint', '')}: {s.value:.0f} major timeouts")
    pressure = (("cpu", "some", T.SUSPECT_CPU_PRESSURE_RATIO), ("io", "full", T.SUSPECT_IO_PRESSURE_RATIO))
    for resource, kind, limit in pressure:
        for s in ask(
            f'rate(lockstep_host_pressure_stalled_seconds_total{{{node},resource="{resource}",kind="{kind}"}}[{w}])'
        ):
            if s.value / scope.scale > limit:
                found.append(f"{resource.upper()} pressure ({kind}) {s.value / scope.scale:.0%} of the time")
    if straggler.kind == "training":
        found += data_wait_evidence(scope, straggler, w)
    return list(dict.fromkeys(found))


def data_wait_evidence(scope: Scope, straggler: Straggler, w: str) -> list[str]:
    by = "(rank)"
    steps = f"sum by {by} (rate({scope.job('lockstep_training_steps_total')}[{w}]))"
    data = scope.prom.query(
        f"sum by {by} (rate({scope.job('lockstep_training_data_wait_seconds_total')}[{w}])) / ({steps} > 0)",
        straggler.end,
    )
    work = scope.prom.query(
        f"(sum by {by} (rate({scope.job('lockstep_training_compute_seconds_total')}[{w}]))"
        f" + sum by {by} (rate({scope.job('lockstep_training_data_wait_seconds_total')}[{w}]))) / ({steps} > 0)",
        straggler.end,
    )
    data_of = {s.labels.get("rank"): s.value for s in data}
    work_of = {s.labels.get("rank"): s.value for s in work}
    if straggler.rank not in data_of or straggler.rank not in work_of or len(work_of) < 2:
        return []
    excess = work_of[straggler.rank] - statistics.median(work_of.values())
    extra_wait = data_of[straggler.rank] - statistics.median(data_of.values())
    if excess > 0 and extra_wait > T.SUSPECT_DATA_WAIT_SHARE * excess:
        return [f"data loader: {extra_wait:.3g} s more data wait per step than the median rank"]
    return []


# --- checkpoints -------------------------------------------------------------------------------


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


# --- alerts, hangs, events ---------------------------------------------------------------------


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
EVENT_COUNTERS: tuple[tuple[str, str, tuple[str, ...], str], ...] = (
    ("fabric", "lockstep_ib_port_link_downed_total", (), "IB {device}/{port} link down"),
    ("fabric", "lockstep_ib_port_link_error_recovery_total", (), "IB {device}/{port} recoveries"),
    ("fabric", "lockstep_ib_port_symbol_errors_total", (), "IB {device}/{port} symbol errors"),
    ("fabric", "lockstep_pfc_pause_storm_events_total", (), "PFC pause storm on {interface}"),
    (
        "filesystem",
        "lockstep_nfs_major_timeouts_total",
        ("instance", "mountpoint"),
        "NFS major timeouts on {mountpoint}",
    ),
)
EVENT_GAUGES = (
    ("fabric", "min_over_time(lockstep_ib_port_state{SEL}[WIN]) < 4", "IB {device}/{port} not active"),
    # Unresponsive at two scrapes or more (one slow statfs on a busy node is no event).
    (
        "filesystem",
        "count_over_time(lockstep_filesystem_responsive{SEL}[WIN])"
        " - sum_over_time(lockstep_filesystem_responsive{SEL}[WIN]) >= 2",
        "{mountpoint} unresponsive",
    ),
)


def event_section(scope: Scope) -> list[Event]:
    if not scope.instances:
        return []
    hosts = host_of_instance(scope)
    selector = scope.nodes("")[1:-1]
    out = []
    for kind, name, by, what in EVENT_COUNTERS:
        counted: dict[Key, float] = {}
        for s in increase_over_job(scope, name):
            key = tuple(sorted((k, v) for k, v in s.labels.items() if not by or k in by))
            counted[key] = counted.get(key, 0.0) + s.value
        for key, value in counted.items():
            labels = dict(key)
            if round(value) > 0:
                out.append(Event(kind, hosts.get(labels.get("instance", ""), ""), fill(what, labels), round(value)))
    for kind, template, what in EVENT_GAUGES:
        for s in scope.at_end(template.replace("SEL", selector).replace("WIN", scope.whole)):
            out.append(Event(kind, hosts.get(s.labels.get("instance", ""), ""), fill(what, s.labels), 0.0))
    return sorted(out, key=lambda e: (e.kind, natural(e.node), e.what))


def fill(template: str, labels: dict[str, str]) -> str:
    return re.sub(r"\{(\w+)\}", lambda m: labels.get(m.group(1), "?"), template)


def grafana_link(base: str, job: Job) -> str:
    query = {"var-job_id": job.job_id, "from": str(int(job.start * 1000)), "to": str(int(job.end * 1000))}
    if job.cluster:
        query = {"var-cluster": job.cluster, **query}
    return f"{base.rstrip('/')}/d/{T.SLURM_JOB_DASHBOARD_UID}?{urllib.parse.urlencode(query)}"
