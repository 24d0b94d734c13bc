"""The simulated node's NCCL: job 4242's Inspector dump files and its RAS service.

In the NCCL scenarios below (elsewhere the job runs without NCCL's telemetry: no dumps, the RAS
port refuses), job 4242 (workloads.py: 16 ranks, ranks 0-7 on node001 = this node, 8-15 on
node002, one training process per node, pid 2200) runs with NCCL 2.30.7's Inspector plugin
dumping into ``nccl-inspector-4242`` in each node's run directory on the shared /scratch (this
node's agent reads its own, task 0's), and with RAS on (this node's RAS address 10.0.0.1, node002's 10.0.0.2).  Each
training step ends with one 4 GiB gradient AllReduce on communicator ``0x5f4a2b1c9d8e7f60``
(the world, 16 ranks on 2 nodes; RAS prints that hash whole, the Inspector plugin its first 14
hex digits, ``0x5f4a2b1c9d8e7f``, and both collectors export the latter in ``comm``): a rank's
kernel runs from its own arrival until the last rank's, plus the transfer, so the rank every
other rank waits for has the shortest time.  The steps are those of the healthy job
(workloads.timeline): the NCCL area tells its own story in its own scenarios, whose step logs
stay healthy as if the job wrote none (the point of NCCL's telemetry: jobs without the emitter).

``nccl-straggler``: rank 5 (node001, GPU 5) computes 1.3x as long as its peers: its AllReduce
time is the transfer alone, its peers' the transfer plus the wait for it; RAS finds it one
AllReduce behind them (they already wait in the next one).
``nccl-jitter`` (its healthy twin): every rank's arrival varies by up to 4 % of its work from
step to step (as a real job's steps do), a different rank last each time: in one step the
median rank may wait up to ~19 % of its collective time for the last one (the alert's threshold
is 20 %, held for 10 minutes), over minutes all ranks wait alike.
``nccl-hang``: 2 minutes before the demo, rank 13 (node002, GPU 5)'s process died in AllReduce
#N: the other 15 ranks launched #N and wait in it for good; RAS lists rank 13 as missing and,
60 s on, dead.  No step completes and no Inspector record is written after it.
``nccl-finished`` (its twin): the job ended 2 minutes before the demo: its communicators were
destroyed and nothing listens on the RAS port.
The hang scenarios of issue 35 (timeline.py) with NCCL's telemetry: ``hang-nccl`` and
``hang-killed`` (rank 6, on this node's GPU 6, stops one AllReduce behind the other 15 and the
counts stop; hang-killed's communicators are gone from KILLED_AT), ``hang-save`` (the coordinator,
rank 0, is behind while the others wait in the save's collective), ``hang-eval`` (no collective,
every rank equal) and ``hang-end`` (nothing listens from HANG_AT).  In the hang scenarios,
this node's agent reads its ranks' dumps and RAS as in the others.

While RAS answers, the job's process (pid 2200, alice's uid 1001) holds the socket listening
on 127.0.0.1:28028 in the simulated procfs (``net/tcp``, its ``fd`` and ``status``), as the
first NCCL process of a node does: the collector trusts an answer only from the process it
names (collectors/nccl/ras_listener.py).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import TYPE_CHECKING

from lockstep.collectors.nccl.ras_client import RAS_CONNECT
from lockstep.simulation import Scenario
from lockstep.simulation.fake_ras import FakeCommunicator, FakeJob, FakeMissingRank, FakeRank, FakeRas
from lockstep.simulation.timeline import HANG_NCCL, HANG_SCENARIOS, hang_phase
from lockstep.simulation.timeline import HANG_RANK as STOPPED_RANK
from lockstep.simulation.workloads import (
    COMPUTE,
    DATA_WAIT,
    DEMO_EPOCH,
    HOSTS,
    JOB_ID,
    RANKS,
    RANKS_PER_NODE,
    TRANSFER,
    timeline,
)

if TYPE_CHECKING:
    from lockstep.simulation import SimulatedNode

SCENARIOS = (
    Scenario(
        "nccl-straggler",
        "Job 4242 (no step logs needed): NCCL Inspector shows rank 5 (GPU 5) with the shortest AllReduce time, "
        "its 15 peers waiting ~30 % of a step for it.",
    ),
    Scenario(
        "nccl-jitter",
        "Job 4242's ranks arrive at the AllReduce up to 4 % of a step apart, a different rank last each step: "
        "no straggler (fires nothing).",
    ),
    Scenario(
        "nccl-hang",
        "Job 4242 hangs: rank 13 (node002, GPU 5) died 2 minutes ago in an AllReduce the other 15 ranks "
        "wait in; RAS lists it dead and the collective counts stop.",
    ),
    Scenario(
        "nccl-finished",
        "Job 4242 ended 2 minutes ago: its NCCL communicators are gone, nothing answers on the RAS port "
        "(fires nothing).",
    ),
)

NCCL_SCENARIOS = tuple(scenario.name for scenario in SCENARIOS)
# Every scenario in which job 4242 runs with NCCL's telemetry (Inspector dumps, RAS answering).
WITH_TELEMETRY = (*NCCL_SCENARIOS, *HANG_NCCL)
COMM_HASH = 0x5F4A2B1C9D8E7F60  # what RAS prints whole ("0x%lx")
# What the Inspector plugin writes as header.id: snprintf(buf, NCCL_COMM_HASH_LENGTH = 17, "0x%lx", hash)
# (NVIDIA/nccl v2.30.7-1, plugins/profiler/inspector/inspector.cc inspectorCommGetHashStr): cut to 14 hex digits.
COMM = f"0x{COMM_HASH:x}"[:16]
COMM_NAME = "world"
PID = 2200
ADDRESSES = ("10.0.0.1", "10.0.0.2")
MESSAGE_BYTES = 4 << 30
P2P_BYTES, P2P_SECONDS = 64 << 20, 0.004
# This node's own dumps (its run directory, task 0): each node's agent reads its own ranks'.
DUMP_GLOB = "/scratch/runs/*__task=0/nccl-inspector-*/*.log"
STRAGGLER_RANK, STRAGGLER_FACTOR = 5, 1.3
JITTER = 0.04
HANG_RANK, HANG_AT = 13, -120.0  # rank 13's process dies at this time
# pid 2200's socket listening on the RAS port: its descriptor, inode, and its user's uid (alice,
# UserId=alice(1001) in simulation/slurm.py's scontrol).
RAS_FD, RAS_SOCKET_INODE, JOB_UID = 9, 280280, 1001
RAS_PORT = 28028
TCP_HEADER = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
DEAD_AFTER = 60.0  # RAS declares a process dead after 60 s without keep-alives
FINISHED_AT = -120.0

# Per dump file: (steps written, file size then), to append instead of rewriting.
_written: dict[str, tuple[int, int]] = {}


def build(node: SimulatedNode, t: float) -> None:
    if node.seams.get(RAS_CONNECT) is None:  # one for the node's life, like every seam; it reads the node's time
        ras = FakeRas(lambda: ras_job(node.scenario, node.t))
        node.seams.replace(RAS_CONNECT.replaced_by(ras.connect))
    _ras_listener(node, t)
    if node.scenario not in WITH_TELEMETRY:
        return  # the job runs without NCCL's telemetry: no dumps to read, no RAS port answering
    node.options["nccl_inspector"] = {"dumps": [DUMP_GLOB], "start_at": "beginning", "node_name": HOSTS[0]}
    node.options["nccl_ras"] = {"node_addresses": [ADDRESSES[0]]}
    steps = _steps(node.scenario, t)
    for task, host in enumerate(HOSTS):
        _dump(node, dump_path(node, task, host), node.scenario, task, steps)


def _ras_listener(node: SimulatedNode, t: float) -> None:
    """pid 2200 holds 127.0.0.1:28028 while RAS answers; nothing listens otherwise."""
    if node.scenario not in WITH_TELEMETRY:
        return
    proc = node.paths.procfs
    fd = proc / str(PID) / "fd" / str(RAS_FD)
    listening = ras_job(node.scenario, t) is not None
    lines = TCP_HEADER
    if listening:
        lines += (
            f"   0: 0100007F:{RAS_PORT:04X} 00000000:0000 0A 00000000:00000000 00:00000000 00000000 "
            f"{JOB_UID:>5}        0 {RAS_SOCKET_INODE} 1 0000000000000000 100 0 0 10 0\n"
        )
        if not fd.is_symlink():
            fd.parent.mkdir(parents=True, exist_ok=True)
            os.symlink(f"socket:[{RAS_SOCKET_INODE}]", fd)
        node.write(
            proc / str(PID) / "status",
            f"Name:\tpython\nTgid:\t{PID}\nPid:\t{PID}\nPPid:\t2101\nNSpid:\t{PID}\n"
            f"Uid:\t{JOB_UID}\t{JOB_UID}\t{JOB_UID}\t{JOB_UID}\nGid:\t{JOB_UID}\t{JOB_UID}\t{JOB_UID}\t{JOB_UID}\n",
        )
    else:
        fd.unlink(missing_ok=True)
    node.write(proc / "net" / "tcp", lines)
    node.write(proc / "net" / "tcp6", TCP_HEADER)


def _steps(scenario: str, t: float) -> list[tuple[float, float]]:
    if scenario in HANG_SCENARIOS:
        return timeline(scenario, t)  # the job's own: stopped at the hang or its end, paused by a save or evaluation
    steps = timeline("healthy", t)
    if scenario == "nccl-hang":
        return [s for s in steps if s[1] <= HANG_AT]
    if scenario == "nccl-finished":
        return [s for s in steps if s[1] <= FINISHED_AT]
    return steps


def _unit(*key: object) -> float:
    """A deterministic pseudo-random number in [0, 1) for the key."""
    digest = hashlib.blake2b(repr(key).encode(), digest_size=4).digest()
    return int.from_bytes(digest, "big") / 2**32


def arrival(scenario: str, rank: int, step: int) -> float:
    """Seconds from the step's start until the rank reaches the AllReduce."""
    work = DATA_WAIT + COMPUTE
    if scenario == "nccl-straggler" and rank == STRAGGLER_RANK:
        return DATA_WAIT + COMPUTE * STRAGGLER_FACTOR
    if scenario == "nccl-jitter":
        return work * (1.0 + JITTER * _unit("jitter", rank, step))
    return work


