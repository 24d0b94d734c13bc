"""What the agent takes from a node, side by side with node_exporter in one run (issue 47).

    .venv/bin/python bench/footprint.py [--interval 15] [--duration 120] [--phase 30] [--repeats 4] [--demo]

Starts `lockstep run` (this machine, defaults: every collector that finds its hardware) and
node_exporter (Debian ``prometheus-node-exporter``, its defaults), each on a free loopback port;
with --demo, `lockstep demo` instead (the simulated 8-GPU node: every collector at work).

1. Steady state: both scraped every --interval seconds (gzip, keep-alive, as Prometheus does)
   for --duration seconds.  Per agent: RSS and PSS at the end, CPU in % of one core over the
   window, threads, wake-ups per second (voluntary + involuntary context switches summed over
   its threads, from /proc/PID/task/*/status: each is a moment the agent took a core), and
   scrape latency p50 / max.  Then per collector, from the agent's own self-metrics over the
   same window: its state, rounds, CPU per round and CPU in % of a core; and the memory its
   modules take, imported one after another into a fresh interpreter after the agent's CLI
   (what two collectors share is counted at the first).
2. Noise on a compute core: a fixed-work-quanta loop (the same work again and again, each
   quantum timed; the HPC way to see OS noise) pinned to CPU 0, with both agents pinned to that
   CPU too, so that every wake-up of theirs lands on the compute core (the worst case; on a
   2-core machine the kernel would otherwise move them to the other core).  Phases of --phase
   seconds under lockstep alone, node_exporter alone and neither (the others SIGSTOPped),
   interleaved, --repeats times; the running agent is scraped every --interval seconds meanwhile.
   Per phase: the quanta's slowdown over the fastest quantum of the whole run, as mean and p99;
   printed as the median and range over the repeats.

Prints figures only (the machine is shared: compare the columns of one run, and give the load
average printed beside them).  Linux only; reads /proc.
"""

from __future__ import annotations

import argparse
import gzip
import http.client
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from http_load import (
    cpu_seconds,
    free_port,
    node_exporter_binary,
    percentile,
    proc_status,
    stop,
    wait_listening,
)  # noqa: E402

COMPUTE_CPU = 0
# One quantum of fixed work: ~0.5 ms of interpreter work on this machine, short enough that a
# preemption of a few hundred microseconds shows, long enough that timing it costs little.
QUANTUM_WORK = 20_000


def pss_mib(pid: int) -> float:
    """Proportional set size: shared pages divided among the processes mapping them."""
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def context_switches(pid: int) -> int:
    """Voluntary + involuntary context switches of the process's live threads (a thread that
    ended during the window takes its count with it: the agents keep theirs)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            text = (task / "status").read_text()
        except OSError:
            continue  # ended between the listing and the read
        for line in text.splitlines():
            if line.startswith(("voluntary_ctxt_switches:", "nonvoluntary_ctxt_switches:")):
                total += int(line.split()[1])
    return total


class Scraper:
    """Scrapes one agent over a kept-alive connection, as Prometheus does; keeps the latencies."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.conn: http.client.HTTPConnection | None = None
        self.latencies_ms: list[float] = []
        self.failed = 0

    def scrape(self) -> None:
        started = time.monotonic()
        try:
            if self.conn is None:
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
            self.conn.request("GET", "/metrics", headers={"Accept-Encoding": "gzip"})
            response = self.conn.getresponse()
            body = response.read()
            if response.status != 200:
                raise OSError(f"HTTP {response.status}")
            if response.getheader("Content-Encoding") == "gzip":
                gzip.decompress(body)
            self.latencies_ms.append((time.monotonic() - started) * 1000)
        except (OSError, http.client.HTTPException):
            self.failed += 1
            if self.conn is not None:
                self.conn.close()
            self.conn = None


@contextmanager
def started(name: str, argv: list[str], port: int, cpus: set[int] | None = None) -> Iterator[subprocess.Popen[bytes]]:
    def pin() -> None:
        if cpus is not None:
            os.sched_setaffinity(0, cpus)

    with open(Path(tempfile.gettempdir()) / f"footprint-{name}.log", "wb") as log:
        process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=log, preexec_fn=pin)
    try:
        wait_listening(port, process, name)
        yield process
    finally:
        process.send_signal(signal.SIGCONT)  # a stopped process does not act on SIGTERM
        stop(process)


