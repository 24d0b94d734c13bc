"""docs/development.md's recipe for a new section of `lockstep report` ("Adding a report section"),
followed to the letter: a throwaway section (the models of the GPUs on the job's nodes) added by
hand to a copy of the repository, the page's commands run as it gives them, and every report
golden it regenerated checked with exact values (the copy, its .venv and the commands:
tests/support/recipe.py).  Its dev/regenerate runs the report's golden tests with a real
Prometheus, as the recipe does, on the data of the session's own run of the demos (the fixture
report_run, tests/support/report_run.py RECORDED): a report section changes no demo, and
watching them again in the copy took 3.5 of the test's 5 minutes."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from lockstep.report import text
from lockstep.report.model import from_json, to_json
from tests.support import recipe, require_real
from tests.support.prometheus import PROMETHEUS
from tests.support.report_run import RECORDED, Run

# A real Prometheus makes the report's goldens (tests/conftest.py).
pytestmark = pytest.mark.e2e

SECTION = "## Adding a report section"
MODEL = "NVIDIA H100 80GB HBM3"  # the simulated node's GPUs
MODULE = "lockstep/report/gpu_models.py"
TEST = "tests/report/test_report_gpu_models.py"
FILES = {
    # 1. Its module.
    MODULE: '''\
"""The GPU models section: the models of the GPUs on the job's nodes."""

from __future__ import annotations

from lockstep.report.scope import Scope


def gpu_models_section(scope: Scope) -> list[str]:
    if not scope.instances:
        return []
    counted = scope.at_end(f"count by (model) (max_over_time({scope.nodes('lockstep_gpu_info')}[{scope.whole}]))")
    return sorted(sample.labels.get("model", "") for sample in counted)
''',
    # 5. Its test, on chosen answers of the stand-in Prometheus.
    TEST: '''\
"""The GPU models section, on chosen answers of a stand-in for Prometheus' API."""

from __future__ import annotations

from lockstep.report.gpu_models import gpu_models_section
from lockstep.report.prometheus import Prometheus
from lockstep.report.scope import Scope
from tests.support.fake_prometheus import FakePrometheus, Rule, serving, vector

T = 1_800_000_000.0


def test_the_models_of_the_gpus_on_the_jobs_nodes() -> None:
    answer = vector(({"model": "NVIDIA H100 80GB HBM3"}, 8.0), ({"model": "NVIDIA A100-SXM4-80GB"}, 8.0))
    rule = Rule(r"^count by \\(model\\) \\(max_over_time\\(lockstep_gpu_info\\{", answer)
    with serving(FakePrometheus([rule])) as fake:
        scope = Scope(Prometheus(fake.url), "4242", "c1", start=T, end=T + 600, instances=["n1:12400", "n2:12400"])
        assert gpu_models_section(scope) == ["NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3"]
    assert fake.seen == [
        'count by (model) (max_over_time(lockstep_gpu_info{instance=~"n1:12400|n2:12400",cluster="c1"}[660000ms]))'
    ]
