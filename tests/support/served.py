"""A collector's round served as a scrape would serve it: run by a real worker, rendered by the
exporter in both formats, and each format parsed back (OpenMetrics by its own parser, which
raises on invalid output)."""

from __future__ import annotations

import dataclasses
import logging

from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics

from lockstep.agent.collector import Collector
from lockstep.agent.exporter import SnapshotExporter
from lockstep.agent.scheduler import Worker, WorkerView
from tests.support import samples, wait_until

OPENMETRICS = "application/openmetrics-text; version=1.0.0"


@dataclasses.dataclass
class Served:
    text: dict  # the text format's samples by (name, labels)
    openmetrics: dict  # the same from the OpenMetrics rendering, parsed by its own parser
    view: WorkerView


def served(collector: Collector) -> Served:
    """One round of the collector run by a worker, scraped in both formats."""
    worker = Worker(collector, interval=3600, deadline=30, staleness_intervals=2, log=logging.getLogger("t.worker"))
    worker.start()
    try:
        wait_until(lambda: worker.view().runs_total >= 1, timeout=30, what="a round")
    finally:
        worker.stop()
        worker.join(30)
    view = worker.view()
    exporter = SnapshotExporter(lambda: [view])
    text = exporter.render()[0].decode()
    om = exporter.render(OPENMETRICS)[0].decode()
    parsed = {}
    for family in parse_openmetrics(om):  # raises on invalid OpenMetrics
        for sample in family.samples:
            parsed[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return Served(samples(text), parsed, view)


def self_metric(result: Served, name: str, collector: str) -> float:
    return result.text[(f"lockstep_collector_{name}", frozenset({("collector", collector)}))]


def of(values: dict, name: str, **labels: str) -> float:
    return values[(name, frozenset(labels.items()))]
