"""NVML calls per GPU per collection round on the simulated node (8 H100s, 18 NVLinks each).

    .venv/bin/python bench/nvml_calls.py [--rounds 20] [--scenario healthy]

Runs the GPU collector against the simulated node's fake NVML, which counts every call
per GPU.  The first round enumerates the GPUs and probes what they support; the steady
state is what every later round costs.  Target: at most 12 calls per GPU per round (issue 3),
plus 2 for the PCIe link's current generation and width (issue 13; its maxima are asked once per
NVML session, in the first round); GPM activity (a sample, and the metrics between it and the
last round's) and the NVSwitch fabric info have their own budget of 3 more (issue 13), printed
apart.  Also prints the collector's CPU time per round (noisy on shared machines: read
it as an order of magnitude).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lockstep.agent.collector import CollectorContext, Paths  # noqa: E402
from lockstep.agent.options import NoOptions  # noqa: E402
from lockstep.agent.seams import Seams
from lockstep.collectors.gpu import GpuCollector  # noqa: E402
from lockstep.collectors.gpu.provider import NVML
from lockstep.simulation.fake_nvml import FakeNvml  # noqa: E402
from lockstep.simulation.gpu import node_spec  # noqa: E402

TARGET = 12 + 2
# Issue 13's GPM activity and fabric health calls: their own budget on top of TARGET.
ADDED = ("nvmlGpmSampleGet", "nvmlGpmMigSampleGet", "nvmlGpmMetricsGet", "nvmlDeviceGetGpuFabricInfoV")
ADDED_TARGET = 3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--scenario", default="healthy")
    args = parser.parse_args()

    fake = FakeNvml(node_spec(args.scenario))
    gpus = len(fake.spec.gpus)
    links = max(g.nvlink_links for g in fake.spec.gpus)
    context = CollectorContext(Paths(), NoOptions(), logging.getLogger("bench"), Seams(NVML.replaced_by(fake)))
    collector = GpuCollector(context)
    try:
        list(collector.collect())
        first = Counter({k: v for k, v in fake.calls.items() if k[1] is not None})
        fake.reset_calls()
        cpu = time.thread_time()
        for _ in range(args.rounds):
            list(collector.collect())
        cpu_per_round = (time.thread_time() - cpu) / args.rounds
        steady = Counter({k: v for k, v in fake.calls.items() if k[1] is not None})
        batches = fake.calls_for(function="nvmlDeviceGetFieldValues")
        fields_per_call = sum(fake.field_requests.values()) / max(1, batches)
    finally:
        collector.close()

    per_gpu = [sum(n for (_, g), n in steady.items() if g == i) / args.rounds for i in range(gpus)]
    added = [sum(n for (f, g), n in steady.items() if g == i and f in ADDED) / args.rounds for i in range(gpus)]
    base = [total - extra for total, extra in zip(per_gpu, added)]
    print(f"simulated node: {gpus} GPUs x {links} NVLinks, scenario {args.scenario}, {args.rounds} rounds")
    print(f"first round (enumeration + probing): {sum(first.values()) / gpus:.1f} NVML calls per GPU")
    print(f"steady state: {max(per_gpu):g} NVML calls per GPU per round, of which")
    print(f"  base set: {max(base):g} (target <= {TARGET})")
    print(f"  GPM activity and fabric health (issue 13): {max(added):g} (target <= {ADDED_TARGET})")
    by_function = Counter()
    for (function, _), n in steady.items():
        by_function[function] += n
    for function, n in sorted(by_function.items()):
        print(f"  {function:45s} {n / args.rounds / gpus:g}")
    print(f"fields per nvmlDeviceGetFieldValues call: {fields_per_call:g}")
    print(f"collector CPU per round: {cpu_per_round * 1000:.2f} ms")
    return 0 if max(base) <= TARGET and max(added) <= ADDED_TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
