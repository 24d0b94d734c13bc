"""The fleet: rules and dashboards on many nodes' history in a real Prometheus, and the `cluster`
label carried through every rule.

A 16-node, 10-minute version of bench/fleet.py (which measures 256 and 1,024 nodes on demand):
the fleet's history is built from the simulated node's expositions, backfilled with promtool,
and a Prometheus evaluates the shipped rule files on it.

Tiers per test (tests/conftest.py): the rules' and the plan's checks are in-process (unit, in the
quick loop), vmalert's dry run is `real`, and what runs on the fleet's Prometheus is `e2e`.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from alerts import render, rules
from alerts.model import Alert, Recording
from tests.support import REPO, require_promtool, require_real, wait_until

sys.path.insert(0, str(REPO / "bench"))
import fleet  # noqa: E402

NODES = 16
AGGREGATION = re.compile(
    r"\b(sum|min|max|avg|group|stddev|stdvar|count|count_values|bottomk|topk|quantile)\b\s*"
    r"(?:(by|without)\s*\(([^)]*)\))?\s*\("
)
# Alerts whose output may lack `cluster`, and why.
WITHOUT_CLUSTER = {
    # absent() has only the labels of its selector's equality matchers: it fires when this
    # Prometheus scrapes no agent at all, which is about the Prometheus, not a cluster of nodes.
    # (With `cluster` as an external label, as docs/deploy.md advises per cluster, it has one.)
    "LockstepAgentDown": "absent(",
}


def _problems(expr: str) -> list[str]:
    found = []
    for match in AGGREGATION.finditer(expr):
        op, clause, labels = match.group(1), match.group(2), match.group(3) or ""
        names = {label.strip() for label in labels.split(",")}
        if clause is None:
            found.append(f"{op}(...) without by (cluster, ...)")
        elif clause == "by" and "cluster" not in names:
            found.append(f"{op} by ({labels}) drops cluster")
        elif clause == "without" and "cluster" in names:
            found.append(f"{op} without ({labels}) drops cluster")
    return found


def _rule_id(rule: Recording | Alert) -> str:
    return rule.record if isinstance(rule, Recording) else rule.name


@pytest.mark.parametrize("rule", [*rules.recordings(), *rules.alerts()], ids=_rule_id)
def test_every_rule_keeps_the_cluster_label(rule: Recording | Alert) -> None:
    """Every aggregation of every recording and alerting rule keeps `cluster` (one Prometheus or
    VictoriaMetrics holds several clusters; a rule that dropped it would merge their jobs)."""
    expr = rule.expr
    if isinstance(rule, Alert) and rule.name in WITHOUT_CLUSTER:
        assert WITHOUT_CLUSTER[rule.name] in expr
        expr = expr.split(WITHOUT_CLUSTER[rule.name])[0]
    assert _problems(expr) == [], expr


def test_the_cluster_check_catches_what_it_is_for() -> None:
    assert _problems("sum(rate(x[5m]))") == ["sum(...) without by (cluster, ...)"]
    assert _problems("max by (job_id) (x)") == ["max by (job_id) drops cluster"]
    assert _problems("count without (cluster) (x)") == ["count without (cluster) drops cluster"]
    assert _problems("quantile by (cluster, job_id) (0.5, x) and max_over_time(y[5m])") == []


@pytest.mark.real
def test_vmalert_accepts_the_shipped_rule_files() -> None:
    """vmalert (the scale-out path) parses the checked-in rule files unchanged (MetricsQL)."""
    vmalert = "/usr/bin/vmalert"
    require_real("vmalert (Debian package victoria-metrics)", os.access(vmalert, os.X_OK))
    result = subprocess.run(
        [vmalert, "-dryRun", *(f"-rule={REPO / path}" for path in render.RULE_FILES.values())],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.fixture(scope="module")
def small_fleet() -> Iterator[tuple[fleet.Result, fleet.Prometheus]]:
    require_promtool()
    require_real("Prometheus server (Debian package prometheus)", os.access(fleet.PROMETHEUS, os.X_OK))
    result, prometheus, directory = fleet.run(NODES, hours=10 / 60, step=15, all_series=False, evaluation_interval="2s")
    try:
        yield result, prometheus
    finally:
        prometheus.stop()
        shutil.rmtree(directory, ignore_errors=True)


def _labels(prometheus: fleet.Prometheus, expr: str) -> list[dict[str, Any]]:
    return [series["metric"] for series in prometheus.query(expr)]


def test_fleet_plan() -> None:
    plan = fleet.plan(NODES)
    assert [n.name for n in plan.nodes] == [f"gpu{i:04d}" for i in range(1, NODES + 1)]
    assert sorted(plan.jobs()) == [
        ("east", "10001"),
        ("east", "10002"),
        ("east", "10003"),
        ("west", "20001"),
        ("west", "20002"),
        ("west", "20003"),
    ]
    assert (plan.straggler, plan.stalled_job, plan.hung_mount) == (("10001", "gpu0002:12400"), "20001", "gpu0012:12400")
    assert [n.name for n in plan.nodes if n.job_id is None] == ["gpu0008", "gpu0016"]


@pytest.mark.e2e
def test_every_rule_group_is_evaluated(small_fleet: tuple[fleet.Result, fleet.Prometheus]) -> None:
    result, _ = small_fleet
    assert sorted(result.groups) == sorted(g.name for g in rules.RECORDING_GROUPS + rules.ALERT_GROUPS)


# Recording rules the simulated fleet cannot feed: NCCL's (no fleet node runs an NCCL job; their
# rules group by cluster explicitly, and tests/alerts/test_alerts_e2e.py's NCCL cases feed them),
# and the hang rules' spinning GPUs and
# saves in progress (no fleet job hangs or saves while the fleet runs; alerts/tests/hang.test.yml
# checks their cluster label reaches the alerts, tests/alerts/test_hangs_e2e.py feeds them from
# the real agent).
# ... and a job whose framework stopped printing (issue 37; proven in alerts/tests/framework.test.yml).
# ... and the straggler evidence verdicts (slower than its peers, holding its job back): they need
# 15 minutes of the recorded 5-minute shares, which a Prometheus started with the test has not
# (alerts/tests/stragglers.test.yml and tests/alerts/test_straggler_real_timing.py feed them).
# ... and a node's XIDs: the fleet is made of one round of each scenario's collectors, and the
# GPU collector's listener thread has not handed it the simulated XIDs by then (a running demo
# has: tests/alerts/test_alerts_e2e.py's gpu-faults and gpu-lost cases record them).
# ... and a checkpoint stall's slow writer (no fleet save stalls for 5 minutes while the fleet runs;
# alerts/tests/nodes.test.yml and test_alerts_e2e.py's checkpoint-stall case feed it).
NO_FLEET_INPUT = (
    "lockstep_nccl_",
    "lockstep_gpu_spinning",
    "lockstep_checkpoint_save:in_progress",
    "lockstep_framework_reports:stopped",
    "lockstep_training_straggler_evidence",
    "lockstep_training_slower_than_peers",
    "lockstep_node_xid_errors",
    "lockstep_checkpoint_stall_writer",
)


@pytest.mark.e2e
def test_recording_rules_keep_cluster_on_the_fleet(small_fleet: tuple[fleet.Result, fleet.Prometheus]) -> None:
    _, prometheus = small_fleet
    empty, without = [], []
    for rule in rules.recordings():
        series = _labels(prometheus, rule.record)
        if not series and not any(part in rule.record for part in NO_FLEET_INPUT):
            empty.append(rule.record)
        without += [f"{rule.record}{labels}" for labels in series if not labels.get("cluster")]
    assert without == []
    assert empty == []  # every recording rule has inputs in the fleet


@pytest.mark.e2e
def test_the_fleets_faults_are_found_where_they_are(small_fleet: tuple[fleet.Result, fleet.Prometheus]) -> None:
    """Straggler, stalled job, hung mount, KV-cache pressure: pending (their `for` runs from
    Prometheus' start) with the cluster, job and node they are on, and no alert without cluster."""
    _, prometheus = small_fleet
    plan = fleet.plan(NODES)
    job, instance = plan.straggler
    expected = {
        ("LockstepTrainingStraggler", "east", job, instance),
        ("LockstepGPUStraggler", "east", job, instance),
        ("LockstepTrainingStalled", "west", plan.stalled_job, ""),
        ("LockstepFilesystemHung", "west", "", plan.hung_mount),
    }

    def found() -> set[tuple[str, str, str, str]]:
        alerts = _labels(prometheus, "ALERTS")
        return {(a["alertname"], a.get("cluster", ""), a.get("job_id", ""), a.get("instance", "")) for a in alerts}

    # Each group's alerts appear with its evaluation after Prometheus' start.
    wait_until(lambda: expected <= found(), timeout=60, step=1, what=f"{expected - found()} in ALERTS")
    alerts = _labels(prometheus, "ALERTS")
    assert [a for a in alerts if not a.get("cluster")] == []
    kv = {a["instance"] for a in alerts if a["alertname"] == "LockstepKVCachePressure"}
    assert kv == {f"{n.name}:12400" for n in plan.nodes if n.job_id is None}
    rank = {a["rank"] for a in alerts if a["alertname"] == "LockstepTrainingStraggler"}
    assert rank == {"11"}  # rank 3 of the job's second node


@pytest.mark.e2e
def test_every_fleet_dashboard_query_returns_data(small_fleet: tuple[fleet.Result, fleet.Prometheus]) -> None:
    result, _ = small_fleet
    assert [panel for panel, *_ in result.queries] == [p for p, _ in [*fleet.dashboard_queries(), *fleet.RAW_QUERIES]]
    # Nothing fires within seconds of Prometheus' start (every alert of the fleet has a `for`).
    empty = [
        (panel, expr)
        for panel, expr, _, _, count in result.queries
        if count == 0 and "firing" not in expr and not any(part in expr for part in NO_FLEET_INPUT)
    ]
    assert empty == []
