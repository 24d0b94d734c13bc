"""The check every sample passes before a scrape (agent/samples.py, agent/exporter.py): values outside
their domain are left out and counted, label values are made safe, and one family that cannot be
rendered fails its own collector only, never the scrape."""

from __future__ import annotations

import hashlib
import logging
import math
import time
from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lockstep.agent.collector import Collector, MetricSpec
from lockstep.agent.exporter import SnapshotExporter
from lockstep.agent.exposition import render_text
from lockstep.agent.families import CounterMetricFamily, GaugeMetricFamily, Metric
from lockstep.agent.samples import MAX_LABEL_VALUE_CHARS, TRUNCATED_MARK, checked_families, safe_label_value
from lockstep.agent.scheduler import Snapshot, State, Worker, WorkerView
from tests.support import (
    GENERATED,
    collector_up,
    context,
    samples,
    wait_until,
)

# --- the exporter: one family that cannot be rendered never blanks the scrape ---


def _view(name: str, families: list[Metric]) -> WorkerView:
    return WorkerView(
        name=name,
        state=State.OK,
        reason="",
        duration_seconds=0.01,
        last_success_wall_time=1.0,
        errors_total=0,
        runs_total=1,
        cpu_seconds_total=0.0,
        snapshot=Snapshot(tuple(families), finished_at=time.monotonic()),
    )


def test_an_unrenderable_family_fails_its_collector_only(caplog: pytest.LogCaptureFixture) -> None:
    # Built past the worker's check (a snapshot made by hand): the exporter's own guard.
    bad = CounterMetricFamily("lockstep_bad", "Too large.", labels=["device"])
    bad.add_metric(["mlx5_0"], 10**400)  # float() of it raises OverflowError
    good = GaugeMetricFamily("lockstep_good", "Fine.")
    good.add_metric([], 7)
    views = [_view("fabric", [bad]), _view("host", [good])]
    exporter = SnapshotExporter(lambda: views)
    with caplog.at_level(logging.ERROR):
        for accept in ("", "application/openmetrics-text; version=1.0.0", "", ""):
            body, _ = exporter.render(accept)
    text = exporter.render()[0].decode()
    assert samples(text)[("lockstep_good", frozenset())] == 7
    assert "lockstep_bad" not in text
    assert collector_up(text, "fabric") == 0 and collector_up(text, "host") == 1
    assert samples(text)[("lockstep_collector_state", frozenset({("collector", "fabric"), ("state", "failed")}))] == 1
    errors = [r.getMessage() for r in caplog.records if r.name == "lockstep.collector.fabric"]
    # Once per change, not per scrape: both formats fail for the same reason.
    assert (
        errors[0]
        == "collector failed: metric lockstep_bad cannot be rendered: OverflowError: int too large to convert to float"
    )
    assert len(errors) == 1


# --- the worker's domain check, for every collector ---

TOY_COUNTER = MetricSpec("lockstep_toy_events_total", "counter", "Toy events.", ("source",))
TOY_GAUGE = MetricSpec("lockstep_toy_level", "gauge", "Toy level.", ("source", "note"))


class Liar(Collector):
    """Reports what it is told: values outside every domain among good ones."""

    name = "liar"
    metrics = (TOY_COUNTER, TOY_GAUGE)

    def collect(self) -> Iterator[Metric]:
        counter, gauge = TOY_COUNTER.family(), TOY_GAUGE.family()
        counter.add_metric(["good"], 5)
        counter.add_metric(["huge"], 10**400)
        counter.add_metric(["negative"], -100)
        counter.add_metric(["infinite"], 1e308 * 10)
        counter.add_metric(["good"], 6)  # a repeated series: the first is kept
        gauge.add_metric(["nan", ""], math.nan)
        gauge.add_metric(["big-label", "x" * (MAX_LABEL_VALUE_CHARS + 1)], 1)
        gauge.add_metric(["negative", ""], -3)  # a gauge may be negative
        return iter([counter, gauge])


