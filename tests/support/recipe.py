"""docs/development.md's recipes ("Adding a collector", "a metric", "an alert", "a report section"),
followed to the letter by the tests in tests/project/test_*_recipe.py: a throwaway change made by
hand in a copy of the repository, the recipe's commands run as the page gives them, and what they
regenerated checked with exact values.

The copy is made from the checkout's files (`git ls-files`, untracked ones too, links kept), never
the checkout itself, in tmp_path, with a git repository of its own: dev/regenerate ends with
`git status`, and a commit of the copy as found shows exactly which files the recipe changed.

Its .venv: a fresh install of every dependency would take minutes.  So the copy's venv has no
packages of its own but a .pth line naming the site-packages of the Python running the test
(the checkout's .venv under ./dev/test), which has every dependency installed; the project itself
is installed into the copy's venv by dev/setup.sh's `ensure_venv test` (the editable install, with
its entry points), as ./dev/test or ./dev/run would have done in a checkout.  A .pth line only
adds the directory to sys.path, so the checkout's own editable-install hook (a .pth file there)
never runs, and the copy's site-packages comes first: the copy's code and entry points are the
ones seen (test_new_collector_recipe.py checks).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import sysconfig
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from lockstep.simulation import cardinality
from tests.support import REPO, require_real

RECIPES = REPO / "docs" / "development.md"
# dev/regenerate leaves out the report's goldens in a copy (PYTEST_ADDOPTS --deselect): they are
# the report's answers to its own queries on its own demos, which neither a new collector nor a new
# metric or alert changes (the report e2e's demos run only the collectors it names; no scenario of
# it brings a new alert's fault), and rerunning them cost 3.5 minutes of a recipe test's 5.  The
# suite's own runs of them check them; the other golden tests run in the copy as the recipe runs them.
REPORT_GOLDENS = ("tests/report/test_report_e2e.py", "tests/report/test_report_ddp_runs.py")
# The recipes' commands take tens of seconds each; a limit far above that only stops a hang.
COMMAND_TIMEOUT = 600
# Of a failed command's output, the end: where pytest's summary and a script's error are.
OUTPUT_SHOWN = 20_000


def recipe_commands(section: str) -> list[list[str]]:
    """The commands of the one ```sh block of the page's section (its "## " title)."""
    text = RECIPES.read_text()
    assert f"\n{section}\n" in text, f"{RECIPES}: no section {section!r}"
    body = text[text.index(f"\n{section}\n") :].split("\n## ", 2)[1]
    blocks = re.findall(r"^```sh\n(.*?)^```$", body, re.MULTILINE | re.DOTALL)
    assert len(blocks) == 1, f"{RECIPES}: {section!r} has {len(blocks)} ```sh blocks, not one"
    commands = [shlex.split(line, comments=True) for line in blocks[0].splitlines()]
    return [command for command in commands if command]


def copy_repository(to: Path) -> None:
    """The checkout's files (untracked ones too, not the ignored: .venv, caches), as a git
    repository with one commit."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
        timeout=60,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source, target = REPO / name, to / name
        if not source.is_symlink() and not source.exists():  # deleted, not yet staged
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target, follow_symlinks=False)  # the fixture trees' links stay links
    git(to, "init", "-q")
    git(to, "add", "-A")
    git(to, "commit", "-q", "-m", "the checkout as found")


def git(repo: Path, *args: str) -> str:
    # Name and address given here: the machine's git may have none configured.
    identity = ["-c", "user.name=recipe test", "-c", "user.email=recipe-test@invalid"]
    result = subprocess.run(["git", *identity, *args], cwd=repo, capture_output=True, text=True, check=True, timeout=60)
    return result.stdout


def environment(tmp: Path, deselect: tuple[str, ...] = REPORT_GOLDENS) -> dict[str, str]:
    """This process's environment, minus what would steer the commands to the checkout or make
    pytest think it runs inside this one, plus temporary and cache directories under tmp (pip
    caches what it builds, pytest makes its base temporary directory), and the golden tests the
    recipe's change cannot alter left out (REPORT_GOLDENS)."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTEST_ADDOPTS") and not key.startswith("PYTEST_XDIST")
    }
    for key, name in (("TMPDIR", "tmp"), ("XDG_CACHE_HOME", "cache")):
        (tmp / name).mkdir()
        env[key] = str(tmp / name)
    if deselect:
        env["PYTEST_ADDOPTS"] = " ".join(f"--deselect {path}" for path in deselect)
    return env


