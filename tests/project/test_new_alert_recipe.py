"""docs/development.md's recipe for a new alert ("Adding an alert"), followed to the letter: a
throwaway alert (the host's memory running out) added by hand to a copy of the repository, with
its threshold, promtool test, runbook, scenario and end-to-end case, the page's commands run as it
gives them, and what they regenerated checked with exact values (the copy, its .venv and the
commands: tests/support/recipe.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.support import recipe

# It starts processes (tests/conftest.py).
pytestmark = pytest.mark.real

SECTION = "## Adding an alert"
ALERT = "LockstepHostMemoryLow"
SCENARIO = "host-memory-low"
RUNBOOK_URL = "https://github.com/lockstep-observability/lockstep/blob/main/docs/runbooks.md#lockstephostmemorylow"
DESCRIPTION = (
    "n1:12400 has 2% of its memory available for new work: the kernel reclaims page cache and may "
    "end a rank's process to free memory."
)

# Each step: (file, the one place it is edited, what replaces it).
STEPS = [
    # 1. The threshold.
    (
        "lockstep/thresholds.py",
        '\nAGENT_JOB = "lockstep"\n',
        '\nAGENT_JOB = "lockstep"\n\n'
        "# LockstepHostMemoryLow: memory available for new work below this share of RAM, for as long.\n"
        "HOST_MEMORY_AVAILABLE_RATIO = 0.05\n"
        'HOST_MEMORY_LOW_FOR = "10m"\n',
    ),
    # 2. The rule, in the storage area's group beside LockstepIOStall, and its name in PRODUCT_ALERTS.
    (
        "alerts/storage.py",
        '            "check the filesystems\' latency and blocked processes.",\n        ),\n',
        '            "check the filesystems\' latency and blocked processes.",\n        ),\n'
        "        Alert(\n"
        f'            "{ALERT}",\n'
        '            "warning",\n'
        "            T.HOST_MEMORY_LOW_FOR,\n"
        '            "lockstep_host_memory_available_bytes / lockstep_host_memory_total_bytes\\n"\n'
        '            f"< {num(T.HOST_MEMORY_AVAILABLE_RATIO)}",\n'
        '            f"Memory runs out on {WHERE}",\n'
        '            f"{WHERE} has {VALUE_PERCENT} of its memory available for new work: the kernel reclaims "\n'
        '            "page cache and may end a rank\'s process to free memory.",\n'
        "        ),\n",
    ),
    ("tests/alerts/test_alert_rules.py", "PRODUCT_ALERTS = {\n", f'PRODUCT_ALERTS = {{\n    "{ALERT}",\n'),
    # 3. Its promtool test: n1 at 2 % for 20 minutes fires; n2 at 40 % and n3's 5-minute dip do not.
    (
        "alerts/tests/storage.test.yml",
        "#lockstepiostall\n",
        "#lockstepiostall\n"
        "\n"
        f"  # --- {ALERT} ---\n"
        "  - interval: 1m\n"
        "    input_series:\n"
        '      - series: lockstep_host_memory_available_bytes{cluster="c1", job="lockstep", instance="n1:12400"}\n'
        "        values: 2x30\n"
        '      - series: lockstep_host_memory_total_bytes{cluster="c1", job="lockstep", instance="n1:12400"}\n'
        "        values: 100x30\n"
        '      - series: lockstep_host_memory_available_bytes{cluster="c1", job="lockstep", instance="n2:12400"}\n'
        "        values: 40x30\n"
        '      - series: lockstep_host_memory_total_bytes{cluster="c1", job="lockstep", instance="n2:12400"}\n'
        "        values: 100x30\n"
        '      - series: lockstep_host_memory_available_bytes{cluster="c1", job="lockstep", instance="n3:12400"}\n'
        "        values: 50x10 2x5 50x15\n"
        '      - series: lockstep_host_memory_total_bytes{cluster="c1", job="lockstep", instance="n3:12400"}\n'
        "        values: 100x30\n"
        "    alert_rule_test:\n"
        "      - eval_time: 5m\n"
        f"        alertname: {ALERT}\n"
        "        exp_alerts: []\n"
        "      - eval_time: 20m\n"
        f"        alertname: {ALERT}\n"
        "        exp_alerts:\n"
        "          - exp_labels:\n"
        "              severity: warning\n"
        "              cluster: c1\n"
        "              job: lockstep\n"
        "              instance: n1:12400\n"
        "            exp_annotations:\n"
        "              summary: Memory runs out on n1:12400\n"
        f'              description: "{DESCRIPTION}"\n'
        f"              runbook_url: {RUNBOOK_URL}\n",
    ),
    # 4. Its runbook, and its row in docs/alerting.md's table.
    (
        "docs/runbooks.md",
        "\n## LockstepCollectorFailing\n",
        f"\n## {ALERT}\n\n"
        "**What it means.** Less than 5 % of the node's memory has been available for new work for\n"
        "10 minutes: the kernel reclaims page cache and the out-of-memory killer may end a rank.\n\n"
        "**First checks.**\n"
        "1. Which process holds the memory: `ps aux --sort=-rss | head` on the node.\n"
        "2. A data loader's workers or a leaking cache growing step after step.\n"
        "3. The job's memory limit (its cgroup) against the node's RAM.\n\n"
        "**Dashboard:** Lockstep / Node → Memory available\n"
        "\n## LockstepCollectorFailing\n",
    ),
    (
        "docs/alerting.md",
        "| `IO_FULL_PRESSURE_RATIO` |\n",
        "| `IO_FULL_PRESSURE_RATIO` |\n"
        f"| {ALERT} | warning | memory available < 5 % of RAM (10m) "
        "| `HOST_MEMORY_AVAILABLE_RATIO`, `HOST_MEMORY_LOW_FOR` |\n",
    ),
    # 5. Its fault on the simulated node, and its end-to-end case.
    (
        "simulation/host.py",
        "from typing import TYPE_CHECKING\n",
        "from typing import TYPE_CHECKING\n\nfrom lockstep.simulation import Scenario\n",
    ),
    (
        "simulation/host.py",
        "GIB = 1024 * 1024\n",
        "GIB = 1024 * 1024\n"
        f'SCENARIOS = (Scenario("{SCENARIO}", "A process holds nearly all of the memory: 2 % is available."),)\n',
    ),
    (
        "simulation/host.py",
        'f"MemAvailable:   {1400 * GIB} kB\\n"',
        f"f\"MemAvailable:   {{(41 if node.scenario == '{SCENARIO}' else 1400) * GIB}} kB\\n\"",
    ),
    (
        "tests/support/observation.py",
        'CASES: dict[str, Case] = {\n    "healthy": case("healthy"),\n',
        'CASES: dict[str, Case] = {\n    "healthy": case("healthy"),\n'
        f'    "{SCENARIO}": case("{SCENARIO}", expect("{ALERT}")),\n',
    ),
]
# The checks the steps answer to: the rules' and the cases' tests, the new scenario's golden.
QUICK_CHECKS = ["tests/alerts", f"tests/simulation/test_exposition.py::test_demo_matches_golden[{SCENARIO}]"]
# The last command's promtool unit tests of the other areas' files (about 40 s of the recipe's
# 85 on an idle 2-core machine): the recipe touches storage.test.yml alone, and the suite runs the
# others itself (tests/alerts/test_alert_rules.py).
PYTEST_NARROWED = ("-k", "not test_promtool_unit_tests_pass or storage.test.yml")
# Tests among those that fail when a step is left out; each must have run and passed.
MUST_PASS = {
    "tests.alerts.test_alert_rules::test_generated_rule_files_are_current",
    "tests.alerts.test_alert_rules::test_the_alerts_are_the_products_with_severity_and_annotations",
    "tests.alerts.test_alert_rules::test_rules_use_only_metrics_the_agent_declares_or_the_workload_contract_names",
    "tests.alerts.test_alert_rules::test_every_alert_is_unit_tested_firing_and_silent",
    "tests.alerts.test_alert_rules::test_every_alert_has_a_runbook_section_naming_an_existing_panel",
    "tests.alerts.test_alert_rules::test_promtool_check_rules_is_clean",
    "tests.alerts.test_alert_rules::test_promtool_unit_tests_pass[storage.test.yml]",
    "tests.alerts.test_alert_cases::test_every_alert_in_the_rule_files_is_expected_by_some_case",
    "tests.alerts.test_alert_cases::test_every_demo_scenario_is_a_case",
    f"tests.simulation.test_exposition::test_demo_matches_golden[{SCENARIO}]",
}


def test_the_recipe_adds_an_alert_with_its_test_runbook_and_scenario(tmp_path: Path) -> None:
    commands = recipe.recipe_commands(SECTION)
    copy, env = recipe.throwaway_copy(tmp_path)
    goldens = sorted(path.name for path in (copy / "tests" / "golden").glob("demo-*.prom"))

    for step in STEPS:
        recipe.edit(copy, *step)

    passed = recipe.follow(copy, tmp_path, commands, QUICK_CHECKS, env, PYTEST_NARROWED)

    # Regenerated: the rule in the rule file and the PrometheusRule, as written.
    rule = {
        "alert": ALERT,
        "expr": "lockstep_host_memory_available_bytes / lockstep_host_memory_total_bytes\n< 0.05",
        "for": "10m",
        "labels": {"severity": "warning"},
        "annotations": {
            "summary": "Memory runs out on {{ with $labels.node }}{{ . }}{{ else }}{{ $labels.instance }}{{ end }}",
            "description": "{{ with $labels.node }}{{ . }}{{ else }}{{ $labels.instance }}{{ end }} has "
            "{{ $value | humanizePercentage }} of its memory available for new work: the kernel reclaims page "
            "cache and may end a rank's process to free memory.",
            "runbook_url": RUNBOOK_URL,
        },
    }
    groups = yaml.safe_load((copy / "alerts" / "lockstep-alerts.rules.yml").read_text())["groups"]
    (storage,) = [group for group in groups if group["name"] == "lockstep-storage.alerts"]
    assert storage["rules"][-2:] == [
        next(r for r in storage["rules"] if r.get("alert") == "LockstepIOStall"),
        rule,
    ]
    prometheus_rule = yaml.safe_load((copy / "deploy" / "prometheusrule.yaml").read_text())
    assert storage in prometheus_rule["spec"]["groups"]
    # The scenario's golden: the healthy node's exposition, but 41 GiB of memory available.
    healthy = (copy / "tests" / "golden" / "demo-healthy.prom").read_text().splitlines()
    low = (copy / "tests" / "golden" / f"demo-{SCENARIO}.prom").read_text().splitlines()
    assert len(low) == len(healthy)
    ((was, now),) = [(a, b) for a, b in zip(healthy, low, strict=True) if a != b]
    assert (was.split()[0], now.split()[0], float(now.split()[1])) == (
        "lockstep_host_memory_available_bytes",
        "lockstep_host_memory_available_bytes",
        41 * 1024**3,
    )
    # What the recipe changed: the files edited by hand and the generated ones; no other golden.
    assert recipe.changed(copy) == sorted(
        [
            *{f" M {name}" for name, _, _ in STEPS},
            " M alerts/lockstep-alerts.rules.yml",
            " M deploy/prometheusrule.yaml",
            f"?? tests/golden/demo-{SCENARIO}.prom",
        ]
    )
    assert f"demo-{SCENARIO}.prom" not in goldens
    assert MUST_PASS <= passed