def exec_seconds(scenario: str, rank: int, step: int) -> float:
    """The rank's AllReduce kernel time: from its arrival until the last rank's, plus the transfer."""
    last = max(arrival(scenario, r, step) for r in range(RANKS))
    return round(last - arrival(scenario, rank, step) + TRANSFER, 6)


def record(scenario: str, rank: int, host: str, step: int, end: float) -> str:
    """The rank's Inspector lines of one step as NCCL 2.30.7 writes them
    (collectors/nccl/inspector_records.py): its activations' Send (ranks 0-7, to the same local
    rank on node002) or Recv (ranks 8-15) of the pipeline, then the gradient AllReduce."""
    seconds = exec_seconds(scenario, rank, step)
    algo_gbs = MESSAGE_BYTES / seconds / 1e9
    bus_gbs = algo_gbs * 2 * (RANKS - 1) / RANKS
    p2p_gbs = P2P_BYTES / P2P_SECONDS / 1e9
    first_stage = rank < RANKS_PER_NODE
    header = (
        f'{{"header":{{"id":"{COMM}","comm_name":"{COMM_NAME}","rank":{rank},"n_ranks":{RANKS},"nnodes":{len(HOSTS)}}},'
        f'"metadata":{{"inspector_output_format_version":"v4.0","git_rev":"","rec_mechanism":"nccl_profiler_interface",'
        f'"dump_timestamp_us":{int((DEMO_EPOCH + end) * 1e6)},"hostname":"{host}","pid":{PID}}},'
    )
    return (
        f'{header}"p2p_perf":{{"p2p":"{"Send" if first_stage else "Recv"}","p2p_sn":{step},'
        f'"p2p_peer":{rank + RANKS_PER_NODE if first_stage else rank - RANKS_PER_NODE},'
        f'"p2p_msg_size_bytes":{P2P_BYTES},"p2p_exec_time_us":{round(P2P_SECONDS * 1e6)},'
        f'"p2p_timing_source":"kernel_gpu","p2p_algobw_gbs":{p2p_gbs:f},"p2p_busbw_gbs":{p2p_gbs:f}}}}}\n'
        f'{header}"coll_perf":{{"coll":"AllReduce","coll_sn":{step},"coll_msg_size_bytes":{MESSAGE_BYTES},'
        f'"coll_exec_time_us":{round(seconds * 1e6)},"coll_timing_source":"kernel_gpu",'
        f'"coll_algobw_gbs":{algo_gbs:f},"coll_busbw_gbs":{bus_gbs:f}}}}}\n'
    )


