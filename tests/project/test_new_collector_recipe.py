"""docs/development.md's recipe for a new collector ("Adding a collector"), followed to the letter:
a throwaway collector added by hand to a copy of the repository, the page's commands run as it
gives them, and what they regenerated checked with exact values.

The copy is made from the checkout's files (`git ls-files`, untracked ones too, links kept), never
the checkout itself, in tmp_path, with a git repository of its own: dev/regenerate ends with
`git status`, and a commit of the copy as found shows exactly which files the recipe changed.

Its .venv: a fresh install of every dependency would take minutes.  So the copy's venv has no
packages of its own but a .pth line naming the site-packages of the Python running this test
(the checkout's .venv under ./dev/test), which has every dependency installed; the project itself
is installed into the copy's venv by dev/setup.sh's `ensure_venv test` (the editable install, with
its entry points), as ./dev/test or ./dev/run would have done in a checkout.  A .pth line only
adds the directory to sys.path, so the checkout's own editable-install hook (a .pth file there)
never runs, and the copy's site-packages comes first: the copy's code and entry points are the
ones seen, which the test checks.
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

# It starts processes (tests/conftest.py).  This file must not name the flag that rewrites the
# goldens: dev/regenerate runs every test module that does, in the copy too.
pytestmark = pytest.mark.real

RECIPE = REPO / "docs" / "development.md"
REPORT_E2E = "tests/report/test_report_e2e.py"
SECTION = "## Adding a collector"

NAME = "throwaway"
ENTRY_POINT = f'{NAME} = "lockstep.collectors.{NAME}:ThrowawayCollector"'
# Steps 1, 3 and 4 of the recipe: the collector, the simulated node's area that makes it emit its
# one metric, and its tests.
FILES = {
    f"collectors/{NAME}.py": '''\
"""A collector tests/project/test_new_collector_recipe.py adds to a copy of the repository."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client.core import Metric

from lockstep.agent.collector import Collector, Families, MetricSpec, NothingHere
from lockstep.agent.options import option, parse_string

ANSWER = MetricSpec("lockstep_throwaway_answer", "gauge", "The answer, read from sysfs.", ("source",))


@dataclass(frozen=True)
class ThrowawayOptions:
    source: str = option("sysfs", parse_string, "the value of its source label")


class ThrowawayCollector(Collector[ThrowawayOptions]):
    name = "throwaway"
    help = "A collector the recipe's test adds to a copy of the repository."
    options_class = ThrowawayOptions
    metrics = (ANSWER,)

    def collect(self) -> Iterator[Metric]:
        path = self.paths.sysfs / "class" / "throwaway" / "answer"
        if not path.exists():
            raise NothingHere(f"no {path}")
        families = Families(self.metrics)
        families[ANSWER].add_metric([self.options.source], float(path.read_text()))
        yield from families.with_samples()
''',
    f"simulation/{NAME}.py": '''\
