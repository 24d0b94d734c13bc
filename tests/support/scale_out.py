"""The scale-out path for the end-to-end test: sharded vmagents scrape the agents and write to
VictoriaMetrics, and vmalert evaluates the rule files against it (Debian package
victoria-metrics; docs/deploy.md, "Past one Prometheus").

The vmagents run the shipped deploy/victoriametrics/vmagent.yml with two changes: the targets
file, and the scrape interval of the single Prometheus it is compared with.  vmalert gets the
same rule files as that Prometheus, with the flags docs/deploy.md gives.

vmalert starts only once VictoriaMetrics holds WARMUP seconds of samples.  MetricsQL's increase()
and rate() count a counter from 0 when its series has no sample before the window and its
first value is small (VictoriaMetrics' rollup heuristics), so on series younger than a window a
counter that was already 2 reads as an increase of 2: in this test every series is new, and
lockstep_pfc_pause_storm_events_total{level="warning"} (2 since boot on the simulated NIC) would
fire LockstepPFCStorm everywhere.  A fleet meets this only for a node's first window after it
joins (docs/deploy.md).  60 s is the longest compressed window over such a counter ([10m]).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import yaml

from tests.support import REPO, http_get, wait_until
from tests.support.prometheus import stop_all

BINARIES = {name: f"/usr/bin/{name}" for name in ("victoria-metrics", "vmagent", "vmalert")}
VMAGENT_CONFIG = REPO / "deploy" / "victoriametrics" / "vmagent.yml"
SHARDS = 2
WARMUP = 65.0
# Seconds after vmalert starts for its alerts to fire.  Its recording rules hold nothing from
# before it started, so an alert over a recorded series' history waits for that history: the
# straggler's 15 minutes of evidence (90 s here) fired 146 s after vmalert started, in the run
# where the Prometheus beside it fired it at 124 s into the run (2026-11-29).
RULES_DEADLINE = 180.0


def available() -> bool:
    return all(os.access(path, os.X_OK) for path in BINARIES.values())


class ScaleOut:
    def __init__(  # type: ignore[no-untyped-def]
        self, tmp: Path, targets: list[dict[str, Any]], rule_files: list[Path], scrape: str, evaluation: str, ports
    ) -> None:
        """scrape, evaluation: the intervals of the Prometheus it is compared with; ports: a
        function returning a free port never handed out before."""
        self.processes: list[tuple[subprocess.Popen[bytes], Path]] = []
        self.tmp = tmp
        vm_port, self.alert_port, self.nobody = ports(), ports(), ports()
        self.rule_files = rule_files
        self.evaluation = evaluation
        self.rules_started: float | None = None  # time.monotonic() when vmalert started
        self.url = f"http://127.0.0.1:{vm_port}"
        self.vmalert = f"http://127.0.0.1:{self.alert_port}"
        (tmp / "targets").mkdir()
        (tmp / "targets" / "agents.json").write_text(json.dumps(targets))
        config = yaml.safe_load(VMAGENT_CONFIG.read_text())
        config["global"] = {"scrape_interval": scrape, "scrape_timeout": scrape}
        config["scrape_configs"][0]["file_sd_configs"] = [{"files": [str(tmp / "targets" / "*.json")]}]
        (tmp / "vmagent.yml").write_text(yaml.safe_dump(config))
        # Queries see samples up to 1 s old (default 30 s): the test's windows are 30 s long.
        self._start(
            "victoria-metrics",
            f"-storageDataPath={tmp / 'vm-data'}",
            f"-httpListenAddr=127.0.0.1:{vm_port}",
            "-retentionPeriod=1d",
            "-search.latencyOffset=1s",
            "-search.disableCache",
        )
        wait_until(lambda: self._ready(f"{self.url}/health"), timeout=60, what="victoria-metrics")
        for member in range(SHARDS):
            self._start(
                "vmagent",
                f"-promscrape.config={tmp / 'vmagent.yml'}",
                f"-promscrape.cluster.membersCount={SHARDS}",
                f"-promscrape.cluster.memberNum={member}",
                f"-remoteWrite.url={self.url}/api/v1/write",
                f"-remoteWrite.tmpDataPath={tmp / f'vmagent-{member}'}",
                "-remoteWrite.flushInterval=1s",
                f"-httpListenAddr=127.0.0.1:{ports()}",
                name=f"vmagent-{member}",
            )

    def start_rules(self) -> None:
        """Start vmalert on the rule files (after WARMUP seconds of data, see above)."""
        rule_files, interval = self.rule_files, self.evaluation
        self._start(
            "vmalert",
            *(f"-rule={path}" for path in rule_files),
            f"-datasource.url={self.url}",
            f"-remoteWrite.url={self.url}",
            f"-remoteRead.url={self.url}",
            f"-evaluationInterval={interval}",
            # No Alertmanager here: the test reads vmalert's own alerts API.
            f"-notifier.url=http://127.0.0.1:{self.nobody}",
            f"-httpListenAddr=127.0.0.1:{self.alert_port}",
        )
        wait_until(lambda: self._ready(f"{self.vmalert}/health"), timeout=60, what="vmalert")
        self.rules_started = time.monotonic()

    def _start(self, binary: str, *args: str, name: str | None = None) -> None:
        log = self.tmp / f"{name or binary}.log"
        with open(log, "wb") as out:
            process = subprocess.Popen(
                [BINARIES[binary], "-loggerLevel=ERROR", *args], stdout=out, stderr=subprocess.STDOUT
            )
        self.processes.append((process, log))

    def _ready(self, url: str) -> bool:
        for process, log in self.processes:
            if process.poll() is not None:
                raise AssertionError(f"{process.args[0]} exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        try:
            return http_get(url, timeout=1)[0] == 200
        except OSError:
            return False

    def alerts(self, tries: int = 1) -> list[dict[str, Any]] | None:
        """Every alert vmalert holds (pending and firing), as Prometheus' alerts API gives them;
        None when vmalert did not answer within 10 s, tries times (on a loaded machine it can be
        that late: a poll of the alerts missed, not an alert)."""
        if self.rules_started is None:
            return []
        for _ in range(tries):
            try:
                status, body = http_get(f"{self.vmalert}/api/v1/alerts", timeout=10)
            except OSError:  # timed out (TimeoutError), or the connection refused or reset
                continue
            assert status == 200, body
            return json.loads(body)["data"]["alerts"] or []  # vmalert 1.79 says null for none
        return None

    def stop_writers(self) -> None:
        """Stop the vmagents and vmalert; VictoriaMetrics keeps serving what they wrote."""
        stop_all([process for process, _ in self.processes[1:]])  # victoria-metrics is started first
        del self.processes[1:]

    def logs(self) -> str:
        return "\n".join(f"--- {log.name}\n{log.read_text()[-1500:]}" for _, log in self.processes)

    def stop(self) -> None:
        stop_all([process for process, _ in self.processes])
