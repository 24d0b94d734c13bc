"""The cost of `lockstep report` for a large, long job: a 1,024-rank, 24-hour job in a real
Prometheus, backfilled with `promtool tsdb create-blocks-from openmetrics`.

    .venv/bin/python bench/report.py [--ranks 1024] [--hours 24] [--scrape 15] [--other-nodes 64] [--keep DIR]

Writes the job's series as an agent fleet would have exported them (8 ranks and 8 GPUs a node:
training step logs, NCCL Inspector counters, GPU utilization, memory, power and clock events,
Slurm's job and GPU records, one checkpoint root; rank 37 slowed by thermal throttling for
three hours, one checkpoint save stalled for 75 minutes), plus --other-nodes nodes running
another job (series the report must not read), every --scrape seconds (15 by default: the
agent's production scrape interval; a Prometheus holding the job holds that many samples), ending
an hour ago.  Then starts Prometheus on the blocks and makes the report in-process three times,
printing how long each took (and of that, how long its queries took: Prometheus answering, the
answers read), how many queries it sent, the slowest, and what it found.  Target (issue 36):
within 10 s.  No assertion: the machines are shared and noisy; read the figures.

What it leaves out, which a real fleet's Prometheus holds and the report reads: one clock event
reason a GPU (an agent exports 11 `lockstep_gpu_clock_event_active` reasons and up to 5
`lockstep_gpu_clock_event_seconds_total`), one NCCL communicator and collective a rank (a real
job has several of each), and no InfiniBand, PFC or filesystem series (the events and the
evidence read them, a series a port or mount of the job's nodes).

The full size takes a while to build: at --scrape 15 about 20 GB of OpenMetrics (written, then
removed once promtool has made the blocks, 0.2 GB) and half an hour or more on 2 cores; --keep DIR
builds it once and reuses it.
"""

from __future__ import annotations

import argparse
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

from lockstep.agent.report.build import build_report
from lockstep.agent.report.prometheus import Prometheus

PER_NODE = 8
STEP_SECONDS = 10.0
SLOW_RANK = 37
COMM = "0x7a1c"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fmt(labels: dict[str, str]) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


