"""Lockstep's Prometheus recording and alerting rules: the index of the rule groups, in the order
the rule files list them.

`python -m alerts --write` renders these groups (alerts/render.py) into
alerts/lockstep-recording.rules.yml, alerts/lockstep-alerts.rules.yml and
deploy/prometheusrule.yaml; tests/alerts/test_alert_rules.py fails when those files differ from what
it renders.  Every number comes from lockstep/thresholds.py, which the dashboards read too.

Where the rules are written:

    alerts/model.py                 Recording, Alert, Group
    alerts/promql.py                PromQL and annotation template helpers
    alerts/recording.py             recording rules: training, GPU, inference, storage, fabric, fleet
    alerts/straggler_recording.py   recording rules: sustained stragglers and their suspects
    alerts/training.py              straggler and stalled-training alerts
    alerts/nccl.py                  NCCL collective straggler and hang (Inspector, RAS): rules and alerts
    alerts/hang.py                  hangs named within minutes (RAS, spinning GPUs, steps), and jobs that ended hung
    alerts/inference.py             inference endpoint alerts
    alerts/storage.py               checkpoint and filesystem alerts
    alerts/gpu.py                   GPU, NVLink and GPU verdict alerts
    alerts/fabric.py                InfiniBand, PFC and RoCE alerts
    alerts/pcie.py                  PCIe link alerts
    alerts/agent.py                 the agent's own alerts
    alerts/nodes.py                 a node's record across jobs: the nodes that keep hurting jobs
    alerts/render.py                the rule files and the PrometheusRule, as YAML
    alerts/compression.py           shorter windows for end-to-end tests (never in production)
"""

from __future__ import annotations

from alerts.agent import AGENT_ALERTS
from alerts.fabric import FABRIC_ALERTS
from alerts.framework import FRAMEWORK_ALERTS, FRAMEWORK_RECORDING
from alerts.gpu import GPU_ALERTS, GPU_VERDICT_ALERTS, NVLINK_ALERTS
from alerts.hang import HANG_ALERTS, HANG_RECORDING
from alerts.inference import INFERENCE_ALERTS
from alerts.model import Alert, Group, Recording
from alerts.nccl import NCCL_ALERTS, NCCL_RECORDING
from alerts.nodes import NODE_ALERTS, NODE_RECORDING
from alerts.pcie import PCIE_ALERTS
from alerts.recording import (
    FABRIC_RECORDING,
    FLEET_RECORDING,
    GPU_RECORDING,
    INFERENCE_RECORDING,
    STORAGE_RECORDING,
    TRAINING_RECORDING,
)
from alerts.storage import CHECKPOINT_ALERTS, STORAGE_ALERTS
from alerts.straggler_recording import STRAGGLER_RECORDING_GROUPS
from alerts.training import STRAGGLER_ALERTS, TRAINING_ALERTS

RECORDING_GROUPS = (
    TRAINING_RECORDING,
    GPU_RECORDING,
    *STRAGGLER_RECORDING_GROUPS,
    NCCL_RECORDING,
    FRAMEWORK_RECORDING,
    HANG_RECORDING,
    INFERENCE_RECORDING,
    STORAGE_RECORDING,
    FABRIC_RECORDING,
    FLEET_RECORDING,
    NODE_RECORDING,
)

# What the workloads on a node do: training, inference and their checkpoints.
WORKLOAD_ALERTS = Group(
    "lockstep-workloads.alerts", (*TRAINING_ALERTS, *FRAMEWORK_ALERTS, *INFERENCE_ALERTS, *CHECKPOINT_ALERTS)
)

ALERT_GROUPS = (
    # The straggler alerts on their own: they read every rank's and busy GPU's recorded series,
    # the costliest alerts at fleet scale (docs/performance.md), and no other alert waits for them.
    Group("lockstep-stragglers.alerts", STRAGGLER_ALERTS),
    WORKLOAD_ALERTS,
    Group("lockstep-nccl.alerts", NCCL_ALERTS),
    Group("lockstep-hang.alerts", HANG_ALERTS),
    GPU_ALERTS,
    GPU_VERDICT_ALERTS,
    NVLINK_ALERTS,
    FABRIC_ALERTS,
    PCIE_ALERTS,
    STORAGE_ALERTS,
    AGENT_ALERTS,
    NODE_ALERTS,
)


def alerts() -> list[Alert]:
    return [rule for group in ALERT_GROUPS for rule in group.rules if isinstance(rule, Alert)]


def recordings() -> list[Recording]:
    return [rule for group in RECORDING_GROUPS for rule in group.rules if isinstance(rule, Recording)]
