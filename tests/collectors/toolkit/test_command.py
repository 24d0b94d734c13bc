"""Running a command with a deadline (toolkit command): the whole exchange bounded, the process group
killed, binary or huge output refused naming the command."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from lockstep.collectors.toolkit.command import CommandOutputError, run_command
from tests.support import (
    alive,
    wait_until,
)

# Tier: real processes and tools (tests/conftest.py).
pytestmark = pytest.mark.real

# --- scontrol: whole-exchange deadline, process group killed, bounded output ---


def test_a_hung_command_and_everything_it_started_are_killed_at_the_deadline(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    script = f"sleep 300 & echo $! >> {pids}; sleep 300 & echo $! >> {pids}; echo $$ >> {pids}; sleep 300"
    with pytest.raises(subprocess.TimeoutExpired):
        run_command(["sh", "-c", script], timeout=1.0)
    started = [int(p) for p in pids.read_text().split()]
    assert len(started) == 3
    wait_until(lambda: not alive(started), timeout=5, what="the command's whole group to be gone")


def test_children_left_by_a_command_that_exited_are_killed(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    # The child closes the pipes, so the command's exit ends the exchange: its child must go too.
    out = run_command(["sh", "-c", f"sleep 300 >/dev/null 2>&1 & echo $! >> {pids}; echo done"], timeout=10)
    assert out == "done\n"
    wait_until(lambda: not alive([int(p) for p in pids.read_text().split()]), timeout=5, what="the orphan gone")


def test_binary_or_huge_command_output_is_refused_naming_the_command(tmp_path: Path) -> None:
    tool = tmp_path / "scontrol"
    tool.write_text("#!/bin/sh\nprintf 'JobId=1 \\377\\376\\000'\n")
    tool.chmod(0o755)
    with pytest.raises(CommandOutputError, match=r"^scontrol printed bytes that are not text \(at byte 8\)$"):
        run_command([str(tool)], timeout=10)
    # 300 MB: refused after 4 MiB, without holding it.
    with pytest.raises(CommandOutputError, match=r"^yes printed more than 4194304 bytes; its output is ignored$"):
        run_command(["yes", "x" * 1000], timeout=30)
