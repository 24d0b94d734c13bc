"""Hostile input at full size (issue 29): each case against a real agent subprocess.

    .venv/bin/python bench/hostile_input.py [CASE ...] [--interval 3]

One function per case (``CASES``: name -> function).  Each starts ``lockstep run`` as its own
process, measures it before the hostile input, while it is there and after it is gone, and
returns the three measurements: the agent's RSS, open fds, series served, and one scrape's
latency, plus what the case is about.  The default run's tests (tests/unit/test_hostile_*.py)
run the same inputs scaled down, with exact values; this prints figures, no pass/fail.

Cases (issue 29 items):
- ``lookalike_engines`` (6): 400 look-alike engines (``python3 .../vllm serve``, one port each,
  all answering as vLLM) forked by one process: ``lockstep_inference_process_info`` grew as
  N x (N+1), 159,600 series.
- ``silent_lookalikes`` (7): a real engine (an HTTP server answering as vLLM) found, then 40
  silent look-alikes on lower ports: it showed ``up 0`` and its series vanished.

The agent reads /proc through a view of the case's processes only (tests/support/lookalikes.py,
symlinks to /proc/PID), so other processes on the machine that look like engines do not change
the figures; everything else is real (processes, sockets, HTTP).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.support import free_port  # noqa: E402
from tests.support.lookalikes import LookalikeEngines, procfs_view  # noqa: E402


@dataclass
class Measure:
    rss_mb: float
    fds: int
    series: int
    scrape_ms: float
    extra: dict[str, float] = field(default_factory=dict)

    def __str__(self) -> str:
        extra = "  ".join(f"{k}={v:g}" for k, v in self.extra.items())
        figures = f"rss {self.rss_mb:6.1f} MB  fds {self.fds:4d}  series {self.series:6d}"
        return f"{figures}  scrape {self.scrape_ms:7.1f} ms  {extra}"


class Agent:
    """`lockstep run` with the inference collector only, on a procfs view, every ``interval`` s."""

    def __init__(self, workdir: Path, procfs: Path, interval: float) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/metrics"
        config = workdir / "lockstep.yml"
        config.write_text(f"collectors:\n  inference:\n    interval: {interval}s\n")
        argv = [sys.executable, "-m", "lockstep.agent.cli", "run", "--config", str(config)]
        argv += ["--collector.disable-defaults", "--collector.inference", "--path.procfs", str(procfs)]
        argv += ["--listen", f"127.0.0.1:{self.port}"]
        self.log = (workdir / "agent.log").open("w")
        self.process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=self.log, cwd=REPO)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                self.scrape()
                return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError("the agent did not serve /metrics within 30 s")

    def scrape(self) -> tuple[str, float]:
        began = time.perf_counter()
        with urllib.request.urlopen(self.url, timeout=30) as response:
            body = response.read().decode()
        return body, (time.perf_counter() - began) * 1000

    def measure(self, extra: Callable[[str], dict[str, float]]) -> Measure:
        body, latency = self.scrape()
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        rss = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:"))
        fds = len(os.listdir(f"/proc/{self.process.pid}/fd"))
        series = sum(1 for line in body.splitlines() if line and not line.startswith("#"))
        return Measure(rss / 1024, fds, series, latency, extra(body))

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()


def _count(body: str, prefix: str) -> float:
    return sum(1 for line in body.splitlines() if line.startswith(prefix))


def _value(body: str, prefix: str) -> float:
    for line in body.splitlines():
        if line.startswith(prefix):
            return float(line.rsplit(" ", 1)[1])
    return -1.0  # absent


def _log_lines(workdir: Path) -> float:
    return float(len((workdir / "agent.log").read_text().splitlines()))


def lookalike_engines(workdir: Path, interval: float, count: int = 400) -> dict[str, Measure]:
    """Item 6: N answering look-alikes forked by one ``vllm serve`` process."""
    view = procfs_view(workdir / "proc", [])
    agent = Agent(workdir, view, interval)

    def extra(body: str) -> dict[str, float]:
        return {
            "process_info": _count(body, "lockstep_inference_process_info{"),
            "up_series": _count(body, "lockstep_inference_up{"),
            "over_cap": _value(body, 'lockstep_inference_discovered_processes{category="over_cap"}'),
            "log_lines": _log_lines(workdir),
        }

    result = {}
    lookalikes = None
    try:
        time.sleep(2 * interval)
        result["before"] = agent.measure(extra)
        lookalikes = LookalikeEngines(workdir / "lookalikes", count, "answer", first_port=20000)
        procfs_view(view, lookalikes.pids)
        time.sleep(8 * interval)  # 32 engines are found in 4 rounds of 8 probes
        result["during"] = agent.measure(extra)
        lookalikes.stop()
        lookalikes = None
        time.sleep(4 * interval)
        result["after"] = agent.measure(extra)
    finally:
        if lookalikes is not None:
            lookalikes.stop()
        agent.stop()
    return result


def silent_lookalikes(workdir: Path, interval: float, count: int = 40) -> dict[str, Measure]:
    """Item 7: a real engine found, then ``count`` silent look-alikes on lower ports."""
    real = LookalikeEngines(workdir / "real", 1, "answer", first_port=47000)
    view = procfs_view(workdir / "proc", real.pids)
    agent = Agent(workdir, view, interval)
    labels = f'engine="vllm",model="llama",server="{real.urls()[0]}"'

    def extra(body: str) -> dict[str, float]:
        return {
            "real_up": _value(body, f"lockstep_inference_up{{{labels}}}"),
            "real_running": _value(body, f"lockstep_inference_requests_running{{{labels}}}"),
            "probing": _value(body, 'lockstep_inference_discovered_processes{category="probing"}'),
            "duration_s": _value(body, 'lockstep_collector_duration_seconds{collector="inference"}'),
            "log_lines": _log_lines(workdir),
        }

    result = {}
    silent = None
    try:
        time.sleep(2 * interval)
        result["before"] = agent.measure(extra)
        silent = LookalikeEngines(workdir / "silent", count, "silent", first_port=30000)
        procfs_view(view, silent.pids)
        time.sleep(8 * interval)
        result["during"] = agent.measure(extra)
        silent.stop()
        silent = None
        time.sleep(4 * interval)
        result["after"] = agent.measure(extra)
    finally:
        if silent is not None:
            silent.stop()
        agent.stop()
        real.stop()
    return result


CASES: dict[str, Callable[[Path, float], dict[str, Measure]]] = {
    "lookalike_engines": lookalike_engines,
    "silent_lookalikes": silent_lookalikes,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="*", help=f"cases to run (default: all): {', '.join(CASES)}")
    parser.add_argument("--interval", type=float, default=3.0, help="the inference collector's interval, seconds")
    args = parser.parse_args()
    unknown = [name for name in args.cases if name not in CASES]
    if unknown:
        parser.error(f"unknown case {', '.join(unknown)}; the cases are {', '.join(CASES)}")
    print(f"load average at start: {os.getloadavg()[0]:.2f} ({os.cpu_count()} CPUs)")
    for name in args.cases or CASES:
        with tempfile.TemporaryDirectory(prefix=f"hostile-{name}-") as workdir:
            result = CASES[name](Path(workdir), args.interval)
        print(f"{name}:")
        for phase, measure in result.items():
            print(f"  {phase:6s} {measure}")
        print(f"  load average now: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
