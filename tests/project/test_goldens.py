"""The golden files and ./dev/regenerate: every test that writes goldens is marked `golden` (the
tests dev/regenerate runs), and one that skips while writing them fails, naming the files it did
not write and the fix (tests/conftest.py), so dev/regenerate never ends as if they were current."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support import REPO, TESTS

UPDATE = "--update-golden"


def golden_marked(function: ast.FunctionDef) -> bool:
    return any(
        isinstance(d, ast.Call) and ast.unparse(d.func) == "pytest.mark.golden" and d.args
        for d in function.decorator_list
    )


def reads_update(function: ast.FunctionDef) -> bool:
    """Whether the function asks pytest for the option that rewrites goldens."""
    return any(
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "getoption"
        and [ast.unparse(arg) for arg in node.args] == [repr(UPDATE)]
        for node in ast.walk(function)
    )


def test_every_test_that_writes_goldens_is_marked_golden() -> None:
    """A test reading the option that rewrites goldens is marked `golden`: dev/regenerate runs
    those (-m golden) and no other, and their skip under the option fails."""
    writers, unmarked = [], []
    for path in sorted(TESTS.rglob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_") and reads_update(node):
                writers.append(f"{path.relative_to(REPO)}::{node.name}")
                if not golden_marked(node):
                    unmarked.append(writers[-1])
    assert unmarked == []
    assert "tests/simulation/test_exposition.py::test_demo_matches_golden" in writers


def test_dev_regenerate_installs_the_goldens_packages_and_fails_when_a_golden_test_does() -> None:
    script = (REPO / "dev" / "regenerate").read_text()
    assert "ensure_debian_packages $(sed 's/#.*//' dev/debian-packages.d/core.txt)\n" in script
    assert "prometheus" in (REPO / "dev" / "debian-packages.d" / "core.txt").read_text().split()
    assert f"-m golden {UPDATE} $golden_modules; then\n" in script
    assert '    echo "dev/regenerate: FAILED: golden files not written' in script


# A golden test whose component is missing, as the report e2e's is without a Prometheus.
GOLDEN_TEST = textwrap.dedent(
    """\
    import pytest

    from tests.support import require_real

    pytestmark = pytest.mark.e2e


    @pytest.mark.golden("report-{scenario}.txt", "report-{scenario}.json")
    @pytest.mark.parametrize("scenario", ["healthy"])
    def test_report_matches_its_goldens(scenario: str) -> None:
        require_real("Prometheus server (Debian package prometheus)", False)


    def test_not_a_golden_test() -> None:
        require_real("Prometheus server (Debian package prometheus)", False)
    """
)


@pytest.mark.real
@pytest.mark.parametrize("update", [True, False], ids=["update-golden", "check"])
def test_a_golden_test_that_skips_fails_under_update_golden(tmp_path: Path, update: bool) -> None:
    """Run by pytest with this suite's conftest (as a plugin: the module lives in tmp_path)."""
    module = tmp_path / "test_throwaway_golden.py"
    module.write_text(GOLDEN_TEST)
    env = {key: value for key, value in os.environ.items() if key not in ("CI", "PYTEST_ADDOPTS")}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "tests.conftest",
            "-p",
            "no:cacheprovider",
            "--no-machine-check",
            "-rfs",
            "-c",
            str(REPO / "pyproject.toml"),
            f"--rootdir={tmp_path}",
            f"--basetemp={tmp_path / 'pytest'}",
            *([UPDATE] if update else []),
            str(module),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    summary = result.stdout.splitlines()[-1]
    if update:
        assert (result.returncode, summary.strip("= ").split(" in ")[0]) == (1, "1 failed, 1 skipped"), result.stdout
        assert (
            "test_throwaway_golden.py::test_report_matches_its_goldens[healthy] skipped under --update-golden "
            "(Prometheus server (Debian package prometheus) not available on this machine), so "
            "tests/golden/report-healthy.txt and tests/golden/report-healthy.json were not written. Install what it "
            "needs and regenerate: as root, ./dev/regenerate installs the Debian packages the goldens need "
            "(dev/debian-packages.d/core.txt)."
        ) in result.stdout.splitlines()
    else:
        assert (result.returncode, summary.strip("= ").split(" in ")[0]) == (0, "2 skipped"), result.stdout
