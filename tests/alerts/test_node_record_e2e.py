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
import math
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
# node -> [(job_id, day, hours)]: a job's checkpoint save stalled with the node its slow writer, as
# the rules record it (alerts/nodes.py, T.NODE_CHECKPOINT_WRITER_RECORD): n62 hurt job 6201 so.
WRITERS = {"n62": [("6201", 2.5, 1)]}
# The lemon n07's own faults, as its agent exports them: (metric, labels, [(day, value from then)]),
# from a day before the alerts' history (7.5 days ago: the series were there when the week began).
# GPU 3 fell off the bus at day 3.5 (XID 79, its first: the agent's XID series is born at 1) for
# 30 minutes, then a row remapping was pending 2 hours; mlx5_0 port 1 went down twice; GPU 5 was
# held down for heat 10 minutes (and by the power cap for hours: not a fault of the node's).
LOST = 3.5
FAULTS: list[tuple[str, dict[str, str], list[tuple[float, float]]]] = [
    ("lockstep_gpu_up", {"gpu": "0", "uuid": "GPU-7-0"}, [(-1, 1)]),
    ("lockstep_gpu_up", {"gpu": "3", "uuid": "GPU-7-3"}, [(-1, 1), (LOST, 0), (LOST + 30 / 1440, 1)]),
    ("lockstep_gpu_xid_errors_total", {"gpu": "3", "uuid": "GPU-7-3", "xid": "79"}, [(LOST, 1)]),
    (
        "lockstep_gpu_row_remapping_pending",
        {"gpu": "3", "uuid": "GPU-7-3"},
        [(-1, 0), (LOST + 30 / 1440, 1), (LOST + 150 / 1440, 0)],
    ),
    # Rows remapped before the week (not counted) and in it.
    ("lockstep_gpu_remapped_rows", {"gpu": "3", "uuid": "GPU-7-3", "cause": "correctable"}, [(-1, 4)]),
    ("lockstep_gpu_remapped_rows", {"gpu": "3", "uuid": "GPU-7-3", "cause": "uncorrectable"}, [(-1, 0), (LOST, 1)]),
    ("lockstep_ib_port_link_downed_total", {"device": "mlx5_0", "port": "1"}, [(-1, 3), (1.0, 4), (4.2, 5)]),
    *[
        (
            "lockstep_gpu_clock_event_seconds_total",
            {"gpu": "5", "uuid": "GPU-7-5", "reason": reason},
            [(-1, 0), *[(2.0 + k / 1440, 60.0 * (k + 1)) for k in range(minutes)]],  # held all the time
        )
        for reason, minutes in (("hw_thermal_slowdown", 10), ("sw_power_cap", 300))
    ],
]
# n42's Slurm node name differs from its host name: `report --node gpu-n42` finds it.
NODE_INFO = ("lockstep_slurm_node_info", {"slurm_node": "gpu-n42"}, [(0, 1)])


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
    lines.append(f"# TYPE {T.NODE_CHECKPOINT_WRITER_RECORD} gauge")
    for node, stalls in WRITERS.items():
        for job_id, day, hours in stalls:
            shown = f'cluster="fleet",instance="{node}:12400",job_id="{job_id}"'
            lines += [
                f"{T.NODE_CHECKPOINT_WRITER_RECORD}{{{shown}}} 1 {start + day * DAY + k * STEP:.0f}"
                for k in range(int(hours * 3600 / STEP))
            ]
    for (name, labels, steps), node in [*((fault, "n07") for fault in FAULTS), (NODE_INFO, "n42")]:
        shown = ",".join(f'{k}="{v}"' for k, v in {**labels, **agent_labels(node)}.items())
        if f"# TYPE {name} gauge" not in lines:  # (a family's series follow each other in FAULTS)
            lines.append(f"# TYPE {name} gauge")
        for k in range(-int(DAY / STEP), int(6.5 * DAY / STEP) - 1):
            at = start + k * STEP
            values = [v for day, v in steps if start + day * DAY <= at]
            if values:  # (a series begins at its first step)
                lines.append(f"{name}{{{shown}}} {values[-1]} {at:.0f}")
    # promtool wants each series' samples together and in time order.
    return "\n".join(lines) + "\n# EOF\n"


