"""Issue 35's hangs on a real Prometheus at the workload's own timing: each hang named within 5
minutes of the stop, its twins silent, and the hung job that ended recorded.

What is read is the run of the demo scenarios at their own timing (tests/support/report_run.py,
the conftest's report_run, watched once for the reports too): one `lockstep demo --speed 10` per
scenario (10 simulated seconds per real second), each target labelled cluster=<scenario>, every
`for:`, range window and offset of the rules divided by exactly the same 10 (alerts/compression.py,
no minimum that would stretch a window), scrapes and evaluations every 1.5 s (15 simulated
seconds, a production scrape interval), the collectors of the job's evidence every second (10
simulated): every window holds what it holds in production, at the scenario's own timing
(simulation/timeline.py: the event at HANG_AT, a minute in).  Unlike tests/alerts/test_alerts_e2e.py,
whose windows have a 30 s floor and whose hour-long 'for' are 30 s, a 6-minute save here lasts 6
minutes of the rules' time.

Only the hang alerts are judged here: the other alerts are proven on the same scenarios by
test_alerts_e2e.py (and those reading time(), left out of that run's rules, cannot follow a clock
that runs 10 times as fast).  The time to fire is read in simulated seconds from the demo's start
(its clock starts when it serves), the alerts API polled every real second (10 simulated seconds):
each hang must fire within 300 simulated seconds of the stop (the job's last step before HANG_AT).
"""

from __future__ import annotations

import pytest

from alerts.hang import HANG_ALERTS
from lockstep.simulation.timeline import HANG_AT
from lockstep.simulation.workloads import timeline
from tests.support.hang_cases import HANG_CASES
from tests.support.report_run import Run

# Tier: a real Prometheus scrapes the real agent (tests/conftest.py).
pytestmark = pytest.mark.e2e

ALERTS = {alert.name for alert in HANG_ALERTS}
FIRES = HANG_CASES
DEADLINE_SIMULATED = 300  # seconds from the stop (PyTorch's watchdog comes at 600)


def stop() -> float:
    """The simulated time of the job's last step before the event."""
    return max(end for _, end in timeline("hang-steps", HANG_AT) if end <= HANG_AT)


def hang_alerts_fired(run: Run, scenario: str) -> dict[str, tuple[float, dict[str, str]]]:
    return {name: seen for name, seen in run.fired.get(scenario, {}).items() if name in ALERTS}


def _describe(run: Run, scenario: str) -> str:
    fired = "\n".join(f"  {name} at {t:.0f} s: {labels}" for name, (t, labels) in run.fired.get(scenario, {}).items())
    log = run.logs.get(f"demo-{scenario}")
    tail = log.read_text()[-1500:] if log is not None and log.exists() else ""
    return f"fired in {scenario} (simulated s):\n{fired or '  nothing'}\ndemo log tail:\n{tail}"


@pytest.mark.parametrize("scenario", list(FIRES))
def test_each_hang_fires_its_alerts_within_five_minutes_and_the_twins_nothing(report_run: Run, scenario: str) -> None:
    run = report_run
    fired = hang_alerts_fired(run, scenario)
    assert set(fired) == set(FIRES[scenario]), _describe(run, scenario)
    for name, labels in FIRES[scenario].items():
        at, got = fired[name]
        assert {k: got.get(k) for k in labels} == labels, _describe(run, scenario)
        if name != "LockstepJobEndedHung":  # the record comes after the job's end
            assert at - stop() <= DEADLINE_SIMULATED, _describe(run, scenario)
    pending = [a["labels"] for a in run.at_end if a["labels"].get("cluster") == scenario and a["state"] == "pending"]
    assert [p for p in pending if p["alertname"] in ALERTS - set(FIRES[scenario])] == [], _describe(run, scenario)
    # Each alert's time from the stop, for the log (pytest -s or a failure's output).
    for name, (at, _) in fired.items():
        print(f"hangs-e2e: {scenario}: {name} firing {at - stop():.0f} simulated s after the stop")
