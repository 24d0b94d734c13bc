"""agent/collector.py: the pieces of the collector protocol that collectors share."""

from __future__ import annotations

import logging
import os

import pytest

from lockstep.agent.collector import CollectorContext, Families, MetricSpec, Paths
from lockstep.agent.seams import Seams
from lockstep.collectors.filesystem.statpool import STAT_TIMER, STATVFS

SIZE = MetricSpec("lockstep_test_size_bytes", "gauge", "Size.", ("mountpoint",), unit="bytes")
READS = MetricSpec("lockstep_test_reads_total", "counter", "Reads.", ("mountpoint",))
LATENCY = MetricSpec("lockstep_test_latency_seconds", "histogram", "Latency.", (), unit="seconds")
UNDECLARED = MetricSpec("lockstep_test_other", "gauge", "Not declared.")


def test_families_are_built_from_the_declarations_in_their_order() -> None:
    families = Families((SIZE, READS, LATENCY))
    families[READS].add_metric(["/data"], 7)
    families[SIZE].add_metric(["/data"], 1024)
    assert [(f.name, f.type) for f in families.all()] == [
        ("lockstep_test_size_bytes", "gauge"),
        ("lockstep_test_reads", "counter"),  # prometheus_client keeps a counter's name without _total
        ("lockstep_test_latency_seconds", "histogram"),
    ]
    assert [f.name for f in families.with_samples()] == ["lockstep_test_size_bytes", "lockstep_test_reads"]
    assert [(s.name, s.labels, s.value) for f in families.with_samples() for s in f.samples] == [
        ("lockstep_test_size_bytes", {"mountpoint": "/data"}, 1024),
        ("lockstep_test_reads_total", {"mountpoint": "/data"}, 7),
    ]


def test_an_undeclared_metric_is_refused_by_name() -> None:
    with pytest.raises(KeyError, match="'lockstep_test_other' is not among the collector's declared metrics"):
        Families((SIZE,))[UNDECLARED]


def test_seams_give_a_replacement_only_for_its_own_seam_and_refuse_anything_else() -> None:
    def fake(path: str) -> os.statvfs_result:
        return os.statvfs_result((4096,) * 10)

    seams = Seams(STATVFS.replaced_by(fake))
    assert seams.get(STATVFS) is fake
    assert seams.get(STAT_TIMER) is None  # not replaced: the collector uses time.perf_counter
    with pytest.raises(TypeError, match="Seams takes SEAM.replaced_by\\(value\\), not function"):
        Seams(lambda path: None)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        Seams(statvfs=lambda path: None)  # type: ignore[call-arg]
    with pytest.raises(AttributeError):
        seams.statvfs = lambda path: None  # type: ignore[attr-defined]
    with pytest.raises(TypeError, match="CollectorContext.seams must be a Seams, not dict"):
        CollectorContext(Paths(), {}, logging.getLogger("test"), {"statvfs": None})  # type: ignore[arg-type]
