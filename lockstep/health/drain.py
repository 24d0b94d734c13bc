"""`lockstep health-check --drain`: an unhealthy node drained in Slurm, with Lockstep's reason.

As LBNL NHC does (../shared/reference/node-health.md): the reason starts with
HEALTH_DRAIN_PREFIX ("lockstep: "), which is how a drain is known to be Lockstep's own.  A node
that someone else drained or downed (any other reason) is left as it is, and no node is ever
returned to service by the check: an operator resumes it after the repair (docs/health-check.md).
Every scontrol call is bounded by what is left of the check's deadline.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess

from lockstep import thresholds as T
from lockstep.report.transport import Deadline

# `scontrol -o show node`: State=IDLE+DRAIN ...  Reason=<text> [<user>@<time>]
STATE = re.compile(r"(?:^|\s)State=(\S+)")
REASON = re.compile(r"(?:^|\s)Reason=(.*?) \[[^\]@]*@[^\]]*\]")


class DrainError(Exception):
    """scontrol could not be asked or refused (the message says which and why)."""


def node_name(given: str | None) -> str:
    """Slurm's name for this node: --node, else slurmd's SLURMD_NODENAME (set for the programs it
    runs), else the short host name (Slurm's default NodeName)."""
    return given or os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def _scontrol(args: list[str], deadline: Deadline) -> str:
    if deadline.passed():
        raise DrainError(f"no time left to run scontrol {' '.join(args)}")
    try:
        # A session of its own: at the deadline, it and whatever it started (a site's wrapper
        # script) are killed, and nothing is left running.
        process = subprocess.Popen(
            ["scontrol", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
        )
    except FileNotFoundError:
        raise DrainError("scontrol is not on PATH (is this a Slurm node?)") from None
    try:
        stdout, stderr = process.communicate(timeout=deadline.left())
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise DrainError(f"scontrol {args[0]} did not finish within the check's deadline") from None
    if process.returncode != 0:
        said = (stderr or stdout).strip().splitlines()
        raise DrainError(f"scontrol {' '.join(args[:3])} failed: {said[0] if said else f'exit {process.returncode}'}")
    return stdout


def drain(node: str, reason: str, deadline: Deadline) -> str:
    """Drain `node` with HEALTH_DRAIN_PREFIX + reason unless it is drained or down already;
    returns what was done, in a line.  DrainError when scontrol cannot be asked."""
    shown = _scontrol(["-o", "show", "node", node], deadline)
    state_match = STATE.search(shown)
    if state_match is None:
        raise DrainError(f"scontrol show node {node}: no State= in its answer")
    state = state_match.group(1)
    reason_match = REASON.search(shown)
    current = reason_match.group(1) if reason_match else ""
    flags = set(state.split("+"))
    if flags & {"DRAIN", "DRAINED", "DRAINING", "DOWN", "FAIL"}:
        if current.startswith(T.HEALTH_DRAIN_PREFIX):
            return f"node {node} already drained by lockstep ({current})"
        return f"node {node} left as it is: {state} by someone else (Reason={current or 'none'})"
    _scontrol(["update", f"NodeName={node}", "State=DRAIN", f"Reason={T.HEALTH_DRAIN_PREFIX}{reason}"], deadline)
    return f"node {node} drained: {T.HEALTH_DRAIN_PREFIX}{reason}"
