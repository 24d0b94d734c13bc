"""The job as every section's queries see it (Scope), and what the sections share: selectors
that name the job or its agents, a counter's increase over the job from its two edges, each
rank's rates asked once, points grouped by time and the ratio of each to its peers' median.

Every query names the job (`job_id`, and `cluster` when given) or the agents that saw it
(`instance=~...`), and every range is the job's own: the cost follows the job's size and length,
never the fleet's (bench/report.py measures a 1,024-rank, 24-hour job).
"""

from __future__ import annotations

import json
import math
import re
import statistics
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from lockstep import thresholds as T
from lockstep.report.prometheus import Prometheus, Sample, Series

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

Key = tuple[tuple[str, str], ...]
RANK_LABELS = ("cluster", "instance", "job_id", "rank", "host")  # a training rank's series


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
    recorded: dict[str, bool] = field(default_factory=dict)  # whether the rules record a series for the job

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


def by_time(series: Iterable[Series], group: Callable[[dict[str, str]], str]) -> dict[tuple[str, float], list]:
    """Each point of each series under (its group, its time): the peers it is compared with."""
    out: dict[tuple[str, float], list[tuple[Key, float]]] = {}
    for s in series:
        key, peers = tuple(sorted(s.labels.items())), group(s.labels)
        for t, v in s.points:
            if math.isfinite(v):
                out.setdefault((peers, t), []).append((key, v))
    return out


def with_peers(values: list[tuple[Key, float]], pairs: bool) -> Iterator[tuple[Key, float, float]]:
    """Each member of a group (a job's ranks, a communicator's) with its value and its peers':
    the group's median where it has more than STRAGGLER_MIN_PEERS members; in a group of two,
    where ``pairs``, the other member's (there the median is the mean of the two, and a rank 10 %
    slower than its peer is only 4.8 % above it); no one in smaller groups.  The straggler rules
    judge so (alerts/straggler_recording.py's ratio to the peers; the NCCL rule, without pairs)."""
    if len(values) > T.STRAGGLER_MIN_PEERS:
        median = statistics.median(v for _, v in values)
        yield from ((key, v, median) for key, v in values)
    elif pairs and len(values) == 2:
        (first, a), (second, b) = values
        yield from ((first, a, b), (second, b, a))


def fill(template: str, labels: dict[str, str]) -> str:
    return re.sub(r"\{(\w+)\}", lambda m: labels.get(m.group(1), "?"), template)
