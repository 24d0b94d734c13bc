"""The report epilog (deploy/slurm/lockstep-report-epilog.sh) can never hold a job (issue 46):
run as slurmctld runs it (sh, an environment of its own), against a Prometheus that drips its
answers it ends at the report's deadline (LOCKSTEP_REPORT_TIMEOUT, passed as --timeout), and a
command that ignores its deadline and SIGTERM is killed by the script's own timeout(1), 15 s
and then 5 s later.  Each says why in syslog (here a stand-in `logger` on PATH that writes a
file).  Under a real Slurm: tests/deploy/test_report_epilog_slurm.py."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.support import LOCKSTEP, REPO
from tests.support.hostile_prometheus import HostileServer, Reply, success

pytestmark = pytest.mark.real

EPILOG = REPO / "deploy" / "slurm" / "lockstep-report-epilog.sh"


def epilog(tmp_path: Path, **settings: str) -> tuple[subprocess.CompletedProcess[str], float, list[str]]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    syslog = tmp_path / "syslog"
    logger = bin_dir / "logger"
    logger.write_text(f'#!/bin/sh\nshift 2\necho "$*" >> {syslog}\n')  # logger -t TAG MESSAGE
    logger.chmod(0o755)
    env = {
        "PATH": f"{bin_dir}:/usr/local/bin:/usr/bin:/bin",
        "SLURM_JOB_ID": "77",
        "LOCKSTEP_REPORT_DEFAULTS": str(tmp_path / "no-defaults"),
        "LOCKSTEP_REPORT_DELAY": "0",
        "LOCKSTEP_REPORT_STORE": str(tmp_path / "store"),
        **{k: v for k, v in os.environ.items() if k == "LOCKSTEP_TEST_RUN"},
        **settings,
    }
    started = time.monotonic()
    done = subprocess.run(["sh", str(EPILOG)], capture_output=True, text=True, timeout=120, env=env)
    took = time.monotonic() - started
    return done, took, syslog.read_text().splitlines() if syslog.exists() else []


def test_against_a_dripping_prometheus_the_epilog_ends_at_the_reports_deadline(tmp_path: Path) -> None:
    with HostileServer(lambda endpoint, form: Reply(success(endpoint, []), drip=0.5)) as server:
        done, took, logged = epilog(
            tmp_path,
            LOCKSTEP=" ".join(LOCKSTEP),
            LOCKSTEP_PROMETHEUS_URL=server.url,
            LOCKSTEP_REPORT_TIMEOUT="5",
        )
    assert done.returncode == 0
    assert logged == [
        f"job 77: lockstep: report: Prometheus at {server.url} did not answer within the report's 5-s deadline "
        "(--timeout)"
    ]
    assert took < 3 * 5  # (the interpreter's start included: 5 s of it at a load of 20)
    assert not (tmp_path / "store").exists()


def test_a_command_that_ignores_its_deadline_and_sigterm_is_killed_by_the_epilogs_timeout(tmp_path: Path) -> None:
    stuck = tmp_path / "stuck"
    stuck.write_text("#!/bin/sh\ntrap '' TERM\nwhile :; do sleep 1; done\n")
    stuck.chmod(0o755)
    done, took, logged = epilog(tmp_path, LOCKSTEP=str(stuck), LOCKSTEP_REPORT_TIMEOUT="1")
    assert done.returncode == 0
    assert logged == ["job 77: lockstep report did not end within LOCKSTEP_REPORT_TIMEOUT=1 s and 15 s more: stopped"]
    assert 1 + 15 <= took < 1 + 15 + 5 + 10  # SIGTERM at 16 s, ignored; SIGKILL 5 s later


def test_a_timeout_that_is_not_a_number_is_said_and_the_default_used(tmp_path: Path) -> None:
    done, _, logged = epilog(tmp_path, LOCKSTEP="true", LOCKSTEP_REPORT_TIMEOUT="soon")
    assert done.returncode == 0
    assert logged == ["job 77: LOCKSTEP_REPORT_TIMEOUT=soon is not a whole number of seconds above 0: 60 used"]
