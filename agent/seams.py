"""The dependencies a collector reads through, which the simulated node and tests may replace.

A collector that reads through something a test cannot have (NVML, a NIC's ioctl, the
kubelet's socket, ``scontrol``) declares that dependency once, next to its real
implementation, as a typed ``Seam``::

    ETHTOOL = Seam[StatsReader]("ethtool", "a NIC's driver info and ethtool statistics")

and asks its context for a replacement, using the real one when there is none::

    reader = context.seams.get(ETHTOOL) or IoctlStatsReader()

The simulated node or a test replaces it: ``Seams(ETHTOOL.replaced_by(CapturedReader()))``;
mypy checks that the replacement has the seam's type.  The agent only carries ``Seams`` from
whoever built it to the collectors (``CollectorContext.seams``): it knows no collector's
types, so this module imports none (the layering test, tests/project/test_layering.py, checks).
A seam is an object imported by name, so a misspelt one fails at import instead of silently
leaving the real dependency in place.  In production ``CollectorContext.seams`` is
``Seams()``: nothing replaced.

The seams several collectors share, the clocks, are declared here.  A collector never keeps a
clock attribute of its own for tests to overwrite: it takes ``context.seams.get(WALL_CLOCK) or
time.time`` (likewise ``MONOTONIC_CLOCK``), so a test, a replay and the simulated node all
set a collector's time the same way, before it is built.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True, eq=False)
class Seam(Generic[T]):
    """One replaceable dependency: ``name`` for messages, ``what`` says what it is."""

    name: str
    what: str

    def replaced_by(self, replacement: T) -> Replacement[T]:
        """This seam with ``replacement`` standing for the real dependency (mypy checks its type)."""
        return Replacement(self, replacement)


@dataclass(frozen=True)
class Replacement(Generic[T]):
    seam: Seam[T]
    value: T


class Seams:
    """The replacements in force: ``Seams(STATVFS.replaced_by(fake), ...)``; none in production."""

    __slots__ = ("_values",)  # ``seams.statvfs = ...`` raises AttributeError instead of doing nothing

    def __init__(self, *replacements: Replacement[Any]) -> None:
        self._values: dict[Seam[Any], Any] = {}
        self.replace(*replacements)

    def replace(self, *replacements: Replacement[Any]) -> None:
        for replacement in replacements:
            if not isinstance(replacement, Replacement):
                raise TypeError(f"Seams takes SEAM.replaced_by(value), not {type(replacement).__name__}")
            self._values[replacement.seam] = replacement.value

    def get(self, seam: Seam[T]) -> T | None:
        """The replacement, or None: the collector then uses the real dependency."""
        value: T | None = self._values.get(seam)
        return value

    def __repr__(self) -> str:
        return f"Seams({', '.join(seam.name for seam in self._values)})"


# Seconds since the epoch, for timestamps the collectors export (time.time when not replaced).
WALL_CLOCK = Seam[Callable[[], float]]("wall_clock", "seconds since the epoch")
# Seconds on a clock that never steps back, for intervals between a collector's own readings
# (time.monotonic when not replaced): GPM's sample spacing, how long a training or NCCL rank has
# been idle, when a discovered engine was last probed.  The simulated node replaces it with its
# simulated time, so what the spacing decides does not depend on the machine's speed.  Not for
# deadlines the agent waits out in real time (a statfs call's): those stay on time.monotonic.
MONOTONIC_CLOCK = Seam[Callable[[], float]]("monotonic_clock", "seconds on a clock that never steps back")
