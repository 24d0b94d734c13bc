"""The straggler and paging cases of tests/alerts/test_pages_e2e.py (shared with test_alerts_e2e.py,
which checks every demo scenario is a case of one or the other)."""

from __future__ import annotations

from dataclasses import dataclass

SPEED = 60  # simulated seconds per real second

STRAGGLER_COLLECTORS = ("training", "gpu", "slurm", "host", "ethtool", "infiniband")
NCCL_COLLECTORS = ("nccl_inspector", "nccl_ras")


@dataclass(frozen=True)
class Case:
    scenario: str
    # alertname -> the suspects its `suspects` annotation must name (None: any)
    fires: dict[str, str | None]
    collectors: tuple[str, ...] = STRAGGLER_COLLECTORS
    nodes: int = 1
    # Faults there from the start need no faster clock (and a demo at speed 1 costs little CPU).
    speed: int = SPEED
    # Notifications: (receiver, alertnames of the one group) - or None: no notification at all.
    notified: tuple[str, frozenset[str]] | None = None


def ticket(*alertnames: str) -> tuple[str, frozenset[str]]:
    return ("lockstep-ticket", frozenset(alertnames))


def page(*alertnames: str) -> tuple[str, frozenset[str]]:
    return ("lockstep-page", frozenset(alertnames))


SUSTAINED = "LockstepTrainingStragglerSustained"
SLOWER = "LockstepTrainingSlowerThanPeers"
GPU_SUSTAINED = "LockstepGPUStragglerSustained"


def slow_rank(suspects: str) -> dict[str, str | None]:
    """A rank that holds its job back is slower than its peers too: both verdicts, one suspect
    (Alertmanager inhibits the second's notification by the first)."""
    return {SUSTAINED: suspects, SLOWER: suspects}


ALL_CASES: dict[str, Case] = {
    "healthy": Case("healthy", {}, collectors=("training", "gpu", "slurm")),
    # The ticket (LockstepTrainingSlowerThanPeers, sequential) is sent first; the same rank's
    # LockstepTrainingStragglerSustained follows in the job's group and inhibits it from then on.
    "slow-rank": Case("slow-rank", slow_rank("none found"), notified=ticket(SLOWER, SUSTAINED)),
    # Issue 44: the same slow rank, which no one waits for (rank 7 starts its steps last).
    "slow-rank-skewed": Case("slow-rank-skewed", {SLOWER: "none found"}, notified=ticket(SLOWER)),
    "straggler-thermal": Case(
        "straggler-thermal",
        {
            **slow_rank("gpu_throttle"),
            GPU_SUSTAINED: "gpu_throttle (sw_thermal_slowdown)",
            "LockstepGPUThermalSlowdown": None,
        },
        notified=ticket("LockstepGPUThermalSlowdown"),
    ),
    "straggler-pfc": Case(
        "straggler-pfc", {**slow_rank("pfc_pause"), "LockstepPFCStorm": None}, notified=page("LockstepPFCStorm")
    ),
    "straggler-data": Case("straggler-data", slow_rank("data_wait"), notified=ticket(SLOWER, SUSTAINED)),
    "straggler-nfs": Case(
        "straggler-nfs",
        {**slow_rank("data_wait, hung_mount"), "LockstepFilesystemHung": None},
        collectors=(*STRAGGLER_COLLECTORS, "filesystem"),
        notified=page("LockstepFilesystemHung"),
    ),
    "gpu-lost": Case(
        "gpu-lost",
        {"LockstepGPUFellOffBus": None, "LockstepTrainingStalled": None, "LockstepNodeNeedsRepair": None},
        collectors=("training", "gpu", "slurm"),
        speed=1,
        # One page, by node: the lost GPU and the node that needs a repair (alerts/alertmanager.yml).
        notified=page("LockstepGPUFellOffBus", "LockstepNodeNeedsRepair"),
    ),
    "leaf-switch": Case(
        "leaf-switch-down",
        {"LockstepIBPortDown": None},
        collectors=("infiniband",),
        nodes=4,
        speed=1,
        notified=page("LockstepIBPortDown"),
    ),
    # Issue 27: NCCL's own telemetry, the job's step logs left out (its two collectors only).
    "nccl-straggler": Case(
        "nccl-straggler",
        {"LockstepNCCLStraggler": "none found"},
        collectors=NCCL_COLLECTORS,
        notified=ticket("LockstepNCCLStraggler"),
    ),
    # Issue 35: rank 13 (dead, on node002 where no agent runs) is named within minutes, and the
    # 15-minute hang alert follows; one page for the job holds both.
    "nccl-hang": Case(
        "nccl-hang",
        {"LockstepNCCLHang": "none found", "LockstepNCCLRankStuck": "none found"},
        collectors=NCCL_COLLECTORS,
        notified=page("LockstepNCCLHang", "LockstepNCCLRankStuck"),
    ),
}
