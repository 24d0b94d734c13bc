"""Every metric the report reads is one the agent declares, and every recorded series one the
shipped rules record: a renamed metric or rule fails here, not in a report that quietly finds
nothing (the rules and dashboards have the same check)."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import re
from collections.abc import Iterator
from pathlib import Path

from alerts import rules
from tests.support import REPO
from tests.support.queries import WORKLOAD_CONTRACT, declared_metrics

# The report and the definitions it shares with the rules.
SOURCES = sorted((REPO / "lockstep" / "report").glob("*.py")) + [REPO / "lockstep" / "suspects.py"]
METRIC = re.compile(r"(?<![\w:])lockstep_[a-z0-9_]+(?![\w:])")
# In a piece of an f-string, a name whole within the piece: not cut by a placeholder either side.
METRIC_IN_PIECE = re.compile(r"(?<=[^\w:])lockstep_[a-z0-9_]+(?=[^\w:])")
RECORDED = re.compile(r"(?<![\w:])[a-z_]+:lockstep_[a-z0-9_]+:[a-z0-9_]+(?![\w:])")
RECORDED_IN_PIECE = re.compile(r"(?<=[^\w:])[a-z_]+:lockstep_[a-z0-9_]+:[a-z0-9_]+(?=[^\w:])")
# Names the report reads that are neither: Prometheus' own series of the alerts.
PROMETHEUS_OWN = {"ALERTS"}


def module_name(path: Path) -> str:
    return "lockstep." + ".".join(path.relative_to(REPO / "lockstep").with_suffix("").parts).removesuffix(".__init__")


def strings_in_source(path: Path) -> Iterator[tuple[str, bool]]:
    """Every string literal of a file, and whether it is a piece of an f-string; a piece is padded
    with a space on each side where no placeholder touches it (the f-string's start or end)."""
    tree = ast.parse(path.read_text(), str(path))
    pieces: dict[int, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            last = len(node.values) - 1
            for i, v in enumerate(node.values):
                if isinstance(v, ast.Constant) and isinstance(v.value, str):
                    pieces[id(v)] = (" " if i == 0 else "") + v.value + (" " if i == last else "")
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield pieces.get(id(node), node.value), id(node) in pieces


def strings_at_runtime(value: object) -> Iterator[str]:
    """The strings of a module's constants: names built by f-strings at import (the recorded
    names), and the suspects' clauses."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, (tuple, list, frozenset, set)):
        for item in value:
            yield from strings_at_runtime(item)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            yield from strings_at_runtime(getattr(value, f.name))


def names_the_report_reads() -> tuple[set[str], set[str]]:
    metrics: set[str] = set()
    recorded: set[str] = set()
    for path in SOURCES:
        for text, piece in strings_in_source(path):
            metrics |= set((METRIC_IN_PIECE if piece else METRIC).findall(text))
            recorded |= set((RECORDED_IN_PIECE if piece else RECORDED).findall(text))
        module = importlib.import_module(module_name(path))
        for name, value in vars(module).items():
            if name.isupper():
                for text in strings_at_runtime(value):
                    metrics |= set(METRIC.findall(text))
                    recorded |= set(RECORDED.findall(text))
    return metrics, recorded


def test_every_metric_and_recorded_series_the_report_reads_exists() -> None:
    metrics, recorded = names_the_report_reads()
    # The scan sees the names built every way: literals, f-string pieces, rendered clauses.
    assert {
        "lockstep_slurm_job_gpu_info",  # a literal in find_job's series
        "lockstep_gpu_utilization_ratio",  # inside an f-string's call
        "lockstep_pfc_pause_seconds_total",  # a suspect's clause
        "lockstep_ib_port_symbol_errors_total",  # a clause built by a function
    } <= metrics
    assert {
        "job_rank:lockstep_training_suspect:active30m",
        "job_comm_rank:lockstep_nccl_collective_seconds:per_op5m",
    } <= recorded
    assert len(metrics) >= 40, sorted(metrics)
    assert sorted(metrics - declared_metrics() - WORKLOAD_CONTRACT - PROMETHEUS_OWN) == []
    assert sorted(recorded - {r.record for r in rules.recordings()}) == []


def test_the_scan_catches_a_name_that_does_not_exist() -> None:
    made_up = "lockstep_gpu_made_up_total"
    assert METRIC.findall(f"rate({made_up}[5m])") == [made_up]
    assert METRIC_IN_PIECE.findall(f" avg_over_time({made_up}{{") == [made_up]
    assert METRIC_IN_PIECE.findall(" lockstep_ib_port_") == []  # cut by a placeholder: not a name
    assert made_up not in declared_metrics()
