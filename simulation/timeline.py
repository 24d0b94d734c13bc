"""When the simulated node's faults begin: the one timeline every area of the node follows.

The fault of a straggler scenario (rank 3, on GPU 3, turns ~10 % slower) begins at SLOW_ONSET,
after 25 minutes of healthy history to compare it against; the GPU area throttles GPU 3, the
fabric area pauses its port, the storage area hangs its NFS server, all from that moment, so the
areas tell one consistent story.  Times are simulated seconds since the demo started.
"""

from __future__ import annotations

SLOW_ONSET = 1500.0
SLOW_FACTOR = 1.10
SLOW_SCENARIOS = (
    "slow-rank",
    "slow-rank-skewed",
    "straggler-thermal",
    "straggler-pfc",
    "straggler-data",
    "straggler-nfs",
)
# Issue 44: node001's ranks start each step SKEW seconds after the one before (launch skew, an
# input pipeline that hands out batches in turn), so its last rank (7) arrives last at every
# all-reduce and the slow rank 3 is waited for by no one: slower than its peers, holding no one back.
SKEWED_SCENARIOS = ("slow-rank-skewed",)
SKEW = 0.7
# In these the rank's data loader is what is slow: its data wait grows by as much time.
DATA_SCENARIOS = ("straggler-data", "straggler-nfs")
# The vLLM server's faults (workloads area); the GPU area gives its GPU the matching load.
INFERENCE_SCENARIOS = ("inference-slow", "inference-errors", "inference-quiet")


def slow(scenario: str, t: float) -> bool:
    """Whether the straggler scenario's fault is on at time t."""
    return scenario in SLOW_SCENARIOS and t >= SLOW_ONSET


# Issue 35's hangs and their twins: at HANG_AT job 4242 hangs (rank HANG_RANK, on this node's GPU
# HANG_RANK, stops before a collective the other 15 ranks launch and spin in), or saves a
# checkpoint synchronously for PAUSE seconds (its coordinator, rank 0, writes while the others
# wait in a collective and spin), or evaluates for PAUSE seconds (every GPU at work, no step, no
# collective), or ends.  hang-killed hangs as hang-nccl and its watchdog (PyTorch's NCCL timeout,
# 10 minutes) ends the job at KILLED_AT.  hang-nccl and hang-killed write no step logs (NCCL's
# telemetry alone), hang-steps no NCCL telemetry (step logs alone); the twins have both.
HANG_AT = 60.0
HANG_RANK = 6
PAUSE = 360.0
KILLED_AT = HANG_AT + 600.0
HANGS = ("hang-nccl", "hang-steps", "hang-killed")
HANG_TWINS = ("hang-save", "hang-eval", "hang-end")
HANG_SCENARIOS = (*HANGS, *HANG_TWINS)
# Who writes what: step logs, NCCL's Inspector dumps and RAS.
HANG_STEP_LOGS = ("hang-steps", *HANG_TWINS)
HANG_NCCL = ("hang-nccl", "hang-killed", *HANG_TWINS)


def hang_phase(scenario: str, t: float) -> str:
    """What job 4242 does at time t in a hang scenario: run, hang, save, evaluate or ended."""
    if scenario not in HANG_SCENARIOS or t < HANG_AT:
        return "run"
    if scenario == "hang-killed" and t >= KILLED_AT or scenario == "hang-end":
        return "ended"
    if scenario in HANGS:
        return "hang"
    if t >= HANG_AT + PAUSE:
        return "run"
    return "save" if scenario == "hang-save" else "evaluate"


# Issue 37: job 4242 seen through its framework's own output alone (framework_logs.py): no per-rank
# step logs, no NCCL telemetry.  framework-stall: its last report at FRAMEWORK_STALL_AT;
# framework-slowdown: 1.5x slower steps from FRAMEWORK_SLOW_AT (20 s into the demo, as the inference
# faults: the end-to-end run watches for 150 s).
FRAMEWORK_ONLY = ("framework-stall", "framework-slowdown")
FRAMEWORK_STALL_AT = -720.0
FRAMEWORK_SLOW_AT = 20.0
