"""The cost of `lockstep report` for a large, long job: a 1,024-rank, 24-hour job in a real
Prometheus, backfilled with `promtool tsdb create-blocks-from openmetrics`.

    .venv/bin/python bench/report.py [--ranks 1024] [--hours 24] [--scrape 15] [--other-nodes 64] [--keep DIR]

Writes the job's series as an agent fleet would have exported them, 8 ranks and 8 GPUs a
node, as many series of each family as the agent exports for the simulated H100 node
(tests/golden/demo-healthy.prom) and the NCCL Inspector for a 3-D parallel job:
- a rank: 5 training counters; 2 NCCL counters for each of 6 (communicator, collective) pairs
  (data-parallel AllReduce, ReduceScatter, AllGather; tensor-parallel AllReduce, AllGather;
  pipeline Broadcast), and an Inspector rank info per communicator;
- a GPU: utilization, memory used and total, power, 11 clock event reasons active and 5 timed,
  2 ECC counters, Slurm's GPU record;
- a node: Slurm's job and node records, 10 InfiniBand ports (state, 4 error counters, transmit
  wait, bytes sent), 4 PFC pause counters and 2 storm counters, 7 filesystems' responsiveness,
  5 NFS operations' major timeouts, 6 pressure counters;
- one checkpoint root, saved hourly;
- what the shipped rules record of the NCCL counters and the report reads: each rank's time per
  collective in each communicator (written at the rule's value, not evaluated).
Rank 37 is slowed by thermal throttling for three hours (and waits least at every collective);
one checkpoint save stalls for 75 minutes.  Plus --other-nodes nodes running another job (series
the report must not read), every --scrape seconds (15 by default: the agent's production scrape
interval; a Prometheus holding the job holds that many samples), ending an hour ago.  Then starts
Prometheus on the blocks, waits until it has compacted them (as a Prometheus holding a day would
have; it compacts on the same 2 cores), and makes the report in-process three times, printing how long each
took (and of that, how long its queries took: Prometheus answering, the answers read), how many
queries it sent, the slowest, and what it found.  Target (issue 36): within 10 s.  No assertion:
the machines are shared and noisy; read the figures.

What it leaves out: series the report does not read (an agent exports about 2,600 a node), and
ALERTS and the other recorded series (a backfilled Prometheus evaluates no rule).

The TSDB is built a block (2 hours) at a time: promtool reads its whole input once per block it
makes, so each window's OpenMetrics is its own file, written while promtool makes the previous
one's block.  At the full size that is about 80 GB of OpenMetrics (never more than two windows'
on disk at once; the blocks take under 1 GB) and about 20 minutes on 2 cores; --keep DIR builds it
once and reuses it.
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterable, Iterator
from pathlib import Path

from lockstep.report.build import build_report
from lockstep.report.prometheus import Prometheus

PER_NODE = 8
STEP_SECONDS = 10.0
SLOW_RANK = 37
BLOCK_SECONDS = 7200  # promtool's block length: each window's OpenMetrics becomes one block
# What an agent exports for a node, after its own exposition of the simulated H100 node
# (tests/golden/demo-healthy.prom): these counts of the series the report reads.
CLOCK_EVENT_REASONS = (
    "idle",
    "applications_clocks_setting",
    "sw_power_cap",
    "hw_slowdown",
    "sync_boost",
    "sw_thermal_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake",
    "display_clock_setting",
    "board_limit",
    "reliability",
)
TIMED_REASONS = ("sw_power_cap", "sync_boost", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake")
IB_PORTS = tuple(f"mlx5_{i}" for i in range(10))
IB_ERRORS = (
    "lockstep_ib_port_symbol_errors_total",
    "lockstep_ib_port_link_downed_total",
    "lockstep_ib_port_link_error_recovery_total",
    "lockstep_ib_port_receive_errors_total",
)
PFC = (("ens3f0np0", "3"), ("ens3f1np1", "global"))
MOUNTS = ("/", "/boot/efi", "/datasets", "/dev/shm", "/home", "/lustre", "/raid")
NFS_OPERATIONS = ("READ", "WRITE", "GETATTR", "LOOKUP", "ACCESS")
PRESSURE = (("cpu", "some"), ("cpu", "full"), ("memory", "some"), ("memory", "full"), ("io", "some"), ("io", "full"))
# A 3-D parallel job's communicators as the NCCL Inspector names them (its data-parallel,
# tensor-parallel and pipeline groups), with the collectives each runs.
COMMUNICATORS = (
    ("0x7a1c", "dp", ("AllReduce", "ReduceScatter", "AllGather")),
    ("0x7a2d", "tp", ("AllReduce", "AllGather")),
    ("0x7a3e", "pp", ("Broadcast",)),
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fmt(labels: dict[str, str]) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


class Fleet:
    """The job's series and the other job's, sample by sample; window() gives one block's worth.

    A counter's value at each sample is its running sum of per-sample increments, kept in
    arrays (one per shape of series) so a window can start anywhere: the blocks are written
    one at a time, each read once by promtool (which reads its whole input once per block)."""

    def __init__(self, args: argparse.Namespace, start: float) -> None:
        self.args = args
        self.points = int(args.hours * 3600 / args.scrape)
        self.times = [start + i * args.scrape for i in range(self.points)]
        self.stamps = [f" {t:.0f}\n" for t in self.times]
        self.nodes = args.ranks // PER_NODE
        self.slow_from, self.slow_to = start + 5 * 3600, start + 8 * 3600
        self.stall_from = start + 10 * 3600
        self.start = start

    def running_sum(self, increments: Iterable[float]) -> list[float]:
        return list(itertools.accumulate(increments))

    def node_of(self, n: int, other: bool = False) -> dict[str, str]:
        name = f"{'other' if other else 'node'}{n:04d}"
        return {"cluster": "bench", "instance": f"{name}:12400", "job": "lockstep"}

    def all_nodes(self) -> Iterator[tuple[int, bool]]:
        yield from ((n, False) for n in range(self.nodes))
        yield from ((n, True) for n in range(self.args.other_nodes))

    def recorded(self, lo: int, hi: int) -> Iterator[str]:
        """What the shipped rules record of the NCCL counters and the report reads where it
        exists: each rank's time per collective in each communicator (alerts/nccl.py), as the
        rule records it every 15 s once its 5-minute window is full (written here, not evaluated:
        promtool's rule backfill of a 1,024-rank day would take hours)."""
        stamps = self.stamps[lo:hi]
        per_op = 2.5 / 4.0  # the counters' collective seconds over collectives
        yield "# TYPE job_comm_rank:lockstep_nccl_collective_seconds:per_op5m gauge\n"
        for n, other in self.all_nodes():
            node = self.node_of(n, other)
            for local in range(PER_NODE):
                rank = n * PER_NODE + local
                slow = not other and rank == SLOW_RANK
                for comm, _, _ in COMMUNICATORS:
                    labels = {
                        "cluster": node["cluster"],
                        "job_id": "9999" if other else "4242",
                        "comm": comm,
                        "rank": str(rank),
                        "host": node["instance"].split(":")[0],
                    }
                    prefix = f"job_comm_rank:lockstep_nccl_collective_seconds:per_op5m{fmt(labels)}"
                    yield "".join(
                        f"{prefix} {per_op * (0.6 if slow and self.slow_from <= t < self.slow_to else 1.0):.4f}{stamp}"
                        for t, stamp in zip(self.times[lo:hi], stamps)
                    )

    def window(self, lo: int, hi: int) -> Iterator[str]:
        """OpenMetrics text for samples lo..hi-1, family by family, each series in time order."""
        args, stamps = self.args, self.stamps[lo:hi]
        slow_node, slow_gpu = divmod(SLOW_RANK, PER_NODE)
        scale = args.scrape / STEP_SECONDS

        slow_window = [self.slow_from <= t < self.slow_to for t in self.times]

        def values(prefix: str, series: list[float]) -> str:
            return "".join(f"{prefix} {v:.3f}{stamp}" for v, stamp in zip(series[lo:hi], stamps))

        def constant(prefix: str, value: str) -> str:
            return "".join(f"{prefix} {value}{stamp}" for stamp in stamps)

        def family(name: str, kind: str) -> str:
            return f"# TYPE {name} {kind}\n"

        def job_of(other: bool) -> str:
            return "9999" if other else "4242"

        # Per rank: training counters (the slow rank computes 1.4x as long in its window, and
        # every rank's step takes 1.1x as long), NCCL's per communicator and collective (the slow
        # rank waits least at each collective).
        training = {
            "lockstep_training_steps_total": (1.0, 1.0, 1.0),
            "lockstep_training_step_seconds_total": (STEP_SECONDS, 1.1, 1.1),
            "lockstep_training_compute_seconds_total": (7.0, 1.0, 1.4),
            "lockstep_training_data_wait_seconds_total": (0.3, 1.0, 1.0),
            "lockstep_training_tokens_total": (4096.0, 1.0, 1.0),
            "lockstep_nccl_collectives_total": (4.0, 1.0, 1.0),
            "lockstep_nccl_collective_seconds_total": (2.5, 1.0, 0.6),
        }
        for metric, (per_step, everyone, slow_rank) in training.items():
            usual = self.running_sum(per_step * scale * (everyone if slow else 1.0) for slow in slow_window)
            slowed = self.running_sum(per_step * scale * (slow_rank if slow else 1.0) for slow in slow_window)
            yield family(metric.removesuffix("_total"), "counter")
            for n, other in self.all_nodes():
                node = self.node_of(n, other)
                for local in range(PER_NODE):
                    rank = n * PER_NODE + local
                    series = slowed if not other and rank == SLOW_RANK else usual
                    labels = {
                        **node,
                        "job_id": job_of(other),
                        "rank": str(rank),
                        "host": node["instance"].split(":")[0],
                    }
                    if metric.startswith("lockstep_nccl"):
                        for comm, _, collectives in COMMUNICATORS:
                            for collective in collectives:
                                yield values(
                                    f"{metric}{fmt({**labels, 'comm': comm, 'collective': collective})}", series
                                )
                    else:
                        yield values(f"{metric}{fmt(labels)}", series)
        yield from self.recorded(lo, hi)
        yield family("lockstep_nccl_rank_info", "gauge")
        for n, other in self.all_nodes():
            node = self.node_of(n, other)
            for local in range(PER_NODE):
                rank = n * PER_NODE + local
                for comm, name, _ in COMMUNICATORS:
                    labels = {
                        **node,
                        "comm": comm,
                        "comm_name": name,
                        "gpu": str(local),
                        "host": node["instance"].split(":")[0],
                        "job_id": job_of(other),
                        "n_ranks": str(args.ranks),
                        "nnodes": str(self.nodes),
                        "rank": str(rank),
                        "records": "all",
                        "uuid": f"GPU-{n:04d}-{local}-{int(other)}",
                    }
                    yield constant(f"lockstep_nccl_rank_info{fmt(labels)}", "1")

        # Per GPU.
        gauges = (
            ("lockstep_gpu_utilization_ratio", "0.95"),
            ("lockstep_gpu_memory_used_bytes", "7e+10"),
            ("lockstep_gpu_memory_total_bytes", "8e+10"),
            ("lockstep_gpu_power_watts", "600"),
        )
        slow_seconds = self.running_sum(args.scrape * 0.8 if slow else 0.0 for slow in slow_window)
        slow_active = [1.0 if slow else 0.0 for slow in slow_window]
        zeros = "0"

        def gpus() -> Iterator[tuple[dict[str, str], bool]]:
            for n, other in self.all_nodes():
                for gpu in range(PER_NODE):
                    labels = {**self.node_of(n, other), "gpu": str(gpu), "uuid": f"GPU-{n:04d}-{gpu}-{int(other)}"}
                    yield labels, not other and (n, gpu) == (slow_node, slow_gpu)

        for name, value in gauges:
            yield family(name, "gauge")
            for labels, _ in gpus():
                yield constant(f"{name}{fmt(labels)}", value)
        # The throttled GPU's thermal reason: its time counter and its flag; every other reason 0.
        for metric, kind, reasons, throttled in (
            ("lockstep_gpu_clock_event_seconds_total", "counter", TIMED_REASONS, slow_seconds),
            ("lockstep_gpu_clock_event_active", "gauge", CLOCK_EVENT_REASONS, slow_active),
        ):
            yield family(metric.removesuffix("_total"), kind)
            for labels, slow in gpus():
                for reason in reasons:
                    prefix = f"{metric}{fmt({**labels, 'reason': reason})}"
                    hot = slow and reason == "hw_thermal_slowdown"
                    yield values(prefix, throttled) if hot else constant(prefix, zeros)
        yield family("lockstep_gpu_ecc_errors", "counter")
        for labels, _ in gpus():
            for kind in ("corrected", "uncorrected"):
                yield constant(f"lockstep_gpu_ecc_errors_total{fmt({**labels, 'type': kind})}", zeros)
        yield family("lockstep_slurm_job_gpu_info", "gauge")
        for n, other in self.all_nodes():
            for gpu in range(PER_NODE):
                labels = {**self.node_of(n, other), "gpu": str(gpu), "uuid": f"GPU-{n:04d}-{gpu}-{int(other)}"}
                yield constant(f"lockstep_slurm_job_gpu_info{fmt({**labels, 'job_id': job_of(other)})}", "1")

        # Per node: Slurm, InfiniBand ports, PFC, filesystems, pressure.
        yield family("lockstep_slurm_job_info", "gauge")
        for n, other in self.all_nodes():
            labels = {**self.node_of(n, other), "job_id": job_of(other), "user": "alice", "account": "llm"}
            labels.update(partition="h100", job_name="bench")
            yield constant(f"lockstep_slurm_job_info{fmt(labels)}", "1")
        yield family("lockstep_slurm_node_info", "gauge")
        for n, other in self.all_nodes():
            node = self.node_of(n, other)
            labels = {**node, "slurm_node": node["instance"].split(":")[0], "state": "ALLOCATED"}
            yield constant(f"lockstep_slurm_node_info{fmt(labels)}", "1")
        yield family("lockstep_ib_port_state", "gauge")
        for n, other in self.all_nodes():
            for device in IB_PORTS:
                yield constant(
                    f"lockstep_ib_port_state{fmt({**self.node_of(n, other), 'device': device, 'port': '1'})}", "4"
                )
        for name in IB_ERRORS:
            yield family(name.removesuffix("_total"), "counter")
            for n, other in self.all_nodes():
                for device in IB_PORTS:
                    yield constant(f"{name}{fmt({**self.node_of(n, other), 'device': device, 'port': '1'})}", zeros)
        # Busy ports: 20 GB/s sent, transmit wait 0.1% of the time (the IB congestion limit is 5%).
        for name, per_second in (
            ("lockstep_ib_port_transmitted_bytes_total", 2e10),
            ("lockstep_ib_port_transmit_wait_total", 2e10 / 4 * 0.001),
        ):
            series = self.running_sum(per_second * args.scrape for _ in self.times)
            yield family(name.removesuffix("_total"), "counter")
            for n, other in self.all_nodes():
                for device in IB_PORTS:
                    yield values(f"{name}{fmt({**self.node_of(n, other), 'device': device, 'port': '1'})}", series)
        pause = self.running_sum(0.0001 * args.scrape for _ in self.times)
        yield family("lockstep_pfc_pause_seconds", "counter")
        for n, other in self.all_nodes():
            for interface, priority in PFC:
                for direction in ("rx", "tx"):
                    labels = {**self.node_of(n, other), "direction": direction, "interface": interface}
                    yield values(f"lockstep_pfc_pause_seconds_total{fmt({**labels, 'priority': priority})}", pause)
        yield family("lockstep_pfc_pause_storm_events", "counter")
        for n, other in self.all_nodes():
            for interface, _ in PFC:
                yield constant(
                    f"lockstep_pfc_pause_storm_events_total{fmt({**self.node_of(n, other), 'interface': interface})}",
                    zeros,
                )
        yield family("lockstep_filesystem_responsive", "gauge")
        for n, other in self.all_nodes():
            for mount in MOUNTS:
                yield constant(
                    f"lockstep_filesystem_responsive{fmt({**self.node_of(n, other), 'mountpoint': mount})}", "1"
                )
        yield family("lockstep_nfs_major_timeouts", "counter")
        for n, other in self.all_nodes():
            for operation in NFS_OPERATIONS:
                labels = {**self.node_of(n, other), "mountpoint": "/home", "operation": operation}
                yield constant(f"lockstep_nfs_major_timeouts_total{fmt(labels)}", zeros)
        stalled = self.running_sum(0.01 * args.scrape for _ in self.times)
        yield family("lockstep_host_pressure_stalled_seconds", "counter")
        for n, other in self.all_nodes():
            for resource, kind in PRESSURE:
                labels = {**self.node_of(n, other), "kind": kind, "resource": resource}
                yield values(f"lockstep_host_pressure_stalled_seconds_total{fmt(labels)}", stalled)

        # One checkpoint root, saved hourly; the save at hour 10 hangs for 75 minutes.
        root = {**self.node_of(0), "root": "/lustre/ckpt/job=4242"}
        yield family("lockstep_checkpoint_info", "gauge")
        yield constant(f"lockstep_checkpoint_info{fmt({**root, 'job_id': '4242'})}", "1")
        yield family("lockstep_checkpoint_expected_interval_seconds", "gauge")
        yield constant(f"lockstep_checkpoint_expected_interval_seconds{fmt(root)}", "3600")
        yield family("lockstep_checkpoint_in_progress_seconds", "gauge")
        progress = [(t - self.stall_from) if self.stall_from <= t < self.stall_from + 4500 else 0 for t in self.times]
        yield values(f"lockstep_checkpoint_in_progress_seconds{fmt(root)}", progress)
        yield family("lockstep_checkpoint_last_success_timestamp_seconds", "gauge")
        success = [self.start + 3600 * int((t - self.start) // 3600) for t in self.times]
        yield values(f"lockstep_checkpoint_last_success_timestamp_seconds{fmt(root)}", success)
        yield "# EOF\n"


def build(fleet: Fleet, work: Path, tsdb: Path) -> None:
    """The TSDB, a block at a time: one window's OpenMetrics is written while promtool makes the
    previous window's block (the two cores both busy), and each file is removed once made."""
    started = time.monotonic()
    written = 0
    making: tuple[subprocess.Popen[bytes], Path] | None = None

    def finish() -> None:
        if making is not None:
            process, source = making
            if process.wait() != 0:
                raise SystemExit(f"report-bench: promtool failed on {source}")
            source.unlink()

    first = fleet.times[0] // BLOCK_SECONDS * BLOCK_SECONDS
    for k, block_start in enumerate(range(int(first), int(fleet.times[-1]) + 1, BLOCK_SECONDS)):
        lo = bisect.bisect_left(fleet.times, block_start)
        hi = bisect.bisect_left(fleet.times, block_start + BLOCK_SECONDS)
        source = work / f"window-{k:02d}.om"
        with open(source, "w") as out:
            for chunk in fleet.window(lo, hi):
                out.write(chunk)
        written += source.stat().st_size
        finish()
        process = subprocess.Popen(
            ["promtool", "tsdb", "create-blocks-from", "openmetrics", "-q", str(source), str(tsdb)]
        )
        making = (process, source)
    finish()
    print(
        f"report-bench: wrote {written / 1e9:.2f} GB of OpenMetrics and promtool made the blocks "
        f"in {time.monotonic() - started:.0f} s"
    )


def settle(url: str, quiet_for: float) -> None:
    """Wait until Prometheus has compacted the bench's 2-hour blocks into the larger ones a
    Prometheus holding a day would hold (it checks every minute, and compacts on the 2 cores
    the report would be measured on): until its block count has held for quiet_for seconds
    (two checks, by default)."""
    started = time.monotonic()

    def blocks() -> float:
        with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
            for line in response.read().decode().splitlines():
                if line.startswith("prometheus_tsdb_blocks_loaded "):
                    return float(line.split()[1])
        return -1.0

    last, since = blocks(), time.monotonic()
    while time.monotonic() - since < quiet_for and time.monotonic() - started < 1800:
        time.sleep(5)
        now = blocks()
        if now != last:
            last, since = now, time.monotonic()
    print(f"report-bench: {last:.0f} blocks after compaction, {time.monotonic() - started:.0f} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--hours", type=float, default=24.0)
    parser.add_argument("--scrape", type=float, default=15.0, help="seconds between samples (default 15)")
    parser.add_argument("--other-nodes", type=int, default=64, help="nodes of another job in the same Prometheus")
    parser.add_argument("--keep", type=Path, help="build the TSDB here and keep it (reused when it exists)")
    parser.add_argument(
        "--settle", type=float, default=130.0, help="seconds the block count must hold before measuring (default 130)"
    )
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
    if not stamp.exists():  # written last: a build cut short is redone
        shutil.rmtree(tsdb, ignore_errors=True)
        build(Fleet(args, start), work, tsdb)
        stamp.write_text(f"{start}\n")
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
        settle(url, args.settle)
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
