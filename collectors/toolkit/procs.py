"""Processes as procfs shows them: the process table, command lines, listening TCP
sockets, and the Slurm job a process belongs to.

Reads ``<procfs>`` directly (honouring --path.procfs) rather than through psutil, whose
procfs root is one process-wide global (see collectors/host.py).  Every function takes
the procfs root and tolerates processes that vanish while being read.

Command lines are read only for the processes a caller asks about: reading
``/proc/PID/cmdline`` takes the target's memory-map lock and can block behind a process
stuck in the kernel, whereas ``/proc/PID/stat`` does not.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from lockstep.agent.collector import shared_read
from lockstep.agent.files import read_text

_PF_KTHREAD = 0x00200000  # a kernel thread (include/linux/sched.h)
_LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's st column
_SLURM_JOB_IN_CGROUP = re.compile(r"/job_(\d+)(?:/|$)")
# The fd link the kernel writes for a socket: "socket:[<inode>]", the inode in decimal ASCII.
_SOCKET_LINK = re.compile(r"socket:\[([0-9]{1,20})\]")
_HEX = re.compile(r"[0-9A-Fa-f]+")


@dataclass(frozen=True)
class Process:
    pid: int
    ppid: int
    comm: str  # the kernel's 15-character command name
    state: str = ""  # R, S, D, ... (of its main thread)
    threads: int = 1
    kernel_thread: bool = False  # PF_KTHREAD in its flags: no user's process (no cgroup of a job, no environment)


@dataclass(frozen=True)
class ListeningSocket:
    address: str  # as text: "0.0.0.0", "127.0.0.1", "::", "10.0.0.5"
    port: int
    inode: int


def process_table(procfs: Path | str) -> dict[int, Process]:
    """Every process, from /proc/PID/stat (no cmdline reads): read once for the collectors'
    rounds run together (agent/collector.py shared_read), so the table is shared: never change it."""
    return shared_read(("process_table", str(procfs)), lambda: _read_process_table(procfs))


def _read_process_table(procfs: Path | str) -> dict[int, Process]:
    table = {}
    try:
        entries = os.listdir(procfs)
    except OSError:
        return {}
    for name in entries:
        if not name.isdigit():
            continue
        try:
            stat = read_text(f"{procfs}/{name}/stat")  # a string path: see slurm_job_of_cgroup
        except OSError:
            continue  # exited meanwhile
        # "PID (comm) S PPID ...": comm may contain spaces and parentheses.
        open_paren, close_paren = stat.find("("), stat.rfind(")")
        if open_paren < 0 or close_paren < open_paren:
            continue
        fields = stat[close_paren + 2 :].split()
        if len(fields) < 2 or not (fields[1].isascii() and fields[1].lstrip("-").isdigit()):  # str.isdigit: "²" too
            continue
        # num_threads is the stat file's 20th field, the 18th after the command name.
        threads = int(fields[17]) if len(fields) > 17 and fields[17].isascii() and fields[17].isdigit() else 0
        # flags is the 9th field, the 7th after the command name.
        kernel = len(fields) > 6 and fields[6].isascii() and fields[6].isdigit() and bool(int(fields[6]) & _PF_KTHREAD)
        table[int(name)] = Process(
            int(name), int(fields[1]), stat[open_paren + 1 : close_paren], fields[0], threads, kernel
        )
    return table


def cmdline(procfs: Path, pid: int) -> list[str]:
    """The process's argv ([] for kernel threads, or when it is gone)."""
    try:
        raw = read_text(procfs / str(pid) / "cmdline")
    except OSError:
        return []
    return [arg for arg in raw.split("\0") if arg] if "\0" in raw else raw.split()


