"""The test suite's own structure: every test module beside the tests of the code it tests (a
collector's in tests/collectors/<collector>/), none importing another (shared code is in
tests/support/, fixtures in tests/conftest.py), no test that asserts nothing, the unit tier
held to what it may use, and what a session shares with its tests and with ./dev/test's other
run (tests/support/session.py)."""

from __future__ import annotations

import ast
import fcntl
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import tomllib

from tests.support import REPO, TESTS, require_real
from tests.support.session import MachineTier, MadeAhead, machine_tier_first

SKIPPED_DIRS = {"fixtures", "golden", "__pycache__"}
# Calls that check something: pytest's, the wait that raises when its condition never holds, and
# the report's comparison with its golden files (tests/support/reports.py).
CHECKING_CALLS = {
    "raises",
    "fail",
    "warns",
    "skip",
    "xfail",
    "wait_until",
    "require_real",
    "require_promtool",
    "golden_check",
    "report_goldens",  # (golden_check, twice)
}


def python_files(top: Path) -> list[Path]:
    return sorted(p for p in top.rglob("*.py") if not SKIPPED_DIRS & set(p.relative_to(top).parts))


def modules_of_tests() -> list[Path]:
    return [p for p in python_files(TESTS) if p.name.startswith("test_")]


# The folders a test module may live in: what it tests.  tests/collectors/ has one folder per
# collector (below), and toolkit/ for the code collectors share.
SUBJECTS = {"agent", "alerts", "collectors", "dashboards", "deploy", "health", "project", "report", "simulation"}


def collector_folders() -> set[str]:
    """The collectors' folders under collectors/, from the entry points pyproject.toml registers
    (lockstep.collectors.nccl:RasCollector is the nccl folder)."""
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    targets = pyproject["project"]["entry-points"]["lockstep.collectors"].values()
    return {target.split(":")[0].split(".")[2] for target in targets}


def test_every_test_module_lives_with_the_tests_of_what_it_tests() -> None:
    misplaced = []
    for path in modules_of_tests():
        parts = path.relative_to(TESTS).parts
        if parts[0] not in SUBJECTS:
            misplaced.append(str(path.relative_to(TESTS)))
        elif parts[0] == "collectors" and (len(parts) != 3 or parts[1] not in collector_folders() | {"toolkit"}):
            misplaced.append(str(path.relative_to(TESTS)))
    assert misplaced == []


