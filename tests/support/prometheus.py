"""A real Prometheus (Debian `prometheus`) for the end-to-end tests: start it on a config, wait
until it is ready, read its alerts, stop everything a test started; backfill its storage from
OpenMetrics text with promtool.  Stack, below, is the one harness of the tests that watch demos
on a real Prometheus: the Prometheus, the demos as its targets, in one order."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import yaml

from lockstep import thresholds as T
from tests.support import LOCKSTEP, REPO, free_port, http_get, require_promtool, wait_until

PROMETHEUS = "/usr/bin/prometheus"


def query_alerts(prometheus: str) -> list[dict[str, Any]]:
    status, body = http_get(f"{prometheus}/api/v1/alerts", timeout=10)
    assert status == 200, body
    return json.loads(body)["data"]["alerts"]


def backfill(openmetrics: Path, tsdb: Path) -> None:
    """`promtool tsdb create-blocks-from openmetrics`: the samples of the file (each series in
    time order) become blocks under tsdb, which start_prometheus then serves (tmp/tsdb)."""
    result = subprocess.run(
        [require_promtool(), "tsdb", "create-blocks-from", "openmetrics", "--quiet", str(openmetrics), str(tsdb)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, f"promtool could not backfill {openmetrics}: {result.stderr[-3000:]}"


def start_logged(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)


# The demos run at a lower priority than Prometheus and the test watching them: Prometheus is the
# instrument, not what is tested.  Starved beside 35 demos starting on 2 cores, its own
# scrape_duration_seconds read up to 29 s for scrapes whose timeout is 5 s (the TSDB of a failed
# full run at f22eba9), so a first scrape's up 0 stood for 24 s before the next was written, and
# LockstepAgentDown (5m, 20 s compressed) fired for agents that answered.  `nice` execs the demo:
# the process started is the demo itself.
DEMO_PRIORITY = ["nice", "-n", "5"]


def start_demo(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    """Start a demo (`lockstep demo ...`) at DEMO_PRIORITY, its output to log."""
    return start_logged([*DEMO_PRIORITY, *args], log)


def start_prometheus(
    tmp: Path, port: int, processes: list[subprocess.Popen[bytes]], extra_args: tuple[str, ...] = ()
) -> str:
    """Start Prometheus on tmp/prometheus.yml (storage tmp/tsdb, log tmp/prometheus.log), add it
    to processes, and return its URL once it is ready."""
    log = tmp / "prometheus.log"
    prometheus = start_logged(
        [
            PROMETHEUS,
            f"--config.file={tmp / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
            *extra_args,
        ],
        log,
    )
    processes.append(prometheus)
    url = f"http://127.0.0.1:{port}"
    wait_until(lambda: is_ready(f"{url}/-/ready", prometheus, log), timeout=60, what="Prometheus")
    return url


def stop_all(processes: list[subprocess.Popen[bytes]]) -> None:
    """Terminate every process, then wait for each (killing one that does not exit in 15 s)."""
    for proc in processes:
        proc.terminate()
    for proc in processes:
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def is_ready(url: str, proc: subprocess.Popen[bytes], log: Path) -> bool:
    if proc.poll() is not None:
        raise AssertionError(f"{proc.args} exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
    try:
        return http_get(url, timeout=1)[0] == 200
    except OSError:
        return False


class Stack:
    """The end-to-end tests' one harness: a real Prometheus scraping `lockstep demo` targets, each
    labelled cluster=<name>, found through one file per target (file_sd, read every second), with
    the rule files given; what it starts is stopped by stop() (Alertmanager too, if added).

    start_demos() starts the demos and waits until each serves (its simulated clock starts then).
    Each demo is a target from before it serves (register="before"): its first scrape then comes
    0.3-1.4 s after it serves, where a target added once it served had its first 3.1-4.7 s after
    (Prometheus passes discovered targets on every 5 s), and a demo whose story begins in its
    first seconds lost them (hang-steps' last steps: CI at f966419, 41029e6).  A run that loads
    LockstepAgentDown adds each once it serves (register="serving"): a target not serving yet
    is a down agent to that alert, so it is added once it answered a scrape."""

    def __init__(
        self,
        tmp: Path,
        rule_files: dict[str, str],
        *,
        scrape_interval: str,
        evaluation_interval: str,
        prometheus_args: tuple[str, ...] = (),
        alertmanager: int | None = None,
    ) -> None:
        """rule_files: file name -> its text; alertmanager: the port (on 127.0.0.1) of the
        Alertmanager Prometheus sends to, started by the caller."""
        self.tmp = tmp
        self.processes: list[subprocess.Popen[bytes]] = []
        self.ports: set[int] = {alertmanager} if alertmanager is not None else set()
        self.targets: dict[str, dict[str, Any]] = {}  # file stem -> target, as registered
        self.ready: dict[str, float] = {}  # demo -> time.monotonic() when it served
        self.logs: dict[str, Path] = {"prometheus": tmp / "prometheus.log"}
        (tmp / "targets").mkdir()
        for name, text in rule_files.items():
            (tmp / name).write_text(text)
        config: dict[str, Any] = {
            "global": {
                "scrape_interval": scrape_interval,
                "scrape_timeout": scrape_interval,
                "evaluation_interval": evaluation_interval,
            },
            "rule_files": [str(tmp / name) for name in rule_files],
            "scrape_configs": [
                {
                    "job_name": T.AGENT_JOB,
                    "file_sd_configs": [{"files": [str(tmp / "targets" / "*.json")], "refresh_interval": "1s"}],
                }
            ],
        }
        if alertmanager is not None:
            alertmanagers = [{"static_configs": [{"targets": [f"127.0.0.1:{alertmanager}"]}]}]
            config["alerting"] = {"alertmanagers": alertmanagers}
        (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.url = start_prometheus(tmp, self.port(), self.processes, prometheus_args)
        self.prometheus = self.processes[0]

    def port(self) -> int:
        """A free port never handed out before (a demo binds its port only once started)."""
        port = free_port()
        while port in self.ports:
            port = free_port()
        self.ports.add(port)
        return port

    def register(self, name: str, target: dict[str, Any]) -> None:
        """One target's file, written whole (never half-written: Prometheus' glob matches a
        staged .name.json beside it too, and read it half-written)."""
        staged = self.tmp / f".target-{name}.json"  # outside the directory Prometheus reads
        staged.write_text(json.dumps([target]))
        staged.rename(self.tmp / "targets" / f"{name}.json")
        self.targets[name] = target

    def absent(self, name: str, cluster: str) -> None:
        """A target nobody listens on (an agent that is not there)."""
        self.register(name, {"targets": [f"127.0.0.1:{self.port()}"], "labels": {"cluster": cluster}})

    def start_demos(
        self,
        demos: dict[str, tuple[str, list[str]]],
        *,
        register: str = "before",
        at_once: int | None = None,
        give_up: float = 300,
    ) -> dict[str, float]:
        """Start `lockstep demo ARGS --listen PORT` for each name -> (cluster, ARGS), at most
        at_once starting at a time (None: all at once), and wait until every one serves.
        Returns (and keeps in .ready) when each served, by time.monotonic()."""
        assert register in ("before", "serving"), register
        waiting = list(demos.items())
        starting: dict[str, tuple[str, subprocess.Popen[bytes], Path, dict[str, Any]]] = {}
        deadline = time.monotonic() + give_up
        while waiting or starting:
            while waiting and (at_once is None or len(starting) < at_once):
                name, (cluster, args) = waiting.pop(0)
                port = self.port()
                target = {"targets": [f"127.0.0.1:{port}"], "labels": {"cluster": cluster}}
                if register == "before":
                    self.register(name, target)
                log = self.tmp / f"demo-{name}.log"
                proc = start_demo([*LOCKSTEP, "demo", *args, "--listen", f"127.0.0.1:{port}"], log)
                self.processes.append(proc)
                self.logs[f"demo-{name}"] = log
                starting[name] = (f"http://127.0.0.1:{port}/healthz", proc, log, target)
            for name, (health, proc, log, target) in list(starting.items()):
                if is_ready(health, proc, log):
                    self.ready[name] = time.monotonic()
                    if register == "serving":
                        # Once it has answered one scrape here: its first rounds (every collector
                        # at once) are done.  Registered at /healthz alone, the last of 35 demos
                        # to start, starved beside the others, timed out Prometheus' first two
                        # scrapes and read as down (2 or 3 cases in each of five runs).
                        http_get(health.removesuffix("/healthz") + "/metrics", timeout=60)
                        self.register(name, target)
                    del starting[name]
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"demos not serving after {give_up:.0f} s: {sorted(starting) + [w[0] for w in waiting]}"
                )
            time.sleep(0.2)
        return {name: self.ready[name] for name in demos}

    def alerts(self) -> list[dict[str, Any]]:
        return query_alerts(self.url)

    def stop_demos(self) -> None:
        """Stop every process but Prometheus (and whatever was started before it), and Prometheus'
        rules: what the tests read from here on is stored (the alerts seen, the data up to the
        stop).  Left evaluating, the alerts' run's compressed rules took 40 % of a core every 2 s
        for the 12 minutes of the suite after it (a session's run lives until the session ends),
        beside the runs that came after it."""
        first = self.processes.index(self.prometheus) + 1
        stop_all(self.processes[first:])
        del self.processes[first:]
        self.unload_rules()

    def unload_rules(self) -> None:
        """Prometheus' configuration reloaded without its rule files (SIGHUP), once it says so:
        its stored data stays queryable, nothing more is evaluated."""
        config = yaml.safe_load((self.tmp / "prometheus.yml").read_text())
        if not config.get("rule_files"):
            return
        config["rule_files"] = []
        staged = self.tmp / ".prometheus.yml"
        staged.write_text(yaml.safe_dump(config))
        staged.rename(self.tmp / "prometheus.yml")
        self.prometheus.send_signal(signal.SIGHUP)

        def unloaded() -> bool:
            status, body = http_get(f"{self.url}/api/v1/rules", timeout=10)
            return status == 200 and json.loads(body)["data"]["groups"] == []

        wait_until(unloaded, timeout=30, what="Prometheus without its rules")

    def stop(self) -> None:
        stop_all(self.processes)
        self.processes.clear()