def agent_labels(node: str) -> dict[str, str]:
    return {"cluster": "fleet", "instance": f"{node}:12400", "job": T.AGENT_JOB}


def expected_counts() -> dict[str, int]:
    counts = {}
    for node, entries in HISTORY.items():
        jobs = {job for name, job, _, _ in entries if job and name in T.NODE_RECORD_ALERTS}
        if jobs:
            counts[f"{node}:12400"] = len(jobs)
    for node, stalls in WRITERS.items():
        counts[f"{node}:12400"] = counts.get(f"{node}:12400", 0) + len({job for job, _, _ in stalls})
    return counts


@pytest.fixture(scope="module")
def now() -> float:
    """When the history ends (STEP before it) and the rules and reports look at it."""
    return time.time()


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory, now: float) -> Iterator[str]:
    require_real("Prometheus server (Debian package prometheus)", os.access(PROMETHEUS, os.X_OK))
    tmp = tmp_path_factory.mktemp("node-record")
    history = tmp / "history.om"
    history.write_text(openmetrics(now))
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
    assert " 4 distinct jobs in the last 7d (jobs 7001, 7002, 7003, 7004)" in described["n07:12400"]
    assert " 3 distinct jobs in the last 7d (jobs 4201, 4202, 4203)" in described["n42:12400"]


def test_the_health_check_reads_the_record_and_names_a_lemon_unhealthy(prometheus: str) -> None:
    """`lockstep health-check --prometheus`: a lemon's healthy agent, and the record decides."""
    wait_until(lambda: len(query(prometheus, T.NODE_JOBS_HURT_RECORD)) == len(expected_counts()), what="the record")
    with agent(answer(200, exposition("healthy").encode())) as url:
        lemon = lockstep("health-check", "--agent", url, "--prometheus", prometheus, "--instance", "n07:12400")
        other = lockstep("health-check", "--agent", url, "--prometheus", prometheus, "--instance", "n13:12400")
    assert (lemon.returncode, lemon.stdout) == (1, "unhealthy: hurt 4 jobs in 7d (LockstepNodeHurtsJobs)\n")
    assert (other.returncode, other.stdout.split(" (")[0]) == (0, "healthy: 8 GPUs, 10 IB ports, 7 mounts")


def firing(node: str, now: float) -> list[tuple[str, list[str], float, float]]:
    """The node's jobs as the history has them: each job once, the alerts that named the node in
    it, the first and last sample of them (as written: whole seconds), in order of the first."""
    start = now - 6.5 * DAY
    jobs: dict[str, tuple[set[str], float, float]] = {}
    for name, job_id, day, hours in HISTORY[node]:
        first = start + day * DAY
        times = [
            float(f"{first + k * STEP:.0f}") for k in range(int(hours * 3600 / STEP)) if first + k * STEP < now - STEP
        ]
        names, low, high = jobs.get(job_id, (set(), math.inf, -math.inf))
        jobs[job_id] = (names | {name}, min(low, times[0]), max(high, times[-1]))
    return sorted(((job_id, sorted(n), lo, hi) for job_id, (n, lo, hi) in jobs.items()), key=lambda j: j[2])


