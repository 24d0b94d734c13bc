"""The report's JSON (its stored form) and the text renderer, on a hand-made report with
something in every section."""

from __future__ import annotations

import json

import pytest

from lockstep.report import text
from lockstep.report.model import SCHEMA, Point, from_json, to_dict, to_json
from tests.support.reports import sample_report


def test_json_reads_back_into_the_same_report() -> None:
    report = sample_report()
    assert from_json(to_json(report)) == report
    assert from_json(to_json(report, compact=True)) == report


def test_compact_json_is_one_line_without_spaces_between_tokens() -> None:
    compact = to_json(sample_report(), compact=True)
    assert "\n" not in compact
    assert compact.startswith('{"schema":"lockstep.report/v1","job":{"job_id":"4242","cluster":"h100-a",')
    assert json.loads(compact) == to_dict(sample_report())


def test_a_file_of_another_schema_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"not a lockstep.report/v1 report \(schema: 'lockstep.report/v0'\)"):
        from_json('{"schema": "lockstep.report/v0"}')
    with pytest.raises(ValueError, match=r"\(schema: 'list'\)"):
        from_json("[]")
    assert SCHEMA == "lockstep.report/v1"


def test_the_json_has_every_documented_top_level_field() -> None:
    assert list(to_dict(sample_report())) == [
        "schema",
        "job",
        "verdict",
        "generated_at",
        "prometheus",
        "grafana_url",
        "gpus",
        "steps",
        "stragglers",
        "checkpoints",
        "hangs",
        "post_mortem",
        "alerts",
        "events",
        "notes",
    ]


def test_text_fits_a_100_column_terminal_and_starts_with_the_verdict() -> None:
    lines = text.render(sample_report()).splitlines()
    assert max(len(line) for line in lines) <= 100
    assert lines[:5] == [
        "Lockstep report: job 4242 (cluster h100-a)",
        "==========================================",
        "job 4242 ran 14 h 02 m on 2 nodes, 16 ranks; lost about 9% to rank 5 on n12 GPU 5, GPU 5 throttled",
        "  (hw_thermal_slowdown) 62% of the time; 1 checkpoint stall (longest 41 min); hung (named at 13:05",
        "  UTC), first to stop: rank 6 on n25 GPU 6; 1 GPU allocated but idle.",
    ]


def test_text_sections_say_what_the_report_holds() -> None:
    lines = text.render(sample_report()).splitlines()
    assert "  n25            3    0%           1.0/80.0           71/75  IDLE" in lines
    assert "  step time  ▁▁▂██▁▁▁  20-29 s" in lines
    assert "    stall: a save in progress 41 min (from 2026-01-01 06:00:00)" in lines
    assert "  post-mortem: first to stop: rank 6, n25, GPU 6 (named by X)" in lines
    assert "  - n25: IB mlx5_0/1 link down (2)" in lines


def test_sparkline_averages_into_its_width_and_draws_a_flat_line_level() -> None:
    points = [Point(float(i), float(i % 2)) for i in range(8)]
    assert text.sparkline(points, width=4) == "▄▄▄▄"  # every pair averages to 0.5: flat, mid-height
    assert text.sparkline([Point(0, 1.0), Point(1, 2.0), Point(2, 3.0)]) == "▁▅█"
    assert text.sparkline([Point(0, 5.0), Point(1, 5.0)]) == "▄▄"
    assert text.sparkline([]) == ""
