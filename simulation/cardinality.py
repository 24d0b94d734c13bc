"""The cardinality budget: how many series the agent exports, per node, GPU, port and interface.

A fleet pays for every series of every node (docs/performance.md, cardinality budget).  The
budget is for the default configuration on the simulated 8-GPU node; tests/simulation/test_cardinality.py
fails when an exposition of the simulated node exceeds it, or when a label could take a new
value over time (a pid, a file path, a request id, a timestamp), which makes new series
without end.  bench/cardinality.py prints the figures.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

# Series per entity on the simulated node, default configuration.  Measured (issue 13's PCIe link
# health): 159 per GPU (108 of them NVLink: 18 links x 6; 4 the PCIe link), 38 per InfiniBand/RoCE
# port, 33 per RoCE interface, 2,252 per node (healthy) to 2,329 (kv-pressure: training and
# inference); the pcie collector adds 100 (9 a PCI function: its link, AER totals, info, skipped
# reads) and its 12 self-metric series.  Issue 13's GPU activity and verdicts then added 29 per GPU
# (188; 190 from a collector's second round, when GPM's two ratio gauges appear): GPM activity
# counters (SM cycles, SM active cycles, 9 pipes), the recovery action state set (8 states), fabric
# state (3) and health (5), lifetime ECC (2): 2,484 to 2,561 per node.  Issue 14 added each Slurm
# job's and Kubernetes container's share of each GPU it runs a process on (2 series a pair; bounded
# by the jobs and pods on the node, no PID): 190 per GPU, 2,500 (healthy) to 2,591 (kubernetes: its
# pods, the training job and an inference server), +16 from the second round.  Issue 29 added
# refusal counters (a self-metric per collector, 4 host, 1 Slurm, 6 inference, 3 training and
# checkpoint): 2,519 to 2,616.  Issue 28's inference families (KV capacity, external prefix hits,
# decode and speculative tokens, rejections, HTTP 5xx) add 7 where an engine runs: up to 2,623.
# Issue 27's NCCL collectors add their self-metric series and, in the NCCL scenarios, a job's
# 8 local ranks' Inspector counters and the RAS view of its 16-rank communicator: 2,545 (healthy)
# to 2,675 (nccl-straggler).  Issue 37's framework_logs collector adds its 13 self-metric series,
# 11 of its own (files by source, invalid lines by reason, bytes read, ...) and 14 a job whose
# framework it reads (Megatron with --log-straggler: job 4242 on every scenario): 2,583 (healthy)
# to 2,713 (nccl-straggler), 2,729 from the second round; the node's budget went from 2,700 to 2,750
# for it, the alternative being a job seen by no series at all.  The headroom is
# small on purpose: a new per-GPU or per-port family should be a decision, with this table updated.
BUDGET_PER_GPU = 195
BUDGET_PER_PORT = 40
BUDGET_PER_INTERFACE = 36
BUDGET_PER_NODE = 2750

# Label names that take a new value per process, file, request or moment: each new value is a
# new series, forever (until the TSDB drops it).
UNBOUNDED_LABEL_NAMES = frozenset(
    {"pid", "ppid", "tid", "path", "file", "filename", "file_path", "request_id", "trace_id", "span_id"}
    | {"timestamp", "time", "date", "step", "iteration", "id"}
)
# Values that look like a moment or a request: Unix times, ISO 8601 dates, random UUIDs (a GPU's
# UUID is "GPU-..." and stays).
UNBOUNDED_VALUE = re.compile(
    r"^(1[5-9]\d{8}(\.\d+)?|\d{4}-\d{2}-\d{2}T.*|[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[0-9a-f]{4}-[0-9a-f]{12})$"
)

Labels = frozenset[tuple[str, str]]


@dataclass(frozen=True)
class Series:
    name: str  # sample name (a histogram's _bucket, _sum, _count are three names)
    labels: Labels

    def label(self, name: str) -> str | None:
        return dict(self.labels).get(name)


def parse(text: str) -> list[Series]:
    """Every series of an exposition.  Golden files write '<varies>' for volatile values."""
    text = re.sub(r" <varies>$", " 0", text, flags=re.MULTILINE)
    return [
        Series(sample.name, frozenset(sample.labels.items()))
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    ]


def family_of(sample_name: str, families: set[str]) -> str:
    """The declared metric a sample belongs to (histogram samples to their family)."""
    if sample_name in families:
        return sample_name
    return re.sub(r"_(bucket|sum|count)$", "", sample_name)


@dataclass(frozen=True)
class Budget:
    """One exposition's series, counted the ways the budget is written."""

    total: int
    gpus: int
    gpu_series: int  # series with a gpu or uuid label
    ports: int
    port_series: int  # series with device and port labels
    interfaces: int
    interface_series: int  # series with an interface label

    @property
    def per_gpu(self) -> float:
        return self.gpu_series / self.gpus if self.gpus else 0.0

    @property
    def per_port(self) -> float:
        return self.port_series / self.ports if self.ports else 0.0

    @property
    def per_interface(self) -> float:
        return self.interface_series / self.interfaces if self.interfaces else 0.0

    def over(self) -> list[str]:
        """What exceeds the budget, in words; empty when within it."""
        checks = (
            ("series per node", self.total, BUDGET_PER_NODE),
            ("series per GPU", self.per_gpu, BUDGET_PER_GPU),
            ("series per InfiniBand/RoCE port", self.per_port, BUDGET_PER_PORT),
            ("series per RoCE interface", self.per_interface, BUDGET_PER_INTERFACE),
        )
        return [f"{what}: {value:g} > budget {limit}" for what, value, limit in checks if value > limit]


def budget(series: list[Series]) -> Budget:
    gpu = [s for s in series if s.label("gpu") is not None or s.label("uuid") is not None]
    port = [s for s in series if s.label("device") is not None and s.label("port") is not None]
    interface = [s for s in series if s.label("interface") is not None]
    return Budget(
        total=len(series),
        gpus=sum(1 for s in series if s.name == "lockstep_gpu_info"),
        gpu_series=len(gpu),
        ports=sum(1 for s in series if s.name == "lockstep_ib_port_info"),
        port_series=len(port),
        interfaces=len({s.label("interface") for s in interface}),
        interface_series=len(interface),
    )


def unbounded_labels(series: list[Series]) -> list[str]:
    """'metric{label="value"}' for every label that names or looks like an unbounded value."""
    found = set()
    for s in series:
        for name, value in s.labels:
            if name in UNBOUNDED_LABEL_NAMES or UNBOUNDED_VALUE.match(value):
                found.add(f'{s.name}{{{name}="{value}"}}')
    return sorted(found)


def by_metric(series: list[Series], families: set[str]) -> Counter[str]:
    return Counter(family_of(s.name, families) for s in series)
