"""A job's range from its raw samples, on a real Prometheus: a job Prometheus saw at one scrape
(Slurm ran it for 4 s; the agent's collection and the scrape met it once), reported a fraction
of a second after that scrape, as the Slurm epilog does.  Its start and end are that sample, not
the 10.7-s window around it: the 1-s grid of the timestamp subquery, capped at the report's
time, held no point at or after the sample (tests/deploy/test_report_epilog_slurm.py met it, 1
run in 3: a report starting 5-10 s before Slurm's StartTime)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from lockstep.report.build import build_report
from lockstep.report.prometheus import Prometheus
from tests.support import free_port, require_real
from tests.support.prometheus import PROMETHEUS, backfill, start_prometheus, stop_all

# Tier: a real Prometheus (tests/conftest.py).
pytestmark = pytest.mark.e2e

# A recent second (Prometheus keeps 15 days), the sample 0.375 s into it.
SAMPLE = (int(time.time()) // 60) * 60 - 3600 + 0.375


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    require_real("Prometheus server (Debian package prometheus)", os.access(PROMETHEUS, os.X_OK))
    tmp: Path = tmp_path_factory.mktemp("range")
    labels = 'cluster="c1",instance="n1:12400",job="lockstep",job_id="7",user="alice"'
    (tmp / "job.om").write_text(
        f"# TYPE lockstep_slurm_job_info gauge\nlockstep_slurm_job_info{{{labels}}} 1 {SAMPLE:.3f}\n# EOF\n"
    )
    backfill(tmp / "job.om", tmp / "tsdb")
    (tmp / "prometheus.yml").write_text("global: {}\n")
    processes: list = []
    try:
        yield start_prometheus(tmp, free_port(), processes)
    finally:
        stop_all(processes)


@pytest.mark.parametrize("after", [0.1, 0.5, 0.9, 1.5, 30.0])
def test_a_job_seen_at_one_scrape_starts_and_ends_at_it_however_soon_it_is_reported(
    prometheus: str, after: float
) -> None:
    report = build_report(Prometheus(prometheus), "7", "c1", now=SAMPLE + after, ended=True)
    assert (report.job.start, report.job.end) == (SAMPLE, SAMPLE)
    assert report.job.state == "ended"
