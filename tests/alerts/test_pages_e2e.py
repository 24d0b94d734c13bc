"""From page to cause, end to end: the sustained straggler detector on a real Prometheus, the
suspect each straggler alert names, and the notifications a real Alertmanager sends per fault.

One Prometheus (Debian `prometheus`) and one Alertmanager (Debian `prometheus-alertmanager`),
started here on free ports with temporary storage, and one `lockstep demo --speed 60` per case
(an hour of simulated time in a minute; faults there from the start at speed 1), each target
labelled cluster=<case>:

- healthy: job 4242 with per-step jitter, per-rank bias, evaluation passes and checkpoint
  pauses (simulation/workloads.py);
- slow-rank: 25 simulated minutes in, rank 3 turns 10 % slower with nothing else wrong;
- slow-rank-skewed: the same, but rank 7 starts its steps last and is the one the others wait for;
- straggler-thermal, -pfc, -data, -nfs: the same, caused by a thermal throttle on its GPU, a PFC
  storm on its NIC, a starved data loader, a hung NFS mount;
- gpu-lost: GPU 5 falls off the bus and job 4242 stalls;
- leaf-switch: four demos of leaf-switch-down (a port down on every node behind a dead leaf
  switch), only the InfiniBand collector enabled.

The whole run takes about a minute and a half.  LOCKSTEP_E2E_SHORT=1 keeps only gpu-lost and
leaf-switch, at speed 1 (grouping and inhibition in 30 s or so), for a machine too busy for 60x
(see LONG below).

The rules are rendered with every `for:` and range window divided by the speed (alerts/compression.py
Compression), so their durations are simulated time.  The Alertmanager runs the shipped
alerts/alertmanager.yml with its receivers pointed at a webhook server in this test and its
timers shortened.  While the run lasts the test keeps every alert seen firing in Prometheus
(with the simulated time it fired at) and every notification the webhook receives.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from alerts import render
from alerts.compression import Compression
from lockstep.simulation.timeline import SLOW_ONSET
from lockstep.simulation.workloads import DEMO_EPOCH
from tests.support import REPO, free_port, http_get, require_real, wait_until
from tests.support.page_cases import ALL_CASES, SLOWER, SPEED, SUSTAINED
from tests.support.prometheus import PROMETHEUS, Stack, is_ready, query_alerts, start_logged, stop_all

ALERTMANAGER = "/usr/bin/prometheus-alertmanager"
# The cases at SPEED (an hour of simulated time) need a machine that is not saturated: a demo a
# few seconds late is minutes of simulated time late.  They pass on an idle 2-core machine (CI)
# and on a loaded one with the test at `nice -n -10`.  LOCKSTEP_E2E_SHORT=1 leaves them out (the
# detection times and suspects are then proven by promtool on alerts/tests/stragglers.test.yml
# alone) and keeps the speed-1 cases (Alertmanager grouping and inhibition).
LONG = os.environ.get("LOCKSTEP_E2E_SHORT") != "1"
DETECTION_LIMIT = 35 * 60  # simulated seconds from the onset within which the sustained alert must fire
DEADLINE = 150  # real seconds for every expected alert to fire
SETTLE = 8  # real seconds to go on once all fired and were notified, for late alerts and notifications

# What the suspects are made from.  The filesystem collector runs only where a mount hangs: on a
# loaded machine its 1 s statfs deadline (the simulated node's) can pass on a healthy mount.
# Left out of this run's rules: on a loaded machine a scrape or a collector round can be a few
# seconds late, which at 60x is minutes of simulated time.  tests/alerts/test_alerts_e2e.py proves them.
AGENT_HEALTH = ("LockstepAgentDown", "LockstepCollectorFailing")

CASES = {name: case for name, case in ALL_CASES.items() if LONG or case.speed == 1}


class Webhook:
    """Alertmanager's webhook receiver: keeps every notification (its JSON body) it is sent."""

    def __init__(self) -> None:
        self.notifications: list[dict[str, Any]] = []
        received = self.notifications

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers["Content-Length"]))
                received.append({"path": self.path, **json.loads(body)})
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


