"""A simulated GPU node: generated sysfs/procfs trees and fakes, for demo, golden test and benchmarks.

The daemon (``lockstep run``, ``once``, ``doctor``) imports nothing of this package; its one
way in is the demo's entry, simulation/demo.py.  ``lockstep demo`` builds a ``SimulatedNode``
in a temporary directory and starts the agent on it: the collectors are the real ones, pointed
at the generated trees through ``--path.*`` and at the fakes (e.g. a fake NVML) through
``CollectorContext.seams`` (agent/seams.py).

Each area of the node (host, GPU, fabric, storage, Slurm, workloads) is one module in
this package with a ``build(node, t)`` function that writes its part of the trees for the
node's scenario at simulated time ``t`` (seconds since the demo started) and may put fakes
in ``node.seams``.  An area module may also define ``SCENARIOS`` (a tuple of ``Scenario``)
for the failures it simulates; every area builds its healthy state for scenarios it does
not know.  Areas and scenarios are found by scanning this package, so adding one touches
no shared list.  Output is a pure function of (scenario, t): the golden test depends on it.
An area that needs a collector pointed at its data (a checkpoint root, a log glob) sets
``node.options[collector][option]`` in ``build`` to the value the config file would hold;
the demo applies those as overrides, through the option's parse function like a flag's, and
an option the collector does not declare is a configuration error (agent/config.py).

Shared facts of the simulated node, so the areas tell one consistent story: 8 H100-class
GPUs (NVML index 0-7, /dev/nvidia0-7), Slurm job 4242 of user alice running one rank per
GPU (local rank i on GPU i), its slurmstepd pid 2101 and training process pid 2200.
Job 4242 has 16 ranks on two nodes: this node is node001 (ranks 0-7), node002 runs ranks
8-15; the ranks' metric logs are under /scratch/runs/llama-70b__job=4242__task=N/logs/
(rootfs).  In scenario ``straggler`` rank 3 (GPU 3) is the slow one; in ``kv-pressure`` a
vLLM server (pid 3100, engine core 3101, outside Slurm) listens on port 8000 (workloads.py).
"""

from __future__ import annotations

import functools
import importlib
import os
import pkgutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from lockstep.agent.collector import Paths
from lockstep.agent.seams import Seams


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    # The node is healthy when the demo starts and the fault begins later (the straggler scenarios
    # of the workloads area): its exposition at t=0 is the healthy one, so it has no golden file.
    starts_healthy: bool = False


# Writes one file of the node's trees: (path, text).
Writer = Callable[[Path, str], None]


HEALTHY = Scenario("healthy", "An 8-GPU training node in steady state: nothing wrong anywhere.")


@functools.cache
def areas() -> tuple[ModuleType, ...]:
    """The area modules of this package (those with a build function), by name."""
    modules = (importlib.import_module(f"{__name__}.{info.name}") for info in pkgutil.iter_modules(__path__))
    return tuple(sorted((m for m in modules if hasattr(m, "build")), key=lambda m: m.__name__))


def scenarios() -> dict[str, Scenario]:
    """Every scenario: healthy first, then the areas' own, by name."""
    found = {s.name: s for area in areas() for s in getattr(area, "SCENARIOS", ())}
    return {HEALTHY.name: HEALTHY, **dict(sorted(found.items()))}


class SimulatedNode:
    def __init__(self, root: Path, scenario: str) -> None:
        if scenario not in scenarios():
            raise ValueError(f"unknown scenario {scenario!r} (known: {', '.join(scenarios())})")
        self.root = root
        self.scenario = scenario
        self.paths = Paths(sysfs=root / "sys", procfs=root / "proc", rootfs=root / "rootfs")
        self.seams = Seams()
        # Collector options the demo needs to find the simulated data (e.g. checkpoint roots
        # under the node's root): collector -> option -> value as in the config file, passed
        # as if given by flags (Overrides.options), so the loader parses and checks them.
        self.options: dict[str, dict[str, Any]] = {}
        self.t = 0.0
        # What write_if_changed last wrote: path -> (text, the file's inode and mtime then).
        self._written: dict[Path, tuple[str, int, int]] = {}
        for path in (self.paths.sysfs, self.paths.procfs, self.paths.rootfs):
            path.mkdir(parents=True, exist_ok=True)
        self.render(0.0)

    def render(self, t: float) -> None:
        """(Re)write every area's trees as they are at simulated time t."""
        self.t = t
        for area in areas():
            area.build(self, t)

    def write(self, path: Path, text: str) -> None:
        """Replace a file atomically, so a collector never reads half of it."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)

    def write_if_changed(self, path: Path, text: str) -> None:
        """write(), only when the content changes: most of the ~800 files are constant, and an
        atomic replace costs ~0.5 ms on ext4 (it flushes the data).  What was written is
        remembered, and a file is unchanged when it is still the one written (same inode and
        mtime: one stat) with the same text.  Reading each file back to compare cost a demo
        more than its collectors did (py-spy, 2026-11-29: the fabric's ~600 files, 2.7 times the
        collectors' samples), on 35 demos the e2e runs' largest CPU cost."""
        known = self._written.get(path)
        if known is not None and known[0] == text:
            try:
                now = path.stat()
            except OSError:
                now = None
            if now is not None and (now.st_ino, now.st_mtime_ns) == known[1:]:
                return
        self.write(path, text)
        written = path.stat()
        self._written[path] = (text, written.st_ino, written.st_mtime_ns)

    def run_clock(self, step: float = 5.0, speed: float = 1.0) -> Callable[[], None]:
        """Advance simulated time, `speed` simulated seconds per real second (for a served demo),
        re-rendering every `step` simulated seconds but at most once a real second.  Returns the
        function that stops it and waits for a render in progress, so the tree can be removed."""
        stop = threading.Event()
        step = max(step, speed)
        began, t0 = time.monotonic(), self.t

        def tick() -> None:
            while not stop.wait(step / speed):
                # From the real time elapsed, so a slow render (a loaded machine) does not slow the clock.
                elapsed = (time.monotonic() - began) * speed
                self.render(t0 + elapsed // step * step)

        thread = threading.Thread(target=tick, name="simulated-clock", daemon=True)
        thread.start()

        def stop_clock() -> None:
            stop.set()
            thread.join(10)

        return stop_clock


def temporary_node(scenario: str) -> tuple[SimulatedNode, tempfile.TemporaryDirectory[str]]:
    """A node in a fresh temporary directory; the caller keeps the directory object alive.

    In memory (/dev/shm) where there is one: the node rewrites hundreds of small files every
    few seconds, and an atomic replace on a disk filesystem (ext4 flushes the data on rename)
    costs ~0.5 ms of CPU each, against ~20 µs on tmpfs.
    """
    shm = "/dev/shm"
    in_memory = shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else None
    directory = tempfile.TemporaryDirectory(prefix=f"lockstep-sim-{scenario}-", dir=in_memory)
    return SimulatedNode(Path(directory.name), scenario), directory