def dump_path(node: SimulatedNode, task: int, host: str) -> Path:
    run = f"llama-70b__job={JOB_ID}__task={task}"
    return node.paths.rootfs / "scratch" / "runs" / run / f"nccl-inspector-{JOB_ID}" / f"{host}-pid{PID}.log"


def _dump(node: SimulatedNode, path: Path, scenario: str, task: int, steps: list[tuple[float, float]]) -> None:
    ranks = range(task * RANKS_PER_NODE, (task + 1) * RANKS_PER_NODE)
    host = HOSTS[task]

    def text(first: int) -> str:
        return "".join(record(scenario, r, host, k, steps[k][1]) for k in range(first, len(steps)) for r in ranks)

    written, size = _written.get(str(path), (0, -1))
    if not path.exists() or path.stat().st_size != size or written > len(steps):
        node.write(path, text(0))
    elif written < len(steps):
        with open(path, "a") as dump:
            dump.write(text(written))
    _written[str(path)] = (len(steps), path.stat().st_size)


def ras_job(scenario: str, t: float) -> FakeJob | None:
    """What the job's RAS service answers at time t (None: nothing listens)."""
    if scenario not in WITH_TELEMETRY or scenario == "nccl-finished" or hang_phase(scenario, t) == "ended":
        return None
    launched = len(_steps(scenario, t))
    # Issue 35: the rank the others wait for (they launched the next collective and wait in it).
    behind = {"hang": STOPPED_RANK, "save": 0}.get(hang_phase(scenario, t))
    ranks, missing = [], []
    for rank in range(RANKS):
        node_index, local = divmod(rank, RANKS_PER_NODE)
        address = ADDRESSES[node_index]
        counts = {"Broadcast": 1, "Reduce": 0, "AllGather": 0, "ReduceScatter": 0, "AllReduce": launched}
        if scenario == "nccl-hang" and t >= HANG_AT:
            if rank == HANG_RANK:
                dead = t >= HANG_AT + DEAD_AFTER
                missing.append(FakeMissingRank(rank, address, PID, local, local, unresponsive=True, dead=dead))
                continue
            counts["AllReduce"] = launched + 1  # launched the AllReduce rank 13 never joined
        elif scenario == "nccl-straggler" and rank != STRAGGLER_RANK:
            counts["AllReduce"] = launched + 1  # the peers wait in the next AllReduce, rank 5 is still computing
        elif behind is not None and rank != behind:
            counts["AllReduce"] = launched + 1  # they wait in a collective the stopped rank never joins
        ranks.append(FakeRank(rank, address, PID, local, local, counts))
    return FakeJob([FakeCommunicator(COMM_HASH, RANKS, ranks, missing)], timestamp="2026-11-25 19:00:00")
