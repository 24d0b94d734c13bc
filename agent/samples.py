"""The last check between a collector and the scrape: every sample's value within its domain.

Collectors check what they read where they read it (a counter's width, a rate's unit); this
check is the agent's guarantee for every collector, including third-party ones, that what a
scrape serves is valid exposition:

- every value is a finite number (``float()`` of a 400-digit integer raises OverflowError,
  which would otherwise break rendering; NaN and infinities are never a measurement here);
- counters and histogram samples are not negative (a counter that goes below zero is not one);
- label values are strings;
- a series appears once per family (a duplicate is invalid exposition: Prometheus rejects it).

A sample that fails is left out and counted (``lockstep_collector_rejected_samples_total``);
the rest of the family is served.

A label value that cannot be served as it is is made safe, in one documented way, rather than
losing its sample (a target's ``up`` or a job's ``*_info`` must not vanish because of one
label), and counted (``lockstep_collector_altered_label_values_total``):

- characters UTF-8 cannot encode (lone surrogates: ``"\\ud800"`` in a JSON job id, or the
  ``\\udcff`` Python makes of a non-UTF-8 byte in a file name) are backslash-escaped
  (``\\udcff``, six ASCII characters), so one such value no longer fails the rendering of
  its collector's every series;
- a value over MAX_LABEL_VALUE_CHARS (a 100 MB ``fw_ver`` must not become a 100 MB label on
  every scrape) is cut to its first characters followed by ``...sha256:`` and 16 hex digits
  of the SHA-256 of the whole value, MAX_LABEL_VALUE_CHARS characters in all: bounded, and two
  long values that differ anywhere stay two series.
"""

from __future__ import annotations

import hashlib
import math
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from lockstep.agent.families import Metric

# Longer than any path (PATH_MAX is 4096) or identifier the built-in collectors put in a label.
MAX_LABEL_VALUE_CHARS = 4096


# What a value cut to MAX_LABEL_VALUE_CHARS ends with: "...sha256:" and 16 hex digits.
TRUNCATED_MARK = "...sha256:"
_HASH_DIGITS = 16


@dataclass(frozen=True)
class Rejection:
    """One sample left out (or, with ``left_out`` False, served with a label value made
    safe), in words: which series, and why."""

    series: str
    reason: str
    left_out: bool = True

    def __str__(self) -> str:
        return f"{self.series}: {self.reason}"


def safe_label_value(value: str) -> str:
    """The value as served: unencodable characters backslash-escaped, then cut to
    MAX_LABEL_VALUE_CHARS with a hash of the whole (see the module's docstring)."""
    return _cut(_escaped(value))


def _escaped(value: str) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    return value


def _cut(value: str) -> str:
    if len(value) <= MAX_LABEL_VALUE_CHARS:
        return value
    digest = hashlib.sha256(value.encode("utf-8")).hexdigest()[:_HASH_DIGITS]
    return value[: MAX_LABEL_VALUE_CHARS - len(TRUNCATED_MARK) - _HASH_DIGITS] + TRUNCATED_MARK + digest


def _series_name(name: str, labels: Mapping[str, object]) -> str:
    shown = ",".join(f"{k}={_short(v)}" for k, v in sorted(labels.items()))
    return f"{name}{{{shown}}}" if shown else name


def _short(value: object, limit: int = 60) -> str:
    text = _escaped(value) if isinstance(value, str) else repr(value)  # a log line must encode too
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
    return ""


def _safe_labels(labels: dict[str, str]) -> tuple[dict[str, str], str]:
    """The labels with every value made safe, and what was done ("" when nothing was)."""
    done = []
    safe = {}
    for key, value in labels.items():
        escaped = _escaped(value)
        if escaped is not value:
            done.append(f"label {key} has characters UTF-8 cannot encode: backslash-escaped")
        safe[key] = _cut(escaped)
        if len(escaped) > MAX_LABEL_VALUE_CHARS:
            done.append(f"label {key} cut from {len(escaped)} characters to {MAX_LABEL_VALUE_CHARS}")
    return safe, "; ".join(done)


def checked_families(families: Iterable[Metric]) -> tuple[tuple[Metric, ...], list[Rejection]]:
    """The families with every out-of-domain sample left out and every label value made safe,
    and what was left out or altered (``Rejection.left_out`` tells which).

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
                # isascii() is O(1) in CPython: ASCII is always encodable
                and all(type(v) is str and len(v) <= MAX_LABEL_VALUE_CHARS and v.isascii() for v in labels.values())
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
                    safe, altered = _safe_labels(labels)
                    if altered:
                        rejections.append(Rejection(_series_name(sample.name, labels), altered, left_out=False))
                        labels = safe
                        sample = sample._replace(labels=safe)
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