def socket_inodes(procfs: Path, pid: int) -> set[int]:
    """Inodes of the sockets the process has open (its fds pointing at 'socket:[N]').

    Raises PermissionError when the agent may not look at the process's descriptors.
    """
    fd_dir = procfs / str(pid) / "fd"
    inodes = set()
    try:
        names = os.listdir(fd_dir)
    except FileNotFoundError:
        return set()
    for name in names:
        try:
            target = os.readlink(fd_dir / name)
        except OSError:
            continue
        socket_link = _SOCKET_LINK.fullmatch(target)
        if socket_link:  # anything else ("socket:[abc]": never the kernel's) is not a socket of ours
            inodes.add(int(socket_link.group(1)))
    return inodes


def listening_sockets(
    procfs: Path, pid: int, tables: dict[str, dict[int, ListeningSocket]] | None = None
) -> list[ListeningSocket]:
    """TCP sockets the process listens on, read from its own network namespace's tables
    (/proc/PID/net/tcp and tcp6) and matched to its descriptors by inode.

    ``tables`` caches each namespace's listening sockets for the caller's round: every
    process of a namespace sees the same tables, so N processes read them once, not N times
    (400 look-alike processes each reading a 400-line table was quadratic)."""
    inodes = socket_inodes(procfs, pid)
    if not inodes:
        return []
    try:
        namespace = os.readlink(procfs / str(pid) / "ns" / "net")
    except OSError:
        namespace = ""
    if tables is None or not namespace:
        listening = _listening_table(procfs, pid)
    elif namespace in tables:
        listening = tables[namespace]
    else:
        listening = tables[namespace] = _listening_table(procfs, pid)
    found = [listening[inode] for inode in inodes if inode in listening]
    return sorted(found, key=lambda s: (s.port, s.address))


def _listening_table(procfs: Path, pid: int) -> dict[int, ListeningSocket]:
    """Every listening TCP socket of the process's network namespace, by inode."""
    return {
        inode: ListeningSocket(_address(address), port, inode)
        for address, port, inode, _ in _listening_lines(procfs / str(pid) / "net")
    }


def listeners_on_port(procfs: Path, port: int) -> dict[int, int]:
    """The TCP sockets listening on ``port``, whatever their address, in the reader's own
    network namespace (``<procfs>/net/tcp{,6}``: /proc/net is /proc/self/net): inode -> the
    uid of the socket's creator (the kernel's ``uid`` column, which its process cannot change)."""
    return {inode: uid for _, found, inode, uid in _listening_lines(procfs / "net") if found == port}


def _listening_lines(net: Path) -> Iterator[tuple[str, int, int, int]]:
    """(hex address, port, inode, uid) of each listening socket in <net>/tcp and tcp6."""
    for table, width in (("tcp", 8), ("tcp6", 32)):
        try:
            text = read_text(net / table)
        except OSError:
            continue
        for line in text.splitlines()[1:]:
            fields = line.split()
            if len(fields) < 10 or fields[3] != _LISTEN or not all(_decimal(fields[i]) for i in (7, 9)):
                continue
            address, _, port = fields[1].partition(":")
            # Hex as the kernel writes it, or the line is skipped: one bad line costs its socket only.
            if len(address) != width or not _HEX.fullmatch(address) or len(port) != 4 or not _HEX.fullmatch(port):
                continue
            yield address, int(port, 16), int(fields[9]), int(fields[7])


def _decimal(text: str) -> bool:
    return text.isascii() and text.isdigit() and len(text) <= 20  # str.isdigit alone: "²" too


def socket_holder(procfs: Path, inode: int, pids: Iterable[int]) -> tuple[int | None, bool]:
    """The first of ``pids`` that holds the socket ``inode`` among its descriptors, and whether
    some of them could not be looked at (another user's process, for an agent that is not root)."""
    unreadable = False
    for pid in pids:
        try:
            if inode in socket_inodes(procfs, pid):
                return pid, unreadable
        except PermissionError:
            unreadable = True
    return None, unreadable


