"""What the rules and dashboards query: the metrics the agent declares (and the workload contract
names), the lockstep_* names in a PromQL expression, and the checked-in dashboards' queries."""

from __future__ import annotations

import json
import re
from typing import Any

from lockstep.agent.catalogue import declared
from tests.support import REPO

# Metrics of the workload collectors (issue 7), named by the contract in DESIGN.md.  The rules
# and panels on them are written against these names; until those collectors are merged they
# are not in the agent's catalogue, and once they are, this set is redundant (not wrong).
WORKLOAD_CONTRACT = {
    "lockstep_inference_up",
    "lockstep_inference_kv_cache_usage_ratio",
    "lockstep_inference_requests_waiting",
    "lockstep_inference_requests_running",
    "lockstep_inference_preemptions_total",
    "lockstep_training_steps_total",
    "lockstep_training_step_seconds_total",
    "lockstep_training_compute_seconds_total",
    "lockstep_training_comm_wait_seconds_total",
    "lockstep_training_data_wait_seconds_total",
    "lockstep_training_last_step_timestamp_seconds",
}
METRIC_NAME = re.compile(r"(?<![\w:])lockstep_[a-z0-9_]+(?![\w:])")


def declared_metrics() -> set[str]:
    """Every series name the agent declares: a histogram's as its samples are named too."""
    names = set()
    for specs in declared().values():
        for spec in specs:
            names.add(spec.name)
            if spec.type == "histogram":
                names |= {f"{spec.name}_bucket", f"{spec.name}_sum", f"{spec.name}_count"}
    return names


def metrics_in(expr: str) -> set[str]:
    """lockstep_* metric names in a PromQL expression (recording rule names contain ':')."""
    return set(METRIC_NAME.findall(expr))


def checked_in() -> dict[str, dict[str, Any]]:
    """Dashboard title -> its checked-in JSON."""
    found = {}
    for path in sorted((REPO / "dashboards").glob("*.json")):
        data = json.loads(path.read_text())
        found[data["title"]] = data
    return found


def panel_queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, PromQL) for every target of every panel."""
    return [(panel["title"], target["expr"]) for panel in dashboard["panels"] for target in panel["targets"]]


def variable_queries(dashboard: dict[str, Any]) -> dict[str, str]:
    return {v["name"]: v["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"}
