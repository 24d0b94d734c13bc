"""bench/report.py at a small size: the fleet it writes (a rank's NCCL communicators, a GPU's clock
event reasons, the recorded NCCL series), built a 2-hour block at a time into a real Prometheus,
gives the report the bench was built to give: rank 37 on node0004 GPU 5 held the job back,
throttled, in its own work and in each of its 3 communicators, and one checkpoint stall.  The
bench measures 1,024 ranks for a day on demand (docs/performance.md)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.support import REPO, require_promtool, require_real

# Tier: a real Prometheus (tests/conftest.py).
pytestmark = pytest.mark.e2e


def test_a_small_run_reports_the_slow_rank_and_the_stall_three_times() -> None:
    require_promtool()
    require_real("Prometheus server (Debian package prometheus)", os.access("/usr/bin/prometheus", os.X_OK))
    run = subprocess.run(
        [sys.executable, "bench/report.py", "--ranks", "64", "--hours", "12", "--scrape", "60"]
        + ["--other-nodes", "2", "--settle", "0"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr
    printed = run.stdout
    assert len(re.findall(r"^report-bench: run [123]: [0-9.]+ s ", printed, re.M)) == 3, printed
    verdict = next(line for line in printed.splitlines() if line.startswith("report-bench: verdict: "))
    assert verdict.startswith("report-bench: verdict: job 4242 ran 11 h 59 m on 8 nodes, 64 ranks; "), verdict
    assert "to rank 37 on node0004 GPU 5, GPU 5 throttled (hw_thermal_slowdown)" in verdict, verdict
    assert "to rank 37 on node0004 GPU 5 (communicator 0x7a1c)" in verdict, verdict
    assert verdict.endswith("1 checkpoint stall (longest 74 min)."), verdict
    # The training straggler and one a communicator; the other job's 16 GPUs not among the 64.
    assert "report-bench: 64 GPUs, 240 timeline points, 4 straggler(s), 1 checkpoint stall(s)" in printed, printed
