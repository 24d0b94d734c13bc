"""Issue 35's hangs on a real Prometheus at the workload's own timing: each hang named within 5
minutes of the stop, its twins silent, and the hung job that ended recorded.

One Prometheus (Debian `prometheus`) scrapes one `lockstep demo --speed 10` per scenario (10
simulated seconds per real second), each target labelled cluster=<scenario>.  Every `for:`, range
window and offset of the rules is divided by exactly the same 10 (alerts/compression.py, no
minimum that would stretch a window), Prometheus scrapes and evaluates every 1.5 s (15 simulated
seconds, a production scrape interval) and the collectors run every second (10 simulated): every
window holds what it holds in production, at the scenario's own timing (simulation/timeline.py:
the event at HANG_AT, a minute in).  Unlike tests/alerts/test_alerts_e2e.py, whose windows have a
30 s floor and whose hour-long 'for' are 30 s, a 6-minute save here lasts 6 minutes of the rules'
time.

Only the hang alerts are loaded (with every recording rule): the other alerts are proven on the
same scenarios by test_alerts_e2e.py, and those reading time() (checkpoint age) cannot follow a
clock that runs 10 times as fast.  The collectors are those of the job's evidence.

The time to fire is read in simulated seconds from the demo's start (its clock starts when it
serves) and the alerts API polled every real second (10 simulated seconds): each hang must fire
within 300 simulated seconds of the stop (the job's last step before HANG_AT).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from alerts import render
from alerts.compression import Compression
from alerts.hang import HANG_ALERTS
from lockstep import thresholds as T
from lockstep.simulation.timeline import HANG_AT
from lockstep.simulation.workloads import timeline
from tests.support import LOCKSTEP, free_port, require_real
from tests.support.hang_cases import HANG_CASES
from tests.support.prometheus import PROMETHEUS, is_ready, query_alerts, start_demo, start_prometheus, stop_all

# Tier: a real Prometheus scrapes the real agent (tests/conftest.py).
pytestmark = pytest.mark.e2e

SPEED = 10
COLLECTORS = ("gpu", "slurm", "training", "nccl_inspector", "nccl_ras", "checkpoint")
ALERTS = {alert.name for alert in HANG_ALERTS}
FIRES = HANG_CASES
DEADLINE_SIMULATED = 300  # seconds from the stop (PyTorch's watchdog comes at 600)
OBSERVE = 110  # real seconds: hang-killed's record fires ~12 simulated minutes in
SETTLE = 8


def stop() -> float:
    """The simulated time of the job's last step before the event."""
    return max(end for _, end in timeline("hang-steps", HANG_AT) if end <= HANG_AT)


