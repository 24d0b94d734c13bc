"""The alert and recording rules (alerts/): generated files current, promtool-clean, unit-tested,
every alert as the product names it, with a runbook section, on metrics the agent declares.

The rules are proven end to end on a real Prometheus in tests/alerts/test_alerts_e2e.py.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from alerts import generated, render, rules
from alerts.__main__ import RULES
from alerts.compression import Compression, scale_duration
from alerts.inference import above_ttft_slo, ttft_slo_text
from alerts.recording import TTFT_P95
from alerts.tests import stragglers
from dashboards.build import boards
from lockstep import thresholds as T
from tests.support import REPO, require_promtool, require_real
from tests.support.queries import WORKLOAD_CONTRACT, declared_metrics, metrics_in

# The alert names on-call routes on (issue 8): part of the product, never renamed silently.
PRODUCT_ALERTS = {
    "LockstepTrainingStraggler",
    "LockstepTrainingStragglerSustained",
    "LockstepTrainingSlowerThanPeers",
    "LockstepGPUStraggler",
    "LockstepGPUStragglerSustained",
    "LockstepTrainingStalled",
    "LockstepFrameworkStalled",
    "LockstepFrameworkSlowdown",
    "LockstepNCCLStraggler",
    "LockstepNCCLHang",
    "LockstepTrainingHung",
    "LockstepNCCLRankStuck",
    "LockstepJobEndedHung",
    "LockstepKVCachePressure",
    "LockstepKVCachePreemptions",
    "LockstepInferenceThroughputDrop",
    "LockstepInferenceTTFTHigh",
    "LockstepInferenceErrors",
    "LockstepCheckpointStalled",
    "LockstepCheckpointOverdue",
    "LockstepGPUFellOffBus",
    "LockstepGPUXidCritical",
    "LockstepGPUUncorrectableECC",
    "LockstepGPURowRemapFailure",
    "LockstepGPUThermalSlowdown",
    "LockstepGPUPowerBrake",
    "LockstepNVLinkDown",
    "LockstepNVLinkErrors",
    "LockstepGPUIdleWhileAllocated",
    "LockstepGPURecoveryActionRequired",
    "LockstepGPUFabricDegraded",
    "LockstepIBPortDown",
    "LockstepIBLinkFlapping",
    "LockstepIBSymbolErrors",
    "LockstepIBCongestion",
    "LockstepPFCStorm",
    "LockstepRoCECongestionControlOff",
    "LockstepPCIeLinkDegraded",
    "LockstepFilesystemHung",
    "LockstepFilesystemAlmostFull",
    "LockstepIOStall",
    "LockstepCollectorFailing",
    "LockstepAgentDown",
    "LockstepNodeHurtsJobs",
    "LockstepNodeNeedsRepair",
}

STRAGGLER_ALERTS = {
    "LockstepFrameworkStalled",
    "LockstepFrameworkSlowdown",
    "LockstepTrainingStraggler",
    "LockstepTrainingStragglerSustained",
    "LockstepTrainingSlowerThanPeers",
    "LockstepGPUStraggler",
    "LockstepGPUStragglerSustained",
    "LockstepNCCLStraggler",
    "LockstepNCCLHang",
    "LockstepTrainingHung",
    "LockstepNCCLRankStuck",
}

RUNBOOKS = REPO / "docs" / "runbooks.md"
TESTS = sorted((REPO / "alerts" / "tests").glob("*.test.yml"))


def test_generated_rule_files_are_current() -> None:
    assert generated.stale_files(RULES) == [], "run: .venv/bin/python -m alerts --write"


def test_the_generated_straggler_unit_tests_are_current() -> None:
    """alerts/tests/stragglers.test.yml is written by alerts/tests/stragglers.py."""
    assert stragglers.OUT.read_text() == stragglers.render(), "run: .venv/bin/python -m alerts.tests.stragglers"


def _records_read(expr: str) -> set[str]:
    """The recorded names (level:metric:operations) an expression reads."""
    without_strings = re.sub(r'"[^"]*"', '""', expr)
    return set(re.findall(r"\b[a-zA-Z_][a-zA-Z0-9_]*:[a-zA-Z0-9_:]*[a-zA-Z0-9_]", without_strings))


def test_each_recording_group_comes_after_the_groups_it_reads() -> None:
    """The order promtool's tests evaluate the groups in (render.GROUP_EVAL_ORDER) is the rule
    files' order: a record read before the group recording it is evaluated would be one
    evaluation old in the tests and fresh in none."""
    recorded_by: dict[str, int] = {}
    for index, group in enumerate(rules.RECORDING_GROUPS):
        for rule in group.rules:
            recorded_by.setdefault(rule.record, index)
    late = []
    for index, group in enumerate(rules.RECORDING_GROUPS):
        seen_in_group = set()
        for rule in group.rules:
            for name in _records_read(rule.expr) - seen_in_group:
                if recorded_by.get(name, -1) >= index:
                    late.append(f"{group.name}: {rule.record} reads {name}")
            seen_in_group.add(rule.record)
    assert late == []
    assert render.GROUP_EVAL_ORDER == [group.name for group in (*rules.RECORDING_GROUPS, *rules.ALERT_GROUPS)]


@pytest.mark.parametrize("test_file", TESTS, ids=lambda path: path.name)
def test_every_promtool_test_evaluates_the_groups_in_their_order(test_file: Path) -> None:
    """Without group_eval_order promtool evaluates the groups in a random order, and a value read
    across groups moves by one evaluation from run to run."""
    block = "group_eval_order:\n" + "".join(f"  - {name}\n" for name in render.GROUP_EVAL_ORDER)
    assert yaml.safe_load(test_file.read_text()).get("group_eval_order") == render.GROUP_EVAL_ORDER, (
        f"{test_file.name}: its group_eval_order must be alerts/render.py's GROUP_EVAL_ORDER:\n{block}"
    )


@pytest.mark.real
def test_promtool_check_rules_is_clean(tmp_path: Path) -> None:
    promtool = require_promtool()
    files = [str(REPO / path) for path in render.RULE_FILES.values()]
    # The PrometheusRule for Kubernetes holds the same groups: check them as a rule file too.
    spec = yaml.safe_load((REPO / render.PROMETHEUS_RULE).read_text())["spec"]
    (tmp_path / "prometheusrule.rules.yml").write_text(yaml.safe_dump(spec))
    result = subprocess.run(
        [promtool, "check", "rules", *files, str(tmp_path / "prometheusrule.rules.yml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    counts = [int(n) for n in re.findall(r"SUCCESS: (\d+) rules found", result.stdout)]
    assert counts == [len(rules.recordings()), len(rules.alerts()), len(rules.recordings()) + len(rules.alerts())]


def test_there_are_promtool_unit_tests() -> None:
    assert len(TESTS) >= 9, TESTS


# One promtool run per file: a failure names its file, and parallel test workers share the
# 20 s of CPU that the whole set takes.
@pytest.mark.real
@pytest.mark.parametrize("test_file", TESTS, ids=lambda path: path.name)
def test_promtool_unit_tests_pass(test_file: Path) -> None:
    promtool = require_promtool()
    result = subprocess.run(
        [promtool, "test", "rules", str(test_file)], capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == 1


def test_the_prometheus_rule_holds_exactly_the_rule_files_groups() -> None:
    spec = yaml.safe_load((REPO / render.PROMETHEUS_RULE).read_text())["spec"]
    from_files = []
    for path in render.RULE_FILES.values():
        from_files += yaml.safe_load((REPO / path).read_text())["groups"]
    assert spec["groups"] == from_files


def test_the_alerts_are_the_products_with_severity_and_annotations() -> None:
    alerts = rules.alerts()
    assert [a.name for a in alerts if a.name not in PRODUCT_ALERTS] == []
    assert PRODUCT_ALERTS - {a.name for a in alerts} == set()
    assert len(alerts) == len(PRODUCT_ALERTS)  # no duplicates
    for group in yaml.safe_load((REPO / render.RULE_FILES["alerting"]).read_text())["groups"]:
        for rule in group["rules"]:
            assert rule["labels"]["severity"] in ("critical", "warning"), rule["alert"]
            annotations = rule["annotations"]
            # The straggler alerts also name their suspects and link the dashboard panel showing them.
            extra = {"suspects", "dashboard_url"} if rule["alert"] in STRAGGLER_ALERTS else set()
            assert set(annotations) == {"summary", "description", "runbook_url"} | extra, rule["alert"]
            assert annotations["runbook_url"] == f"{T.RUNBOOK_BASE_URL}#{rule['alert'].lower()}"
            assert all(annotations[key].strip() for key in ("summary", "description")), rule["alert"]


def test_recording_rules_are_named_level_metric_operations() -> None:
    for recording in rules.recordings():
        level, metric, operation = recording.record.split(":")
        assert level and operation, recording.record
        assert metric.startswith("lockstep_"), recording.record


def test_rules_use_only_metrics_the_agent_declares_or_the_workload_contract_names() -> None:
    known = declared_metrics() | WORKLOAD_CONTRACT
    used = {name for rule in [*rules.recordings(), *rules.alerts()] for name in metrics_in(rule.expr)}
    assert used - known == set()


def _promtool_cases() -> dict[str, dict[str, int]]:
    """Per alert: how many promtool checks expect it firing and how many expect it silent."""
    cases: dict[str, dict[str, int]] = {}
    for path in TESTS:
        for test in yaml.safe_load(path.read_text())["tests"]:
            for check in test.get("alert_rule_test", []):
                counts = cases.setdefault(check["alertname"], {"firing": 0, "silent": 0})
                counts["firing" if check.get("exp_alerts") else "silent"] += 1
    return cases


def test_every_alert_is_unit_tested_firing_and_silent() -> None:
    cases = _promtool_cases()
    for alert in rules.alerts():
        assert cases.get(alert.name, {}).get("firing", 0) >= 1, f"{alert.name}: no promtool test sees it fire"
        assert cases.get(alert.name, {}).get("silent", 0) >= 1, f"{alert.name}: no promtool test sees it silent"


def _runbook_sections() -> dict[str, str]:
    sections: dict[str, str] = {}
    name = None
    for line in RUNBOOKS.read_text().splitlines():
        if line.startswith("## "):
            name = line[3:].strip()
            sections[name] = ""
        elif name is not None:
            sections[name] += line + "\n"
    return sections


def _panels() -> set[tuple[str, str]]:
    found = set()
    for board in boards():
        data: dict[str, Any] = board.dashboard().to_json_data()
        found |= {(data["title"], panel.title) for panel in data["panels"]}
    return found


def test_every_alert_has_a_runbook_section_naming_an_existing_panel() -> None:
    sections = _runbook_sections()
    panels = _panels()
    for alert in rules.alerts():
        assert alert.name in sections, f"docs/runbooks.md has no '## {alert.name}' section"
        text = sections[alert.name]
        assert "**What it means.**" in text and "**First checks.**" in text, alert.name
        checks = re.findall(r"^\d\. ", text.split("**First checks.**")[1], flags=re.M)
        assert len(checks) >= 3, f"{alert.name}: fewer than three first checks"
        named = re.findall(r"^\*\*Dashboard:\*\* (.+?) → (.+?)\s*$", text, flags=re.M)
        assert named, f"{alert.name}: no '**Dashboard:** <dashboard> → <panel>' line"
        for dashboard, panel in named:
            assert (dashboard, panel) in panels, f"{alert.name}: no panel {panel!r} on {dashboard!r}"


@pytest.mark.parametrize(
    ("duration", "factor", "minimum", "scaled"),
    [
        ("10m", 1 / 30, 1, "20s"),
        ("5m", 1 / 30, 1, "10s"),
        ("1m", 1 / 30, 1, "2s"),
        ("0m", 1 / 30, 1, "0s"),
        ("2m", 1 / 300, 1, "1s"),
        ("5m", 1 / 10, 30, "30s"),
        ("1h", 1 / 10, 30, "360s"),
    ],
)
def test_durations_scale_for_the_end_to_end_test(duration: str, factor: float, minimum: int, scaled: str) -> None:
    assert scale_duration(duration, factor, minimum) == scaled


@pytest.mark.parametrize(
    ("duration", "scaled"), [("0m", "0s"), ("1m", "20s"), ("5m", "20s"), ("10m", "20s"), ("15m", "30s")]
)
def test_a_compressed_for_is_at_least_min_for_and_at_most_max_for(duration: str, scaled: str) -> None:
    assert Compression(for_scale=1 / 30, min_for=20, max_for=30).for_(duration) == scaled


def test_the_end_to_end_compression_changes_only_durations_and_the_clock() -> None:
    compression = Compression(for_scale=1 / 30, range_scale=1 / 10, min_range=30, clock_offset=1000)
    production = yaml.safe_load(render.render_rule_files()[render.RULE_FILES["alerting"]])
    compressed = yaml.safe_load(render.render_rule_files(compression)[render.RULE_FILES["alerting"]])
    durations = re.compile(r"\[\d+[smhd]\]|offset \d+[smhd]|\(?time\(\)( - \d+\))?")
    for group, compressed_group in zip(production["groups"], compressed["groups"]):
        for rule, compressed_rule in zip(group["rules"], compressed_group["rules"]):
            assert {**rule, "for": None, "expr": None} == {**compressed_rule, "for": None, "expr": None}
            assert durations.sub("D", rule["expr"]) == durations.sub("D", compressed_rule["expr"])
    by_name = {r["alert"]: r for g in compressed["groups"] for r in g["rules"]}
    assert by_name["LockstepIOStall"]["for"] == "20s"
    assert by_name["LockstepIBSymbolErrors"]["expr"].startswith("increase(lockstep_ib_port_symbol_errors_total[360s])")
    recording = render.render_rule_files(compression)[render.RULE_FILES["recording"]]
    assert "(time() - 1000) - lockstep_checkpoint_last_success_timestamp_seconds" in recording
    assert "rate(lockstep_training_compute_seconds_total[30s])" in recording


@pytest.mark.real
def test_the_alertmanager_configuration_is_valid() -> None:
    """alerts/alertmanager.yml as amtool (Debian prometheus-alertmanager) reads it; what it does
    with the alerts is proven in tests/alerts/test_pages_e2e.py."""
    amtool = "/usr/bin/amtool"
    require_real("amtool (Debian package prometheus-alertmanager)", Path(amtool).exists())
    result = subprocess.run(
        [amtool, "check-config", str(REPO / "alerts" / "alertmanager.yml")], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "6 inhibit rules" in result.stdout and "2 receivers" in result.stdout, result.stdout


def _matches(matcher: str, alertname: str) -> bool:
    """Whether an Alertmanager matcher on alertname (=, =~; anchored as Alertmanager anchors) matches."""
    match = re.fullmatch(r'alertname(=~|=)"(.*)"', matcher.strip())
    assert match, matcher
    operator, value = match.groups()
    return alertname == value if operator == "=" else re.fullmatch(value, alertname) is not None


def test_a_node_that_needs_a_repair_is_one_page_per_node() -> None:
    """Issue 45: the alerts that say a node's hardware needs a repair (thresholds.py
    NODE_REPAIR_ALERTS, each critical) and LockstepNodeNeedsRepair, which fires on any of them, go
    to the pager grouped by node, before the routes that group by job: exactly those alerts."""
    config = yaml.safe_load((REPO / "alerts" / "alertmanager.yml").read_text())
    first = config["route"]["routes"][0]
    assert (first["receiver"], first["group_by"]) == ("lockstep-page", ["cluster", "instance"])
    (matcher,) = first["matchers"]
    routed = {name for name in PRODUCT_ALERTS if _matches(matcher, name)}
    assert routed == {*T.NODE_REPAIR_ALERTS, "LockstepNodeNeedsRepair"}
    severities = {alert.name: alert.severity for alert in rules.alerts()}
    assert {severities[name] for name in routed} == {"critical"}
    (node_alert,) = [alert for alert in rules.alerts() if alert.name == "LockstepNodeNeedsRepair"]
    assert all(name in node_alert.expr for name in T.NODE_REPAIR_ALERTS)


def test_a_lost_gpu_inhibits_its_jobs_hang_alerts() -> None:
    """Issue 35 item 6: LockstepGPUFellOffBus (which carries the job_id of its node's Slurm job)
    inhibits every hang alert of that job, as it does the job's stall: the lost GPU is the page."""
    config = yaml.safe_load((REPO / "alerts" / "alertmanager.yml").read_text())
    inhibited_by_job = set()
    for rule in config["inhibit_rules"]:
        source = rule["source_matchers"]
        if any(_matches(m, "LockstepGPUFellOffBus") for m in source) and rule["equal"] == ["cluster", "job_id"]:
            inhibited_by_job |= {
                name
                for name in PRODUCT_ALERTS
                if all(_matches(m, name) for m in rule["target_matchers"] if m.strip().startswith("alertname"))
            }
    hangs = {"LockstepTrainingStalled", "LockstepNCCLHang", "LockstepTrainingHung", "LockstepNCCLRankStuck"}
    assert hangs - inhibited_by_job == set()
    assert "LockstepGPUFellOffBus" not in inhibited_by_job
    # The hang alerts carry the job_id the inhibition is equal on.
    for alert in rules.alerts():
        if alert.name in hangs:
            assert "job_id" in alert.expr, alert.name


@pytest.mark.real
def test_a_models_own_ttft_slo_replaces_the_default_for_it_alone(tmp_path: Path) -> None:
    """thresholds.py INFERENCE_TTFT_SLO_SECONDS_BY_MODEL: a listed model is held to its own SLO,
    every other model to the default.  Rendered with one override and run by promtool: a p95 of
    3 s breaks the default (2 s) but not the 405B model's 5 s; 6 s breaks both."""
    promtool = require_promtool()
    big = 'meta-llama/Llama-3.1-405B-Instruct"\\'  # quotes and backslashes are escaped, not injected
    expr = above_ttft_slo(2.0, {big: 5.0})
    assert expr == (
        f'{TTFT_P95}{{model!="meta-llama/Llama-3.1-405B-Instruct\\"\\\\"}} > 2\n'
        "or\n"
        f'{TTFT_P95}{{model="meta-llama/Llama-3.1-405B-Instruct\\"\\\\"}} > 5'
    )
    assert ttft_slo_text(2.0, {big: 5.0}) == (
        '{{ if eq $labels.model "meta-llama/Llama-3.1-405B-Instruct\\"\\\\" }}5{{ else }}2{{ end }}'
    )
    assert above_ttft_slo(2.0, {}) == f"{TTFT_P95} > 2"
    (tmp_path / "slo.rules.yml").write_text(
        yaml.safe_dump({"groups": [{"name": "slo", "rules": [{"alert": "SLO", "expr": expr}]}]})
    )
    p95 = TTFT_P95
    series = [
        (f'{p95}{{server="a", model="small"}}', "3x10"),
        (f'{p95}{{server="b", model="meta-llama/Llama-3.1-405B-Instruct\\"\\\\"}}', "3x10"),
        (f'{p95}{{server="c", model="meta-llama/Llama-3.1-405B-Instruct\\"\\\\"}}', "6x10"),
    ]
    test = {
        "rule_files": ["slo.rules.yml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": name, "values": values} for name, values in series],
                "alert_rule_test": [
                    {
                        "eval_time": "5m",
                        "alertname": "SLO",
                        "exp_alerts": [
                            {"exp_labels": {"server": "a", "model": "small"}},
                            {"exp_labels": {"server": "c", "model": big}},
                        ],
                    }
                ],
            }
        ],
    }
    (tmp_path / "slo.test.yml").write_text(yaml.safe_dump(test))
    result = subprocess.run(
        [promtool, "test", "rules", "slo.test.yml"], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert result.returncode == 0, result.stdout + result.stderr
