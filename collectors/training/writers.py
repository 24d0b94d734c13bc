"""Which followed logs a process on this node still holds open for writing: how the training
collector tells a hung rank (its process is alive, blocked in a collective or stopped) from a
finished one (its process exited and the kernel closed its files).

A rank's process keeps its log open for the life of the process (lockstep.emitter's StepLog
does; so does Python's logging.FileHandler), so the writer is any process with a descriptor on
the log's inode opened for writing.  Descriptors are matched without touching the files
themselves: ``readlink`` of ``/proc/PID/fd/N`` (the path as the process names it, maybe in
another mount namespace: only its last component is compared) and ``/proc/PID/fdinfo/N``
(``flags`` and ``ino``, Linux 5.14 and later).  A ``stat`` through the link would block on a
hung network filesystem, the one place logs are most often kept.  The agent's own descriptors
are read-only and so never count.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

_WRITE_MODES = (os.O_WRONLY, os.O_RDWR)


@dataclass(frozen=True)
class WriterScan:
    """Writers found per (basename, inode); ``complete`` is False when some process's
    descriptors could not be read (the agent is not root): a file without a writer found may
    then still have one."""

    writers: dict[tuple[str, int], int]
    complete: bool


def _fdinfo(path: Path) -> tuple[int, int] | None:
    """(flags, ino) of a descriptor, None if the kernel does not say (older than 5.14)."""
    flags = ino = None
    try:
        with open(path, "rb") as info:
            for line in info.read(4096).decode("ascii", "replace").splitlines():
                key, _, value = line.partition(":")
                if key == "flags":
                    flags = int(value.strip(), 8)
                elif key == "ino":
                    ino = int(value.strip())
    except (OSError, ValueError):
        return None
    return (flags, ino) if flags is not None and ino is not None else None


def scan_writers(procfs: Path, wanted: set[tuple[str, int]]) -> WriterScan:
    """Count, for each (file basename, inode) in wanted, the processes holding it open for writing."""
    names = {name for name, _ in wanted}
    writers = dict.fromkeys(wanted, 0)
    complete = True
    try:
        pids = [entry for entry in os.listdir(procfs) if entry.isdigit()]
    except OSError:
        return WriterScan(writers, complete=False)
    for pid in pids:
        fd_dir = procfs / pid / "fd"
        try:
            fds = os.listdir(fd_dir)
        except FileNotFoundError:
            continue  # exited meanwhile
        except OSError:
            complete = False  # not ours to look at (PermissionError)
            continue
        found: set[tuple[str, int]] = set()
        for fd in fds:
            try:
                target = os.readlink(fd_dir / fd)
            except OSError:
                continue
            name = target.rsplit("/", 1)[-1]
            if name not in names:
                continue
            info = _fdinfo(procfs / pid / "fdinfo" / fd)
            if info is None:
                continue
            flags, ino = info
            if flags & os.O_ACCMODE in _WRITE_MODES and (name, ino) in writers:
                found.add((name, ino))
        for key in found:  # a process counts once per file, however many descriptors it holds
            writers[key] += 1
    return WriterScan(writers, complete)
