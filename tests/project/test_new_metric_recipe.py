"""docs/development.md's recipe for a new metric ("Adding a metric"), followed to the letter: a
throwaway metric of the host collector (the file handles allocated, /proc/sys/fs/file-nr) added by
hand to a copy of the repository, the page's commands run as it gives them, and what they
regenerated checked with exact values (the copy, its .venv and the commands: tests/support/recipe.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lockstep.simulation import cardinality
from tests.support import recipe

# It starts processes (tests/conftest.py).
pytestmark = pytest.mark.real

SECTION = "## Adding a metric"
METRIC = "lockstep_host_open_files"
HELP = "File handles allocated on the host (the first field of /proc/sys/fs/file-nr)."

# Step 1: declared beside the collector's other metrics, in its `metrics`, emitted by collect().
DECLARE = (
    "collectors/host.py",
    "_SKIP_SOURCES = (",
    f'OPEN_FILES = MetricSpec("{METRIC}", "gauge", "{HELP}")\n_SKIP_SOURCES = (',
)
LIST = (
    "collectors/host.py",
    "        BLOCKED,\n        SKIPPED_VALUES,\n",
    "        BLOCKED,\n        OPEN_FILES,\n        SKIPPED_VALUES,\n",
)
EMIT = (
    "collectors/host.py",
    "        self._blocked_tasks(families)\n",
    "        self._blocked_tasks(families)\n"
    '        file_nr = self.proc / "sys" / "fs" / "file-nr"\n'
    "        if file_nr.exists():\n"
    "            families[OPEN_FILES].add_metric([], int(read_text(file_nr).split()[0]))\n",
)
# Step 2: the simulated node writes what the collector reads.
SIMULATE = (
    "simulation/host.py",
    '    node.write(proc / "loadavg", ',
    '    node.write(proc / "sys" / "fs" / "file-nr", "4128\\t0\\t9223372036854775807\\n")\n'
    '    node.write(proc / "loadavg", ',
)
# Step 3: its test, with the exact value.
TEST = "tests/collectors/host/test_host_open_files.py"
FILES = {
    TEST: '''\
"""lockstep_host_open_files, from /proc/sys/fs/file-nr."""

from __future__ import annotations

import shutil
from pathlib import Path

from lockstep.collectors.host import HostCollector
from tests.support import FIXTURES, collected, context


def test_open_files_from_file_nr(tmp_path: Path) -> None:
    shutil.copytree(FIXTURES / "host" / "proc", tmp_path / "proc", symlinks=True)
    (tmp_path / "proc" / "sys" / "fs").mkdir(parents=True)
    (tmp_path / "proc" / "sys" / "fs" / "file-nr").write_text("2208\\t0\\t9223372036854775807\\n")
    assert collected(HostCollector(context(proc=tmp_path / "proc")))[("lockstep_host_open_files", frozenset())] == 2208
''',
}
QUICK_CHECKS = [
    "tests/collectors/host",
    "tests/simulation/test_exposition.py",
    "tests/simulation/test_cardinality.py",
]
# Tests among those that fail when a step is left out; each must have run and passed.
MUST_PASS = {
    "tests.collectors.host.test_host_open_files::test_open_files_from_file_nr",
    "tests.simulation.test_exposition::test_catalogue_doc_is_up_to_date",
    "tests.simulation.test_exposition::test_emitted_and_declared_metrics_match",
    "tests.simulation.test_exposition::test_demo_matches_golden[healthy]",
    "tests.simulation.test_cardinality::test_simulated_node_figures",
}


def test_the_recipe_adds_a_metric_to_the_catalogue_and_the_goldens(tmp_path: Path) -> None:
    commands = recipe.recipe_commands(SECTION)
    copy, env = recipe.throwaway_copy(tmp_path)
    goldens = sorted((copy / "tests" / "golden").glob("demo-*.prom"))
    before = {golden.name: recipe.series(golden) for golden in goldens}
    healthy = before["demo-healthy.prom"]

    # The steps by hand.
    for step in (DECLARE, LIST, EMIT, SIMULATE):
        recipe.edit(copy, *step)
    recipe.write(copy, FILES)
    recipe.set_series_total(copy, len(healthy), len(healthy) + 1)

    passed = recipe.follow(copy, tmp_path, commands, QUICK_CHECKS, env)

    # Regenerated: the catalogue's row, and every golden (each has the host collector) exactly the
    # one series more.
    assert f"| `{METRIC}` | gauge | — | — | {HELP} |\n" in (copy / "docs" / "metrics.md").read_text()
    assert f"\n{METRIC} 4128.0\n" in (copy / "tests" / "golden" / "demo-healthy.prom").read_text()
    for golden in goldens:
        assert (recipe.series(golden) - before[golden.name], before[golden.name] - recipe.series(golden)) == (
            {cardinality.Series(METRIC, frozenset())},
            set(),
        ), golden.name
    # What the recipe changed: the files edited by hand and the generated ones; no other.
    assert recipe.changed(copy) == sorted(
        [
            " M collectors/host.py",
            " M simulation/host.py",
            " M docs/metrics.md",
            " M tests/simulation/test_cardinality.py",
            *[f" M tests/golden/{golden.name}" for golden in goldens],
            f"?? {TEST}",
        ]
    )
    assert MUST_PASS <= passed
