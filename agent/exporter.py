"""Turns the workers' latest snapshots, plus the agent's self-metrics, into an exposition.

This is the whole scrape path: it reads one immutable view per worker and renders.
No collector code, file or hardware access happens here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

from lockstep import __version__
from lockstep.agent.collector import MetricSpec
from lockstep.agent.exposition import (
    CONTENT_TYPE_OPENMETRICS,
    CONTENT_TYPE_TEXT,
    render_openmetrics,
    render_text,
)
from lockstep.agent.families import Metric
from lockstep.agent.logs import collector_logger
from lockstep.agent.scheduler import HEALTHY_STATES, State, WorkerView

BUILD_INFO = MetricSpec("lockstep_build_info", "gauge", "The running Lockstep agent's version; always 1.", ("version",))
COLLECTOR_UP = MetricSpec(
    "lockstep_collector_up",
    "gauge",
    "1 when the collector's last run succeeded or found nothing to collect on this machine; "
    "0 when it failed, is stuck past its deadline, or has not run yet.",
    ("collector",),
)
COLLECTOR_STATE = MetricSpec(
    "lockstep_collector_state",
    "gauge",
    "The collector's state, one series per state, 1 for the current one (ok, nothing_here, failed, stuck, never_ran).",
    ("collector", "state"),
)
COLLECTOR_DURATION = MetricSpec(
    "lockstep_collector_duration_seconds",
    "gauge",
    "How long the collector's last run took; while a run is stuck, how long it has been running.",
    ("collector",),
    unit="seconds",
)
COLLECTOR_LAST_SUCCESS = MetricSpec(
    "lockstep_collector_last_success_timestamp_seconds",
    "gauge",
    "Unix time the collector's last successful run finished (absent until one has).",
    ("collector",),
    unit="seconds",
)
COLLECTOR_ERRORS = MetricSpec(
    "lockstep_collector_errors_total",
    "counter",
    "Runs of the collector that failed or overran their deadline.",
    ("collector",),
)
COLLECTOR_RUNS = MetricSpec(
    "lockstep_collector_runs_total", "counter", "Finished runs of the collector.", ("collector",)
)
COLLECTOR_REJECTED = MetricSpec(
    "lockstep_collector_rejected_samples_total",
    "counter",
    "Samples the collector produced that were left out because their value or labels were outside "
    "their domain (not a finite number, a negative counter, a label that is not a string, a repeated series).",
    ("collector",),
)
COLLECTOR_ALTERED_LABELS = MetricSpec(
    "lockstep_collector_altered_label_values_total",
    "counter",
    "Samples the collector produced that were served with a label value made safe: characters UTF-8 "
    "cannot encode backslash-escaped, a value over 4096 characters cut and ended with a hash of the whole "
    "(docs/security.md).",
    ("collector",),
)
COLLECTOR_CPU = MetricSpec(
    "lockstep_collector_cpu_seconds_total",
    "counter",
    "CPU time the collector's worker thread spent in its finished runs.",
    ("collector",),
    unit="seconds",
)

SELF_METRICS = (
    BUILD_INFO,
    COLLECTOR_UP,
    COLLECTOR_STATE,
    COLLECTOR_DURATION,
    COLLECTOR_LAST_SUCCESS,
    COLLECTOR_ERRORS,
    COLLECTOR_RUNS,
    COLLECTOR_CPU,
    COLLECTOR_REJECTED,
    COLLECTOR_ALTERED_LABELS,
)


@dataclass(frozen=True)
class ExpositionFormat:
    """One format the endpoint serves: what it is called, its Content-Type, and its encoder."""

    name: str
    content_type: str
    encoder: Callable[[list[Metric]], bytes]


# The formats served, and nothing else (each is one cached rendering per snapshot).  Names are
# rendered with the default escaping (underscores) whatever "escaping=" a scraper asks for, and
# the Content-Type does not echo one: the agent's names are legacy Prometheus names, which that
# escaping leaves as they are, so a scraper asking for allow-utf-8 gets exactly what it would
# have; serving dots or values escaping as well would be more renderings for no agent name.
TEXT_FORMAT = ExpositionFormat("text 0.0.4", CONTENT_TYPE_TEXT, render_text)
OPENMETRICS_FORMAT = ExpositionFormat("openmetrics 1.0.0", CONTENT_TYPE_OPENMETRICS, render_openmetrics)
SUPPORTED_FORMATS = (TEXT_FORMAT, OPENMETRICS_FORMAT)


def negotiate_format(accept_header: str) -> ExpositionFormat:
    """The format to answer an Accept header with: OpenMetrics 1.0.0 or the text format.

    Done here rather than by prometheus_client's choose_encoder, which raises TypeError on a
    version it cannot parse ("version=1.x") and takes any other version at its word
    ("version=1.0.0.<anything>", each a Content-Type of its own).  As choose_encoder does, the
    first acceptable entry wins (Prometheus lists its entries best first; q-values are not read).
    A text/plain entry of any version gets the text format.  An OpenMetrics entry counts when it
    names version 1.0.0 or none; any other version, parsable or not, is skipped, and when nothing
    counts the answer is the text format, never 406: that is what
    prometheus_client does for a version below 1.0.0 and what client_golang's
    NegotiateIncludingOpenMetrics does for every version it does not know, and a scraper always
    accepts the text format (Prometheus parses a response by its Content-Type).
    """
    for entry in accept_header.split(","):
        media_type, *params = entry.split(";")
        media_type = media_type.strip().lower()
        if media_type == "text/plain":
            return TEXT_FORMAT
        if media_type != "application/openmetrics-text":
            continue
        versions = [
            value.strip() for name, _, value in (p.partition("=") for p in params) if name.strip().lower() == "version"
        ]
        if not versions or versions[0] == "1.0.0":
            return OPENMETRICS_FORMAT
    return TEXT_FORMAT


class SnapshotExporter:
    """Renders the agent's workers' latest snapshots and self-metrics for a scrape.

    ``views`` is called once per scrape and returns the workers' current views; the
    daemon swaps its set of workers on reload, so the exporter asks each time.
    """

    def __init__(self, views: Callable[[], list[WorkerView]]) -> None:
        self._views = views
        # Collectors whose snapshot cannot be rendered, and why: logged once per change.
        self._render_failures: dict[str, str] = {}

    def render(self, accept_header: str = "") -> tuple[bytes, str]:
        """The exposition body and its content type, in the format the scraper asked for.

        Self-metrics are rendered on every scrape (a stuck run's duration grows); each
        collector's snapshot is rendered once per format and reused until it is replaced.
        Rendering is most of a scrape's cost (a few µs per series), so this keeps scrape
        latency flat however many series the collectors export.
        """
        # The caches below are keyed by the format negotiated, never by the raw header: a
        # client varying its Accept header gets one of SUPPORTED_FORMATS, so each snapshot holds
        # at most that many renderings (one per distinct header grew memory without bound).
        exposition_format = negotiate_format(accept_header)
        encoder, cache_key = exposition_format.encoder, exposition_format.name
        views = sorted(self._views(), key=lambda v: v.name)
        parts = []
        failures: dict[str, str] = {}
        for view in views:
            snapshot = view.snapshot
            if snapshot is None:
                continue
            text = snapshot.rendered.get(cache_key)
            if text is None:
                try:
                    text = encoder(list(snapshot.families))
                except Exception:
                    # One collector's bad family must not blank the whole scrape: leave that
                    # collector's families out and report it failed.
                    snapshot.render_errors[cache_key] = _render_problem(encoder, snapshot.families)
                    text = b""
                snapshot.rendered[cache_key] = text
            if cache_key in snapshot.render_errors:
                failures[view.name] = snapshot.render_errors[cache_key]
                continue
            parts.append(text)
        self._log_render_failures(failures)
        parts.insert(0, encoder(list(self_metrics(views, failures))))
        if exposition_format is OPENMETRICS_FORMAT:
            # Each part ends with the format's "# EOF" line; the whole exposition has one.
            parts = [part.removesuffix(b"# EOF\n") for part in parts] + [b"# EOF\n"]
        return b"".join(parts), exposition_format.content_type

    def _log_render_failures(self, failures: dict[str, str]) -> None:
        for name, reason in failures.items():
            if self._render_failures.get(name) != reason:
                collector_logger(name).error("collector failed: %s", reason)
        # Concurrent scrapes may both log one change; a lock on the scrape path is not worth it.
        self._render_failures = failures


def _render_problem(encoder: Callable[[list[Metric]], bytes], families: Iterable[Metric]) -> str:
    """Which family cannot be rendered, and why (the renderers wrap the cause with the whole
    family in its arguments, as prometheus_client's do: far too long for a log line)."""
    for family in families:
        try:
            encoder([family])
        except Exception as exc:
            cause = exc.args[0] if exc.args and isinstance(exc.args[0], str) else str(exc)
            return f"metric {family.name} cannot be rendered: {type(exc).__name__}: {cause}"
    return "its metrics cannot be rendered together"


def self_metrics(views: Iterable[WorkerView], render_failures: Mapping[str, str] = {}) -> Iterator[Metric]:
    """The agent's own metrics; a collector in ``render_failures`` is reported failed."""
    build = BUILD_INFO.family()
    build.add_metric([__version__], 1)
    up, state, duration, last_success, errors, runs, cpu, rejected, altered = (
        spec.family() for spec in SELF_METRICS[1:]
    )
    for view in views:
        current = State.FAILED if view.name in render_failures else view.state
        up.add_metric([view.name], 1 if current in HEALTHY_STATES else 0)
        for candidate in State:
            state.add_metric([view.name, candidate.value], 1 if current == candidate else 0)
        if view.duration_seconds is not None:
            duration.add_metric([view.name], view.duration_seconds)
        if view.last_success_wall_time is not None:
            last_success.add_metric([view.name], view.last_success_wall_time)
        errors.add_metric([view.name], view.errors_total)
        runs.add_metric([view.name], view.runs_total)
        cpu.add_metric([view.name], view.cpu_seconds_total)
        rejected.add_metric([view.name], view.rejected_samples_total)
        altered.add_metric([view.name], view.altered_label_values_total)
    yield from (build, up, state, duration, last_success, errors, runs, cpu, rejected, altered)