def agents(stack: ExitStack, demo: bool, cpus: set[int] | None) -> dict[str, tuple[subprocess.Popen[bytes], int]]:
    lockstep_port, exporter_port = free_port(), free_port()
    command = ["demo", "--scenario", "healthy"] if demo else ["run"]
    lockstep_argv = [sys.executable, "-m", "lockstep.agent.cli", *command, "--listen", f"127.0.0.1:{lockstep_port}"]
    exporter_argv = [node_exporter_binary(), f"--web.listen-address=127.0.0.1:{exporter_port}"]
    return {
        "lockstep": (stack.enter_context(started("lockstep", lockstep_argv, lockstep_port, cpus)), lockstep_port),
        "node_exporter": (
            stack.enter_context(started("node_exporter", exporter_argv, exporter_port, cpus)),
            exporter_port,
        ),
    }


def steady_state(
    running: dict[str, tuple[subprocess.Popen[bytes], int]], interval: float, duration: float
) -> tuple[dict, dict]:
    scrapers = {name: Scraper(port) for name, (_, port) in running.items()}
    time.sleep(interval)  # the start and the first rounds are not the steady state
    counters0 = collector_counters(running["lockstep"][1])
    cpu0 = {name: cpu_seconds(p.pid) for name, (p, _) in running.items()}
    switches0 = {name: context_switches(p.pid) for name, (p, _) in running.items()}
    started = time.monotonic()
    next_scrape = started
    while time.monotonic() - started < duration:
        for scraper in scrapers.values():
            scraper.scrape()
        next_scrape += interval
        time.sleep(max(0.0, next_scrape - time.monotonic()))
    elapsed = time.monotonic() - started
    counters = collector_counters(running["lockstep"][1])
    rows = {}
    for name, (process, _) in running.items():
        latencies = sorted(scrapers[name].latencies_ms)
        rows[name] = {
            "RSS MiB": f"{proc_status(process.pid, 'VmRSS') / 1024:.1f}",
            "PSS MiB": f"{pss_mib(process.pid):.1f}",
            "CPU, % of a core": f"{(cpu_seconds(process.pid) - cpu0[name]) / elapsed * 100:.2f}",
            "threads": str(proc_status(process.pid, "Threads")),
            "wake-ups per second": f"{(context_switches(process.pid) - switches0[name]) / elapsed:.1f}",
            "scrape p50 / max ms": f"{percentile(latencies, 0.5):.1f} / {max(latencies, default=float('nan')):.1f}"
            + (f" ({scrapers[name].failed} failed)" if scrapers[name].failed else ""),
        }
    return rows, per_collector(counters0, counters, elapsed)


def collector_counters(port: int) -> dict[str, dict[str, float]]:
    """Per collector: its runs, CPU seconds and state, from the agent's own /metrics."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    found: dict[str, dict[str, float]] = {}
    pattern = r'^lockstep_collector_(runs_total|cpu_seconds_total|state)\{collector="(\w+)"(?:,state="(\w+)")?\} (\S+)$'
    for kind, name, state, value in re.findall(pattern, text, flags=re.M):
        entry = found.setdefault(name, {})
        if kind == "state":
            if float(value) == 1:
                entry["state"] = state  # type: ignore[assignment]
        else:
            entry[kind] = float(value)
    return found


IMPORT_COSTS = """
import importlib, re
from importlib.metadata import entry_points
def rss():
    return int(re.search(r"VmRSS:\\s+(\\d+)", open("/proc/self/status").read()).group(1))
import lockstep.agent.cli
previous = rss()
for entry in sorted(entry_points(group="lockstep.collectors"), key=lambda e: e.name):
    importlib.import_module(entry.module)
    now = rss()
    print(entry.name, (now - previous) / 1024)
    previous = now
"""


def import_costs() -> dict[str, float]:
    """MiB each collector's modules add, imported one after another after the CLI."""
    result = subprocess.run([sys.executable, "-c", IMPORT_COSTS], capture_output=True, text=True, timeout=120)
    costs = {}
    for line in result.stdout.splitlines():
        name, mib = line.split()
        costs[name] = float(mib)
    return costs


def per_collector(before: dict[str, dict[str, float]], after: dict[str, dict[str, float]], elapsed: float) -> dict:
    memory = import_costs()
    rows = {}
    for name in sorted(after):
        runs = after[name].get("runs_total", 0) - before.get(name, {}).get("runs_total", 0)
        cpu = after[name].get("cpu_seconds_total", 0) - before.get(name, {}).get("cpu_seconds_total", 0)
        rows[name] = {
            "state": str(after[name].get("state", "?")),
            "rounds": f"{runs:.0f}",
            "CPU ms per round": f"{cpu / runs * 1000:.2f}" if runs else "-",
            "CPU, % of a core": f"{cpu / elapsed * 100:.3f}",
            "modules, MiB": f"{memory[name]:.2f}" if name in memory else "-",
        }
    return rows