"""The throwaway collector's one file on the simulated node."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lockstep.simulation import SimulatedNode


def build(node: SimulatedNode, t: float) -> None:
    node.write(node.paths.sysfs / "class" / "throwaway" / "answer", "42\\n")
''',
    f"tests/collectors/{NAME}/__init__.py": "",
    f"tests/collectors/{NAME}/test_{NAME}.py": '''\
"""The throwaway collector on a tree the test writes."""

from __future__ import annotations

from pathlib import Path

from lockstep.collectors.throwaway import ThrowawayCollector, ThrowawayOptions
from tests.support import collected, context


def test_reads_the_answer(tmp_path: Path) -> None:
    answer = tmp_path / "class" / "throwaway" / "answer"
    answer.parent.mkdir(parents=True)
    answer.write_text("42\\n")
    collector = ThrowawayCollector(context(sys_=tmp_path, options=ThrowawayOptions(source="test")))
    assert collected(collector) == {("lockstep_throwaway_answer", frozenset({("source", "test")})): 42.0}
''',
}

# The recipe's `./dev/test --quick` runs the whole unit tier (about 90 s on an idle 2-core
# machine, on top of the rest); here it runs the checks the steps above answer to, which dev/test
# passes on to pytest: the collector's own tests, the suite's structure and layering, the
# catalogue, goldens and declared-vs-emitted check, the series figures, the example configuration.
QUICK_CHECKS = [
    f"tests/collectors/{NAME}",
    "tests/project",
    "tests/simulation/test_exposition.py",
    "tests/simulation/test_cardinality.py",
    "tests/agent/test_config.py",
]
# Tests among those that fail when a step is left out; each must have run and passed.
MUST_PASS = {
    f"tests.collectors.{NAME}.test_{NAME}::test_reads_the_answer",
    "tests.project.test_suite::test_every_collector_has_its_tests_in_one_folder_named_after_it",
    "tests.simulation.test_exposition::test_catalogue_doc_is_up_to_date",
    "tests.simulation.test_exposition::test_emitted_and_declared_metrics_match",
    "tests.simulation.test_exposition::test_demo_matches_golden[healthy]",
    "tests.simulation.test_cardinality::test_simulated_node_figures",
    "tests.project.test_layering::test_collectors_import_of_the_agent_only_its_api_for_collectors",
    "tests.agent.test_config::test_documented_example_file_is_current",
    "tests.agent.test_config::test_documented_example_file_is_valid_and_shows_the_defaults",
}
# The recipe's commands take tens of seconds each; a limit far above that only stops a hang.
COMMAND_TIMEOUT = 600
# Of a failed command's output, the end: where pytest's summary and a script's error are.
OUTPUT_SHOWN = 20_000


def recipe_commands() -> list[list[str]]:
    """The commands of the one ```sh block of the page's "Adding a collector" section."""
    text = RECIPE.read_text()
    section = text[text.index(f"\n{SECTION}\n") :].split("\n## ", 2)[1]
    blocks = re.findall(r"^```sh\n(.*?)^```$", section, re.MULTILINE | re.DOTALL)
    assert len(blocks) == 1, f"{RECIPE}: {SECTION!r} has {len(blocks)} ```sh blocks, not one"
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


def environment(tmp: Path) -> dict[str, str]:
    """This process's environment, minus what would steer the commands to the checkout or make
    pytest think it runs inside this one, plus temporary and cache directories under tmp (pip
    caches what it builds, pytest makes its base temporary directory)."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTEST_ADDOPTS") and not key.startswith("PYTEST_XDIST")
    }
    for key, name in (("TMPDIR", "tmp"), ("XDG_CACHE_HOME", "cache")):
        (tmp / name).mkdir()
        env[key] = str(tmp / name)
    # dev/regenerate leaves out the report e2e's goldens in the copy: that module's demos run only
    # the collectors it names (--collector.disable-defaults), so a new collector cannot change its
    # goldens, and rerunning it here cost 3.5 of this test's 5 minutes.  The suite's own run of
    # it checks its goldens; the other golden modules run here as the recipe runs them.
    env["PYTEST_ADDOPTS"] = f"--deselect {REPORT_E2E}"
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


def register(copy: Path) -> None:
    """Step 2: the entry point, last in pyproject.toml's table of collectors."""
    pyproject = copy / "pyproject.toml"
    table = '[project.entry-points."lockstep.collectors"]\n'
    text = pyproject.read_text()
    start = text.index(table) + len(table)
    end = text.index("\n\n", start) + 1
    pyproject.write_text(text[:end] + ENTRY_POINT + "\n" + text[end:])


def set_series_total(copy: Path, old: int, new: int) -> None:
    """Step 5: the healthy node's series total in test_simulated_node_figures."""
    path = copy / "tests" / "simulation" / "test_cardinality.py"
    text = path.read_text()
    figures = "assert (healthy.total, healthy.gpus, healthy.ports, healthy.interfaces) == ("
    assert text.count(f"{figures}{old}, ") == 1, f"{path}: no {figures}{old}, ...)"
    path.write_text(text.replace(f"{figures}{old}, ", f"{figures}{new}, "))


def series(golden: Path) -> set[cardinality.Series]:
    return set(cardinality.parse(golden.read_text()))


def passed_tests(junit: Path) -> set[str]:
    """The tests of a JUnit report that passed (neither failed, errored nor skipped)."""
    return {
        f"{case.get('classname')}::{case.get('name')}"
        for case in ET.parse(junit).getroot().iter("testcase")
        if not any(child.tag in ("failure", "error", "skipped") for child in case)
    }