def run(command: list[str], cwd: Path, env: dict[str, str]) -> str:
    """Run a command to its end (its output on failure); on a hang, it and every process it
    started are stopped, so nothing is left running."""
    with subprocess.Popen(
        command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    ) as process:
        try:
            output, _ = process.communicate(timeout=COMMAND_TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            output, _ = process.communicate()
            pytest.fail(f"{shlex.join(command)} still running after {COMMAND_TIMEOUT} s:\n{output[-OUTPUT_SHOWN:]}")
    assert process.returncode == 0, f"{shlex.join(command)} exited {process.returncode}:\n{output[-OUTPUT_SHOWN:]}"
    return output


def make_venv(copy: Path, env: dict[str, str]) -> None:
    """The copy's .venv: its own interpreter and site-packages, the dependencies from this
    process's site-packages (module docstring), the project installed as a checkout has it."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(copy / ".venv")], check=True, timeout=120)
    site_packages = subprocess.run(
        [str(copy / ".venv" / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.strip()
    ours = dict.fromkeys([sysconfig.get_path("purelib"), sysconfig.get_path("platlib")])
    (Path(site_packages) / "dependencies-of-the-checkout.pth").write_text("".join(f"{path}\n" for path in ours))
    run(["bash", "-c", "source dev/setup.sh && ensure_venv test"], copy, env)


def throwaway_copy(tmp_path: Path, deselect: tuple[str, ...] = REPORT_GOLDENS) -> tuple[Path, dict[str, str]]:
    """A copy of the repository in tmp_path/repo with its .venv, and the environment to run the
    recipe's commands in."""
    require_real("git", shutil.which("git") is not None)
    copy = tmp_path / "repo"
    copy_repository(copy)
    for path in deselect:
        assert (copy / path).is_file(), path  # what environment() leaves out of dev/regenerate
    env = environment(tmp_path, deselect)
    make_venv(copy, env)
    return copy, env


def edit(copy: Path, name: str, old: str, new: str) -> None:
    """A step by hand: the one place `old` is in the copy's file `name`, replaced by `new`."""
    path = copy / name
    text = path.read_text()
    assert text.count(old) == 1, f"{name}: {old!r} found {text.count(old)} times, not once"
    # An indented line is found whole, from its start: one indented more would take the edit
    # at the wrong depth (a statement moved into a block).
    assert not old.startswith(" ") or f"\n{old}" in text, f"{name}: {old!r} is not at a line's start"
    path.write_text(text.replace(old, new))


def write(copy: Path, files: dict[str, str]) -> None:
    """Steps by hand: new files in the copy."""
    for name, text in files.items():
        (copy / name).parent.mkdir(parents=True, exist_ok=True)
        (copy / name).write_text(text)


def follow(
    copy: Path,
    tmp_path: Path,
    commands: list[list[str]],
    checks: list[str],
    env: dict[str, str],
    pytest_narrowed: tuple[str, ...] = (),
) -> set[str]:
    """Run the recipe's commands in the copy, as the page gives them.  `./dev/test` is narrowed to
    the checks the recipe's steps answer to (the whole unit tier is about 90 s on an idle 2-core
    machine, on top of the rest), which dev/test passes on to pytest; a `python -m pytest`
    command gets pytest_narrowed (e.g. a -k leaving out the tests of files the recipe does not
    touch: the suite itself runs those).  Returns the tests that passed in the commands that run
    pytest (module::name, as JUnit names them)."""
    passed: set[str] = set()
    for number, command in enumerate(commands):
        pytest_run = command[0] == "./dev/test" or command[1:3] == ["-m", "pytest"]
        if pytest_run:
            # --no-machine-check: the outer run's own check covers what the command starts, and work
            # beside it on the machine would show in the inner one.  The report says which passed.
            junit = tmp_path / f"command-{number}.xml"
            command = [
                *command,
                *(checks if command[0] == "./dev/test" else pytest_narrowed),
                "--no-machine-check",
                "-p",
                "no:cacheprovider",
                f"--basetemp={tmp_path / 'pytest'}",
                f"--junitxml={junit}",
            ]
        run(command, copy, env)
        if pytest_run:
            passed |= passed_tests(junit)
    return passed


def changed(copy: Path) -> list[str]:
    """What the recipe changed in the copy: `git status --porcelain` lines, sorted."""
    return sorted(git(copy, "status", "--porcelain", "--untracked-files=all").splitlines())


def passed_tests(junit: Path) -> set[str]:
    """The tests of a JUnit report that passed (neither failed, errored nor skipped)."""
    return {
        f"{case.get('classname')}::{case.get('name')}"
        for case in ET.parse(junit).getroot().iter("testcase")
        if not any(child.tag in ("failure", "error", "skipped") for child in case)
    }


def series(golden: Path) -> set[cardinality.Series]:
    """The series of a golden exposition."""
    return set(cardinality.parse(golden.read_text()))


def set_series_total(copy: Path, old: int, new: int) -> None:
    """The healthy node's series total in tests/simulation/test_cardinality.py's
    test_simulated_node_figures, from old to new."""
    edit(
        copy,
        "tests/simulation/test_cardinality.py",
        f"assert (healthy.total, healthy.gpus, healthy.ports, healthy.interfaces) == ({old}, ",
        f"assert (healthy.total, healthy.gpus, healthy.ports, healthy.interfaces) == ({new}, ",
    )
