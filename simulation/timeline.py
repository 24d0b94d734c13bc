"""When the simulated node's faults begin: the one timeline every area of the node follows.

The fault of a straggler scenario (rank 3, on GPU 3, turns ~10 % slower) begins at SLOW_ONSET,
after 25 minutes of healthy history to compare it against; the GPU area throttles GPU 3, the
fabric area pauses its port, the storage area hangs its NFS server, all from that moment, so the
areas tell one consistent story.  Times are simulated seconds since the demo started.
"""

from __future__ import annotations

SLOW_ONSET = 1500.0
SLOW_FACTOR = 1.10
SLOW_SCENARIOS = ("slow-rank", "straggler-thermal", "straggler-pfc", "straggler-data", "straggler-nfs")
# In these the rank's data loader is what is slow: its data wait grows by as much time.
DATA_SCENARIOS = ("straggler-data", "straggler-nfs")
# The vLLM server's faults (workloads area); the GPU area gives its GPU the matching load.
INFERENCE_SCENARIOS = ("inference-slow", "inference-errors", "inference-quiet")


def slow(scenario: str, t: float) -> bool:
    """Whether the straggler scenario's fault is on at time t."""
    return scenario in SLOW_SCENARIOS and t >= SLOW_ONSET