def test_the_recipe_adds_a_collector_to_everything_generated_and_checked(tmp_path: Path) -> None:
    require_real("git", shutil.which("git") is not None)
    commands = recipe_commands()
    copy = tmp_path / "repo"
    copy_repository(copy)
    assert (copy / REPORT_E2E).is_file()  # what environment() leaves out of dev/regenerate
    env = environment(tmp_path)
    make_venv(copy, env)
    goldens = sorted((copy / "tests" / "golden").glob("demo-*.prom"))
    before = {golden.name: series(golden) for golden in goldens}
    healthy = before["demo-healthy.prom"]
    # The agent's self-metric series for a collector: the new one gets the same as the host collector.
    self_metrics = {
        cardinality.Series(s.name, (s.labels - {("collector", "host")}) | {("collector", NAME)})
        for s in healthy
        if s.label("collector") == "host"
    }
    answer = cardinality.Series("lockstep_throwaway_answer", frozenset({("source", "sysfs")}))

    # The steps by hand.
    for name, text in FILES.items():
        (copy / name).parent.mkdir(parents=True, exist_ok=True)
        (copy / name).write_text(text)
    register(copy)
    set_series_total(copy, len(healthy), len(healthy) + len(self_metrics) + 1)

    # The commands, as the page gives them.
    junit = tmp_path / "quick.xml"
    for command in commands:
        if command[0] == "./dev/test":
            # QUICK_CHECKS (above) rather than the whole unit tier.  --no-machine-check: this run's
            # own check covers what the command starts, and work beside it on the machine would
            # show in the inner one.  The report says which tests passed.
            command = [
                *command,
                *QUICK_CHECKS,
                "--no-machine-check",
                "-p",
                "no:cacheprovider",
                f"--basetemp={tmp_path / 'pytest'}",
                f"--junitxml={junit}",
            ]
        run(command, copy, env)

    # Regenerated: the catalogue has the collector's section, the example configuration its
    # section with its option, and every golden exactly the collector's series more.
    assert (
        "## Collector `throwaway`\n\n"
        "| metric | type | unit | labels | meaning |\n"
        "|---|---|---|---|---|\n"
        "| `lockstep_throwaway_answer` | gauge | — | `source` | The answer, read from sysfs. |\n"
    ) in (copy / "docs" / "metrics.md").read_text()
    assert (
        "  # A collector the recipe's test adds to a copy of the repository.\n"
        "  throwaway:\n"
        "    enabled: true\n"
        "    interval: 15s\n"
        "    deadline: 15s\n"
        "    # the value of its source label\n"
        "    source: sysfs\n"
    ) in (copy / "docs" / "lockstep.example.yml").read_text()
    assert len(self_metrics) > 10  # up, state, duration, runs, errors, ...
    assert 'lockstep_throwaway_answer{source="sysfs"} 42.0\n' in (goldens[0].parent / "demo-healthy.prom").read_text()
    for golden in goldens:
        assert (series(golden) - before[golden.name], before[golden.name] - series(golden)) == (
            self_metrics | {answer},
            set(),
        ), golden.name
    # What the recipe changed: the files written by hand and the generated ones that name the
    # collector; no other (the rules and dashboards were current, and stay so).
    assert sorted(git(copy, "status", "--porcelain", "--untracked-files=all").splitlines()) == sorted(
        [
            " M docs/lockstep.example.yml",
            " M docs/metrics.md",
            " M pyproject.toml",
            " M tests/simulation/test_cardinality.py",
            *[f" M tests/golden/{golden.name}" for golden in goldens],
            *[f"?? {name}" for name in FILES],
        ]
    )
    # The quick checks ran in the copy, and those a missing step fails passed.
    assert MUST_PASS <= passed_tests(junit)

    # The copy's code and entry points were the ones used, not the checkout's.
    where = run(
        [
            str(copy / ".venv" / "bin" / "python"),
            "-c",
            "import importlib.metadata, lockstep.agent, lockstep.collectors.throwaway as t;"
            "(ep,) = importlib.metadata.entry_points(group='lockstep.collectors', name='throwaway');"
            "print(lockstep.agent.__file__, t.__file__, ep.dist.locate_file(''), sep='\\n')",
        ],
        tmp_path,
        env,
    )
    venv_site = next((copy / ".venv" / "lib").glob("python3*/site-packages"))
    assert where.split("\n")[:3] == [
        str(copy / "agent" / "__init__.py"),
        str(copy / "collectors" / "throwaway.py"),
        str(venv_site),
    ]
    # ... and the checkout's install was left alone.
    for dist_info in Path(sysconfig.get_path("purelib")).glob("lockstep-*.dist-info"):
        assert NAME not in (dist_info / "entry_points.txt").read_text()
