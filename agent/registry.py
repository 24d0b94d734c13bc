"""Finds collectors through the entry-point group ``lockstep.collectors``.

A third-party package adds a collector by declaring, in its own pyproject.toml::

    [project.entry-points."lockstep.collectors"]
    mycollector = "my_package.module:MyCollector"

Loading a collector class imports its module only: collectors make no hardware call at
import or construction, so discovery is cheap and safe.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.metadata import entry_points

from lockstep.agent.collector import Collector

ENTRY_POINT_GROUP = "lockstep.collectors"
BUILTIN_DISTRIBUTION = "lockstep"


@dataclass(frozen=True)
class Registered:
    cls: type[Collector]
    distribution: str  # the package that provides it; "lockstep" for the built-in ones

    @property
    def builtin(self) -> bool:
        return self.distribution == BUILTIN_DISTRIBUTION


@dataclass(frozen=True)
class Discovery:
    collectors: dict[str, Registered]
    problems: list[str]  # plugins that could not be loaded, in words for the operator


def discover() -> Discovery:
    collectors: dict[str, Registered] = {}
    problems: list[str] = []
    declared_by: dict[str, str] = {}  # metric name -> collector that declares it
    for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        distribution = ep.dist.name if ep.dist is not None else "unknown"
        where = f"collector {ep.name!r} ({ep.value}, from {distribution})"
        try:
            cls = ep.load()
        except Exception as exc:
            problems.append(f"{where}: cannot be loaded: {type(exc).__name__}: {exc}")
            continue
        if not (isinstance(cls, type) and issubclass(cls, Collector)):
            problems.append(f"{where}: is not a subclass of lockstep.agent.collector.Collector")
            continue
        if getattr(cls, "name", None) != ep.name:
            problems.append(f"{where}: its class says name={getattr(cls, 'name', None)!r}; they must match")
            continue
        if ep.name in collectors:
            problems.append(
                f"{where}: a collector of that name is already provided by {collectors[ep.name].distribution}"
            )
            continue
        clashes = [m.name for m in cls.metrics if m.name in declared_by]
        if clashes:
            owners = ", ".join(f"{m} (declared by {declared_by[m]})" for m in clashes)
            problems.append(f"{where}: declares metrics another collector already declares: {owners}")
            continue
        for metric in cls.metrics:
            declared_by[metric.name] = ep.name
        collectors[ep.name] = Registered(cls, distribution)
    return Discovery(collectors, problems)
