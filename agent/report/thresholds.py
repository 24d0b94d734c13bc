"""The thresholds the report's notes use: the alert rules' own, copied from alerts/thresholds.py.

alerts/ is not part of the installed package (it generates the rule files), so the report
carries the numbers it needs here; tests/agent/report/test_notes.py checks every one equals
alerts/thresholds.py's, so a threshold moved there and not here fails the suite.  A note then
never contradicts an alert: both judge by the same number.
"""

from __future__ import annotations

TRAINING_STRAGGLER_COMPUTE_RATIO = 1.25
TRAINING_STRAGGLER_EVIDENCE_RATIO = 1.05
STRAGGLER_MIN_PEERS = 2
SUSPECT_GPU_THROTTLE_REASONS = ("hw_slowdown", "hw_thermal_slowdown", "sw_thermal_slowdown", "hw_power_brake")
SUSPECT_GPU_THROTTLE_SHARE = 0.1
SUSPECT_PFC_PAUSE_RATIO = 0.02
SUSPECT_IB_TRANSMIT_WAIT_RATIO = 0.05
SUSPECT_DATA_WAIT_SHARE = 0.5
SUSPECT_CPU_PRESSURE_RATIO = 0.25
SUSPECT_IO_PRESSURE_RATIO = 0.1
GRAFANA_URL = "http://grafana.example.com"
SLURM_JOB_DASHBOARD_UID = "lockstep-slurm-job"
TRAINING_STALL_WINDOW = "10m"
TRAINING_STEPPED_WITHIN = "2m"
CHECKPOINT_STALL_INTERVALS = 1.0
CHECKPOINT_OVERDUE_INTERVALS = 2.0
CHECKPOINT_DEFAULT_INTERVAL_SECONDS = 3600
CRITICAL_XIDS = (48, 61, 62, 64, 74, 92, 94, 95, 119, 120)
GPU_THROTTLE_TIME_RATIO = 0.25
GPU_IDLE_ACTIVITY_RATIO = 0.01
NCCL_STRAGGLER_WAIT_SHARE = 0.2


def seconds(duration: str) -> float:
    """A Prometheus duration of one unit ("10m", "2h", "30s") in seconds."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    return float(duration[:-1]) * units[duration[-1]]
