"""Asking slurmctld through scontrol: job details and the node's state, off the collection path."""

from __future__ import annotations

import re
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lockstep.agent.collector import Families
from lockstep.collectors.slurm.gres import expand_ranges
from lockstep.collectors.slurm.metrics import CONTROLLER_FAILURES, CONTROLLER_REQUESTS
from lockstep.collectors.toolkit.scontrol import SCONTROL, parse_scontrol_record, run_scontrol, why

__all__ = [
    "SCONTROL",
    "ControllerCache",
    "ControllerSnapshot",
    "JobDetails",
    "parse_scontrol_record",
    "run_scontrol",
    "why",
]

_IDX = re.compile(r"\(IDX:([0-9,\-]*)\)")


@dataclass(frozen=True)
class JobDetails:
    user: str = ""
    account: str = ""
    partition: str = ""
    name: str = ""
    array_job_id: str = ""
    array_task_id: str = ""
    gres_indices: tuple[int, ...] = ()


@dataclass(frozen=True)
class ControllerSnapshot:
    jobs: dict[str, JobDetails]
    node: dict[str, str] | None


class ControllerCache:
    """What slurmctld told us, refreshed in a background thread, rate-limited and time-limited.

    A refresh asks for the node's state and for the jobs nobody could tell us about yet; it
    starts at most once per ``interval``, never while another runs, and each command has a
    time limit.  A collection round waits for a refresh it started for at most ``wait``
    seconds, then carries on with what it has: a slow or dead slurmctld never stalls it.
    """

    def __init__(
        self, scontrol: Callable[[list[str], float], str], node: str, interval: float, timeout: float, log: Any
    ) -> None:
        self.scontrol = scontrol
        self.node_name = node
        self.interval = interval
        self.timeout = timeout
        self.log = log
        self._lock = threading.Lock()
        self._jobs: dict[str, JobDetails] = {}
        self._node: dict[str, str] | None = None
        self._last_start = -float("inf")
        self._thread: threading.Thread | None = None
        self.requests: dict[str, int] = {}
        self.failures: dict[str, int] = {}
        self.refreshed = threading.Event()

    def snapshot(self, missing: list[str], wait: float) -> ControllerSnapshot:
        """What is known now; starts a refresh when one is due, and waits for it up to ``wait``."""
        with self._lock:
            due = time.monotonic() - self._last_start >= self.interval
            idle = self._thread is None or not self._thread.is_alive()
            started = due and idle
            if started:
                wanted = [j for j in missing if j not in self._jobs]
                thread = threading.Thread(target=self._refresh, args=(wanted,), name="slurm-controller", daemon=True)
                self.refreshed.clear()
                try:
                    thread.start()
                except RuntimeError:
                    # No thread can be created (task limit): leave nothing behind, so the
                    # run fails with the reason and the next one tries again.
                    self.refreshed.set()
                    raise
                self._thread = thread
                self._last_start = time.monotonic()
        if started:
            self.refreshed.wait(wait)
        with self._lock:
            return ControllerSnapshot(dict(self._jobs), self._node)

    def forget_except(self, job_ids: set[str]) -> None:
        with self._lock:
            self._jobs = {k: v for k, v in self._jobs.items() if k in job_ids}

    def _run(self, command: str, *args: str) -> str | None:
        with self._lock:
            self.requests[command] = self.requests.get(command, 0) + 1
        try:
            return self.scontrol(list(args), self.timeout)
        except (OSError, subprocess.SubprocessError) as exc:
            with self._lock:
                self.failures[command] = self.failures.get(command, 0) + 1
            self.log.warning("slurmctld request failed", extra={"command": command, "error": why(exc)})
            return None

    def _refresh(self, wanted: list[str]) -> None:
        try:
            for job_id in wanted:
                out = self._run("scontrol show job", "-d", "-o", "show", "job", job_id)
                if out:
                    details = _details_from_scontrol(out)
                    if details is not None:
                        with self._lock:
                            self._jobs[job_id] = details
            out = self._run("scontrol show node", "-o", "show", "node", self.node_name)
            if out and out.strip():
                with self._lock:
                    self._node = parse_scontrol_record(out.strip().splitlines()[0])
        finally:
            self.refreshed.set()

    def add_counters(self, families: Families) -> None:
        with self._lock:
            for command in sorted(set(self.requests) | {"scontrol show node"}):
                families[CONTROLLER_REQUESTS].add_metric([command], self.requests.get(command, 0))
                families[CONTROLLER_FAILURES].add_metric([command], self.failures.get(command, 0))


def _details_from_scontrol(out: str) -> JobDetails | None:
    """JobDetails from ``scontrol -d -o show job ID`` (the job line, then its node lines)."""
    lines = out.strip().splitlines()
    if not lines:
        return None
    record = parse_scontrol_record(lines[0])
    user = record.get("UserId", "").split("(")[0]
    indices: list[int] = []
    for match in _IDX.finditer(out):
        try:
            indices.extend(expand_ranges(match.group(1)))
        except ValueError:
            pass  # not Slurm's notation, or past the bound: that node line's GPUs are left out
    return JobDetails(
        user=user,
        account=record.get("Account", "") if record.get("Account") != "(null)" else "",
        partition=record.get("Partition", ""),
        name=record.get("JobName", ""),
        array_job_id=record.get("ArrayJobId", ""),
        array_task_id=record.get("ArrayTaskId", ""),
        gres_indices=tuple(indices),
    )