def process_ids(procfs: Path) -> list[int]:
    """The pids in procfs, ascending (no file read)."""
    try:
        return sorted(int(name) for name in os.listdir(procfs) if name.isascii() and name.isdigit())
    except OSError:
        return []


def process_owner(procfs: Path, pid: int) -> tuple[int | None, tuple[int, ...]]:
    """The process's effective uid and its pid in each of its pid namespaces, outermost first
    (NSpid: ``(93445, 17)`` for pid 17 of a container), from /proc/PID/status, which anyone may
    read: (None, ()) when it is gone or unreadable."""
    try:
        text = read_text(procfs / str(pid) / "status")
    except OSError:
        return None, ()
    uid: int | None = None
    pids: tuple[int, ...] = (pid,)
    for line in text.splitlines():
        key, _, value = line.partition(":")
        fields = value.split()
        if key == "Uid" and len(fields) >= 2 and _decimal(fields[1]):
            uid = int(fields[1])
        elif key == "NSpid" and fields and all(_decimal(f) for f in fields):
            pids = tuple(int(f) for f in fields)
    return uid, pids


def _address(hex_address: str) -> str:
    """/proc/net/tcp's address: 32-bit words in host (little-endian) byte order."""
    words = bytes.fromhex(hex_address)
    raw = b"".join(words[i : i + 4][::-1] for i in range(0, len(words), 4))
    return str(ipaddress.ip_address(raw))


def descendants(table: dict[int, Process], root: int) -> list[int]:
    """root and every process below it, sorted."""
    children: dict[int, list[int]] = {}
    for process in table.values():
        children.setdefault(process.ppid, []).append(process.pid)
    found, stack = [], [root]
    while stack:
        pid = stack.pop()
        found.append(pid)
        stack.extend(children.get(pid, ()))
    return sorted(found)


def slurm_job(procfs: Path, pid: int) -> str:
    """The Slurm job a process runs in, "" if none (or it cannot be told).

    From its cgroup path (``.../job_4242/...``, cgroup v1 or v2, readable by anyone), else
    from SLURM_JOB_ID in its environment (needs the right to read it; only that one
    variable is looked at, nothing else of the environment is kept or logged).
    """
    return slurm_job_of_cgroup(procfs, pid) or slurm_job_of_environ(procfs, pid)


def slurm_job_of_environ(procfs: Path, pid: int) -> str:
    """SLURM_JOB_ID from the process's environment, "" if absent, unreadable or not a number
    (its user writes it: a claim, not a proof; slurm_job_of_cgroup is the proof)."""
    try:
        with open(f"{procfs}/{pid}/environ", "rb") as file:
            environ = file.read()
    except OSError:
        return ""
    for entry in environ.split(b"\0"):
        if entry.startswith(b"SLURM_JOB_ID="):
            value = entry[len(b"SLURM_JOB_ID=") :].decode("ascii", "replace")
            return value if value.isdigit() else ""
    return ""


def slurm_job_of_cgroup(procfs: Path, pid: int) -> str:
    """The Slurm job whose cgroup the process is in, "" if none.  Unlike its environment,
    which its user writes, a process's cgroup is set by slurmd: a user cannot claim a job."""
    try:
        # A string path: read for every process of the node every round, and pathlib's
        # joins cost more than the read (bench/footprint.py, docs/performance.md).
        match = _SLURM_JOB_IN_CGROUP.search(read_text(f"{procfs}/{pid}/cgroup"))
    except OSError:
        return ""
    return match.group(1) if match else ""


def same_network_namespace(procfs: Path, pids: Iterable[int]) -> dict[int, bool]:
    """Whether each process shares the agent's network namespace (True when unknown)."""
    try:
        ours = os.readlink(procfs / "self" / "ns" / "net")
    except OSError:
        return dict.fromkeys(pids, True)
    result = {}
    for pid in pids:
        try:
            result[pid] = os.readlink(procfs / str(pid) / "ns" / "net") == ours
        except OSError:
            result[pid] = True
    return result
