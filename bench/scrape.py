"""Scrape latency, CPU per collection round, peak RSS and series count on the simulated node.

    .venv/bin/python bench/scrape.py [--scenario healthy] [--scrapes 1000] [--interval 1s]

Starts `lockstep demo` as its own process (so RSS is the agent's alone) with collectors
running every --interval, scrapes /metrics over one keep-alive connection the way
Prometheus does, and prints the figures.  Targets (issue 2): scrape p99 < 5 ms, RSS < 60 MB.
No assertion: the machines are shared and noisy; read the figures, compare ratios.
"""

from __future__ import annotations

import argparse
import http.client
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenario", default="healthy")
    parser.add_argument("--scrapes", type=int, default=1000)
    parser.add_argument("--interval", default="1s", help="every collector's interval during the run")
    args = parser.parse_args()

    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "bench.yml"
        from lockstep.agent.registry import discover

        builtin = sorted(n for n, r in discover().collectors.items() if r.builtin)
        config.write_text(
            "log_level: warning\ncollectors:\n"
            + "".join(f"  {name}:\n    interval: {args.interval}\n" for name in builtin)
        )
        agent = subprocess.Popen(
            [sys.executable, "-m", "lockstep.agent.cli", "demo", "--scenario", args.scenario, "--config", str(config),
             "--listen", f"127.0.0.1:{port}"],
        )  # fmt: skip
        try:
            return run(agent, port, args)
        finally:
            agent.terminate()
            agent.wait(10)


def run(agent: subprocess.Popen[bytes], port: int, args: argparse.Namespace) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    for _ in range(200):
        try:
            conn.request("GET", "/metrics")
            conn.getresponse().read()
            break
        except OSError:
            conn.close()
            time.sleep(0.05)
    time.sleep(3)  # let every collector run a few rounds
    latencies = []
    cpu_started = cpu_seconds(agent.pid)
    for _ in range(args.scrapes):
        started = time.perf_counter()
        conn.request("GET", "/metrics")
        body = conn.getresponse().read()
        latencies.append((time.perf_counter() - started) * 1000)
    agent_cpu_during_scrapes = cpu_seconds(agent.pid) - cpu_started
    text = body.decode()
    series = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
    per_round = {}
    totals: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in ("lockstep_collector_cpu_seconds_total", "lockstep_collector_runs_total"):
                totals.setdefault(sample.labels["collector"], {})[sample.name] = sample.value
    for collector, t in sorted(totals.items()):
        runs = t.get("lockstep_collector_runs_total", 0)
        per_round[collector] = t.get("lockstep_collector_cpu_seconds_total", 0) / runs if runs else float("nan")
    latencies.sort()
    p50 = statistics.median(latencies)
    p99 = latencies[int(len(latencies) * 0.99) - 1]
    print(f"scenario {args.scenario}: {args.scrapes} scrapes over one connection, collectors every {args.interval}")
    print(f"  scrape latency   p50 {p50:.2f} ms   p99 {p99:.2f} ms   max {latencies[-1]:.2f} ms   (target p99 < 5 ms)")
    print(f"  agent CPU        {agent_cpu_during_scrapes * 1000 / args.scrapes:.2f} ms per scrape (whole process)")
    for collector, seconds in per_round.items():
        print(f"  collector {collector:<10} {seconds * 1000:.2f} ms CPU per collection round")
    print(f"  peak RSS         {peak_rss_mib(agent.pid):.1f} MiB   (target < 60 MB)")
    print(f"  series           {series}   exposition {len(body)} bytes")
    return 0


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


if __name__ == "__main__":
    sys.exit(main())