@dataclass
class Run:
    prometheus: str
    # cluster -> alertname -> (seconds after the start, simulated time it fired at, annotations)
    fired: dict[str, dict[str, tuple[float, float | None, dict[str, str]]]] = field(default_factory=dict)
    first_sample: dict[str, float] = field(default_factory=dict)  # cluster -> simulated time of the first scrape
    notifications: list[dict[str, Any]] = field(default_factory=list)
    duration: float = 0.0

    def query(self, expr: str) -> list[dict[str, Any]]:
        import urllib.parse

        status, body = http_get(f"{self.prometheus}/api/v1/query?" + urllib.parse.urlencode({"query": expr}), 30)
        assert status == 200, body
        return json.loads(body)["data"]["result"]

    def simulated_now(self, cluster: str) -> float | None:
        """The simulated time (seconds since the demo's t=0) of the cluster's last training step.

        Read over the last 15 s, not at the instant: a scrape that fails (late on a loaded machine)
        marks the demo's series stale, and an instant query then finds none while its alerts, read
        over ranges, go on firing (CI once found no simulated time at the sustained alert's firing)."""
        series = f'lockstep_training_last_step_timestamp_seconds{{cluster="{cluster}"}}'
        result = self.query(f"max(last_over_time({series}[15s]))")
        return float(result[0]["value"][1]) - DEMO_EPOCH if result else None

    def groups(self, cluster: str) -> dict[tuple[str, str], list[dict[str, Any]]]:
        """The cluster's notification groups: (receiver, group key) -> its notifications in order."""
        found: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for notification in self.notifications:
            if notification["groupLabels"].get("cluster") == cluster:
                found.setdefault((notification["receiver"], notification["groupKey"]), []).append(notification)
        return found


def _alertmanager_config(webhook: str) -> dict[str, Any]:
    """The shipped configuration, receivers pointed at the test's webhook and timers shortened."""
    config = yaml.safe_load((REPO / "alerts" / "alertmanager.yml").read_text())
    for receiver in config["receivers"]:
        receiver["webhook_configs"] = [{"url": f"{webhook}/{receiver['name']}", "send_resolved": False}]
    config["route"].update({"group_wait": "3s", "group_interval": "3s", "repeat_interval": "1h"})
    return config


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    require_real("Prometheus server (Debian package prometheus)", os.access(PROMETHEUS, os.X_OK))
    require_real("Alertmanager (Debian package prometheus-alertmanager)", os.access(ALERTMANAGER, os.X_OK))
    tmp = tmp_path_factory.mktemp("pages")
    processes = []
    stack: Stack | None = None
    webhook = Webhook()
    try:
        alertmanager_port = free_port()
        (tmp / "alertmanager.yml").write_text(yaml.safe_dump(_alertmanager_config(webhook.url)))
        am_log = tmp / "alertmanager.log"
        processes.append(
            start_logged(
                [
                    ALERTMANAGER,
                    f"--config.file={tmp / 'alertmanager.yml'}",
                    f"--storage.path={tmp / 'am-data'}",
                    f"--web.listen-address=127.0.0.1:{alertmanager_port}",
                    "--cluster.listen-address=",  # no gossip port: a single instance
                    "--log.level=warn",
                ],
                am_log,
            )
        )
        # Durations are simulated: divide them by the speed.
        # Scrapes every 3 s (a loaded machine answers a 1 s scrape timeout late): windows of at least 9 s.
        compression = Compression(for_scale=1 / SPEED, range_scale=1 / SPEED, min_range=9)
        rule_files = {}
        for name, text in render.render_rule_files(compression).items():
            groups = yaml.safe_load(text)["groups"]
            for group in groups:
                group["rules"] = [r for r in group["rules"] if r.get("alert") not in AGENT_HEALTH]
            rule_files[Path(name).name] = yaml.safe_dump({"groups": groups}, sort_keys=False)
        # Prometheus first, so it scrapes each demo from (nearly) its simulated start.
        stack = Stack(
            tmp,
            rule_files,
            scrape_interval="3s",
            evaluation_interval="1s",
            alertmanager=alertmanager_port,
        )
        url = stack.url
        am = f"http://127.0.0.1:{alertmanager_port}/-/ready"
        wait_until(lambda: is_ready(am, processes[0], am_log), timeout=60, what="Alertmanager")
        demos = {}
        for name, case in CASES.items():
            config = tmp / f"lockstep-{name}.yml"
            config.write_text(
                yaml.safe_dump(
                    # A generous deadline: a loaded machine must not make a collector "stuck".
                    {"collectors": {c: {"interval": "2s", "deadline": "10s"} for c in case.collectors}},
                )
            )
            args = ["--scenario", case.scenario, "--speed", str(case.speed), "--config", str(config)]
            args += ["--collector.disable-defaults", *(f"--collector.{c}" for c in case.collectors)]
            for index in range(case.nodes):
                demos[f"{name}-{index}"] = (name, args)
        # Their simulated clocks start once they serve: a slow start costs no simulated time.  Each
        # is a target from before it serves (the agent's health alerts are left out of this run).
        stack.start_demos(demos, register="before", give_up=180)

        result = Run(url)
        began = time.monotonic()
        deadline = began + DEADLINE
        settle_until: float | None = None
        while time.monotonic() < deadline:
            now = time.monotonic()
            for alert in query_alerts(url):
                if alert["state"] != "firing":
                    continue
                cluster, name = alert["labels"].get("cluster", ""), alert["labels"]["alertname"]
                if name not in result.fired.setdefault(cluster, {}):
                    simulated = result.simulated_now(cluster) if name in (SUSTAINED, SLOWER) else None
                    result.fired[cluster][name] = (round(now - began, 1), simulated, alert["annotations"])
            for cluster in CASES:
                if cluster not in result.first_sample and (t := result.simulated_now(cluster)) is not None:
                    result.first_sample[cluster] = t
            all_fired = all(set(case.fires) <= set(result.fired.get(name, {})) for name, case in CASES.items())
            # Settle once every case that notifies has been notified: the last alert's way to the
            # webhook (Prometheus' next send, group_wait) is longer than SETTLE on a busy machine.
            notified = {n["groupLabels"].get("cluster") for n in list(webhook.notifications)}
            all_notified = all(name in notified for name, case in CASES.items() if case.notified is not None)
            if all_fired and all_notified and settle_until is None:
                settle_until = now + SETTLE
            if settle_until is not None and now >= settle_until:
                break
            time.sleep(1)
        result.notifications = list(webhook.notifications)
        result.duration = time.monotonic() - began
        yield result
        report(result)
    finally:
        if stack is not None:
            stack.stop()
        stop_all(processes)
        webhook.close()


