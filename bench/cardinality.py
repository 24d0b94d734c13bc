"""Series per node: the agent on the simulated 8-GPU node, by collector and by metric, against
node_exporter's and dcgm-exporter's defaults.

    .venv/bin/python bench/cardinality.py [--scenario kv-pressure] [--metrics 25]

- Lockstep: one round of `lockstep demo --once --scenario X` (default configuration; the demo
  turns on two generic ethtool statistics and two generic RDMA hw_counters to show them), counted
  by collector (from the metric declarations) and by metric, then per GPU, per InfiniBand/RoCE
  port and per RoCE interface against the budget (simulation/cardinality.py).
- node_exporter (Debian `prometheus-node-exporter`, default collectors, on this machine): its
  series, and how many of them are per CPU.  A GPU node has far more CPUs than this 2-core
  machine, so the per-CPU part is also scaled to a 2 x 56-core, 224-thread node.
- dcgm-exporter: not runnable without DCGM; its default counter list is 21 fields per GPU
  (etc/default-counters.csv, NVIDIA/dcgm-exporter commit 00d6d344ea4a), one series each per GPU.
Prints figures; no pass/fail (tests/simulation/test_cardinality.py enforces the budget).
"""

from __future__ import annotations

import argparse
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections import Counter

from lockstep.agent import catalogue
from lockstep.simulation import cardinality
from lockstep.simulation.snapshot import expositions

DCGM_DEFAULT_FIELDS = 21  # uncommented rows of dcgm-exporter's etc/default-counters.csv (see above)
GPU_NODE_CPUS = 224


def node_exporter_series() -> tuple[list[cardinality.Series], int] | None:
    binary = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
    if binary is None:
        return None
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    process = subprocess.Popen(
        [binary, f"--web.listen-address=127.0.0.1:{port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        for _ in range(100):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
                    text = response.read().decode()
                break
            except OSError:
                time.sleep(0.1)
        else:
            return None
    finally:
        process.terminate()
        process.wait(10)
    series = cardinality.parse(text)
    cpus = len({s.label("cpu") for s in series if s.label("cpu") is not None})
    return series, cpus


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenario", default="kv-pressure", help="simulated node scenario (training and inference)")
    parser.add_argument("--metrics", type=int, default=25, help="how many of the largest metrics to list")
    args = parser.parse_args()

    series = cardinality.parse(expositions(args.scenario, [0.0])[0])
    sections = catalogue.declared()
    collector_of = {spec.name: section for section, specs in sections.items() for spec in specs}
    families = set(collector_of)
    metric_counts = cardinality.by_metric(series, families)
    collector_counts: Counter[str] = Counter()
    for name, count in metric_counts.items():
        collector_counts[collector_of.get(name, "?")] += count

    print(f"lockstep, simulated node, scenario {args.scenario}: {len(series)} series")
    print("  by collector:")
    for name, count in collector_counts.most_common():
        print(f"    {name:<14} {count:>6}")
    print(f"  by metric (largest {args.metrics} of {len(metric_counts)}):")
    for name, count in metric_counts.most_common(args.metrics):
        print(f"    {name:<58} {count:>6}")
    b = cardinality.budget(series)
    print(
        f"  per GPU {b.per_gpu:g} (budget {cardinality.BUDGET_PER_GPU}), per port {b.per_port:g} "
        f"(budget {cardinality.BUDGET_PER_PORT}), per RoCE interface {b.per_interface:g} "
        f"(budget {cardinality.BUDGET_PER_INTERFACE}), per node {b.total} (budget {cardinality.BUDGET_PER_NODE})"
    )
    dcgm = DCGM_DEFAULT_FIELDS * b.gpus
    print(f"dcgm-exporter default counters: {DCGM_DEFAULT_FIELDS} per GPU, {dcgm} for {b.gpus} GPUs")
    measured = node_exporter_series()
    if measured is None:
        print("node_exporter: not installed (Debian prometheus-node-exporter)")
        return 0
    ne, cpus = measured
    per_cpu = sum(1 for s in ne if s.label("cpu") is not None)
    scaled = len(ne) - per_cpu + round(per_cpu / max(cpus, 1) * GPU_NODE_CPUS)
    print(
        f"node_exporter default collectors on this machine: {len(ne)} series, {per_cpu} of them per CPU "
        f"({cpus} CPUs); scaled to {GPU_NODE_CPUS} CPUs: {scaled}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
