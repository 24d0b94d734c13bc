"""Finds collectors through the entry-point group ``lockstep.collectors``.

A third-party package adds a collector by declaring, in its own pyproject.toml::

    [project.entry-points."lockstep.collectors"]
    mycollector = "my_package.module:MyCollector"

Loading a collector class imports its module only: collectors make no hardware call at
import or construction, so discovery is cheap and safe.
"""

from __future__ import annotations

import configparser
import importlib
import os
import re
import sys
from dataclasses import dataclass
from typing import Any

from lockstep.agent.collector import Collector

ENTRY_POINT_GROUP = "lockstep.collectors"
BUILTIN_DISTRIBUTION = "lockstep"


@dataclass(frozen=True)
class EntryPoint:
    name: str
    value: str  # "package.module:Class"
    distribution: str  # the distribution's name, as its METADATA says it

    def load(self) -> Any:
        module, _, attribute = self.value.partition(":")
        loaded = importlib.import_module(module.strip())
        for part in filter(None, attribute.strip().split(".")):
            loaded = getattr(loaded, part)
        return loaded


def entry_points(group: str) -> list[EntryPoint]:
    """The group's entry points, as importlib.metadata.entry_points(group=...) finds them: each
    distribution on sys.path once (the first of a name wins), its `entry_points.txt` read.

    Not importlib.metadata itself (issue 47): it loads `email` and `zipfile` with it, 4.5 MiB
    resident on every node, to read a few lines of one file per distribution.  Distributions in
    zip files (eggs) are not read; tests/agent/test_registry_entry_points.py holds the answer
    equal to importlib.metadata's on the installed packages and on plugins made for it."""
    found: list[EntryPoint] = []
    seen: set[str] = set()
    for directory in sys.path:
        try:
            names = sorted(os.listdir(directory or "."))
        except OSError:  # gone, not a directory (a zip), unreadable
            continue
        for entry in names:
            if not entry.endswith((".dist-info", ".egg-info")):
                continue
            info = os.path.join(directory or ".", entry)
            name = _distribution_name(info) or entry.rpartition(".")[0].split("-")[0]
            normalized = re.sub(r"[-_.]+", "-", name).lower()
            if normalized in seen:
                continue
            seen.add(normalized)
            sections = configparser.ConfigParser(delimiters=("=",), interpolation=None, strict=False)
            # Names keep their case (configparser lowers them by default).
            sections.optionxform = str  # type: ignore[assignment,method-assign]
            try:
                sections.read(os.path.join(info, "entry_points.txt"), encoding="utf-8")
            except (configparser.Error, OSError, UnicodeDecodeError):
                continue
            if sections.has_section(group):
                found += [EntryPoint(key, value, name) for key, value in sections.items(group)]
    return found


def _distribution_name(info: str) -> str:
    """The Name field of a distribution's metadata (METADATA, or PKG-INFO for an egg-info)."""
    for file in ("METADATA", "PKG-INFO"):
        try:
            with open(os.path.join(info, file), encoding="utf-8", errors="replace") as fields:
                for line in fields:
                    if not line.strip():
                        break  # the headers end at the first blank line
                    if line.lower().startswith("name:"):
                        return line[5:].strip()
        except OSError:
            continue
    return ""


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
    for ep in sorted(entry_points(ENTRY_POINT_GROUP), key=lambda e: e.name):
        distribution = ep.distribution or "unknown"
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