def quanta(seconds: float, scrape: Scraper | None, interval: float) -> list[float]:
    """Fixed work, timed, for `seconds` (this process is pinned to the compute CPU); the agent
    under test is scraped between quanta every `interval` seconds (a scrape's own cost is the
    agent's, the client's time is left out of the quanta)."""
    times = []
    end = time.monotonic() + seconds
    next_scrape = time.monotonic()
    while (now := time.monotonic()) < end:
        if scrape is not None and now >= next_scrape:
            scrape.scrape()
            next_scrape += interval
            continue
        begin = time.perf_counter()
        sum(range(QUANTUM_WORK))
        times.append(time.perf_counter() - begin)
    return times


def noise(running: dict[str, tuple[subprocess.Popen[bytes], int]], args: argparse.Namespace) -> dict[str, dict]:
    os.sched_setaffinity(0, {COMPUTE_CPU})
    phases: dict[str, list[list[float]]] = {"neither": [], **{name: [] for name in running}}
    scrapers = {name: Scraper(port) for name, (_, port) in running.items()}
    for repeat in range(args.repeats):
        for phase in phases:
            for name, (process, _) in running.items():
                process.send_signal(signal.SIGCONT if name == phase else signal.SIGSTOP)
            time.sleep(2)  # a resumed agent catches up on the rounds it missed: not its steady noise
            print(f"  noise: repeat {repeat + 1}, {phase} ...", file=sys.stderr, flush=True)
            phases[phase].append(quanta(args.phase, scrapers.get(phase), args.interval))
    for process, _ in running.values():
        process.send_signal(signal.SIGCONT)
    fastest = min(t for runs in phases.values() for run in runs for t in run)
    rows = {}
    for phase, runs in phases.items():
        means = [statistics.fmean(run) / fastest - 1 for run in runs]
        p99s = [percentile(sorted(run), 0.99) / fastest - 1 for run in runs]
        rows[phase] = {
            "quantum slowdown, mean (median, range over repeats)": _spread(means),
            "quantum slowdown, p99": _spread(p99s),
            "quanta per phase": f"{statistics.median(len(run) for run in runs):,.0f}",
        }
    return rows


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values) * 100:.1f} % ({min(values) * 100:.1f}-{max(values) * 100:.1f})"


def transpose(rows: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
    """Collectors as rows, figures as columns (print_table prints its keys as columns)."""
    keys = list(next(iter(rows.values())))
    return {key: {name: rows[name][key] for name in rows} for key in keys}


def print_table(title: str, rows: dict[str, dict[str, str]]) -> None:
    names = list(rows)
    print(f"\n| {title} | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for key in rows[names[0]]:
        print(f"| {key} | " + " | ".join(rows[name][key] for name in names) + " |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--interval", type=float, default=15.0, help="scrape interval, seconds (default 15)")
    parser.add_argument("--duration", type=float, default=120.0, help="steady-state window, seconds (default 120)")
    parser.add_argument("--phase", type=float, default=30.0, help="one noise phase, seconds (default 30)")
    parser.add_argument("--repeats", type=int, default=4, help="noise phases of each kind (default 4; 0: none)")
    parser.add_argument("--demo", action="store_true", help="lockstep on the simulated 8-GPU node (lockstep demo)")
    args = parser.parse_args()
    if os.cpu_count() == 1:
        args.repeats = 0  # the loop, the agents and this script would all share the one core
    print(f"load average before: {os.getloadavg()[0]:.2f}, {os.cpu_count()} CPUs", flush=True)
    with ExitStack() as stack:
        print("steady state ...", file=sys.stderr, flush=True)
        rows, collectors = steady_state(agents(stack, args.demo, None), args.interval, args.duration)
    what = "lockstep demo (simulated 8-GPU node)" if args.demo else "this machine, defaults"
    print_table(f"{what}, scraped every {args.interval:g} s for {args.duration:g} s", rows)
    print_table("per collector, same window", transpose(collectors))
    if args.repeats:
        with ExitStack() as stack:
            running = agents(stack, args.demo, {COMPUTE_CPU})
            time.sleep(args.interval)  # first rounds done
            rows = noise(running, args)
        print_table(
            f"fixed-work quanta on CPU {COMPUTE_CPU} (agents pinned there too), "
            f"{args.repeats} x {args.phase:g}-s phases",
            rows,
        )
    print(f"\nload average after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