def test_report_node_tells_a_lemons_story(prometheus: str, now: float) -> None:
    """`lockstep report --node`: the jobs the node hurt, when and by which alerts, and its own
    faults over the week, from the real Prometheus holding the history."""
    result = lockstep("report", "--node", "n07", "--prometheus", prometheus, "--format", "json", "--at", f"{now:.3f}")
    assert result.returncode == 0, result.stderr
    story = json.loads(result.stdout)
    assert (story["node"], story["cluster"], story["instances"]) == ("n07", "fleet", ["n07:12400"])
    assert [(j["job_id"], j["alerts"], j["first"], j["last"]) for j in story["jobs"]] == firing("n07", now)
    assert [j["report"] for j in story["jobs"]] == [f"lockstep report {j}" for j in ("7001", "7002", "7003", "7004")]
    assert story["faults"] == [
        {
            "kind": "gpu_lost",
            "where": "GPU 3",
            "what": "lost (fell off the bus or unreachable)",
            "count": 1800,
            "unit": "s",
        },
        {
            "kind": "gpu_throttled_seconds",
            "where": "GPU 5",
            "what": "GPU clocks held down (reason hw_thermal_slowdown)",
            "count": 600,
            "unit": "s",
        },
        {"kind": "link_downs", "where": "mlx5_0 port 1", "what": "InfiniBand link downs", "count": 2, "unit": ""},
        {
            "kind": "remapped_rows",
            "where": "GPU 3",
            "what": "memory rows remapped (cause uncorrectable)",
            "count": 1,
            "unit": "",
        },
        {"kind": "row_remapping_pending", "where": "GPU 3", "what": "a row remapping pending", "count": 1, "unit": ""},
        {"kind": "xid_errors", "where": "GPU 3", "what": "XID errors (xid 79)", "count": 1, "unit": ""},
    ]
    assert story["verdict"] == (
        "n07 was named by the straggler or hang alerts of, or stalled the checkpoint saves of, 4 jobs in the last "
        "7d: a repeat offender "
        "(LockstepNodeHurtsJobs at 3); its own faults: gpu_lost, gpu_throttled_seconds, link_downs, remapped_rows, "
        "row_remapping_pending, xid_errors."
    )
    page = lockstep("report", "--node", "n07", "--prometheus", prometheus, "--format", "html", "--at", f"{now:.3f}")
    assert page.returncode == 0, page.stderr
    for job_id, _, first, _ in firing("n07", now):
        since = int(first - 3600) * 1000
        assert (
            f"/d/{T.SLURM_JOB_DASHBOARD_UID}?var-cluster=fleet&amp;var-job_id={job_id}&amp;from={since}" in page.stdout
        )


def test_report_node_finds_a_node_by_its_slurm_name_and_says_it_has_no_fault(prometheus: str, now: float) -> None:
    result = lockstep("report", "--node", "gpu-n42", "--prometheus", prometheus, "--at", f"{now:.3f}")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "Node gpu-n42 (cluster fleet)"
    assert lines[1].endswith("UTC; agents: n42:12400")
    assert lines[3:5] == [
        "gpu-n42 was named by the straggler or hang alerts of, or stalled the checkpoint saves of, 3 jobs in",
        "the last 7d: a repeat offender (LockstepNodeHurtsJobs at 3); no fault of its own recorded.",
    ]
    assert [line.split()[0] for line in lines if line.startswith("  42")] == ["4201", "4202", "4203"]
    assert lines[-2:] == ["Its own faults (0)", "  none"]
    assert all(len(line) <= 100 for line in lines)


def test_report_node_lists_the_jobs_whose_saves_it_stalled(prometheus: str, now: float) -> None:
    """The record of a checkpoint stall's slow writer is one of the jobs the node hurt."""
    result = lockstep("report", "--node", "n62", "--prometheus", prometheus, "--format", "json", "--at", f"{now:.3f}")
    assert result.returncode == 0, result.stderr
    story = json.loads(result.stdout)
    first = float(f"{now - 6.5 * DAY + 2.5 * DAY:.0f}")
    assert [(j["job_id"], j["alerts"], j["first"], j["last"]) for j in story["jobs"]] == [
        ("6201", ["LockstepCheckpointStalled"], first, first + 3600 - STEP)
    ]
    assert story["verdict"] == (
        "n62 was named by the straggler or hang alerts of, or stalled the checkpoint saves of, 1 job in the "
        "last 7d; no fault of its own recorded."
    )


def test_report_node_of_an_unknown_node_is_one_line(prometheus: str, now: float) -> None:
    result = lockstep("report", "--node", "n99", "--prometheus", prometheus, "--since", "36h")
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == (
        f"lockstep: report: node n99 is unknown to Prometheus at {prometheus} (no agent or alert named it in the "
        "last 36h)\n"
    )
