"""The demo's entry: what ``lockstep demo`` and ``--gpu.fake-nvml`` (agent/cli.py) take from the simulation.

The daemon's own code never loads the simulation: ``run``, ``once`` and ``doctor`` work on the
real machine.  The one way in is this module, imported by agent/cli.py inside the functions that
serve the ``demo`` command (and ``demo --help``) and the ``--gpu.fake-nvml SPEC`` flag, so that a
newcomer finds in one place what the simulation hands the real agent: the node's trees
(``--path.*``), its fakes (``Seams``) and the collector options that point collectors at its
data.  tests/project/test_layering.py holds the daemon to that: no other import of
``lockstep.simulation`` from agent/ or collectors/.
"""

from __future__ import annotations

import argparse
import tempfile
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lockstep.agent.seams import Seams
from lockstep.collectors.gpu.provider import NVML
from lockstep.simulation import SimulatedNode, scenarios, temporary_node
from lockstep.simulation.fake_nvml import FakeSpecError, from_spec_file


def scenario_help() -> str:
    """``demo --help``: the scenarios, one paragraph each."""
    return "Run the agent on a simulated node.\n\nscenarios:\n" + "\n".join(
        textwrap.fill(s.description, 78, initial_indent=f"  {s.name:<18} ", subsequent_indent=" " * 21)
        for s in scenarios().values()
    )


def scenario_name(value: str) -> str:
    """``--scenario``'s type: a known scenario of the simulated node."""
    if value not in scenarios():
        raise argparse.ArgumentTypeError(f"unknown scenario {value!r} (choose from {', '.join(sorted(scenarios()))})")
    return value


@dataclass
class Demo:
    """A simulated node in a temporary directory, and what the agent needs to run on it."""

    node: SimulatedNode
    directory: tempfile.TemporaryDirectory[str]  # removed when this object is collected

    @property
    def paths(self) -> dict[str, str]:
        """``--path.sysfs`` etc.: where the node's trees are."""
        paths = self.node.paths
        return {"sysfs": str(paths.sysfs), "procfs": str(paths.procfs), "rootfs": str(paths.rootfs)}

    @property
    def seams(self) -> Seams:
        """The node's fakes (NVML, the NICs' ethtool, scontrol, the kubelet, the engines' /metrics)."""
        return self.node.seams

    @property
    def options(self) -> dict[str, dict[str, Any]]:
        """Collector options that point collectors at the node's data (a log glob, a checkpoint root)."""
        return self.node.options


def start(scenario: str) -> Demo:
    node, directory = temporary_node(scenario)
    return Demo(node, directory)


def seams_with_fake_nvml(spec: Path) -> Seams:
    """``run|once|doctor --gpu.fake-nvml SPEC``: the real agent on this machine, with the GPU
    collector reading the fake NVML the spec describes.  ValueError names each problem of the
    spec with its file:line."""
    try:
        return Seams(NVML.replaced_by(from_spec_file(spec)))
    except FakeSpecError as exc:
        raise ValueError("; ".join(exc.problems)) from None
