"""The Grafana dashboards (dashboards/): generated JSON current (golden), the dashboards and
variables the issue lists, current panel types with units, thresholds equal to the alerts',
queries on existing metrics, and the sidecar ConfigMaps matching the JSON.

Every query is run against a real Prometheus in tests/alerts/test_alerts_e2e.py.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from alerts import generated, rules
from dashboards.__main__ import DASHBOARDS
from dashboards.build import boards
from dashboards.panels import DS
from dashboards.render import CONFIGMAPS, json_path
from lockstep import thresholds as T
from tests.support import REPO
from tests.support.queries import (
    WORKLOAD_CONTRACT,
    checked_in,
    declared_metrics,
    metrics_in,
    panel_queries,
    variable_queries,
)

PANEL_TYPES = {"timeseries", "stat", "table", "heatmap"}
RECORDED = re.compile(r"\b[a-z_]+:lockstep_[a-z0-9_]+:[a-z0-9_]+\b")
# kubectl apply keeps each object in an annotation limited to 256 KiB.
KUBECTL_APPLY_LIMIT = 256 * 1024


def panel(title: str, dashboard: dict[str, Any]) -> dict[str, Any]:
    (found,) = [p for p in dashboard["panels"] if p["title"] == title]
    return found


def test_generated_dashboards_are_current() -> None:
    assert generated.stale_files(DASHBOARDS) == [], "run: .venv/bin/python -m dashboards --write"


def test_the_dashboards_the_issue_lists() -> None:
    assert sorted(checked_in()) == [
        "Lockstep / Agent health",
        "Lockstep / Fabric (InfiniBand, RoCE, PFC)",
        "Lockstep / Fleet overview",
        "Lockstep / GPU & NVLink",
        "Lockstep / Inference",
        "Lockstep / Node",
        "Lockstep / Slurm job",
        "Lockstep / Storage & checkpoints",
    ]
    assert sorted(p.name for p in (REPO / "dashboards").glob("*.json")) == sorted(b.file_name for b in boards())


def test_variables_datasource_cluster_node_and_job() -> None:
    for title, dashboard in checked_in().items():
        variables = {v["name"]: v for v in dashboard["templating"]["list"]}
        assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
        assert variables["cluster"]["query"] == "label_values(lockstep_build_info, cluster)", title
        assert variables["cluster"]["includeAll"] and variables["cluster"]["allValue"] == ".*", title
        expected = {
            "Lockstep / Fleet overview": {"datasource", "cluster"},
            "Lockstep / Slurm job": {"datasource", "cluster", "job_id"},
        }.get(title, {"datasource", "cluster", "node"})
        assert set(variables) == expected, title
        for variable in variables.values():
            if variable["type"] == "query":
                assert variable["datasource"] == DS, (title, variable["name"])


def test_panels_are_current_types_with_units_on_the_datasource_variable() -> None:
    for title, dashboard in checked_in().items():
        assert dashboard["schemaVersion"] >= 36, title  # no migration of legacy panels on import
        ids = [p["id"] for p in dashboard["panels"]]
        assert len(ids) == len(set(ids)), title
        for p in dashboard["panels"]:
            where = f"{title} / {p['title']}"
            assert p["type"] in PANEL_TYPES, where
            assert p["fieldConfig"]["defaults"]["unit"], where
            assert p["datasource"] == DS, where
            assert 0 <= p["gridPos"]["x"] and p["gridPos"]["x"] + p["gridPos"]["w"] <= 24, where
            assert p["targets"] and all(t["expr"] and t["datasource"] == DS for t in p["targets"]), where
        assert {p["type"] for p in dashboard["panels"]} <= PANEL_TYPES


def test_every_query_selects_on_the_dashboards_variables() -> None:
    for title, dashboard in checked_in().items():
        required = {
            "Lockstep / Fleet overview": "$cluster",
            "Lockstep / Slurm job": "$job_id",
        }.get(title, "$node")
        for panel_title, expr in panel_queries(dashboard):
            assert required in expr, f"{title} / {panel_title}: {expr}"
            assert "$cluster" in expr, f"{title} / {panel_title}: {expr}"


def test_queries_use_declared_metrics_and_existing_recording_rules() -> None:
    known = declared_metrics() | WORKLOAD_CONTRACT
    recorded = {r.record for r in rules.recordings()}
    for title, dashboard in checked_in().items():
        queries = panel_queries(dashboard) + list(variable_queries(dashboard).items())
        for where, expr in queries:
            assert metrics_in(expr) - known == set(), f"{title} / {where}"
            assert set(RECORDED.findall(expr)) - recorded == set(), f"{title} / {where}"


def _steps(p: dict[str, Any]) -> list[float]:
    return [s["value"] for s in p["fieldConfig"]["defaults"]["thresholds"]["steps"] if s["value"] is not None]


# Each panel that shows an alert's quantity draws the alert's threshold (from lockstep/thresholds.py).
ALERT_THRESHOLDS = [
    ("Lockstep / Fleet overview", "Worst training stragglers", T.TRAINING_STRAGGLER_COMPUTE_RATIO),
    ("Lockstep / Fleet overview", "Slowest GPUs against their job", T.GPU_STRAGGLER_SM_CLOCK_RATIO),
    ("Lockstep / Slurm job", "Compute time per step against the job's median", T.TRAINING_STRAGGLER_COMPUTE_RATIO),
    ("Lockstep / Slurm job", "SM clock against the job's median", T.GPU_STRAGGLER_SM_CLOCK_RATIO),
    ("Lockstep / Slurm job", "Slowest GPU against the job", T.GPU_STRAGGLER_SM_CLOCK_RATIO),
    ("Lockstep / GPU & NVLink", "SM clock against the job's median", T.GPU_STRAGGLER_SM_CLOCK_RATIO),
    ("Lockstep / GPU & NVLink", "NVLink errors per minute", T.NVLINK_ERRORS_PER_MINUTE),
    ("Lockstep / Inference", "KV cache usage", T.KV_CACHE_USAGE_RATIO),
    ("Lockstep / Inference", "Preemptions per minute", T.KV_PREEMPTIONS_PER_MINUTE),
    ("Lockstep / Inference", "Generation throughput against its last hour", T.INFERENCE_THROUGHPUT_DROP_RATIO),
    ("Lockstep / Inference", "Time to first token (p95)", T.INFERENCE_TTFT_SLO_SECONDS),
    ("Lockstep / Inference", "Aborted or failed requests (share)", T.INFERENCE_FAILED_REQUESTS_RATIO),
    ("Lockstep / Fabric (InfiniBand, RoCE, PFC)", "Transmit wait (congestion)", T.IB_TRANSMIT_WAIT_RATIO),
    ("Lockstep / Fabric (InfiniBand, RoCE, PFC)", "Link downs and retrains (15m)", T.IB_LINK_FLAP_EVENTS),
    ("Lockstep / Fabric (InfiniBand, RoCE, PFC)", "Symbol errors per hour", T.IB_SYMBOL_ERRORS_PER_HOUR),
    ("Lockstep / Fabric (InfiniBand, RoCE, PFC)", "PFC pause (share of time)", T.PFC_TX_PAUSE_RATIO),
    ("Lockstep / Storage & checkpoints", "I/O pressure (all tasks stalled)", T.IO_FULL_PRESSURE_RATIO),
    ("Lockstep / Storage & checkpoints", "Space left", T.FILESYSTEM_AVAILABLE_CRITICAL_RATIO),
    ("Lockstep / Storage & checkpoints", "Space left", T.FILESYSTEM_AVAILABLE_PREDICT_RATIO),
    ("Lockstep / Node", "Pressure stall (share of time)", T.IO_FULL_PRESSURE_RATIO),
    ("Lockstep / Node", "Filesystems: space left", T.FILESYSTEM_AVAILABLE_CRITICAL_RATIO),
]


@pytest.mark.parametrize(("dashboard", "title", "threshold"), ALERT_THRESHOLDS)
def test_thresholds_are_the_alerts(dashboard: str, title: str, threshold: float) -> None:
    p = panel(title, checked_in()[dashboard])
    assert threshold in _steps(p)
    if p["type"] == "timeseries":
        assert p["fieldConfig"]["defaults"]["custom"]["thresholdsStyle"]["mode"] == "line"


def test_configmaps_hold_the_dashboards_for_the_grafana_sidecar() -> None:
    docs = [d for d in yaml.safe_load_all((REPO / CONFIGMAPS).read_text()) if d]
    assert len(docs) == len(boards())
    for doc, board in zip(docs, boards()):
        assert doc["kind"] == "ConfigMap" and doc["metadata"]["namespace"] == "lockstep"
        assert doc["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert list(doc["data"]) == [board.file_name]
        assert doc["data"][board.file_name] == (REPO / json_path(board)).read_text()
        assert len(json.dumps(doc)) < KUBECTL_APPLY_LIMIT, doc["metadata"]["name"]


def test_write_then_check_round_trips(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--write` into an empty tree produces exactly what `--check` accepts (and removes stale JSON)."""
    (tmp_path / "dashboards").mkdir()
    (tmp_path / "deploy").mkdir()
    (tmp_path / "dashboards" / "renamed-away.json").write_text("{}")
    monkeypatch.setattr(generated, "REPO", tmp_path)
    assert generated.main(DASHBOARDS, ["--check"]) == 1
    assert generated.main(DASHBOARDS, ["--write"]) == 0
    assert generated.main(DASHBOARDS, ["--check"]) == 0
    assert not (tmp_path / "dashboards" / "renamed-away.json").exists()
