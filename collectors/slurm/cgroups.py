"""A Slurm job's cgroups: finding its processes, and its CPU time, memory and OOM kills (v1 and v2)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from lockstep.agent.files import read_text

_JOB_DIR = re.compile(r"^job_(\d+|s[0-9a-z]{13})$")


@dataclass
class LocalJob:
    """A job seen on this node: its id and where its cgroup data is."""

    job_id: str
    cpu_dir: Path | None = None  # v2: the job dir; v1: the cpuacct one
    memory_dir: Path | None = None
    cgroup_v2: bool = False
    pid_dirs: list[Path] = field(default_factory=list)  # dirs whose subtree holds its processes
    pids: set[int] = field(default_factory=set)


def job_dirs(parent: Path) -> list[Path]:
    try:
        return sorted(p for p in parent.iterdir() if _JOB_DIR.match(p.name) and p.is_dir())
    except OSError:
        return []


def cgroup_pids(directory: Path) -> set[int]:
    """Every pid in a cgroup's subtree (cgroup.procs of each descendant)."""
    pids: set[int] = set()
    for dirpath, _dirs, files in os.walk(directory):
        if "cgroup.procs" in files:
            try:
                pids.update(int(p) for p in read_text(Path(dirpath) / "cgroup.procs").split())
            except (OSError, ValueError):
                continue
    return pids


def _read_int(path: Path) -> int | None:
    try:
        return int(read_text(path).strip())
    except (OSError, ValueError):
        return None


def _read_keyed(path: Path, key: str) -> int | None:
    try:
        for line in read_text(path).splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        return None
    return None


def cpu_seconds(job: LocalJob) -> float | None:
    if job.cpu_dir is None:
        return None
    if job.cgroup_v2:
        usec = _read_keyed(job.cpu_dir / "cpu.stat", "usage_usec")
        return usec / 1e6 if usec is not None else None
    nsec = _read_int(job.cpu_dir / "cpuacct.usage")
    return nsec / 1e9 if nsec is not None else None


def memory_bytes(job: LocalJob) -> int | None:
    if job.memory_dir is None:
        return None
    name = "memory.current" if job.cgroup_v2 else "memory.usage_in_bytes"
    return _read_int(job.memory_dir / name)


def oom_kills(job: LocalJob) -> int | None:
    if job.memory_dir is None:
        return None
    if job.cgroup_v2:
        return _read_keyed(job.memory_dir / "memory.events", "oom_kill")
    return _read_keyed(job.memory_dir / "memory.oom_control", "oom_kill")