def test_every_collector_has_its_tests_in_one_folder_named_after_it() -> None:
    folders = {p.name for p in (TESTS / "collectors").iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert sorted(collector_folders() - folders) == []  # a collector without tests
    assert sorted(folders - collector_folders() - {"toolkit"}) == []  # a folder of no collector


def test_a_unit_test_cannot_start_a_process_or_ask_for_a_real_component() -> None:
    """The unit tier is in-process (tests/conftest.py): a test that needs more is marked `real`."""
    with pytest.raises(AssertionError, match="a unit test started a process: mark it @pytest.mark.real"):
        subprocess.run(["true"], check=False)
    with pytest.raises(pytest.fail.Exception, match="a unit test needs promtool: mark it @pytest.mark.real"):
        require_real("promtool", True)


@pytest.mark.real
def test_a_real_test_may_start_a_process() -> None:
    assert subprocess.run(["true"], check=False).returncode == 0


def imported(path: Path) -> set[str]:
    """Every module an import statement of the file names (relative ones resolved)."""
    package = ".".join(path.relative_to(REPO).with_suffix("").parts[:-1])
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join([*parts[: len(parts) - node.level + 1], *([base] if base else [])])
            names.add(base)
            names |= {f"{base}.{alias.name}" for alias in node.names}
    return names


def test_no_module_imports_a_test_module_or_the_conftest() -> None:
    """Test modules are imported by pytest alone: what two share is in tests/support/ or is a fixture."""

    def is_test_module(name: str) -> bool:
        parts = name.split(".")
        return parts[0] == "tests" and (parts[-1].startswith("test_") or parts[-1] == "conftest")

    found = {
        str(path.relative_to(REPO)): sorted(name for name in imported(path) if is_test_module(name))
        for path in [*python_files(TESTS), *python_files(REPO / "bench")]
    }
    assert {path: names for path, names in found.items() if names} == {}


def checks(function: ast.FunctionDef, module: dict[str, ast.FunctionDef], seen: frozenset[str] = frozenset()) -> bool:
    """Whether the function asserts, raises or makes a checking call, itself or through a function
    of its module that it calls."""
    for node in ast.walk(function):
        if isinstance(node, ast.Assert | ast.Raise):
            return True
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if name in CHECKING_CALLS:
                return True
            if name in module and name not in seen and checks(module[name], module, seen | {name}):
                return True
    return False


def test_every_test_checks_something() -> None:
    """A test that asserts nothing passes whatever happens (a report of figures belongs in bench/ or
    in a fixture's teardown)."""
    unchecked = []
    for path in modules_of_tests():
        tree = ast.parse(path.read_text())
        module = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                methods = {n.name: n for n in node.body if isinstance(n, ast.FunctionDef)}
                unchecked += [
                    f"{path.relative_to(TESTS)}::{node.name}::{name}"
                    for name, method in methods.items()
                    if name.startswith("test") and not checks(method, {**module, **methods})
                ]
        unchecked += [
            f"{path.relative_to(TESTS)}::{name}"
            for name, function in module.items()
            if name.startswith("test") and not checks(function, module)
        ]
    assert unchecked == []


# --- what a session shares (tests/support/session.py) ---


def test_a_run_made_ahead_is_handed_over_and_left_only_when_closed() -> None:
    steps: list[str] = []

    @contextmanager
    def make() -> Iterator[str]:
        steps.append("entered")
        try:
            yield "the run"
        finally:
            steps.append("left")

    ahead = MadeAhead("test-run", make)
    assert ahead.result() == "the run"
    assert ahead.result() == "the run"  # every reader gets the same run
    assert steps == ["entered"]
    ahead.close()
    assert steps == ["entered", "left"]
    ahead.close()  # (the session's end closes it again)
    assert steps == ["entered", "left"]


def test_a_run_made_ahead_that_failed_raises_its_error_in_each_test_that_asks() -> None:
    @contextmanager
    def make() -> Iterator[str]:
        raise RuntimeError("prometheus exited with 1")
        yield "never"

    ahead = MadeAhead("test-run", make)
    for _ in range(2):
        with pytest.raises(RuntimeError, match="prometheus exited with 1"):
            ahead.result()
    ahead.close()


class _Item:
    def __init__(self, name: str, fixtures: tuple[str, ...] = (), machine: bool = False) -> None:
        self.name, self.fixturenames, self.machine = name, list(fixtures), machine

    def get_closest_marker(self, name: str) -> object | None:
        return object() if name == "machine" and self.machine else None


def test_a_run_that_holds_the_machine_tier_and_a_shared_runs_readers_puts_them_first() -> None:
    items = [
        _Item("alerts", ("alerts_run",)),
        _Item("hangs", ("report_run",)),
        _Item("slurm", machine=True),
        _Item("pages"),
        _Item("report", ("tmp_path", "report_run")),
        _Item("fuse", machine=True),
    ]
    assert machine_tier_first(items, "report_run") is True  # type: ignore[arg-type]
    assert [item.name for item in items] == ["slurm", "fuse", "hangs", "report", "alerts", "pages"]
    # Without the machine tier (or without a reader) nothing is made ahead, and the order stays.
    readers_only = [_Item("alerts", ("alerts_run",)), _Item("hangs", ("report_run",))]
    assert machine_tier_first(readers_only, "report_run") is False  # type: ignore[arg-type]
    assert [item.name for item in readers_only] == ["alerts", "hangs"]


def test_a_machine_check_waits_until_another_runs_machine_tier_ended(tmp_path: Path) -> None:
    lock = tmp_path / "machine-tier.lock"
    tier, other_run = MachineTier(lock), MachineTier(lock)
    tier.hold()
    with tier.quiet():  # this run's own check while it holds the tier: no deadlock
        pass
    checked = threading.Event()

    def check() -> None:
        with other_run.quiet():
            checked.set()

    thread = threading.Thread(target=check)
    thread.start()
    assert not checked.wait(0.5), "the other run's check went on while the machine tier held the lock"
    tier.release()
    thread.join(timeout=10)
    assert checked.is_set()
    with open(lock, "ab") as free:  # and the check let go of it
        fcntl.flock(free, fcntl.LOCK_EX | fcntl.LOCK_NB)
