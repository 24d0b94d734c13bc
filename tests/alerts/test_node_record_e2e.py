"""A node's record across jobs on a real Prometheus (alerts/nodes.py): a week of a 64-node fleet's
alert history, backfilled into its TSDB with promtool, then the shipped rule files evaluated on it.

The history is the ALERTS series Prometheus itself keeps for firing alerts, written as it writes
them (one sample an evaluation while an alert fires, its labels and alertname, alertstate), over
the last 6.5 days: two lemons (n07 hurt four jobs, named by several alerts in one of them; n42
three), n13 two jobs (below the threshold), ten nodes one job each, n20 a port down all week
(no job), n33 a straggler whose series has no job id, n51 a hang still pending.  The alert must
name exactly the two lemons with their jobs, and the record count every node as said.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.parse
from collections.abc import Iterator

import pytest
import yaml

from alerts import render
from lockstep import thresholds as T
from tests.support import REPO, free_port, http_get, lockstep, require_real, wait_until
from tests.support.agent_http import agent, answer, exposition
from tests.support.prometheus import PROMETHEUS, backfill, query_alerts, start_prometheus, stop_all

pytestmark = pytest.mark.e2e

NODES = [f"n{i:02d}" for i in range(64)]
STEP = 60  # seconds between the history's samples (an evaluation interval)
DAY = 86400
# node -> [(alertname, job_id, day the alert fired, hours it fired)]
HISTORY: dict[str, list[tuple[str, str, float, float]]] = {
    "n07": [
        ("LockstepTrainingStragglerSustained", "7001", 0.5, 2),
        ("LockstepGPUStragglerSustained", "7001", 0.6, 1),  # the same job again: counted once
        ("LockstepNCCLStraggler", "7002", 2.0, 1),
        ("LockstepTrainingHung", "7003", 3.5, 0.5),
        ("LockstepJobEndedHung", "7004", 5.0, 1),
    ],
    "n42": [
        ("LockstepTrainingStraggler", "4201", 1.0, 1),
        ("LockstepGPUStraggler", "4202", 4.0, 1),
        ("LockstepNCCLRankStuck", "4203", 6.0, 0.5),
    ],
    "n13": [("LockstepTrainingStragglerSustained", "1301", 1.5, 3), ("LockstepNCCLStraggler", "1302", 3.0, 1)],
    **{node: [("LockstepTrainingStraggler", f"9{i:03d}", 0.2 + i * 0.6, 1)] for i, node in enumerate(NODES[50:60])},
    "n20": [("LockstepIBPortDown", "", 0.1, 150)],
    "n33": [("LockstepTrainingStragglerSustained", "", 2.0, 2)],
}
PENDING = {"n61": ("LockstepNCCLRankStuck", "6101", 4.5, 1)}  # never fired


def openmetrics(now: float) -> str:
    """The history as OpenMetrics text, ending STEP before `now`, starting 6.5 days before it."""
    start = now - 6.5 * DAY
    lines = ["# TYPE ALERTS gauge"]
    histories = [(node, entry, "firing") for node, entries in HISTORY.items() for entry in entries]
    histories += [(node, entry, "pending") for node, entry in PENDING.items()]
    for node, (alertname, job_id, day, hours), state in histories:
        labels = {
            "alertname": alertname,
            "alertstate": state,
            "severity": "warning",
            "cluster": "fleet",
            "instance": f"{node}:12400",
            "job": T.AGENT_JOB,
            **({"job_id": job_id} if job_id else {}),
        }
        shown = ",".join(f'{k}="{v}"' for k, v in labels.items())
        first = start + day * DAY
        for k in range(int(hours * 3600 / STEP)):
            at = first + k * STEP
            if at < now - STEP:
                lines.append(f"ALERTS{{{shown}}} 1 {at:.0f}")
    # promtool wants each series' samples together and in time order.
    return "\n".join(lines) + "\n# EOF\n"


def expected_counts() -> dict[str, int]:
    counts = {}
    for node, entries in HISTORY.items():
        jobs = {job for name, job, _, _ in entries if job and name in T.NODE_RECORD_ALERTS}
        if jobs:
            counts[f"{node}:12400"] = len(jobs)
    return counts


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    require_real("Prometheus server (Debian package prometheus)", os.access(PROMETHEUS, os.X_OK))
    tmp = tmp_path_factory.mktemp("node-record")
    history = tmp / "history.om"
    history.write_text(openmetrics(time.time()))
    backfill(history, tmp / "tsdb")
    rule_files = [REPO / path for path in render.RULE_FILES.values()]
    config = {"global": {"evaluation_interval": "1s"}, "rule_files": [str(p) for p in rule_files]}
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
    processes: list[subprocess.Popen[bytes]] = []
    try:
        yield start_prometheus(tmp, free_port(), processes)
    finally:
        stop_all(processes)


def query(url: str, expr: str) -> list[dict[str, object]]:
    status, body = http_get(f"{url}/api/v1/query?" + urllib.parse.urlencode({"query": expr}), timeout=30)
    assert status == 200, body
    return json.loads(body)["data"]["result"]


def test_the_record_counts_each_nodes_distinct_jobs(prometheus: str) -> None:
    def recorded() -> dict[str, int]:
        return {
            r["metric"]["instance"]: int(float(r["value"][1]))  # type: ignore[index]
            for r in query(prometheus, "instance:lockstep_jobs_hurt:count7d")
        }

    wait_until(lambda: recorded() == expected_counts(), timeout=60, step=0.5, what="the node record")


def test_the_alert_names_the_two_lemons_with_their_jobs_and_no_other_node(prometheus: str) -> None:
    def firing() -> dict[str, str]:
        return {
            a["labels"]["instance"]: a["annotations"]["description"]
            for a in query_alerts(prometheus)
            if a["labels"]["alertname"] == "LockstepNodeHurtsJobs" and a["state"] == "firing"
        }

    wait_until(lambda: set(firing()) == {"n07:12400", "n42:12400"}, timeout=60, step=0.5, what="the lemons' alert")
    described = firing()
    assert "of 4 distinct jobs in the last 7d (jobs 7001, 7002, 7003, 7004)" in described["n07:12400"]
    assert "of 3 distinct jobs in the last 7d (jobs 4201, 4202, 4203)" in described["n42:12400"]


def test_the_health_check_reads_the_record_and_names_a_lemon_unhealthy(prometheus: str) -> None:
    """`lockstep health-check --prometheus`: a lemon's healthy agent, and the record decides."""
    wait_until(lambda: len(query(prometheus, T.NODE_JOBS_HURT_RECORD)) == len(expected_counts()), what="the record")
    with agent(answer(200, exposition("healthy").encode())) as url:
        lemon = lockstep("health-check", "--agent", url, "--prometheus", prometheus, "--instance", "n07:12400")
        other = lockstep("health-check", "--agent", url, "--prometheus", prometheus, "--instance", "n13:12400")
    assert (lemon.returncode, lemon.stdout) == (1, "unhealthy: hurt 4 jobs in 7d (LockstepNodeHurtsJobs)\n")
    assert (other.returncode, other.stdout.split(" (")[0]) == (0, "healthy: 8 GPUs, 10 IB ports, 7 mounts")
