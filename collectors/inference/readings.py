"""An engine's /metrics answer read into normalised values: the exposition parsed into
samples by name, and the helpers the engine parsers (engines/) combine them with."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families


class ScrapeError(Exception):
    """Why a target gave no usable answer, in words for the operator."""


@dataclass
class Histogram:
    buckets: dict[float, float] = field(default_factory=dict)  # upper bound -> cumulative count
    sum: float = 0.0


@dataclass
class Reading:
    """One model's normalised values; None where the engine has no such metric."""

    kv_cache_usage: float | None = None
    waiting: float | None = None
    running: float | None = None
    preemptions: float | None = None
    prefix_hits: float | None = None
    prefix_queries: float | None = None
    ttft: Histogram | None = None
    itl: Histogram | None = None
    prompt_tokens: float | None = None
    generation_tokens: float | None = None
    finished: dict[str, float] | None = None  # reason (one of FINISH_REASONS) -> requests
    e2e_latency: Histogram | None = None
    queue_time: Histogram | None = None


class Samples:
    """An exposition's samples by name.  ``*_created`` samples (creation times that
    OpenMetrics-style exporters put next to counters and histograms) are not data."""

    def __init__(self, text: str) -> None:
        self.by_name: dict[str, list[tuple[dict[str, str], float]]] = defaultdict(list)
        try:
            for family in text_string_to_metric_families(text):
                for sample in family.samples:
                    if not sample.name.endswith("_created"):
                        self.by_name[sample.name].append((sample.labels, sample.value))
        except (ValueError, TypeError, IndexError) as exc:
            raise ScrapeError(f"not Prometheus text exposition: {exc}") from None

    def first(self, *names: str) -> list[tuple[dict[str, str], float]]:
        """The samples of the first of ``names`` present (current name, then older ones)."""
        for name in names:
            if name in self.by_name:
                return self.by_name[name]
        return []

    def where(self, name: str, **labels: str) -> list[tuple[dict[str, str], float]]:
        return [(have, v) for have, v in self.by_name.get(name, []) if all(have.get(k) == x for k, x in labels.items())]

    def has_prefix(self, prefix: str) -> bool:
        return any(name.startswith(prefix) for name in self.by_name)


def per_model(
    samples: Iterable[tuple[dict[str, str], float]], model_label: str | None, combine: Callable[..., float] = sum
) -> dict[str, float]:
    """Values by model ("" when the engine has no model label), NaNs dropped; series of
    one model (data-parallel replicas, other labels) combined with ``combine``."""
    groups: dict[str, list[float]] = defaultdict(list)
    for labels, value in samples:
        if not math.isnan(value):
            groups[labels.get(model_label, "") if model_label else ""].append(value)
    return {model: combine(values) for model, values in groups.items()}


def histograms(s: Samples, names: Sequence[str], model_label: str | None) -> dict[str, Histogram]:
    """The first present histogram of ``names``, per model, replicas' buckets added up."""
    for name in names:
        buckets = s.by_name.get(f"{name}_bucket")
        if buckets:
            break
    else:
        return {}
    found: dict[str, Histogram] = defaultdict(Histogram)
    for labels, value in buckets:
        try:
            bound = float(labels["le"])
        except (KeyError, ValueError):
            continue
        model = labels.get(model_label, "") if model_label else ""
        h = found[model]
        h.buckets[bound] = h.buckets.get(bound, 0.0) + value
    for model, total in per_model(s.by_name.get(f"{name}_sum", []), model_label).items():
        if model in found:
            found[model].sum = total
    return {model: h for model, h in found.items() if math.inf in h.buckets}


# Why a request ended, in Lockstep's words: the engine's stop condition (EOS or a stop
# string), its length limit, the client or server gave up on it, or it failed.
FINISH_REASONS = ("stop", "length", "abort", "error")


def finished_by_reason(
    samples: Iterable[tuple[dict[str, str], float]],
    model_label: str | None,
    reason_of: Callable[[dict[str, str]], str | None],
) -> dict[str, dict[str, float]]:
    """Finished requests per model and reason; ``reason_of`` maps a sample's labels to one of
    FINISH_REASONS, or None for a sample that is no finished request of ours (skipped)."""
    found: dict[str, dict[str, float]] = defaultdict(dict)
    for labels, value in samples:
        reason = reason_of(labels)
        if reason is None or math.isnan(value):
            continue
        model = labels.get(model_label, "") if model_label else ""
        found[model][reason] = found[model].get(reason, 0.0) + value
    return dict(found)


def histogram_sums(s: Samples, name: str, model_label: str | None) -> dict[str, float]:
    """The ``_sum`` of a histogram per model: the running total of what it observed (a
    per-request token-count histogram's sum is the engine's token counter)."""
    return per_model(s.by_name.get(f"{name}_sum", []), model_label)


def ratio(numerator: dict[str, float], denominator: dict[str, float]) -> dict[str, float]:
    return {m: numerator[m] / denominator[m] for m in numerator if denominator.get(m, 0) > 0}


def readings_by_model(**fields: dict[str, Any]) -> dict[str, Reading]:
    """Each field's values by model gathered into one Reading per model (KV-cache usage clamped to 0..1)."""
    readings: dict[str, Reading] = {}
    for name, values in fields.items():
        for model, value in values.items():
            if name == "kv_cache_usage":
                value = min(1.0, max(0.0, value))
            setattr(readings.setdefault(model, Reading()), name, value)
    return readings
