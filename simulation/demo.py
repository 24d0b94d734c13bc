"""The demo's entry: what ``lockstep demo`` (agent/cli.py) takes from the simulated node.

The daemon's own code never loads the simulation: ``run``, ``once`` and ``doctor`` work on the
real machine.  The one way in is this module, imported by agent/cli.py inside the function that
serves the ``demo`` command (and ``demo --help``), so that a newcomer finds in one place what the
demo hands the real agent: the node's trees (``--path.*``), its fakes (``Seams``) and the
collector options that point collectors at its data.  tests/unit/test_layering.py holds the
daemon to that: no other import of ``lockstep.simulation`` from agent/ or collectors/.
"""

from __future__ import annotations

import argparse
import tempfile
import textwrap
from dataclasses import dataclass
from typing import Any

from lockstep.agent.seams import Seams
from lockstep.simulation import SimulatedNode, scenarios, temporary_node


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