def _describe(run: Run, cluster: str) -> str:
    fired = "\n".join(f"  {name}: {seen}" for name, seen in run.fired.get(cluster, {}).items())
    groups = "\n".join(
        f"  {key[0]} {key[1]}: {[sorted(a['labels']['alertname'] for a in n['alerts']) for n in sent]}"
        for key, sent in run.groups(cluster).items()
    )
    return f"fired in {cluster}:\n{fired or '  nothing'}\nnotification groups:\n{groups or '  none'}"


@pytest.mark.parametrize("cluster", list(CASES))
@pytest.mark.e2e
def test_each_case_fires_its_alerts_naming_the_suspect_and_no_others(run: Run, cluster: str) -> None:
    fired = run.fired.get(cluster, {})
    assert set(fired) == set(CASES[cluster].fires), _describe(run, cluster)
    for name, suspects in CASES[cluster].fires.items():
        if suspects is not None:
            assert fired[name][2]["suspects"] == suspects, _describe(run, cluster)


@pytest.mark.skipif(not LONG, reason="LOCKSTEP_E2E_SHORT=1 leaves out the hour of simulated time at 60x")
@pytest.mark.e2e
def test_a_ten_percent_straggler_is_caught_within_35_simulated_minutes(run: Run) -> None:
    """The 1.25x alert (LockstepTrainingStraggler) stays silent meanwhile (the case test: nothing
    else fired).  Prometheus must have scraped at least 15 minutes of healthy history before the
    onset: a 10 % straggler's 30-minute mean crosses the 5 % margin when half the window is slow,
    15 minutes in, and from then on the window holds what it would in production."""
    assert run.first_sample["slow-rank"] <= SLOW_ONSET - 15 * 60, run.first_sample
    seconds, simulated, _ = run.fired["slow-rank"][SUSTAINED]
    assert simulated is not None, f"slow-rank served no training step in the 15 s before {SUSTAINED} fired"
    assert 0 < simulated - SLOW_ONSET <= DETECTION_LIMIT, (simulated, seconds)


