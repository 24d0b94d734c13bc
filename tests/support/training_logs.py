"""Lines of the training collector's JSON-lines rank logs (docs/workloads.md), as the tests write them.

One record a line: ``{"ts", "job_id", "rank", "host", "step", "metric", "value"}``.  A step's
records are stamped ``T0 + step`` seconds, so a test's timeline is its step numbers; times are
binary fractions (1.0, 0.5) so the collector's sums are exact.
"""

from __future__ import annotations

import json

T0 = 1_767_312_000  # 2026-01-02 00:00:00 UTC, the first step's timestamp


def log_record(step: int, metric: str, value: object, *, job: str = "7", rank: int = 0, host: str = "h") -> str:
    """One record, as a line.  ``value`` may be anything JSON holds: tests write bad ones too
    (json.dumps writes a lone surrogate in ``job`` as the escape \\ud800, which json.loads reads
    back as one)."""
    fields = {"ts": T0 + step, "job_id": job, "rank": rank, "host": host, "step": step}
    return json.dumps({**fields, "metric": metric, "value": value}) + "\n"


def log_steps(first: int, count: int, *, job: str = "7", rank: int = 0, host: str = "h") -> str:
    """``count`` complete steps from step ``first``: two records each, a 1.0 s step of which 0.5 s
    is compute."""
    return "".join(
        log_record(step, metric, value, job=job, rank=rank, host=host)
        for step in range(first, first + count)
        for metric, value in (("step_time_sec", 1.0), ("compute_time_sec", 0.5))
    )
