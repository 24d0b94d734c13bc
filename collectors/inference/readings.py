"""An engine's /metrics answer read into normalised values: the exposition parsed into
samples by name, and the helpers the engine parsers (engines/) combine them with."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

# Parsed, a body takes ~20 times its size in Python objects, so only the engine's own series
# (its prefix) are parsed, at most MAX_SERIES of them (fetch.py caps the body).
MAX_SERIES = 10_000


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
    OpenMetrics-style exporters put next to counters and histograms) are not data.

    With ``prefix``, only the series whose names start with it are parsed (the engine's own;
    its process_* and python_* series are most of a body and never read), at most MAX_SERIES.
    Every value read is a count, ratio or duration: one that is not a finite number of at
    least 0 (``+Inf``, ``-100``) is left out and counted in ``rejected``, with an example in
    ``rejected_example``.  A series that appears twice is not valid exposition: the answer is
    refused (summing the two, as before, made up a value).
    """

    def __init__(self, text: str, prefix: str = "") -> None:
        self.by_name: dict[str, list[tuple[dict[str, str], float]]] = defaultdict(list)
        self.rejected = 0
        self.rejected_example = ""
        if prefix:
            text = _only_prefixed(text, prefix)
        seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
        try:
            for family in text_string_to_metric_families(text):
                for sample in family.samples:
                    if sample.name.endswith("_created"):
                        continue
                    key = (sample.name, tuple(sorted(sample.labels.items())))
                    if key in seen:
                        raise ScrapeError(
                            f"series {_series(sample.name, sample.labels)} appears twice: not valid exposition"
                        )
                    seen.add(key)
                    if not (math.isfinite(sample.value) and sample.value >= 0):
                        self.rejected += 1
                        self.rejected_example = f"{_series(sample.name, sample.labels)} = {sample.value}"
                        continue
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


def _only_prefixed(text: str, prefix: str) -> str:
    """The lines of the series whose names start with ``prefix`` (and their # HELP/# TYPE
    lines); ScrapeError past MAX_SERIES such series."""
    kept = []
    series = 0
    for line in text.splitlines():
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 3 and parts[2].startswith(prefix):
                kept.append(line)
        elif line.startswith(prefix):
            series += 1
            if series > MAX_SERIES:
                raise ScrapeError(f"more than {MAX_SERIES} {prefix}* series in the answer")
            kept.append(line)
    return "\n".join(kept) + "\n"


def _series(name: str, labels: dict[str, str]) -> str:
    shown = ",".join(f'{k}="{v[:40]}"' for k, v in sorted(labels.items()))
    return f"{name}{{{shown}}}"


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
    """The first present histogram of ``names``, per model, replicas' buckets added up.

    Each of the engine's histogram series (one label set but ``le``) is checked first, and
    one that is not a valid histogram is left out and counted in ``s.rejected``: a bound that
    is not a number, is NaN or negative (``-Inf``; a duration never is, and OpenMetrics allows
    no negative bucket beside a ``_sum``), a bound given twice (``1`` and ``1.0``, ``1e400`` and
    ``+Inf``: the same bucket, which were added up), no ``+Inf`` bucket, or cumulative counts
    that decrease.  A model whose replicas' buckets do not add up to a valid histogram (bounds
    that differ between replicas) is left out too.  What is re-exported is always valid
    OpenMetrics.
    """
    for name in names:
        buckets = s.by_name.get(f"{name}_bucket")
        if buckets:
            break
    else:
        return {}
    series: dict[tuple[tuple[str, str], ...], dict[float, float]] = defaultdict(dict)
    refused: dict[tuple[tuple[str, str], ...], str] = {}
    for labels, value in buckets:
        key = tuple(sorted((k, v) for k, v in labels.items() if k != "le"))
        bound, problem = _bucket_bound(labels.get("le"))
        if not problem and bound in series[key]:
            problem = f'bound le="{labels["le"]}" repeats a bucket already given'
        if problem:
            refused.setdefault(key, problem)
            continue
        series[key][bound] = value
    found: dict[str, Histogram] = defaultdict(Histogram)
    for key, bounds in series.items():
        problem = refused.get(key) or _histogram_problem(bounds)
        if problem:
            refused.setdefault(key, problem)
            continue
        model = dict(key).get(model_label, "") if model_label else ""
        h = found[model]
        for bound, value in bounds.items():
            h.buckets[bound] = h.buckets.get(bound, 0.0) + value
    for model, h in list(found.items()):
        problem = _histogram_problem(h.buckets)
        if problem:
            del found[model]
            refused[((model_label or "model", model),)] = f"its replicas' buckets differ: {problem}"
    for key, problem in refused.items():
        s.rejected += 1
        s.rejected_example = f"histogram {_series(name, dict(key))}: {problem}"
    for model, total in per_model(s.by_name.get(f"{name}_sum", []), model_label).items():
        if model in found:
            found[model].sum = total
    return dict(found)


def _bucket_bound(le: str | None) -> tuple[float, str]:
    """A bucket's upper bound, and "" if it is one; else (0, why not)."""
    if le is None:
        return 0.0, "a bucket has no le label"
    try:
        bound = float(le)
    except ValueError:
        return 0.0, f'bound le="{le[:40]}" is not a number'
    if math.isnan(bound) or bound < 0:
        return 0.0, f'bound le="{le[:40]}" is not a number of at least 0'
    return bound, ""


def _histogram_problem(buckets: dict[float, float]) -> str:
    """Why cumulative ``buckets`` (bound -> count) are not a histogram, or ""."""
    if math.inf not in buckets:
        return "no +Inf bucket"
    counts = [count for _, count in sorted(buckets.items())]
    if any(later < earlier for earlier, later in zip(counts, counts[1:])):
        return "cumulative counts decrease as the bound grows"
    return ""


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
