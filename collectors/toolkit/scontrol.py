"""Asking Slurm with ``scontrol``: the seam tests and the simulated node replace, and its records parsed.

Shared by the Slurm collector (job details, the node's state) and the framework_logs collector
(a job's StdOut/StdErr and BatchHost): one seam, so one fake ``scontrol`` answers both.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable

from lockstep.agent.seams import Seam
from lockstep.collectors.toolkit.command import run_command

_KEY = re.compile(r"^[A-Za-z][A-Za-z:/_]*=")

# ``scontrol ARGS`` with a timeout in seconds -> its stdout; a replacement raises OSError or
# subprocess.CalledProcessError like run_scontrol below.
SCONTROL = Seam[Callable[[list[str], float], str]]("scontrol", "scontrol ARGS with a timeout -> stdout")


def run_scontrol(args: list[str], timeout: float) -> str:
    """``scontrol ARGS`` within a whole-exchange deadline (its process group killed then) and
    an output bound; its stdout, or CalledProcessError/TimeoutExpired/CommandOutputError."""
    return run_command(["scontrol", *args], timeout)


def parse_scontrol_record(line: str) -> dict[str, str]:
    """One record of ``scontrol -o show ...``: space-separated Key=Value, values may hold spaces
    only in the trailing fields (Reason=, Command=), which are split off by their key."""
    record: dict[str, str] = {}
    key = None
    for token in line.split(" "):
        if "=" in token and _KEY.match(token):
            key, _, value = token.partition("=")
            record[key] = value
        elif key is not None:
            record[key] += " " + token
    return record


def why(exc: BaseException) -> str:
    """What scontrol said (its last stderr line), rather than Python's account of the exit."""
    if isinstance(exc, subprocess.TimeoutExpired):
        return f"no answer within {exc.timeout:g}s"
    if isinstance(exc, subprocess.CalledProcessError):
        said = (exc.stderr or "").strip().splitlines()
        return f"exit status {exc.returncode}: {said[-1] if said else 'no message'}"
    return str(exc)