@dataclass
class Run:
    fired: dict[str, dict[str, tuple[float, dict[str, str]]]] = field(default_factory=dict)  # simulated s
    at_end: list[dict[str, object]] = field(default_factory=list)
    logs: dict[str, Path] = field(default_factory=dict)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    require_real("Prometheus server (Debian package prometheus)", os.access(PROMETHEUS, os.X_OK))
    tmp = tmp_path_factory.mktemp("hangs")
    processes: list = []
    try:
        compression = Compression(for_scale=1 / SPEED, range_scale=1 / SPEED, min_range=1)
        for name, text in render.render_rule_files(compression).items():
            groups = yaml.safe_load(text)["groups"]
            for group in groups:
                group["rules"] = [r for r in group["rules"] if "record" in r or r["alert"] in ALERTS]
            groups = [g for g in groups if g["rules"]]
            (tmp / Path(name).name).write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
        config = tmp / "lockstep.yml"
        config.write_text(
            yaml.safe_dump({"collectors": {c: {"interval": "1s", "deadline": "10s"} for c in COLLECTORS}})
        )
        (tmp / "targets.json").write_text("[]")
        prometheus_config = {
            "global": {"scrape_interval": "1500ms", "scrape_timeout": "1500ms", "evaluation_interval": "1500ms"},
            "rule_files": [str(tmp / Path(name).name) for name in render.RULE_FILES.values()],
            "scrape_configs": [
                {
                    "job_name": T.AGENT_JOB,
                    "file_sd_configs": [{"files": [str(tmp / "targets.json")], "refresh_interval": "1s"}],
                }
            ],
        }
        (tmp / "prometheus.yml").write_text(yaml.safe_dump(prometheus_config))
        url = start_prometheus(tmp, free_port(), processes)
        result = Run(logs={"prometheus": tmp / "prometheus.log"})
        demos = {}
        for scenario in FIRES:
            port = free_port()
            log = tmp / f"demo-{scenario}.log"
            args = [*LOCKSTEP, "demo", "--scenario", scenario, "--speed", str(SPEED), "--config", str(config)]
            args += ["--collector.disable-defaults", *(f"--collector.{c}" for c in COLLECTORS)]
            processes.append(start_demo([*args, "--listen", f"127.0.0.1:{port}"], log))
            demos[scenario] = (f"http://127.0.0.1:{port}/healthz", processes[-1], log, port)
            result.logs[scenario] = log
        # Each demo becomes a target the moment it serves: its simulated clock starts then.
        ready: dict[str, float] = {}
        give_up = time.monotonic() + 120
        while len(ready) < len(demos):
            assert time.monotonic() < give_up, f"not serving after 120 s: {sorted(set(demos) - set(ready))}"
            for scenario, (health, proc, log, _port) in demos.items():
                if scenario not in ready and is_ready(health, proc, log):
                    ready[scenario] = time.monotonic()
                    targets = [
                        {"targets": [f"127.0.0.1:{demos[s][3]}"], "labels": {"cluster": s}} for s in sorted(ready)
                    ]
                    (tmp / "targets.json.tmp").write_text(json.dumps(targets))
                    os.replace(tmp / "targets.json.tmp", tmp / "targets.json")
            time.sleep(0.2)
        until = max(ready.values()) + OBSERVE
        while time.monotonic() < until:
            now = time.monotonic()
            for alert in query_alerts(url):
                cluster = alert["labels"].get("cluster", "")
                if alert["state"] == "firing" and cluster in ready:
                    seen = result.fired.setdefault(cluster, {})
                    seen.setdefault(alert["labels"]["alertname"], ((now - ready[cluster]) * SPEED, alert["labels"]))
            done = all(set(wanted) <= set(result.fired.get(s, {})) for s, wanted in FIRES.items())
            if done and now >= until - OBSERVE + 30 and until > now + SETTLE:
                until = now + SETTLE  # every expected alert fired: a little longer for unexpected ones
            time.sleep(1)
        result.at_end = query_alerts(url)
        yield result
        report(result)
    finally:
        stop_all(processes)


def _describe(run: Run, scenario: str) -> str:
    fired = "\n".join(f"  {name} at {t:.0f} s: {labels}" for name, (t, labels) in run.fired.get(scenario, {}).items())
    tail = run.logs[scenario].read_text()[-1500:] if scenario in run.logs else ""
    return f"fired in {scenario} (simulated s):\n{fired or '  nothing'}\ndemo log tail:\n{tail}"


@pytest.mark.parametrize("scenario", list(FIRES))
def test_each_hang_fires_its_alerts_within_five_minutes_and_the_twins_nothing(run: Run, scenario: str) -> None:
    fired = run.fired.get(scenario, {})
    assert set(fired) == set(FIRES[scenario]), _describe(run, scenario)
    for name, labels in FIRES[scenario].items():
        at, got = fired[name]
        assert {k: got.get(k) for k in labels} == labels, _describe(run, scenario)
        if name != "LockstepJobEndedHung":  # the record comes after the job's end
            assert at - stop() <= DEADLINE_SIMULATED, _describe(run, scenario)
    pending = [a["labels"] for a in run.at_end if a["labels"].get("cluster") == scenario and a["state"] == "pending"]
    assert [p for p in pending if p["alertname"] not in FIRES[scenario]] == [], _describe(run, scenario)


def report(run: Run) -> None:
    """Printed after the module's tests (pytest -s): each alert's time from the stop."""
    for scenario, alerts in run.fired.items():
        for name, (at, _) in alerts.items():
            print(f"hangs-e2e: {scenario}: {name} firing {at - stop():.0f} simulated s after the stop")