def families(args: argparse.Namespace, start: float) -> Iterator[str]:
    """OpenMetrics text, family by family, each series' samples in time order."""
    points = int(args.hours * 3600 / args.scrape)
    times = [start + i * args.scrape for i in range(points)]
    nodes = args.ranks // PER_NODE
    slow_from, slow_to = start + 5 * 3600, start + 8 * 3600

    def node_of(n: int, other: bool = False) -> dict[str, str]:
        name = f"{'other' if other else 'node'}{n:04d}"
        return {"cluster": "bench", "instance": f"{name}:12400", "job": "lockstep"}

    def all_nodes() -> Iterator[tuple[int, bool]]:
        yield from ((n, False) for n in range(nodes))
        yield from ((n, True) for n in range(args.other_nodes))

    def job_of(other: bool) -> str:
        return "9999" if other else "4242"

    def family(name: str, kind: str) -> str:
        return f"# TYPE {name} {kind}\n"

    # Per rank: training and NCCL counters (the slow rank computes 1.4x as long in its window).
    def rank_series(metric: str) -> Iterator[str]:
        base = metric.removesuffix("_total")
        yield family(base, "counter")
        for n, other in all_nodes():
            for local in range(PER_NODE):
                rank = n * PER_NODE + local
                labels = {
                    **node_of(n, other),
                    "job_id": job_of(other),
                    "rank": str(rank),
                    "host": node_of(n, other)["instance"].split(":")[0],
                }
                if metric.startswith("lockstep_nccl"):
                    labels = {**labels, "comm": COMM, "collective": "AllReduce"}
                total = 0.0
                lines = []
                for t in times:
                    slow = not other and rank == SLOW_RANK and slow_from <= t < slow_to
                    per_step = {
                        "lockstep_training_steps_total": 1.0,
                        "lockstep_training_step_seconds_total": STEP_SECONDS * (1.1 if slow_from <= t < slow_to else 1),
                        "lockstep_training_compute_seconds_total": 7.0 * (1.4 if slow else 1.0),
                        "lockstep_training_data_wait_seconds_total": 0.3,
                        "lockstep_training_tokens_total": 4096.0,
                        "lockstep_nccl_collectives_total": 4.0,
                        "lockstep_nccl_collective_seconds_total": 2.5 * (0.6 if slow else 1.0),
                    }[metric]
                    total += per_step * args.scrape / STEP_SECONDS
                    lines.append(f"{metric}{fmt(labels)} {total:.3f} {t:.0f}\n")
                yield "".join(lines)

    for metric in (
        "lockstep_training_steps_total",
        "lockstep_training_step_seconds_total",
        "lockstep_training_compute_seconds_total",
        "lockstep_training_data_wait_seconds_total",
        "lockstep_training_tokens_total",
        "lockstep_nccl_collectives_total",
        "lockstep_nccl_collective_seconds_total",
    ):
        yield from rank_series(metric)

    def gauge_per_gpu(
        name: str,
        value: Callable[[int, int, float, bool], float],
        kind: str = "gauge",
        extra: dict[str, str] | None = None,
    ) -> Iterator[str]:
        yield family(name.removesuffix("_total"), kind)
        for n, other in all_nodes():
            for gpu in range(PER_NODE):
                labels = {**node_of(n, other), "gpu": str(gpu), "uuid": f"GPU-{n:04d}-{gpu}-{int(other)}"}
                labels.update(extra or {})
                yield "".join(f"{name}{fmt(labels)} {value(n, gpu, t, other):.3f} {t:.0f}\n" for t in times)

    slow_node, slow_gpu = divmod(SLOW_RANK, PER_NODE)

    def throttled(n: int, gpu: int, t: float, other: bool) -> float:
        if other or (n, gpu) != (slow_node, slow_gpu):
            return 0.0
        return max(0.0, min(t, slow_to) - slow_from) * 0.8

    yield from gauge_per_gpu("lockstep_gpu_utilization_ratio", lambda n, g, t, o: 0.95)
    yield from gauge_per_gpu("lockstep_gpu_memory_used_bytes", lambda n, g, t, o: 70e9)
    yield from gauge_per_gpu("lockstep_gpu_memory_total_bytes", lambda n, g, t, o: 80e9)
    yield from gauge_per_gpu("lockstep_gpu_power_watts", lambda n, g, t, o: 600.0)
    yield from gauge_per_gpu(
        "lockstep_gpu_clock_event_seconds_total", throttled, "counter", {"reason": "hw_thermal_slowdown"}
    )
    yield from gauge_per_gpu(
        "lockstep_gpu_clock_event_active",
        lambda n, g, t, o: 1.0 if not o and (n, g) == (slow_node, slow_gpu) and slow_from <= t < slow_to else 0.0,
        extra={"reason": "hw_thermal_slowdown"},
    )
    yield family("lockstep_slurm_job_gpu_info", "gauge")
    for n, other in all_nodes():
        for gpu in range(PER_NODE):
            labels = {**node_of(n, other), "gpu": str(gpu), "uuid": f"GPU-{n:04d}-{gpu}-{int(other)}"}
            labels["job_id"] = job_of(other)
            yield "".join(f"lockstep_slurm_job_gpu_info{fmt(labels)} 1 {t:.0f}\n" for t in times)
    yield family("lockstep_slurm_job_info", "gauge")
    for n, other in all_nodes():
        labels = {**node_of(n, other), "job_id": job_of(other), "user": "alice", "account": "llm", "partition": "h100"}
        labels["job_name"] = "bench"
        yield "".join(f"lockstep_slurm_job_info{fmt(labels)} 1 {t:.0f}\n" for t in times)
    yield family("lockstep_slurm_node_info", "gauge")
    for n, other in all_nodes():
        labels = {**node_of(n, other), "slurm_node": node_of(n, other)["instance"].split(":")[0], "state": "ALLOCATED"}
        yield "".join(f"lockstep_slurm_node_info{fmt(labels)} 1 {t:.0f}\n" for t in times)
    # One checkpoint root, saved hourly; the save at hour 10 hangs for 75 minutes.
    root = {**node_of(0), "root": "/lustre/ckpt/job=4242"}
    yield family("lockstep_checkpoint_info", "gauge")
    yield "".join(f"lockstep_checkpoint_info{fmt({**root, 'job_id': '4242'})} 1 {t:.0f}\n" for t in times)
    yield family("lockstep_checkpoint_expected_interval_seconds", "gauge")
    yield "".join(f"lockstep_checkpoint_expected_interval_seconds{fmt(root)} 3600 {t:.0f}\n" for t in times)
    yield family("lockstep_checkpoint_in_progress_seconds", "gauge")
    stall_from = start + 10 * 3600
    yield "".join(
        f"lockstep_checkpoint_in_progress_seconds{fmt(root)} "
        f"{(t - stall_from) if stall_from <= t < stall_from + 4500 else 0:.0f} {t:.0f}\n"
        for t in times
    )
    yield family("lockstep_checkpoint_last_success_timestamp_seconds", "gauge")
    yield "".join(
        f"lockstep_checkpoint_last_success_timestamp_seconds{fmt(root)} {start + 3600 * int((t - start) // 3600):.0f} "
        f"{t:.0f}\n"
        for t in times
    )
    yield "# EOF\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--hours", type=float, default=24.0)
    parser.add_argument("--scrape", type=float, default=15.0, help="seconds between samples (default 15)")
    parser.add_argument("--other-nodes", type=int, default=64, help="nodes of another job in the same Prometheus")
    parser.add_argument("--keep", type=Path, help="build the TSDB here and keep it (reused when it exists)")
    args = parser.parse_args()
    for tool in ("promtool", "prometheus"):
        if shutil.which(tool) is None:
            print(f"bench/report.py: {tool} not found (Debian package prometheus)", file=sys.stderr)
            return 1
    work = args.keep or Path(tempfile.mkdtemp(prefix="lockstep-report-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    tsdb = work / "tsdb"
    end = (time.time() // 60) * 60 - 3600
    start = end - args.hours * 3600
    stamp = work / "start"
    if not tsdb.exists():
        started = time.monotonic()
        source = work / "job.om"
        with open(source, "w") as out:
            for chunk in families(args, start):
                out.write(chunk)
        size = source.stat().st_size
        print(f"report-bench: wrote {size / 1e9:.2f} GB of OpenMetrics in {time.monotonic() - started:.0f} s")
        started = time.monotonic()
        subprocess.run(
            ["promtool", "tsdb", "create-blocks-from", "openmetrics", "-q", str(source), str(tsdb)], check=True
        )
        source.unlink()
        stamp.write_text(f"{start}\n")
        print(f"report-bench: promtool built the blocks in {time.monotonic() - started:.0f} s")
    start = float(stamp.read_text())
    port = free_port()
    (work / "prometheus.yml").write_text("global: {}\n")
    prometheus = subprocess.Popen(
        [
            "prometheus",
            f"--storage.tsdb.path={tsdb}",
            "--storage.tsdb.retention.time=3650d",
            f"--web.listen-address=127.0.0.1:{port}",
            f"--config.file={work / 'prometheus.yml'}",
            "--log.level=warn",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline or prometheus.poll() is not None:
                print("report-bench: Prometheus did not become ready", file=sys.stderr)
                return 1
            time.sleep(0.5)
        print(
            f"report-bench: job 4242: {args.ranks} ranks on {args.ranks // PER_NODE} nodes, {args.hours:g} h, "
            f"a sample every {args.scrape:g} s; {args.other_nodes} nodes of another job beside it"
        )
        for attempt in range(3):
            client = Prometheus(url, timeout=120)
            started = time.monotonic()
            report = build_report(client, "4242", "bench", now=start + args.hours * 3600 + 1800)
            took = time.monotonic() - started
            asking = sum(seconds for _, seconds in client.log)
            print(
                f"report-bench: run {attempt + 1}: {took:.2f} s ({asking:.2f} s in queries), {client.queries} queries"
            )
        for expr, seconds in sorted(client.log, key=lambda q: -q[1])[:5]:
            print(f"report-bench: slowest: {seconds:.2f} s  {expr[:150]}")
        print(f"report-bench: verdict: {report.verdict}")
        print(
            f"report-bench: {len(report.gpus)} GPUs, {len(report.steps.timeline)} timeline points, "
            f"{len(report.stragglers)} straggler(s), "
            f"{sum(len(r.stalls) for r in report.checkpoints)} checkpoint stall(s)"
        )
    finally:
        prometheus.terminate()
        prometheus.wait(30)
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
