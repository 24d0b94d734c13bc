"""The import graph of the package ``lockstep``: no cycles, and the layers point one way.

    lockstep.agent        the daemon: imports no collector and no simulation code
    lockstep.collectors   the collectors: import the agent's API, never the simulation
    lockstep.simulation   the simulated node, the fake NVML: may import both
    lockstep.report       `lockstep report`, a client of Prometheus: imports none of the three,
                          only what every judge shares (lockstep.thresholds, lockstep.suspects)
    lockstep.health       `lockstep health-check`, a client of the agent: as the report (and may
                          use the report's HTTP transport)

Within lockstep.collectors, each collector (a module or package under collectors/) imports
no other collector: what two need lives in the toolkit (lockstep.collectors.toolkit), which
imports no collector.  Of the agent, collectors import only the modules meant for them
(COLLECTOR_API), never the daemon's configuration loader, CLI, scheduler or server.

The one import from the daemon into the simulation is the demo's entry (``lockstep demo``):
agent/cli.py -> simulation/demo.py, inside the functions that serve that command.  The graph is
read from the source (every import statement, including those inside functions and under
``if TYPE_CHECKING:``, which are edges for mypy and for a reader), with each file under its import
name (pyproject.toml package-dir), so it is the graph an import-graph tool would draw.
"""

from __future__ import annotations

import ast
import functools
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import tomllib

from tests.support import REPO

PACKAGE_DIRS: dict[str, str] = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
# (importer, imported): the daemon's only way into the simulation.
SANCTIONED = {("lockstep.agent.cli", "lockstep.simulation.demo")}


@dataclass(frozen=True)
class Import:
    importer: str
    imported: str
    line: int
    in_function: bool


def modules() -> dict[str, Path]:
    """Every module of the package: import name -> its one real file."""
    found = {}
    for package, folder in PACKAGE_DIRS.items():
        root = REPO / folder
        for path in sorted(root.rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join([package, *parts])] = path
    return found


def imports(known: dict[str, Path]) -> list[Import]:
    """Every import of a lockstep module by a lockstep module, resolved to the module imported."""
    found = []
    for name, path in known.items():
        tree = ast.parse(path.read_text(), str(path))
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        functions = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        inside = {id(n) for f in functions for n in ast.walk(f) if n is not f}
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join([*anchor, base] if base else anchor)
                # `from lockstep.agent import gpus` imports the module lockstep.agent.gpus.
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
            for target in targets:
                while target and target not in known:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    found.append(Import(name, target, node.lineno, id(node) in inside))
    return found


@functools.cache
def package_imports() -> tuple[Import, ...]:
    """imports(modules()), read once for the module's tests (parsing every file took 0.75 s a test)."""
    return tuple(imports(modules()))


def layer(module: str) -> str:
    return module.split(".")[1] if module.count(".") >= 1 else module


