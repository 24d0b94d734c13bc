"""The NCCL panels of the Slurm job dashboard (issue 27): one job's collectives as NCCL itself
reports them, for jobs that write no step logs.  Inspector: each rank's time per collective
against its communicator's median, the share of its peers' time lost waiting for it, its bus
bandwidth.  RAS: each communicator's progress, its missing and dead ranks, the ranks behind."""

from __future__ import annotations

from alerts.nccl import PER_OP, STRAGGLER_SUSPECT, STUCK_RANKS, STUCK_SUSPECT, WAIT_SHARE
from alerts.promql import num
from dashboards.panels import JOB, RATE, RED, Cell, above, table, timeseries
from lockstep import thresholds as T

RANK_BY = "by (cluster, job_id, comm, rank, host)"


def collectives() -> list[Cell]:
    """Inspector: who waits for whom."""
    return [
        timeseries(
            "Time per collective per rank",
            [(f"{PER_OP}{{{JOB}}}", "{{comm}} rank {{rank}} ({{host}})")],
            "s",
            "Each rank's mean kernel time per collective (NCCL Inspector, 5 min). A collective runs until every "
            "rank has joined: the rank every other rank waits for has the shortest time, its peers the longest.",
        ),
        timeseries(
            "Peers' collective time lost to each rank",
            [(f"{WAIT_SHARE}{{{JOB}}}", "{{comm}} rank {{rank}} ({{host}})")],
            "percentunit",
            "1 - the rank's time per collective / its communicator's median: the share of the median rank's "
            f"collective time spent waiting for this rank. LockstepNCCLStraggler fires above "
            f"{T.NCCL_STRAGGLER_WAIT_SHARE:.0%} for {T.NCCL_STRAGGLER_FOR}.",
            above((T.NCCL_STRAGGLER_WAIT_SHARE, RED)),
        ),
        timeseries(
            "Bus bandwidth per rank",
            [
                (
                    f"sum {RANK_BY} (rate(lockstep_nccl_collective_bus_bytes_total{{{JOB}}}[{RATE}]))\n"
                    f"/ sum {RANK_BY} (rate(lockstep_nccl_collective_seconds_total{{{JOB}}}[{RATE}]))",
                    "{{comm}} rank {{rank}} ({{host}})",
                )
            ],
            "Bps",
            "NCCL's bus bandwidth, weighted by time, over every collective type: comparable with the links' "
            "speed. A straggler's peers show a low bandwidth (their time includes the wait).",
        ),
        table(
            "Straggling ranks and their suspects",
            [
                (
                    f"{STRAGGLER_SUSPECT}{{{JOB}}}\nor\nlabel_replace(\n"
                    f"  {WAIT_SHARE}{{{JOB}}} > {num(T.NCCL_STRAGGLER_WAIT_SHARE)}\n"
                    f"  unless on (cluster, job_id, comm, rank) {STRAGGLER_SUSPECT},\n"
                    '  "suspect", "none found", "", ""\n)',
                    "",
                )
            ],
            "none",
            "Ranks whose peers lose more than "
            f"{T.NCCL_STRAGGLER_WAIT_SHARE:.0%} of their collective time waiting for them, with what their node "
            "showed in the last 30 minutes (the training straggler suspects, docs/alerting.md).",
            hide=("Time", "__name__", "job", "Value", "cluster", "job_id"),
        ),
    ]


def communicators() -> list[Cell]:
    """RAS: progress, missing and dead ranks, the ranks behind."""
    return [
        timeseries(
            "Collectives launched per communicator",
            [
                (
                    f"max by (cluster, job_id, comm) (rate(lockstep_nccl_communicator_collectives_total{{{JOB}}}"
                    f"[{RATE}]))",
                    "{{comm}}",
                )
            ],
            "ops",
            "Collectives a second launched by each communicator's furthest rank (NCCL RAS). Zero for "
            f"{T.NCCL_HANG_WINDOW} after running: LockstepNCCLHang.",
        ),
        timeseries(
            "Missing and dead ranks",
            [
                (f"max by (comm) (lockstep_nccl_communicator_missing_ranks{{{JOB}}})", "{{comm}} missing"),
                (f"max by (comm) (lockstep_nccl_communicator_dead_ranks{{{JOB}}})", "{{comm}} dead"),
            ],
            "none",
            "Ranks that did not answer the RAS query; dead: unreachable for 60 s (LockstepNCCLHang).",
            above((1, RED)),
        ),
        table(
            "Stuck ranks and their suspects",
            [
                (
                    f"{STUCK_SUSPECT}{{{JOB}}}\nor\nlabel_replace(\n"
                    f"  {STUCK_RANKS}{{{JOB}}}\n"
                    f"  unless on (cluster, job_id, comm, rank) {STUCK_SUSPECT},\n"
                    '  "suspect", "none found", "", ""\n)',
                    "",
                )
            ],
            "none",
            "Ranks behind their communicator's furthest rank, and missing ranks (RAS), with the node whose agent "
            "reports their address, their GPU (NVML index) and what that node showed in the last 30 minutes.",
            hide=("Time", "__name__", "job", "Value", "cluster", "job_id"),
        ),
    ]


def nccl() -> list[Cell]:
    """The NCCL rows of the Slurm job dashboard (dashboards/boards/slurm_job.py)."""
    return [*collectives(), *communicators()]
