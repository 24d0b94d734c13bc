"""/run/netns as found: the first `ip netns add` on a machine creates /run/netns and bind-mounts
it onto itself (shared propagation), and `ip netns del` leaves both behind."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

RUN_NETNS = Path("/run/netns")


def mounts_on(path: Path) -> int:
    """How many mounts /proc/self/mountinfo lists on path (stacked bind mounts count each)."""
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return 0
    return sum(1 for line in lines if line.split()[4] == str(path))


@dataclass(frozen=True)
class RunNetns:
    existed: bool
    mounts: int


def run_netns_state() -> RunNetns:
    return RunNetns(RUN_NETNS.exists(), mounts_on(RUN_NETNS))


def restore_run_netns(before: RunNetns) -> None:
    """Undo what `ip netns add` did to /run/netns since `before`, once no namespace is left in it."""
    if RUN_NETNS.exists() and os.listdir(RUN_NETNS):
        return  # another namespace lives there (someone else's): leave it
    for _ in range(mounts_on(RUN_NETNS) - before.mounts):
        subprocess.run(["umount", str(RUN_NETNS)], capture_output=True, check=False)
    if not before.existed:
        try:
            RUN_NETNS.rmdir()
        except OSError:
            pass
