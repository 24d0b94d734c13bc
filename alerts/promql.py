"""Helpers the rules are written with: PromQL fragments (aggregation labels, numbers, regexes) and
the Go templates of alert annotations ({{ $labels.x }} and {{ $value }}, evaluated by Prometheus)."""

from __future__ import annotations

from collections.abc import Iterable

from lockstep import thresholds as T


def by(*labels: str) -> str:
    """by (...) over the target labels and the given ones: aggregations keep where it happened."""
    return f"by ({', '.join((*T.TARGET_LABELS, *labels))})"


def on(*labels: str) -> str:
    return f"on ({', '.join((*T.TARGET_LABELS, *labels))})"


def job_by() -> str:
    """A job spans nodes: per-job aggregations are by cluster and job id only."""
    return "by (cluster, job_id)"


JOB_ON = "on (cluster, job_id)"


def num(value: float) -> str:
    """A threshold as PromQL writes it: 0.9, 2, 0.016666..."""
    return repr(float(value)).removesuffix(".0")


def regex(values: Iterable[object]) -> str:
    return "|".join(str(v) for v in values)


def label(name: str) -> str:
    return "{{ $labels." + name + " }}"


# Where an alert fired: the Kubernetes node name when the scrape adds it, else the instance.
WHERE = "{{ with $labels.node }}{{ . }}{{ else }}{{ $labels.instance }}{{ end }}"
VALUE = "{{ $value }}"
VALUE_PERCENT = "{{ $value | humanizePercentage }}"
VALUE_DURATION = "{{ $value | humanizeDuration }}"
VALUE_2F = '{{ printf "%.2f" $value }}'


def percent(ratio: float) -> str:
    return f"{ratio * 100:g} %"