def test_samples_outside_their_domain_are_left_out_counted_and_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    worker = Worker(Liar(context()), interval=0.1, deadline=1, staleness_intervals=3, log=logging.getLogger("t"))
    with caplog.at_level(logging.WARNING, logger="t"):
        worker.start()
        wait_until(lambda: worker.view().runs_total >= 3, what="three rounds")
        worker.stop()
        worker.join(5)
    view = worker.view()
    assert view.state == State.OK
    text = SnapshotExporter(lambda: [view]).render()[0].decode()
    s = samples(text)
    assert s[("lockstep_toy_events_total", frozenset({("source", "good")}))] == 5
    assert s[("lockstep_toy_level", frozenset({("source", "negative"), ("note", "")}))] == -3
    # A label over the cap is cut (with a hash of the whole), not a reason to lose the sample.
    cut = "x" * (MAX_LABEL_VALUE_CHARS - 26) + "...sha256:" + hashlib.sha256(b"x" * 4097).hexdigest()[:16]
    assert s[("lockstep_toy_level", frozenset({("source", "big-label"), ("note", cut)}))] == 1
    toy = {labels for name, labels in s if name.startswith("lockstep_toy")}
    assert len(toy) == 3
    assert view.rejected_samples_total == 5 * view.runs_total
    assert s[("lockstep_collector_rejected_samples_total", frozenset({("collector", "liar")}))] == 5 * view.runs_total
    assert s[("lockstep_collector_altered_label_values_total", frozenset({("collector", "liar")}))] == view.runs_total
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 2  # once per change, not once per round
    assert warnings[1].startswith("made safe 1 label values: lockstep_toy_level{note=xxxx")
    assert warnings[1].endswith(": label note cut from 4097 characters to 4096")
    assert warnings[0].startswith(
        "left out 5 samples outside their domain: lockstep_toy_events_total{source=huge}: value "
        "100000000000000000000000000000000000000000000000000000000000... (401 chars) is too large for a 64-bit float; "
        "lockstep_toy_events_total{source=negative}: value -100 is negative (a counter never is); "
        "lockstep_toy_events_total{source=infinite}: value inf is not a finite number (and 2 more)"
    )


sample_values = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(10**400), max_value=10**400),
    st.text(max_size=5),
    st.none(),
)


@GENERATED
@given(st.lists(st.tuples(st.sampled_from(["counter", "gauge"]), st.text(max_size=8), sample_values), max_size=12))
def test_any_sample_values_render_after_the_domain_check(rows: list[tuple[str, str, object]]) -> None:
    families = []
    for kind, label, number in rows:
        family = (CounterMetricFamily if kind == "counter" else GaugeMetricFamily)(
            f"lockstep_gen_{kind}", "Generated.", labels=["l"]
        )
        family.add_metric([label], number)  # type: ignore[arg-type]
        families.append(family)
    checked, _ = checked_families(families)
    text = render_text(list(checked)).decode()  # never raises
    for (name, _labels), value in samples(text).items():
        assert math.isfinite(value)
        assert value >= 0 or not name.endswith("_total")


# --- item 14: a label over the 4,096-character cap ---


def test_a_value_over_the_cap_is_cut_with_a_hash_of_the_whole() -> None:
    long_a, long_b = "a" * 5000, "a" * 4999 + "b"  # differ only past the cap
    cut_a, cut_b = safe_label_value(long_a), safe_label_value(long_b)
    assert len(cut_a) == len(cut_b) == MAX_LABEL_VALUE_CHARS
    digest = hashlib.sha256(long_a.encode()).hexdigest()[:16]
    assert cut_a == "a" * (MAX_LABEL_VALUE_CHARS - 26) + TRUNCATED_MARK + digest
    assert cut_a != cut_b  # two values, two series
    assert safe_label_value("x" * MAX_LABEL_VALUE_CHARS) == "x" * MAX_LABEL_VALUE_CHARS  # at the cap: as it is
    assert safe_label_value("caf\u00e9 \ud800") == "caf\u00e9 \\ud800"  # UTF-8 is kept, a surrogate escaped