''',
}
# Each edit: (file, the one place it is edited, what replaces it).
EDITS = [
    # 2. The model: its field in Report.
    (
        "lockstep/report/model.py",
        "    events: list[Event] = field(default_factory=list)\n",
        "    events: list[Event] = field(default_factory=list)\n"
        "    gpu_models: list[str] = field(default_factory=list)\n",
    ),
    (
        "tests/report/test_report_model.py",
        '        "events",\n        "notes",\n    ]\n',
        '        "events",\n        "gpu_models",\n        "notes",\n    ]\n',
    ),
    # 3. build.py asks it beside the others and puts it in the report.
    (
        "lockstep/report/build.py",
        "from lockstep.report.gpus import gpu_section\n",
        "from lockstep.report.gpu_models import gpu_models_section\nfrom lockstep.report.gpus import gpu_section\n",
    ),
    (
        "lockstep/report/build.py",
        "\n            events_asked = pool.submit(event_section, scope)\n",
        "\n            events_asked = pool.submit(event_section, scope)\n"
        "            gpu_models_asked = pool.submit(gpu_models_section, scope)\n",
    ),
    (
        "lockstep/report/build.py",
        "        events=events,\n",
        "        events=events,\n        gpu_models=gpu_models_asked.result(),\n",
    ),
    # 4. The renderers.
    (
        "lockstep/report/text.py",
        '    out.append("Fabric and filesystem events on the job\'s nodes")\n',
        '    out.append("GPU models: " + (", ".join(report.gpu_models) or "none"))\n'
        '    out.append("")\n'
        '    out.append("Fabric and filesystem events on the job\'s nodes")\n',
    ),
    (
        "lockstep/report/html.py",
        '    parts.append("<h2>Fabric and filesystem events</h2>")\n',
        '    parts.append("<h2>GPU models</h2>")\n'
        "    parts.append(items(report.gpu_models))\n"
        '    parts.append("<h2>Fabric and filesystem events</h2>")\n',
    ),
    # 7. The docs: what it reads, and its JSON field.
    (
        "docs/report.md",
        "| every sample |\n\nThe sections that read different series",
        "| every sample |\n| GPU models | `lockstep_gpu_info` on the job's nodes at its end | the last sample |\n\n"
        "The sections that read different series",
    ),
    (
        "docs/report.md",
        "| `notes` | [string] | |\n",
        "| `gpu_models` | [string] | the models of the GPUs on the job's nodes |\n| `notes` | [string] | |\n",
    ),
]
# 6. Nothing in it depends on when Prometheus scraped: canonical() stays as it is.
QUICK_CHECKS = ["tests/report"]
# Tests among those that fail when a step is left out; each must have run and passed.
MUST_PASS = {
    "tests.report.test_report_gpu_models::test_the_models_of_the_gpus_on_the_jobs_nodes",
    "tests.report.test_report_model::test_the_json_has_every_documented_top_level_field",
    "tests.report.test_report_model::test_json_reads_back_into_the_same_report",
    "tests.report.test_report_names::test_every_metric_and_recorded_series_the_report_reads_exists",
}
EVENTS = "\nFabric and filesystem events on the job's nodes\n"


def test_the_recipe_adds_a_report_section_to_every_report_golden(tmp_path: Path, report_run: Run) -> None:
    require_real("Prometheus server (Debian package prometheus)", os.access(PROMETHEUS, os.X_OK))
    commands = recipe.recipe_commands(SECTION)
    copy, env = recipe.throwaway_copy(tmp_path, deselect=())
    env[RECORDED] = str(report_run.recorded)
    golden = copy / "tests" / "golden"
    # The goldens as the checkout's report code reads and writes them (a golden written before a
    # field was added reads back with its default).
    before = {path.name: from_json(path.read_text()) for path in sorted(golden.glob("report-*.json"))}
    assert len(before) == 16

    recipe.write(copy, FILES)
    for edit in EDITS:
        recipe.edit(copy, *edit)

    passed = recipe.follow(copy, tmp_path, commands, QUICK_CHECKS, env)

    # Every report golden has the section: the simulated node's GPU model where the report's demos
    # ran the GPU collector (test_report_e2e.py), none in the DDP runs' (the training collector alone).
    for name, report in before.items():
        models = [] if name.startswith("report-ddp-") else [MODEL]
        assert json.loads((golden / name).read_text()) == {**json.loads(to_json(report)), "gpu_models": models}, name
        txt = name.removesuffix(".json") + ".txt"
        was = text.render(report)
        assert was.count(EVENTS) == 1, txt
        assert (golden / txt).read_text() == was.replace(
            EVENTS, f"\nGPU models: {', '.join(models) or 'none'}\n{EVENTS}"
        ), txt
    # What the recipe changed: the files edited by hand, the new ones and the report goldens.
    assert recipe.changed(copy) == sorted(
        [
            *{f" M {name}" for name, _, _ in EDITS},
            *[f"?? {name}" for name in FILES],
            *[f" M tests/golden/{name}" for name in before],
            *[f" M tests/golden/{name.removesuffix('.json')}.txt" for name in before],
        ]
    )
    assert MUST_PASS <= passed
    # The copy (31 MB with its goldens' runs) would stay until the session ends, beside the runs
    # that watch demos: the suite's check of the machine allows 52 MB of temporary files in all.
    shutil.rmtree(tmp_path)