def cycles(edges: list[Import]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    graph: dict[str, set[str]] = {}
    for edge in edges:
        graph.setdefault(edge.importer, set()).add(edge.imported)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in sorted(graph.get(node, ())):
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return components


def test_the_graph_is_read_from_every_file_under_its_import_name() -> None:
    known = modules()
    edges = imports(known)
    assert known["lockstep.agent.cli"] == REPO / "agent" / "cli.py"
    assert known["lockstep.collectors.gpu.collector"] == REPO / "collectors" / "gpu" / "collector.py"
    pairs = {(e.importer, e.imported) for e in edges}
    assert ("lockstep.agent.daemon", "lockstep.agent.scheduler") in pairs  # `from lockstep.agent.scheduler import`
    assert ("lockstep.collectors.gpu.collector", "lockstep.agent.collector") in pairs
    assert len(known) > 100 and len(edges) > 300  # the whole package, not a corner of it


def test_no_import_cycles() -> None:
    assert cycles(list(package_imports())) == []


def test_the_daemon_imports_no_collector_and_collectors_no_simulation() -> None:
    wrong_way = [
        f"{known_path(e.importer)}:{e.line}: {e.importer} imports {e.imported}"
        for e in package_imports()
        if (layer(e.importer), layer(e.imported)) in {("agent", "collectors"), ("agent", "simulation")}
        or (layer(e.importer), layer(e.imported)) == ("collectors", "simulation")
        if (e.importer, e.imported) not in SANCTIONED
    ]
    assert wrong_way == []


# Shared by every judge (rules, dashboards, report, health checks): they import only each other.
SHARED_JUDGEMENTS = ("thresholds", "suspects")
# Commands that read the agent or Prometheus from outside, run by people, Slurm or
# node-problem-detector, never by the daemon: `lockstep report` and `lockstep health-check`
# (which reaches HTTP through the report's transport).
CLIENTS = ("report", "health")


def test_the_report_is_a_client_and_the_judgements_a_leaf() -> None:
    """The report and the health check (clients, run by people, Slurm and node-problem-detector,
    not by the daemon) import nothing of the daemon, the collectors or the simulation; the daemon
    reaches them only through the CLI's commands; the thresholds and suspects import nothing of
    lockstep but each other."""
    edges = list(package_imports())
    wrong = [
        f"{known_path(e.importer)}:{e.line}: {e.importer} imports {e.imported}"
        for e in edges
        if (layer(e.importer) in CLIENTS and layer(e.imported) in {"agent", "collectors", "simulation"})
        or (layer(e.importer) == "agent" and layer(e.imported) in CLIENTS and e.importer != "lockstep.agent.cli")
        or (layer(e.importer) in SHARED_JUDGEMENTS and layer(e.imported) not in SHARED_JUDGEMENTS)
    ]
    assert wrong == []
    assert ("lockstep.report.build", "lockstep.thresholds") in {(e.importer, e.imported) for e in edges}


def test_the_demo_entry_is_imported_only_inside_the_functions_that_serve_demo() -> None:
    entry = [e for e in package_imports() if (e.importer, e.imported) in SANCTIONED]
    assert entry and all(e.in_function for e in entry), entry


def test_the_cycle_finder_finds_a_cycle() -> None:
    edges = [
        Import("a", "b", 1, False),
        Import("b", "c", 1, False),
        Import("c", "a", 1, True),
        Import("c", "d", 1, False),
    ]
    assert cycles(edges) == [["a", "b", "c"]]


def known_path(module: str) -> str:
    return str(modules()[module].relative_to(REPO))


# --- inside lockstep.collectors: collectors apart, the toolkit below them, the agent's API ---

COLLECTORS = "lockstep.collectors"
TOOLKIT = "lockstep.collectors.toolkit"
# The agent's modules a collector may import: what it declares and gets (collector), its options
# and their parsers (options), its replaceable dependencies and clocks (seams), bounded reads of
# untrusted files (files), the GPU inventory (gpus), the metric families it builds (families)
# and how a value is written in them (exposition).  The rest is the daemon's: a collector
# importing it would be tied to how the agent loads, schedules and serves (a plugin as well).
COLLECTOR_API = frozenset(
    f"lockstep.agent.{name}" for name in ("collector", "options", "seams", "files", "gpus", "families", "exposition")
)


def collector_of(module: str) -> str | None:
    """The collector a module belongs to (``gpu`` for lockstep.collectors.gpu.session), None for
    the package lockstep.collectors itself and for modules outside it."""
    if not module.startswith(f"{COLLECTORS}."):
        return None
    return module.removeprefix(f"{COLLECTORS}.").split(".")[0]


def in_toolkit(module: str) -> bool:
    return module == TOOLKIT or module.startswith(f"{TOOLKIT}.")


def one_collector_imports_another(edges: list[Import]) -> list[Import]:
    """Imports of one collector's module by another collector's (the toolkit is no collector)."""
    return [
        e
        for e in edges
        if not in_toolkit(e.importer)
        and not in_toolkit(e.imported)
        and collector_of(e.importer) is not None
        and collector_of(e.imported) is not None
        and collector_of(e.importer) != collector_of(e.imported)
    ]


def the_toolkit_imports_a_collector(edges: list[Import]) -> list[Import]:
    return [e for e in edges if in_toolkit(e.importer) and collector_of(e.imported) and not in_toolkit(e.imported)]


def collectors_import_the_daemon(edges: list[Import]) -> list[Import]:
    """Imports of agent modules outside COLLECTOR_API by collectors and the toolkit."""
    return [
        e
        for e in edges
        if collector_of(e.importer) is not None and layer(e.imported) == "agent" and e.imported not in COLLECTOR_API
    ]


def shown(edges: list[Import], known: dict[str, Path]) -> list[str]:
    """``file:line: importer imports imported``, once per import statement and module imported
    (``from m import a, b`` is one edge per name)."""
    lines = (f"{known[e.importer].relative_to(REPO)}:{e.line}: {e.importer} imports {e.imported}" for e in edges)
    return list(dict.fromkeys(lines))


def test_no_collector_imports_another() -> None:
    known = modules()
    assert shown(one_collector_imports_another(list(package_imports())), known) == []


def test_the_toolkit_imports_no_collector() -> None:
    known = modules()
    assert shown(the_toolkit_imports_a_collector(list(package_imports())), known) == []


def test_collectors_import_of_the_agent_only_its_api_for_collectors() -> None:
    known = modules()
    assert shown(collectors_import_the_daemon(list(package_imports())), known) == []
    # The allow-list names modules that exist: a renamed one must not leave it allowing nothing.
    assert COLLECTOR_API <= set(known)


def test_the_collector_rules_catch_what_the_code_did_before_the_toolkit() -> None:
    """Imports as they were before issue 33, each caught by its rule; and what is allowed."""
    ethtool = Import("lockstep.collectors.ethtool", "lockstep.collectors.infiniband.sysfs", 44, False)
    inspector = Import("lockstep.collectors.nccl.inspector", "lockstep.collectors.training.tail", 48, False)
    kubernetes = Import("lockstep.collectors.kubernetes", "lockstep.collectors.containers", 47, False)
    checkpoint = Import("lockstep.collectors.checkpoint.collector", "lockstep.collectors.filesystem", 104, True)
    parsers = Import("lockstep.collectors.training.collector", "lockstep.agent.config", 15, False)
    command = Import("lockstep.collectors.slurm.scontrol", "lockstep.agent.command", 14, False)
    toolkit_up = Import("lockstep.collectors.toolkit.follow", "lockstep.collectors.training.records", 9, False)
    allowed = [
        Import("lockstep.collectors.nccl.inspector", "lockstep.collectors.toolkit.follow", 48, False),
        Import("lockstep.collectors.nccl.inspector", "lockstep.collectors.nccl.inspector_records", 47, False),
        Import("lockstep.collectors.toolkit.procs", "lockstep.agent.files", 21, False),
        Import("lockstep.collectors.gpu.collector", "lockstep.agent.options", 40, False),
        Import("lockstep.collectors.host", "lockstep.collectors", 1, False),
    ]
    edges = [ethtool, inspector, kubernetes, checkpoint, parsers, command, toolkit_up, *allowed]
    assert one_collector_imports_another(edges) == [ethtool, inspector, kubernetes, checkpoint]
    assert collectors_import_the_daemon(edges) == [parsers, command]
    assert the_toolkit_imports_a_collector(edges) == [toolkit_up]


@pytest.mark.real
def test_once_and_help_load_no_simulation_code() -> None:
    """What the graph says, checked on the running daemon: a whole `lockstep once` round with every
    default collector (found through the entry points, as installed) loads no lockstep.simulation module."""
    code = (
        "import os, sys, contextlib\n"
        "from lockstep.agent import cli\n"
        "real_stdout = os.dup(1)\n"
        "os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # the exposition and the help text\n"
        "cli.main(['once', '--log.level', 'error'])\n"
        "with contextlib.suppress(SystemExit):\n"
        "    cli.main(['run', '--help'])\n"
        "sys.stdout.flush()\n"
        "os.dup2(real_stdout, 1)\n"
        "print(sorted(m for m in sys.modules if m.startswith('lockstep.simulation')))\n"
        "print(len([m for m in sys.modules if m.startswith('lockstep.collectors.')]))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd="/")
    loaded_simulation, loaded_collectors = result.stdout.splitlines()[-2:]
    assert loaded_simulation == "[]", result.stderr[-2000:]
    assert int(loaded_collectors) >= 11  # the round did load the collectors