@pytest.mark.skipif(not LONG, reason="LOCKSTEP_E2E_SHORT=1 leaves out the hour of simulated time at 60x")
@pytest.mark.e2e
def test_a_slow_rank_nothing_waits_for_is_named_slower_than_its_peers_and_holds_no_one_back(run: Run) -> None:
    """Issue 44's second verdict: in slow-rank-skewed rank 7 starts its steps last and arrives last
    at every all-reduce (the witness names it, not rank 3), so LockstepTrainingStragglerSustained
    stays silent (the case test: nothing else fired) and LockstepTrainingSlowerThanPeers names rank
    3 within the same 35 simulated minutes."""
    seconds, simulated, _ = run.fired["slow-rank-skewed"][SLOWER]
    assert simulated is not None, f"slow-rank-skewed served no training step in the 15 s before {SLOWER} fired"
    assert 0 < simulated - SLOW_ONSET <= DETECTION_LIMIT, (simulated, seconds)
    last = run.query('job_rank:lockstep_training_last_to_arrive:bool5m{cluster="slow-rank-skewed"} == 1')
    assert [r["metric"]["rank"] for r in last] == ["7"]
    (named,) = run.query(f'ALERTS{{cluster="slow-rank-skewed", alertname="{SLOWER}", alertstate="firing"}}')
    assert named["metric"]["rank"] == "3"


@pytest.mark.parametrize("cluster", list(CASES))
@pytest.mark.e2e
def test_one_notification_group_per_fault(run: Run, cluster: str) -> None:
    """Every case is one fault: it notifies one group (or nothing), holding only the root cause's
    alerts; what the root cause explains is inhibited."""
    groups = run.groups(cluster)
    expected = CASES[cluster].notified
    if expected is None:
        assert groups == {}, _describe(run, cluster)
        return
    assert len(groups) == 1, _describe(run, cluster)
    (receiver, _), sent = next(iter(groups.items()))
    alertnames = {alert["labels"]["alertname"] for notification in sent for alert in notification["alerts"]}
    assert (receiver, alertnames) == expected, _describe(run, cluster)
    if cluster == "leaf-switch":  # the four nodes' port-down alerts in the one notification
        instances = {alert["labels"]["instance"] for alert in sent[-1]["alerts"]}
        assert len(instances) == CASES[cluster].nodes, _describe(run, cluster)


def report(run: Run) -> None:
    """Printed after the module's tests (a report, not a test: the checks are the tests above):
    detection times and notification counts (pytest -s shows them)."""
    for cluster, alerts in run.fired.items():
        for name, (seconds, simulated, notes) in alerts.items():
            at = f", {(simulated - SLOW_ONSET) / 60:.1f} simulated min after the onset" if simulated else ""
            print(f"pages-e2e: {cluster}: {name} firing after {seconds} s{at}; suspects: {notes.get('suspects')}")
        groups = run.groups(cluster)
        sent = sum(map(len, groups.values()))
        print(f"pages-e2e: {cluster}: {len(groups)} notification group(s), {sent} notification(s)")
    print(f"pages-e2e: first scraped simulated time per case: {run.first_sample}; observed {run.duration:.0f} s")
    if os.environ.get("PAGES_DEBUG"):
        for expr in (
            'job_rank:lockstep_training_work_seconds:ratio_to_median30m{cluster="slow-rank"}',
            'job_rank:lockstep_training_work_seconds:ratio_to_median5m{cluster="slow-rank"}',
            'job:lockstep_training_work_seconds:mad30m{cluster="slow-rank"}',
            'job:lockstep_training_work_seconds:median30m{cluster="slow-rank"}',
            'job:lockstep_training_ranks:count{cluster="slow-rank"}',
            'instance:lockstep_host:info{cluster="slow-rank"}',
            'ALERTS{cluster="slow-rank"}',
        ):
            print(expr, [(r["metric"].get("rank"), r["value"][1]) for r in run.query(expr)])


@pytest.mark.parametrize("speed", ["0", "fast"])
@pytest.mark.real
def test_a_bad_demo_speed_is_a_clear_error(speed: str) -> None:
    from tests.support import lockstep

    result = lockstep("demo", "--speed", speed, "--once")
    assert result.returncode == 2
    assert f"argument --speed: expected a number of simulated seconds per second, 0 < speed <= 1000, got '{speed}'" in (
        result.stderr
    )
