"""bench/straggler_rules.py: what the straggler rule groups read, parsed from the shipped rule
files, and a 4-node, 40-minute run of the bench that prints every measured group's evaluation
time (the bench measures 1,024 nodes on demand)."""

from __future__ import annotations

import os
import sys

import pytest

from tests.support import REPO, require_promtool, require_real

sys.path.insert(0, str(REPO / "bench"))
import straggler_rules  # noqa: E402


def test_reads_finds_names_ranges_and_offsets() -> None:
    expr = (
        "quantile_over_time(0.5, job_rank:lockstep_x:ratio5m[6h] offset 30m)\n"
        "and job_rank:lockstep_x:ratio5m offset 1h\n"
        'and rate(lockstep_y_total{reason=~"a|lockstep_z"}[1h30m]) > 0 and on (cluster, job_id) lockstep_w'
    )
    assert straggler_rules.reads(expr) == [
        straggler_rules.Read("job_rank:lockstep_x:ratio5m", True, 6 * 3600 + 1800),
        straggler_rules.Read("job_rank:lockstep_x:ratio5m", True, 3600),
        straggler_rules.Read("lockstep_y_total", True, 5400),
        straggler_rules.Read("lockstep_w", False, 0),
    ]


def test_the_measured_groups_and_what_they_read_follow_the_shipped_rules() -> None:
    rules = straggler_rules.rules_read()
    assert any("straggler" in name for name in rules.groups)
    assert len(rules.groups) >= 2  # and the alert group of the straggler alerts
    assert rules.raw and all(name.startswith("lockstep_") and name not in rules.records for name in rules.raw)
    assert set(rules.recorded_history) <= set(rules.records)
    # Every input the rules read has a series in the simulated node but the log writers' count.
    _, missing = straggler_rules.raw_series(straggler_rules.build(4, [2, 1, 1], 0.0), rules.raw, 0.0, 0.0)
    assert missing in ([], ["lockstep_training_log_writer_processes"])


def test_default_jobs_fill_the_fleet() -> None:
    for nodes in (1, 4, 64, 1024):
        assert sum(straggler_rules.default_jobs(nodes)) == nodes
    assert straggler_rules.default_jobs(1024)[:3] == [512, 256, 128]


@pytest.mark.e2e
def test_a_small_run_prints_every_straggler_groups_evaluation_time(capsys: pytest.CaptureFixture[str]) -> None:
    require_promtool()
    require_real("Prometheus server (Debian package prometheus)", os.access("/usr/bin/prometheus", os.X_OK))
    result = straggler_rules.run(4, [2, 1, 1], hours=40 / 60, evaluation_interval="3s", rounds=2, log=False)
    straggler_rules.report(result)
    printed = capsys.readouterr().out
    assert not result.history_ran_out
    for group in result.groups:
        last, largest = result.durations[group]
        assert 0 < last <= largest
        assert any(line.strip().startswith(group) and " ms " in line for line in printed.splitlines()), printed
    # The fleet's inputs reached the rules: they recorded per-rank series.
    assert 32 in result.produced.values()  # a series per rank
