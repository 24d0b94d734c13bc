"""The scale-out path end to end (docs/deploy.md, "Past one Prometheus"): two sharded vmagents
write to VictoriaMetrics and vmalert evaluates the shipped rule files; the same alerts fire there
as on a single Prometheus scraping the same agents, and every dashboard query returns data from
VictoriaMetrics.

A subset of tests/alerts/test_alerts_e2e.py's cases (SCALE_OUT_CASES, one of each kind of rule)
is observed on both paths in the alert cases' run (the conftest's alerts_run,
tests/support/observation.py): the vmagents and the Prometheus scrape the same demos.

Needs the Debian package victoria-metrics (installed by ./dev/test as root); skips without it,
and fails under CI=true.
"""

from __future__ import annotations

import pytest

from tests.support import require_real, scale_out
from tests.support.observation import CASES, SCALE_OUT_CASES, Run, dashboard_problems
from tests.support.queries import checked_in


@pytest.fixture(scope="module")
def run(alerts_run: Run) -> Run:
    """The alert cases' run, which watched SCALE_OUT_CASES on both paths (tests/support/observation.py)."""
    require_real("vmagent, vmalert and victoria-metrics (Debian package victoria-metrics)", scale_out.available())
    return alerts_run


# In-process: the unit tier (no marker; tests/conftest.py), in the quick loop.
def test_the_subset_names_known_cases() -> None:
    assert sorted(set(SCALE_OUT_CASES) - set(CASES)) == []


@pytest.mark.parametrize("name", SCALE_OUT_CASES)
@pytest.mark.e2e
def test_scale_out_fires_the_same_alerts(run: Run, name: str) -> None:
    """Each case fires its alerts and no others on vmalert, as on the single Prometheus, and
    nothing else is pending at the end."""
    assert run.scale_out is not None
    if name not in run.scenarios:
        pytest.skip(f"`lockstep demo --help` does not list scenario {CASES[name].demo!r}")
    wanted = CASES[name].expected
    fired = run.vm_firing(name)
    missing = [e for e in wanted if not any(e.matches(a) for a in fired)]
    unexpected = [a for a in fired if not any(e.matches(a) for e in wanted)]
    description = f"vmalert fired in {name}: {fired}\nPrometheus fired: {run.firing(name)}\n{run.scale_out.logs()}"
    assert (missing, unexpected) == ([], []), description
    assert {a["alertname"] for a in fired} == {a["alertname"] for a in run.firing(name)}, description
    pending = [
        a["labels"]
        for a in run.vm_at_end
        if a["labels"].get("cluster") == name and not any(e.matches(a["labels"]) for e in wanted)
    ]
    assert pending == [], description


@pytest.mark.parametrize("title", sorted(checked_in()))
@pytest.mark.e2e
def test_scale_out_dashboard_queries_return_data(run: Run, title: str) -> None:
    """Grafana pointed at VictoriaMetrics (its Prometheus API): every query and variable works."""
    assert run.scale_out is not None
    assert dashboard_problems(checked_in()[title], run.scale_out.url, run.observed_at) == []
