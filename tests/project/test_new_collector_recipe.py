"""docs/development.md's recipe for a new collector ("Adding a collector"), followed to the letter:
a throwaway collector added by hand to a copy of the repository, the page's commands run as it
gives them, and what they regenerated checked with exact values (the copy, its .venv and the
commands: tests/support/recipe.py)."""

from __future__ import annotations

import sysconfig
from pathlib import Path

import pytest

from lockstep.simulation import cardinality
from tests.support import recipe

# It starts processes (tests/conftest.py).
pytestmark = pytest.mark.real

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

from lockstep.agent.families import Metric

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

# The recipe's `./dev/test --quick`, narrowed to the checks the steps above answer to
# (recipe.follow): the collector's own tests, the suite's structure and layering, the catalogue,
# goldens and declared-vs-emitted check, the series figures, the example configuration.
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


def register(copy: Path) -> None:
    """Step 2: the entry point, last in pyproject.toml's table of collectors."""
    pyproject = copy / "pyproject.toml"
    table = '[project.entry-points."lockstep.collectors"]\n'
    text = pyproject.read_text()
    start = text.index(table) + len(table)
    end = text.index("\n\n", start) + 1
    pyproject.write_text(text[:end] + ENTRY_POINT + "\n" + text[end:])


def test_the_recipe_adds_a_collector_to_everything_generated_and_checked(tmp_path: Path) -> None:
    commands = recipe.recipe_commands(SECTION)
    copy, env = recipe.throwaway_copy(tmp_path)
    goldens = sorted((copy / "tests" / "golden").glob("demo-*.prom"))
    before = {golden.name: recipe.series(golden) for golden in goldens}
    healthy = before["demo-healthy.prom"]
    # The agent's self-metric series for a collector: the new one gets the same as the host collector.
    self_metrics = {
        cardinality.Series(s.name, (s.labels - {("collector", "host")}) | {("collector", NAME)})
        for s in healthy
        if s.label("collector") == "host"
    }
    answer = cardinality.Series("lockstep_throwaway_answer", frozenset({("source", "sysfs")}))

    # The steps by hand.
    recipe.write(copy, FILES)
    register(copy)
    recipe.set_series_total(copy, len(healthy), len(healthy) + len(self_metrics) + 1)

    # The commands, as the page gives them.
    passed = recipe.follow(copy, tmp_path, commands, QUICK_CHECKS, env)

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
        assert (recipe.series(golden) - before[golden.name], before[golden.name] - recipe.series(golden)) == (
            self_metrics | {answer},
            set(),
        ), golden.name
    # What the recipe changed: the files written by hand and the generated ones that name the
    # collector; no other (the rules and dashboards were current, and stay so).
    assert recipe.changed(copy) == sorted(
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
    assert MUST_PASS <= passed

    # The copy's code and entry points were the ones used, not the checkout's.
    where = recipe.run(
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
