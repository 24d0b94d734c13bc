"""Host collector: CPU, memory, load, pressure stall information, blocked tasks.

Reads procfs directly (honouring --path.procfs) rather than through psutil: psutil's
procfs root is one process-wide global (``psutil.PROCFS_PATH``), which cannot serve an
agent pointed at a host tree mounted elsewhere and, in the same process, tests pointed at
fixture trees.  The files read here are stable kernel ABI with a one-line format each.
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Iterator

from lockstep.agent.collector import Collector, CollectorContext, Families, MetricSpec
from lockstep.agent.families import Metric
from lockstep.agent.files import read_text
from lockstep.collectors.toolkit.procs import process_table

CPU_SECONDS = MetricSpec(
    "lockstep_host_cpu_seconds_total",
    "counter",
    "CPU time spent in each mode, summed over all CPUs (from /proc/stat).",
    ("mode",),
    unit="seconds",
)
CPUS = MetricSpec("lockstep_host_cpus", "gauge", "Online CPUs counted in /proc/stat.")
MEMORY_TOTAL = MetricSpec("lockstep_host_memory_total_bytes", "gauge", "Usable RAM (MemTotal).", unit="bytes")
MEMORY_AVAILABLE = MetricSpec(
    "lockstep_host_memory_available_bytes",
    "gauge",
    "Memory available for new work without swapping (MemAvailable).",
    unit="bytes",
)
MEMORY_DIRTY = MetricSpec(
    "lockstep_host_memory_dirty_bytes",
    "gauge",
    "Page cache waiting to be written back (Dirty); grows while a checkpoint write stalls.",
    unit="bytes",
)
MEMORY_WRITEBACK = MetricSpec(
    "lockstep_host_memory_writeback_bytes", "gauge", "Page cache being written back now (Writeback).", unit="bytes"
)
SWAP_TOTAL = MetricSpec("lockstep_host_swap_total_bytes", "gauge", "Swap space (SwapTotal).", unit="bytes")
SWAP_FREE = MetricSpec("lockstep_host_swap_free_bytes", "gauge", "Unused swap space (SwapFree).", unit="bytes")
LOAD = {
    window: MetricSpec(f"lockstep_host_load{window}", "gauge", f"{window}-minute load average.")
    for window in ("1", "5", "15")
}
PRESSURE = MetricSpec(
    "lockstep_host_pressure_stalled_seconds_total",
    "counter",
    "Time in which some (kind=some) or all (kind=full) non-idle tasks were stalled on the "
    "resource, from /proc/pressure (pressure stall information).",
    ("resource", "kind"),
    unit="seconds",
)
BLOCKED = MetricSpec(
    "lockstep_host_processes_blocked",
    "gauge",
    "Tasks (threads) in uninterruptible sleep (state D): stuck in the kernel, typically on "
    "storage or a hung network filesystem.",
)
RUNNING = MetricSpec(
    "lockstep_host_processes_running", "gauge", "Tasks runnable right now (procs_running in /proc/stat)."
)
CONTEXT_SWITCHES = MetricSpec(
    "lockstep_host_context_switches_total", "counter", "Context switches since boot (ctxt in /proc/stat)."
)
BOOT_TIME = MetricSpec(
    "lockstep_host_boot_time_seconds", "gauge", "Unix time the host booted (btime in /proc/stat).", unit="seconds"
)
SKIPPED_VALUES = MetricSpec(
    "lockstep_host_skipped_values_total",
    "counter",
    "Values in procfs files that are not in the kernel's own format (e.g. a non-numeric /proc/stat field) "
    "and were skipped, by file (stat, meminfo, loadavg, pressure), since the agent started.",
    ("source",),
)
_SKIP_SOURCES = ("stat", "meminfo", "loadavg", "pressure")

# /proc/stat's cpu line, in order; guest time is already counted in user and nice.
_CPU_MODES = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
_MEMINFO = {
    "MemTotal": MEMORY_TOTAL,
    "MemAvailable": MEMORY_AVAILABLE,
    "Dirty": MEMORY_DIRTY,
    "Writeback": MEMORY_WRITEBACK,
    "SwapTotal": SWAP_TOTAL,
    "SwapFree": SWAP_FREE,
}
_PRESSURE_RESOURCES = ("cpu", "memory", "io")
# A count as the kernel writes it: unsigned decimal ASCII, at most 20 digits (2**64).
_COUNT = re.compile(r"[0-9]{1,20}")


def _count(text: str) -> int | None:
    """An unsigned kernel count, or None for what the kernel never writes (the sample is
    skipped: one bad value never costs the rest of the file, or the collector)."""
    return int(text) if _COUNT.fullmatch(text) else None


class HostCollector(Collector):
    name = "host"
    help = "CPU, memory, load, pressure stall information and blocked tasks, from procfs."
    default_interval = 15.0
    metrics = (
        CPU_SECONDS,
        CPUS,
        RUNNING,
        CONTEXT_SWITCHES,
        BOOT_TIME,
        *_MEMINFO.values(),
        *LOAD.values(),
        PRESSURE,
        BLOCKED,
        SKIPPED_VALUES,
    )

    def __init__(self, context: CollectorContext) -> None:
        super().__init__(context)
        self.proc = context.paths.procfs
        self._ticks_per_second = os.sysconf("SC_CLK_TCK")
        self._skipped: list[str] = []  # this round's values skipped, named "file: field"
        self._skipped_logged: list[str] = []  # the last set logged: logged once per change
        self._skipped_total = dict.fromkeys(_SKIP_SOURCES, 0)  # lockstep_host_skipped_values_total

    def check(self) -> str:
        super().check()
        missing = [r for r in _PRESSURE_RESOURCES if not (self.proc / "pressure" / r).exists()]
        if missing:
            return (
                f"no {self.proc}/pressure/{','.join(missing)} (kernel without PSI or booted with psi=0): "
                "pressure metrics omitted"
            )
        return ""

    def collect(self) -> Iterator[Metric]:
        families = Families(self.metrics)
        self._skipped = []
        self._stat(families)
        self._meminfo(families)
        self._loadavg(families)
        self._pressure(families)
        self._blocked_tasks(families)
        for skipped in self._skipped:  # "stat: cpu nice", "pressure/io: some"
            source = skipped.split(":", 1)[0].split("/", 1)[0]
            self._skipped_total[source] += 1
        for source, count in self._skipped_total.items():
            families[SKIPPED_VALUES].add_metric([source], count)
        if self._skipped != self._skipped_logged:  # the same bad file would otherwise log every round
            self._skipped_logged = self._skipped
            if self._skipped:
                self.log.warning("skipped values the kernel never writes: %s", "; ".join(self._skipped[:5]))
        # Every family is exposed each round, except a load average /proc/loadavg does not have.
        load = set(LOAD.values())
        yield from (families[spec] for spec in self.metrics if spec not in load or families[spec].samples)

    def _stat(self, families: Families) -> None:
        cpu, cpus, running, ctxt, btime = (
            families[CPU_SECONDS],
            families[CPUS],
            families[RUNNING],
            families[CONTEXT_SWITCHES],
            families[BOOT_TIME],
        )
        online = 0
        for line in read_text(self.proc / "stat").splitlines():
            key, _, rest = line.partition(" ")
            if key == "cpu":
                for mode, ticks in zip(_CPU_MODES, rest.split(), strict=False):
                    count = _count(ticks)
                    if count is None:
                        self._skipped.append(f"stat: cpu {mode}")
                    else:
                        cpu.add_metric([mode], count / self._ticks_per_second)
            elif key.startswith("cpu"):
                online += 1
            elif key in ("ctxt", "btime", "procs_running"):
                family = {"ctxt": ctxt, "btime": btime, "procs_running": running}[key]
                count = _count(rest.strip())
                if count is None:
                    self._skipped.append(f"stat: {key}")
                else:
                    family.add_metric([], count)
        cpus.add_metric([], online)

    def _meminfo(self, families: Families) -> None:
        for line in read_text(self.proc / "meminfo").splitlines():
            field, _, rest = line.partition(":")
            if field in _MEMINFO:
                parts = rest.split()
                count = _count(parts[0]) if parts else None
                if count is None:
                    self._skipped.append(f"meminfo: {field}")
                    continue
                scale = 1024 if parts[1:] == ["kB"] else 1
                families[_MEMINFO[field]].add_metric([], count * scale)

    def _loadavg(self, families: Families) -> None:
        values = read_text(self.proc / "loadavg").split()
        for (window, spec), value in zip(LOAD.items(), values, strict=False):
            try:
                families[spec].add_metric([], float(value))  # nan/inf: left out by the worker's domain check
            except ValueError:
                self._skipped.append(f"loadavg: {window}")

    def _pressure(self, families: Families) -> None:
        family = families[PRESSURE]
        for resource in _PRESSURE_RESOURCES:
            try:
                text = read_text(self.proc / "pressure" / resource)
            except (FileNotFoundError, NotADirectoryError):
                continue  # kernel without PSI: the metric is absent, not an error
            except OSError as exc:
                if exc.errno == errno.EOPNOTSUPP:  # PSI compiled in but disabled (psi=0)
                    continue
                raise
            for line in text.splitlines():
                kind, *fields = line.split() or [""]
                values = dict(f.split("=", 1) for f in fields if "=" in f)
                total = _count(values.get("total", ""))
                if total is None:
                    self._skipped.append(f"pressure/{resource}: {kind[:32]}")
                    continue
                family.add_metric([resource, kind], total / 1e6)  # µs -> s

    def _blocked_tasks(self, families: Families) -> None:
        """Count threads in state D.  A thread of a training job stuck on a hung mount is not
        the process's main thread, so a process with more than one thread has its per-task stat
        files read; a single-threaded one (most of a node's: kernel threads, shells, daemons) is
        judged by the process table's state, which the round's other collectors read too
        (collectors/toolkit/procs.py process_table)."""
        blocked = 0
        for pid, process in process_table(self.proc).items():
            if process.threads == 1:
                blocked += process.state == "D"
                continue
            # String paths: every thread of the node every round, and pathlib's joins cost more
            # than the reads (docs/performance.md).
            task_dir = f"{self.proc}/{pid}/task"
            try:
                tids = os.listdir(task_dir)
            except OSError:
                continue  # the process exited meanwhile
            for tid in tids:
                try:
                    stat = read_text(f"{task_dir}/{tid}/stat")
                except OSError:
                    continue
                # The command name in parentheses may contain spaces and ')': split at the last one.
                state = stat[stat.rfind(")") + 2 : stat.rfind(")") + 3]
                if state == "D":
                    blocked += 1
        families[BLOCKED].add_metric([], blocked)
