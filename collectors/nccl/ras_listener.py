"""Whose answer it is: the process holding NCCL's RAS port, checked against what the answer says.

Any user on the node can listen on the RAS port (28028) while no NCCL process holds it, and
answer the agent's query with anything: ranks on this node's addresses that name another
user's processes, dead ranks.  The job id of every series came from the first pid the answer
named, so such an answer raised the hang alert for someone else's healthy job (issue 46).  An
answer is now trusted only if the socket listening on the port belongs to the process it
claims to come from:

1. The sockets listening on the port in the agent's network namespace (``<procfs>/net/tcp``
   and ``tcp6``, whatever their address: one on ::1 beside NCCL's on 127.0.0.1 would take
   "localhost" connections) are the same before the query and after the answer: a listener
   that changed meanwhile is not known to be the one that answered.
2. Each is held (``/proc/PID/fd`` -> ``socket:[inode]``) by a process that runs as the socket's
   user (the ``uid`` column of /proc/net/tcp, set by the kernel when the socket was made) and
   that the answer names as one of this node's ranks (its pid, or its pid inside its
   container's pid namespace: ``NSpid`` of /proc/PID/status), or that is in the same Slurm job
   (its cgroup, set by slurmd) as a process the answer names running as that user (a
   DataLoader worker forked by a rank holds the rank's socket too).
3. An agent that is not root may not read other users' descriptors.  When the holder cannot be
   found for that reason alone, the answer is trusted if a process it names as this node's rank
   runs as the socket's user: then the answer is that user's to give.

The job id of the answer's series is the job of that process (its cgroup, else its
SLURM_JOB_ID), never that of a pid the answer merely names.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from lockstep.collectors.nccl.ras_client import RasError
from lockstep.collectors.toolkit.procs import (
    process_ids,
    process_owner,
    slurm_job_of_cgroup,
    socket_holder,
)


class Untrusted(RasError):
    """The answer does not come from the process it names (or that cannot be told): refused."""


def trusted_listener(
    procfs: Path,
    port: int,
    before: dict[int, int],
    after: dict[int, int],
    named: set[int],
    previous: int | None = None,
) -> int:
    """The pid whose job the answer is, or Untrusted saying why.

    ``before`` and ``after``: the sockets listening on ``port`` (inode -> uid,
    procs.listeners_on_port) before the query and after the answer; ``named``: the pids the
    answer gives this node's ranks; ``previous``: the pid trusted last time, looked at first.
    """
    if not after:
        raise Untrusted(f"no socket listening on port {port} is seen in {procfs}/net/tcp or tcp6")
    if before != after:
        raise Untrusted(f"the socket listening on port {port} changed during the query")
    if not named:
        raise Untrusted("the answer names no process among this node's ranks: whose answer it is cannot be told")
    existing = process_ids(procfs)
    here = [pid for pid in existing if pid in named]
    # The last holder first, then the named processes (a rank, rather than its forked workers),
    # then every other: a container's rank is named by its pid inside the container.
    first = [previous] if previous in existing else []
    order = [*first, *(p for p in here if p != previous), *(p for p in existing if p not in named and p != previous)]
    trusted = [_check(procfs, port, inode, uid, named, here, order) for inode, uid in sorted(after.items())]
    return trusted[0]


def _check(
    procfs: Path, port: int, inode: int, uid: int, named: set[int], here: list[int], order: Iterable[int]
) -> int:
    holder, unreadable = socket_holder(procfs, inode, order)
    if holder is None:
        if not unreadable:
            raise Untrusted(f"no process holds the socket listening on port {port} (inode {inode})")
        # Not root: another user's descriptors cannot be read.  The user is known, though.
        for pid in here:
            if process_owner(procfs, pid)[0] == uid:
                return pid
        raise Untrusted(
            f"the socket listening on port {port} is uid {uid}'s, and no process the answer names runs as it "
            "(the agent may not read other users' descriptors to tell more)"
        )
    holder_uid, namespace_pids = process_owner(procfs, holder)
    if holder_uid != uid:
        raise Untrusted(f"pid {holder} holds the socket listening on port {port} but runs as another user")
    if holder in named or (namespace_pids and namespace_pids[-1] in named):
        return holder
    job = slurm_job_of_cgroup(procfs, holder)
    if job and any(slurm_job_of_cgroup(procfs, p) == job and process_owner(procfs, p)[0] == uid for p in here):
        return holder
    raise Untrusted(
        f"pid {holder}, which listens on port {port}, is none of the processes the answer names "
        "nor in their Slurm job as their user"
    )
