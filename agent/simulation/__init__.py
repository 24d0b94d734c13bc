"""A simulated GPU node: generated sysfs/procfs trees and fakes, for demo, golden test and benchmarks.

Nothing in the production code paths imports this package.  ``lockstep demo`` builds a
``SimulatedNode`` in a temporary directory and starts the agent on it: the collectors are
the real ones, pointed at the generated trees through ``--path.*`` and at the fakes
(e.g. a fake NVML) through ``CollectorContext.fakes``.

Each area of the node (host, GPU, fabric, storage, Slurm, workloads) has one module here
with a ``build(node, t)`` function that writes its part of the trees for the node's
scenario at simulated time ``t`` (seconds since the demo started) and may register fakes.
Adding an area = one module + one entry in ``AREAS``; adding a scenario = one entry in
``SCENARIOS`` + the areas reacting to its name.  Output is a pure function of
(scenario, t): the golden test depends on that.
"""

from __future__ import annotations

import os
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.collector import Paths


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str


SCENARIOS = {
    s.name: s for s in (Scenario("healthy", "An 8-GPU training node in steady state: nothing wrong anywhere."),)
}


class SimulatedNode:
    def __init__(self, root: Path, scenario: str) -> None:
        if scenario not in SCENARIOS:
            raise ValueError(f"unknown scenario {scenario!r} (known: {', '.join(SCENARIOS)})")
        self.root = root
        self.scenario = scenario
        self.paths = Paths(sysfs=root / "sys", procfs=root / "proc", rootfs=root / "rootfs")
        self.fakes: dict[str, Any] = {}
        self.t = 0.0
        for path in (self.paths.sysfs, self.paths.procfs, self.paths.rootfs):
            path.mkdir(parents=True, exist_ok=True)
        self.render(0.0)

    def render(self, t: float) -> None:
        """(Re)write every area's trees as they are at simulated time t."""
        self.t = t
        for build in AREAS:
            build(self, t)

    def write(self, path: Path, text: str) -> None:
        """Replace a file atomically, so a collector never reads half of it."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)

    def run_clock(self, step: float = 5.0) -> threading.Event:
        """Advance simulated time in real time (for a served demo); set the event to stop."""
        stop = threading.Event()

        def tick() -> None:
            while not stop.wait(step):
                self.render(self.t + step)

        threading.Thread(target=tick, name="simulated-clock", daemon=True).start()
        return stop


def temporary_node(scenario: str) -> tuple[SimulatedNode, tempfile.TemporaryDirectory[str]]:
    """A node in a fresh temporary directory; the caller keeps the directory object alive."""
    directory = tempfile.TemporaryDirectory(prefix=f"lockstep-sim-{scenario}-")
    return SimulatedNode(Path(directory.name), scenario), directory


from agent.simulation import host  # noqa: E402  (areas import SimulatedNode from here)

AREAS: list[Callable[[SimulatedNode, float], None]] = [host.build]
