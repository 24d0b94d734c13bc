"""The last check between a collector and the scrape: every sample's value within its domain.

Collectors check what they read where they read it (a counter's width, a rate's unit); this
check is the agent's guarantee for every collector, including third-party ones, that what a
scrape serves is valid exposition:

- every value is a finite number (``float()`` of a 400-digit integer raises OverflowError,
  which would otherwise break rendering; NaN and infinities are never a measurement here);
- counters and histogram samples are not negative (a counter that goes below zero is not one);
- label values are strings of bounded size (a 100 MB ``fw_ver`` must not become a 100 MB label
  on every scrape);
- a series appears once per family (a duplicate is invalid exposition: Prometheus rejects it).

A sample that fails is left out and counted (``lockstep_collector_rejected_samples_total``);
the rest of the family is served.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from prometheus_client.core import Metric

# Longer than any path (PATH_MAX is 4096) or identifier the built-in collectors put in a label.
MAX_LABEL_VALUE_CHARS = 4096


@dataclass(frozen=True)
class Rejection:
    """One sample left out, in words: which series, and why."""

    series: str
    reason: str

    def __str__(self) -> str:
        return f"{self.series}: {self.reason}"


def _series_name(name: str, labels: Mapping[str, object]) -> str:
    shown = ",".join(f"{k}={_short(v)}" for k, v in sorted(labels.items()))
    return f"{name}{{{shown}}}" if shown else name


def _short(value: object, limit: int = 60) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} chars)"


def _value_problem(value: object, non_negative: bool) -> tuple[float, str]:
    """The value as a float and "" if it is in the domain; else (0, why not)."""
    if isinstance(value, bool):
        return 0.0, f"value {value!r} is not a number"
    try:
        number = float(value)  # type: ignore[arg-type]
    except OverflowError:
        return 0.0, f"value {_short(str(value))} is too large for a 64-bit float"
    except (TypeError, ValueError):
        return 0.0, f"value {_short(value)} is not a number"
    if not math.isfinite(number):
        return 0.0, f"value {number} is not a finite number"
    if non_negative and number < 0:
        return 0.0, f"value {number:g} is negative (a counter never is)"
    return number, ""


def _labels_problem(labels: Mapping[str, object]) -> str:
    for key, value in labels.items():
        if not isinstance(value, str):
            return f"label {key} is {type(value).__name__}, not a string"
        if len(value) > MAX_LABEL_VALUE_CHARS:
            return f"label {key} is {len(value)} characters long (limit {MAX_LABEL_VALUE_CHARS})"
    return ""


def checked_families(families: Iterable[Metric]) -> tuple[tuple[Metric, ...], list[Rejection]]:
    """The families with every out-of-domain sample left out, and what was left out.

    Families whose samples are all fine are returned as they are (no copy).  This runs on
    every sample of every round, so the common case (a finite float, short string labels)
    is checked first and cheaply; the reasons are worked out only for a sample that fails.
    """
    result: list[Metric] = []
    rejections: list[Rejection] = []
    for family in families:
        non_negative = family.type in _NON_NEGATIVE_TYPES
        kept = []
        seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
        changed = False
        for sample in family.samples:
            value = sample.value
            labels = sample.labels
            fine = (
                (type(value) is float or type(value) is int)
                and -_MAX_FLOAT <= value <= _MAX_FLOAT  # False for NaN and the infinities
                and (value >= 0 or not non_negative)
                and all(type(v) is str and len(v) <= MAX_LABEL_VALUE_CHARS for v in labels.values())
            )
            reason = ""
            if not fine:
                reason = _labels_problem(labels)
                if not reason:
                    number, reason = _value_problem(value, non_negative)
                    if not reason and type(value) is not float and type(value) is not int:
                        sample = sample._replace(value=number)
                        changed = True
            if not reason:
                key = (sample.name, tuple(labels.items()))
                if key in seen:
                    reason = "the same series appears twice; the first is kept"
                seen.add(key)
            if reason:
                rejections.append(Rejection(_series_name(sample.name, labels), reason))
                changed = True
                continue
            kept.append(sample)
        if changed:
            copy = Metric(family.name, family.documentation, family.type, family.unit)
            copy.samples = kept
            family = copy
        result.append(family)
    return tuple(result), rejections


_NON_NEGATIVE_TYPES = frozenset({"counter", "histogram", "gaugehistogram", "summary"})
_MAX_FLOAT = sys.float_info.max
