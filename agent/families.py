"""Metric families as collectors build them: the agent's own, in place of prometheus_client's.

Why not prometheus_client's classes (issue 47): importing any module of that package runs its
`__init__`, which loads its HTTP servers and clients (`http.server`, `wsgiref`, `urllib.request`)
and `ssl`: 12 MiB of the agent's resident memory on every node, for a few small classes and two
renderers the agent uses.  These classes keep prometheus_client's interface (0.26: the
constructors, `add_metric`, `add_sample`, `name`, `documentation`, `type`, `unit`, `samples`), so
a collector written against prometheus_client's families works unchanged, and the renderers
(lockstep/agent/exposition.py) render either kind byte for byte as prometheus_client does
(tests/agent/test_exposition.py compares them on every simulated scenario).  prometheus_client
is still what the inference collector parses servers' expositions with, imported only there.

A name is checked as a legacy Prometheus name ([a-zA-Z_:][a-zA-Z0-9_:]*): the agent exports no
other, and a name that is not one is a collector's bug, raised where the family is made.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, NamedTuple

METRIC_TYPES = ("counter", "gauge", "summary", "histogram", "gaugehistogram", "unknown", "info", "stateset")
_LEGACY_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


class Sample(NamedTuple):
    name: str
    labels: dict[str, str]
    value: float
    timestamp: float | None = None
    exemplar: Any = None  # (never set by the agent; kept for prometheus_client's shape)
    native_histogram: Any = None


class Metric:
    """A metric family and its samples."""

    def __init__(self, name: str, documentation: str, typ: str, unit: str = "") -> None:
        if unit and not name.endswith("_" + unit):
            name += "_" + unit
        if not _LEGACY_NAME.fullmatch(name):
            raise ValueError(f"invalid metric name {name}")
        if typ == "untyped":
            typ = "unknown"
        if typ not in METRIC_TYPES:
            raise ValueError(f"Invalid metric type: {typ}")
        self.name = name
        self.documentation = documentation
        self.unit = unit
        self.type = typ
        self.samples: list[Sample] = []

    def add_sample(self, name: str, labels: dict[str, str], value: float, timestamp: float | None = None) -> None:
        self.samples.append(Sample(name, labels, value, timestamp))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Metric) and (self.name, self.documentation, self.type, self.unit, self.samples) == (
            other.name,
            other.documentation,
            other.type,
            other.unit,
            other.samples,
        )

    def __repr__(self) -> str:
        return f"Metric({self.name}, {self.documentation}, {self.type}, {self.unit}, {self.samples})"


class _Labelled(Metric):
    """A family whose samples are added by their label values, in the order of its label names."""

    def __init__(self, name: str, documentation: str, typ: str, labels: Sequence[str] | None, unit: str) -> None:
        super().__init__(name, documentation, typ, unit)
        self._labelnames = tuple(labels or ())

    def _labels(self, values: Sequence[str]) -> dict[str, str]:
        return dict(zip(self._labelnames, values))


class GaugeMetricFamily(_Labelled):
    TYPE = "gauge"

    def __init__(
        self,
        name: str,
        documentation: str,
        value: float | None = None,
        labels: Sequence[str] | None = None,
        unit: str = "",
    ) -> None:
        if labels is not None and value is not None:
            raise ValueError("Can only specify at most one of value and labels.")
        super().__init__(name, documentation, self.TYPE, labels, unit)
        if value is not None:
            self.add_metric([], value)

    def add_metric(self, labels: Sequence[str], value: float, timestamp: float | None = None) -> None:
        self.samples.append(Sample(self.name, self._labels(labels), value, timestamp))


class UnknownMetricFamily(GaugeMetricFamily):
    """Values whose kind the agent cannot know (a NIC driver's statistics): a gauge's interface."""

    TYPE = "unknown"


class CounterMetricFamily(_Labelled):
    def __init__(
        self,
        name: str,
        documentation: str,
        value: float | None = None,
        labels: Sequence[str] | None = None,
        created: float | None = None,
        unit: str = "",
    ) -> None:
        if labels is not None and value is not None:
            raise ValueError("Can only specify at most one of value and labels.")
        # The family is named without "_total"; its samples with it (OpenMetrics).
        super().__init__(name.removesuffix("_total"), documentation, "counter", labels, unit)
        if value is not None:
            self.add_metric([], value, created)

    def add_metric(
        self, labels: Sequence[str], value: float, created: float | None = None, timestamp: float | None = None
    ) -> None:
        self.samples.append(Sample(self.name + "_total", self._labels(labels), value, timestamp))
        if created is not None:
            self.samples.append(Sample(self.name + "_created", self._labels(labels), created, timestamp))


class HistogramMetricFamily(_Labelled):
    def __init__(
        self,
        name: str,
        documentation: str,
        buckets: Sequence[tuple[str, float]] | None = None,
        sum_value: float | None = None,
        labels: Sequence[str] | None = None,
        unit: str = "",
    ) -> None:
        if sum_value is not None and buckets is None:
            raise ValueError("sum value cannot be provided without buckets.")
        if labels is not None and buckets is not None:
            raise ValueError("Can only specify at most one of buckets and labels.")
        super().__init__(name, documentation, "histogram", labels, unit)
        if buckets is not None:
            self.add_metric([], buckets, sum_value)

    def add_metric(
        self,
        labels: Sequence[str],
        buckets: Sequence[tuple[str, float]],
        sum_value: float | None,
        timestamp: float | None = None,
    ) -> None:
        """Buckets are (upper bound as text, cumulative count), sorted, "+Inf" last."""
        for bound, count in buckets:
            self.samples.append(Sample(self.name + "_bucket", {**self._labels(labels), "le": bound}, count, timestamp))
        # No sum (nor count) where a bucket is negative (OpenMetrics), as prometheus_client does.
        if float(buckets[0][0]) >= 0 and sum_value is not None:
            self.samples.append(Sample(self.name + "_count", self._labels(labels), buckets[-1][1], timestamp))
            self.samples.append(Sample(self.name + "_sum", self._labels(labels), sum_value, timestamp))
