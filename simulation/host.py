"""The simulated node's procfs: /proc/stat, meminfo, loadavg, pressure and a few processes."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lockstep.simulation import SimulatedNode

CPUS = 16
TICKS = 100  # USER_HZ
BOOT_TIME = 1_767_225_600  # 2026-01-01T00:00:00Z
GIB = 1024 * 1024


def build(node: SimulatedNode, t: float) -> None:
    proc = node.paths.procfs
    # Cumulative CPU ticks grow with t: a busy training node, ~70 % user.
    per_second = {"user": 1120, "nice": 0, "system": 160, "idle": 280, "iowait": 24, "irq": 0, "softirq": 8, "steal": 0}
    base = 86_400  # the node has been up a day when the demo starts
    ticks = [int(rate * (base + t)) for rate in per_second.values()]
    lines = ["cpu  " + " ".join(str(v) for v in ticks) + " 0 0"]
    for cpu in range(CPUS):
        lines.append(f"cpu{cpu} " + " ".join(str(v // CPUS) for v in ticks) + " 0 0")
    lines += [
        "intr 0",
        f"ctxt {int(52_000 * (base + t))}",
        f"btime {BOOT_TIME}",
        f"processes {int(3 * (base + t))}",
        "procs_running 9",
        "procs_blocked 0",
    ]
    node.write(proc / "stat", "\n".join(lines) + "\n")
    node.write(
        proc / "meminfo",
        f"MemTotal:       {2048 * GIB} kB\n"
        f"MemFree:        {300 * GIB} kB\n"
        f"MemAvailable:   {1400 * GIB} kB\n"
        f"Buffers:        {2 * GIB} kB\n"
        f"Cached:         {1100 * GIB} kB\n"
        f"SwapTotal:      0 kB\n"
        f"SwapFree:       0 kB\n"
        f"Dirty:          {12 * 1024} kB\n"
        f"Writeback:      0 kB\n",
    )
    node.write(proc / "loadavg", f"8.12 8.05 7.98 9/2411 {4000 + int(t)}\n")
    # PSI totals in microseconds.
    for resource, some_rate, full_rate in (("cpu", 2_000, 0), ("memory", 10, 5), ("io", 1_500, 700)):
        some = int(some_rate * (base + t))
        full = int(full_rate * (base + t))
        node.write(
            proc / "pressure" / resource,
            f"some avg10=0.20 avg60=0.18 avg300=0.15 total={some}\n"
            f"full avg10=0.07 avg60=0.06 avg300=0.05 total={full}\n",
        )
    # Processes: init, one training process with a data-loader thread, slurmstepd.
    processes = {
        1: ("systemd", {1: "S"}),
        2101: ("slurmstepd: [4242.0]", {2101: "S"}),
        2200: ("python", {2200: "R", 2201: "S", 2202: "S"}),
    }
    for pid, (comm, tasks) in processes.items():
        for tid, state in tasks.items():
            stat = f"{tid} ({comm}) {state} 1 {pid} {pid} 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 {len(tasks)} 0 100\n"
            node.write(proc / str(pid) / "task" / str(tid) / "stat", stat)
        node.write(proc / str(pid) / "stat", (proc / str(pid) / "task" / str(pid) / "stat").read_text())
        node.write(proc / str(pid) / "comm", comm.split(":")[0] + "\n")
