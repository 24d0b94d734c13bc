"""A fake `scontrol` on PATH answering from captured output (tests/fixtures/slurm), logging each call."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from tests.support import FIXTURES

SLURM = FIXTURES / "slurm"


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
        f'  "-d -o show job 102") cat {SLURM}/scontrol-show-job-gres.txt ;;\n'
        f'  "-o show node node07") cat {SLURM}/scontrol-show-node-drain.txt ;;\n'
        '  *) echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1 ;;\n'
        "esac\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return log
