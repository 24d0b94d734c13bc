"""The two exposition formats the agent serves, rendered from metric families (the agent's,
lockstep/agent/families.py, or prometheus_client's: the same attributes).

Byte for byte what prometheus_client 0.26's `exposition.generate_latest` and
`openmetrics.exposition.generate_latest` write with their default escaping (underscores), which
tests/agent/test_exposition.py checks on every simulated scenario and on hostile names and
values; written here so that the agent need not import that package (lockstep/agent/families.py
says why).  Names are legacy Prometheus names, a character outside them written `_`; label
values are UTF-8 with backslash, newline and double quote escaped.  Native histogram samples,
which OpenMetrics 1.0 cannot carry, are left out of both (prometheus_client leaves them out of
OpenMetrics 1.0 and fails on them in the text format).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from typing import Any

CONTENT_TYPE_TEXT = "text/plain; version=0.0.4; charset=utf-8"
CONTENT_TYPE_OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"

_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_NOT_METRIC_RUNE = re.compile(r"[^a-zA-Z0-9_:]")
_NOT_LABEL_RUNE = re.compile(r"[^a-zA-Z0-9_]")
# Samples the text format cannot type as the family: each goes in a gauge family of its own.
_OPENMETRICS_ONLY = ("_created", "_gsum", "_gcount")
# The text format's names for OpenMetrics' types.
_TEXT_TYPES = {"info": "gauge", "stateset": "gauge", "gaugehistogram": "histogram", "unknown": "untyped"}


def go_float(value: float) -> str:
    """A value as Go (and so Prometheus) writes it: +Inf, -Inf, NaN, exponents past 1e6."""
    d = float(value)
    if d == math.inf:
        return "+Inf"
    if d == -math.inf:
        return "-Inf"
    if math.isnan(d):
        return "NaN"
    s = repr(d)
    dot = s.find(".")
    if d > 0 and dot > 6:
        mantissa = f"{s[0]}.{s[1:dot]}{s[dot + 1 :]}".rstrip("0.")
        return f"{mantissa}e+{dot - 1:02d}"
    return s


def _metric_name(name: str) -> str:
    return name if _METRIC_NAME.fullmatch(name) else _underscored(name, metric=True)


def _label_name(name: str) -> str:
    return name if _LABEL_NAME.fullmatch(name) else _underscored(name, metric=False)


def _underscored(name: str, metric: bool) -> str:
    """Each character a name may not hold (a digit first) as `_`."""
    if not name:
        return name
    head = (
        name[0] if (name[0].isascii() and (name[0].isalpha() or name[0] == "_" or (metric and name[0] == ":"))) else "_"
    )
    return head + (_NOT_METRIC_RUNE if metric else _NOT_LABEL_RUNE).sub("_", name[1:])


def _label_value(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _labels(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{_label_name(k)}="{_label_value(v)}"' for k, v in sorted(labels.items())) + "}"


def render_text(families: Iterable[Any]) -> bytes:
    """The Prometheus text format 0.0.4."""
    out: list[str] = []

    def line(sample: Any) -> str:
        at = "" if sample.timestamp is None else f" {int(float(sample.timestamp) * 1000):d}"
        return f"{_metric_name(sample.name)}{_labels(sample.labels)} {go_float(sample.value)}{at}\n"

    for family in families:
        try:
            name, kind = family.name, family.type
            if kind == "counter":
                name += "_total"
            elif kind == "info":
                name += "_info"
            kind = _TEXT_TYPES.get(kind, kind)
            help_text = family.documentation.replace("\\", r"\\").replace("\n", r"\n")
            out.append(f"# HELP {_metric_name(name)} {help_text}\n# TYPE {_metric_name(name)} {kind}\n")
            apart: dict[str, list[str]] = {}
            for sample in family.samples:
                if getattr(sample, "native_histogram", None):
                    continue
                suffix = next((s for s in _OPENMETRICS_ONLY if sample.name == family.name + s), None)
                if suffix is None:
                    out.append(line(sample))
                else:
                    apart.setdefault(suffix, []).append(line(sample))
        except Exception as exc:
            exc.args = (exc.args or ("",)) + (family,)
            raise
        for suffix, lines in sorted(apart.items()):
            own = _metric_name(family.name + suffix)
            out.append(f"# HELP {own} {help_text}\n# TYPE {own} gauge\n")
            out.extend(lines)
    return "".join(out).encode("utf-8")


def render_openmetrics(families: Iterable[Any]) -> bytes:
    """OpenMetrics 1.0.0, ending `# EOF`."""
    out: list[str] = []
    for family in families:
        try:
            name = _metric_name(family.name)
            out.append(f"# HELP {name} {_label_value(family.documentation)}\n# TYPE {name} {family.type}\n")
            if family.unit:
                out.append(f"# UNIT {name} {family.unit}\n")
            for sample in family.samples:
                if getattr(sample, "native_histogram", None):
                    continue
                at = "" if sample.timestamp is None else f" {sample.timestamp}"
                exemplar = _exemplar(family, sample) if getattr(sample, "exemplar", None) else ""
                # (prometheus_client writes a sample's name with a label name's characters: no colon.)
                value = "" if sample.value is None else go_float(sample.value)
                out.append(f"{_label_name(sample.name)}{_labels(sample.labels)} {value}{at}{exemplar}\n")
        except Exception as exc:
            exc.args = (exc.args or ("",)) + (family,)
            raise
    out.append("# EOF\n")
    return "".join(out).encode("utf-8")


def _exemplar(family: Any, sample: Any) -> str:
    """A sample's exemplar (a prometheus_client family's: the agent makes none)."""
    kind, name = family.type, sample.name
    if not (
        (kind == "counter" and name.endswith("_total"))
        or (kind == "gaugehistogram" and name.endswith("_bucket"))
        or (kind == "histogram" and (name.endswith("_bucket") or name == family.name))
    ):
        raise ValueError(f"Metric {family.name} has exemplars, but is not a histogram bucket or counter")
    exemplar = sample.exemplar
    labels = ",".join(f'{k}="{_label_value(v)}"' for k, v in sorted(exemplar.labels.items()))
    at = "" if exemplar.timestamp is None else f" {exemplar.timestamp}"
    return f" # {{{labels}}} {go_float(exemplar.value)}{at}"
