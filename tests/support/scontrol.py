"""`scontrol` answering from captured output (tests/fixtures/slurm): in-process on the collector's
SCONTROL seam for unit tests (``captured_scontrol``), or as a real program on PATH for tests that
exercise running the command itself (``fake_scontrol``, a `real` test).  Both give the same answers."""

from __future__ import annotations

import os
import stat
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support import FIXTURES

SLURM = FIXTURES / "slurm"
# What each command line is answered with (the rest fail as scontrol does for an unknown job).
ANSWERS = {
    "-d -o show job 102": SLURM / "scontrol-show-job-gres.txt",
    "-o show node node07": SLURM / "scontrol-show-node-drain.txt",
}


def captured_scontrol(calls: list[str] | None = None) -> Callable[[list[str], float], str]:
    """The SCONTROL seam's stand-in: ``SCONTROL.replaced_by(captured_scontrol())``.  Each call's
    arguments are appended to ``calls`` when given."""

    def scontrol(args: list[str], timeout: float) -> str:
        command = " ".join(args)
        if calls is not None:
            calls.append(command)
        answer = ANSWERS.get(command)
        if answer is None:
            stderr = "slurm_load_jobs error: Invalid job id specified\n"
            raise subprocess.CalledProcessError(1, ["scontrol", *args], "", stderr)
        return answer.read_text()

    return scontrol


def fake_scontrol(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, delay: float = 0) -> Path:
    """An `scontrol` on PATH that answers from captured output and logs each call."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "scontrol.log"
    script = bin_dir / "scontrol"
    script.write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> {log}\n'
        f"sleep {delay}\n"
        'case "$*" in\n'
        + "".join(f'  "{command}") cat {answer} ;;\n' for command, answer in ANSWERS.items())
        + '  *) echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1 ;;\n'
        "esac\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return log
