"""The agent's own metric families and renderers (lockstep/agent/families.py, exposition.py)
against prometheus_client 0.26, which they replace on the scrape path: the same bytes in both
formats for every family of every simulated scenario, and for names, values and labels no
collector here makes (a third-party collector may)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import core as pc
from prometheus_client import openmetrics
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Exemplar

from lockstep.agent import families as ours
from lockstep.agent.exposition import go_float, render_openmetrics, render_text
from tests.support import REPO

GOLDEN = sorted((REPO / "tests" / "golden").glob("demo-*.prom"))


class Registry:
    """Just enough of a registry for prometheus_client's encoders."""

    def __init__(self, families: list[Any]) -> None:
        self.families = families

    def collect(self) -> list[Any]:
        return self.families


def theirs(families: list[Any]) -> tuple[bytes, bytes]:
    registry = Registry(families)
    return generate_latest(registry), openmetrics.exposition.generate_latest(registry)


def rendered(families: list[Any]) -> tuple[bytes, bytes]:
    return render_text(families), render_openmetrics(families)


@pytest.mark.parametrize("golden", GOLDEN, ids=lambda p: p.stem)
def test_every_scenarios_families_render_as_prometheus_client_renders_them(golden: Path) -> None:
    """The families of each scenario's exposition (its values that vary between runs made a
    number), rendered by both."""
    families = list(text_string_to_metric_families(golden.read_text().replace("<varies>", "1234567.5")))
    assert len(families) > 10
    assert rendered(families) == theirs(families)


def both(build: Any) -> tuple[Any, Any]:
    """A family built the same way from each module's classes."""
    return build(ours), build(pc)


HOSTILE = 'back\\slash "quoted" new\nline é ☃ \t tab'
CASES: dict[str, Any] = {
    "gauge with hostile help and label values": lambda m: _gauge(m, HOSTILE),
    "special values": lambda m: _values(m),
    "counter with created and a timestamp": lambda m: _counter(m),
    "histogram": lambda m: _histogram(m, [("0.5", 1), ("1.0", 3), ("+Inf", 4)], 2.5),
    "histogram with a negative bucket": lambda m: _histogram(m, [("-1.0", 1), ("+Inf", 2)], 1.0),
    "unknown with a unit": lambda m: _unknown(m),
}


def _gauge(m: Any, text: str) -> Any:
    family = m.GaugeMetricFamily("lockstep_test_things", text, labels=["a", "b"])
    family.add_metric([text, ""], 1)
    family.add_metric(["x", "y"], 2.5)
    return family


def _values(m: Any) -> Any:
    family = m.GaugeMetricFamily("lockstep_test_values", "values", labels=["v"])
    for i, value in enumerate([math.inf, -math.inf, math.nan, 1e21, 123456789.0, 1234567.0, -0.0, 0, 10**20, 1e-7]):
        family.add_metric([str(i)], value)
    return family


def _counter(m: Any) -> Any:
    family = m.CounterMetricFamily("lockstep_test_reads_total", "reads", labels=["dev"], unit="")
    family.add_metric(["sda"], 7, created=1700000000.25)
    family.add_metric(["sdb"], 8, timestamp=1700000001.5)
    return family


def _histogram(m: Any, buckets: list[tuple[str, float]], total: float) -> Any:
    family = m.HistogramMetricFamily("lockstep_test_latency", "latency", labels=["op"], unit="seconds")
    family.add_metric(["read"], buckets, total)
    return family


def _unknown(m: Any) -> Any:
    family = m.UnknownMetricFamily("lockstep_test_stat", "a driver's statistic", labels=["nic"], unit="bytes")
    family.add_metric(["eth0"], 3)
    return family


@pytest.mark.parametrize("case", list(CASES))
def test_each_kind_of_family_renders_as_prometheus_client_renders_it(case: str) -> None:
    mine, reference = both(CASES[case])
    assert (mine.name, mine.type, mine.unit, mine.samples) == (
        reference.name,
        reference.type,
        reference.unit,
        [tuple(s) for s in reference.samples],
    )
    assert rendered([mine]) == theirs([reference])


def test_what_only_a_third_party_family_holds_renders_as_prometheus_client_renders_it() -> None:
    """Names outside the legacy set (prometheus_client's families accept them), an info and a
    state set, an exemplar: each as prometheus_client writes it."""
    odd = pc.Metric("lockstep_test_odd", "odd", "gauge")
    odd.add_sample("lockstep_test:odd", {"bad-label": "v", "0digit": "w"}, 1)
    info = pc.InfoMetricFamily("lockstep_test_build", "build", value={"version": "1"})
    states = pc.StateSetMetricFamily("lockstep_test_state", "state", value={"a": True, "b": False})
    counter = pc.CounterMetricFamily("lockstep_test_events", "events", labels=["k"])
    counter.add_metric(["v"], 3, exemplar=Exemplar({"trace_id": 'a"b'}, 1.0, 1700000000.5))
    for family in (odd, info, states, counter):
        assert rendered([family]) == theirs([family])


def test_a_name_outside_the_legacy_set_is_refused_where_the_family_is_made() -> None:
    with pytest.raises(ValueError, match="invalid metric name lockstep-test"):
        ours.GaugeMetricFamily("lockstep-test", "x")
    with pytest.raises(ValueError, match="Invalid metric type: bogus"):
        ours.Metric("lockstep_test", "x", "bogus")


def test_values_are_written_as_go_writes_them() -> None:
    assert [go_float(v) for v in (math.inf, -math.inf, math.nan, 1e21, 1234567.0, 123456.0, 2, 0.1)] == [
        "+Inf",
        "-Inf",
        "NaN",
        "1e+21",
        "1.234567e+06",
        "123456.0",
        "2.0",
        "0.1",
    ]
