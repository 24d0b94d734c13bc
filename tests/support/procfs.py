"""Fixture procfs trees for processes and their sockets: what the kernel shows in
/proc/PID/{cgroup,status,fd} and /proc/net/tcp{,6}, written in its own format (tests read
these trees through a collector's procfs root, never by patching open or listdir)."""

from __future__ import annotations

from pathlib import Path

JOB_CGROUP = "0::/system.slice/slurmstepd.scope/job_{job}/step_0/user/task_0\n"
USER, OTHER_USER = 1000, 1001
LISTENER_INODE = 51234  # the socket listening on NCCL's RAS port in the NCCL tests
TCP_HEADER = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"


def tcp_listen(address: str, port: int, uid: int, inode: int) -> str:
    """One listening socket's line of /proc/net/tcp or tcp6 (address in the kernel's hex)."""
    return (
        f"   0: {address}:{port:04X} {'0' * len(address)}:0000 0A 00000000:00000000 00:00000000 00000000 "
        f"{uid:>5}        0 {inode} 1 0000000000000000 100 0 0 10 0\n"
    )


def stat(proc: Path, pid: int, comm: str = "python", *, ppid: int = 1, state: str = "S", threads: int = 1) -> None:
    """The process's /proc/PID/stat, as the kernel writes it (a user process: no PF_KTHREAD in
    its flags; the fields after num_threads cut short)."""
    (proc / str(pid)).mkdir(parents=True, exist_ok=True)
    (proc / str(pid) / "stat").write_text(
        f"{pid} ({comm}) {state} {ppid} {pid} {pid} 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 {threads} 0 100\n"
    )


def process(
    proc: Path,
    pid: int,
    *,
    uid: int = USER,
    job: str | None = "4242",
    sockets: tuple[int, ...] = (),
    nspid: tuple[int, ...] = (),
) -> None:
    """A process in the fixture procfs: its stat, cgroup, status (uid, NSpid), socket descriptors."""
    (proc / str(pid) / "fd").mkdir(parents=True, exist_ok=True)
    stat(proc, pid)
    (proc / str(pid) / "cgroup").write_text(JOB_CGROUP.format(job=job) if job else "0::/user.slice/session-3.scope\n")
    pids = "\t".join(str(p) for p in (nspid or (pid,)))
    (proc / str(pid) / "status").write_text(
        f"Name:\tpython\nTgid:\t{pid}\nPid:\t{pid}\nNSpid:\t{pids}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n"
    )
    for fd, inode in enumerate(sockets, start=7):
        (proc / str(pid) / "fd" / str(fd)).symlink_to(f"socket:[{inode}]")


def listeners(proc: Path, *lines: str, v6: tuple[str, ...] = ()) -> None:
    """The agent's network namespace's TCP tables (<procfs>/net/tcp and tcp6)."""
    (proc / "net").mkdir(parents=True, exist_ok=True)
    (proc / "net" / "tcp").write_text(TCP_HEADER + "".join(lines))
    (proc / "net" / "tcp6").write_text(TCP_HEADER + "".join(v6))
