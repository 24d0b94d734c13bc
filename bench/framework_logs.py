"""What the framework_logs collector costs at its bounds: memory and time of a round.

    .venv/bin/python bench/framework_logs.py

Cases, each in a fresh temporary root with its own collector (defaults unless said):
- chatty: a 64 MiB StdOut of a chatty job (Megatron step reports among 20 lines of other output
  each), read over the rounds its 8 MiB budget takes;
- garbage: a 64 MiB file of no newline at all (one over-long line after another);
- jobs: max_jobs (256) jobs' files of NeMo reports, and 64 more jobs refused;
- one_byte_lines: 16 MiB of "1" lines.
Prints the rounds' wall time (untraced), the peak of Python allocations (tracemalloc, a second
pass) during the rounds and what is held after them, and the series of the last round.
"""

from __future__ import annotations

import logging
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

from lockstep.agent.collector import CollectorContext, Paths
from lockstep.collectors.framework_logs import FrameworkLogsCollector, FrameworkLogsOptions

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "framework_logs"
MIB = 1 << 20


def chatty(root: Path) -> None:
    megatron = [line for line in (FIXTURES / "megatron.log").read_text().splitlines() if "iteration" in line]
    noise = "".join(f"[rank{r}]: some library warns about something, number {r}\n" for r in range(20))
    block = "".join(f"{line}\n{noise}" for line in megatron)
    text = block * (64 * MIB // len(block))
    (root / "slurm-1.out").write_text(text)


def garbage(root: Path) -> None:
    (root / "slurm-2.out").write_bytes(b"x" * (64 * MIB))


def jobs(root: Path) -> None:
    nemo = (FIXTURES / "nemo.log").read_text()
    for job in range(320):
        (root / f"slurm-{1000 + job}.out").write_text(nemo)


def one_byte_lines(root: Path) -> None:
    (root / "slurm-3.out").write_bytes(b"1\n" * (8 * MIB))


def run(name: str, make: Callable[[Path], None], rounds: int) -> None:
    """Two passes over the same files: the rounds' time (no tracing), then their memory (tracemalloc)."""
    with tempfile.TemporaryDirectory() as directory:
        root = Path(directory)
        (root / "proc").mkdir()
        (root / "out").mkdir()
        make(root / "out")
        options = FrameworkLogsOptions(paths=("/out/slurm-*.out",), start_at="beginning", slurm=False, pods=False)
        context = CollectorContext(Paths(procfs=root / "proc", rootfs=root), options, logging.getLogger("bench"))
        collector = FrameworkLogsCollector(context)
        times = []
        for _ in range(rounds):
            start = time.perf_counter()
            families = list(collector.collect())
            times.append(time.perf_counter() - start)
        collector.close()
        series = sum(len(family.samples) for family in families)
        collector = FrameworkLogsCollector(context)
        tracemalloc.start()
        for _ in range(rounds):
            list(collector.collect())
        current, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        collector.close()
        print(
            f"{name}: {rounds} rounds in {sum(times):.2f} s (slowest {max(times):.2f} s), "
            f"peak {peak / 1e6:.1f} MB, held {current / 1e6:.2f} MB, {series} series"
        )


def main() -> None:
    logging.disable(logging.WARNING)
    run("chatty", chatty, 9)
    run("garbage", garbage, 9)
    run("jobs", jobs, 2)
    run("one_byte_lines", one_byte_lines, 3)


if __name__ == "__main__":
    main()
