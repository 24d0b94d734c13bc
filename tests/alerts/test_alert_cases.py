"""The end-to-end alert run's table of cases (tests/support/observation.py CASES), checked without
running it: every alert of the rule files is expected by some case (or proven elsewhere), and
every scenario of the simulated node is a case of one of the end-to-end runs.  So an alert or a
scenario added without its case fails the unit tier, not only the full suite's
tests/alerts/test_alerts_e2e.py (which checks that each case fires exactly what it expects)."""

from __future__ import annotations

from lockstep.simulation import scenarios
from tests.support.hang_cases import HANG_CASES
from tests.support.observation import CASES, PROVEN_ELSEWHERE, rule_file_alerts
from tests.support.page_cases import ALL_CASES as PAGE_CASES


def test_every_alert_in_the_rule_files_is_expected_by_some_case() -> None:
    """An alert no simulated fault fires is proven only on hand-written series: add a scenario
    that produces its fault and a case expecting it (docs/development.md, "Adding an alert")."""
    expected = {e.alertname for c in CASES.values() for e in c.expected}
    assert sorted(rule_file_alerts() - expected - set(PROVEN_ELSEWHERE)) == []
    assert sorted(set(PROVEN_ELSEWHERE) - rule_file_alerts()) == []


def test_every_demo_scenario_is_a_case() -> None:
    """A scenario of the simulated node says what it fires (or that it fires nothing) in one of
    the end-to-end runs: test_alerts_e2e.py's CASES, test_pages_e2e.py's or test_hangs_e2e.py's."""
    page_scenarios = {c.scenario for c in PAGE_CASES.values()}
    cases = {c.demo for c in CASES.values()} | page_scenarios | set(HANG_CASES)
    assert sorted(set(scenarios()) - cases) == []
