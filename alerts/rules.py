"""Lockstep's Prometheus recording and alerting rules: the one source the rule files are made from.

`python -m alerts --write` renders this module into alerts/lockstep-recording.rules.yml,
alerts/lockstep-alerts.rules.yml and deploy/prometheusrule.yaml; tests/test_alert_rules.py
fails when those files differ from what this module renders.  Every number comes from
alerts/thresholds.py, which the dashboards read too.

Recording rules are named level:metric:operations: the level is what a series is per (job_rank,
job_gpu, job, endpoint, root, port, interface, mountpoint, instance), the metric what it
measures, the operations how it was made (mean5m: a per-step mean over 5 minutes from two
counters' rates; ratio_to_median5m: divided by the job's median).

Alert annotations are Go templates, evaluated by Prometheus: {{ $labels.x }} and {{ $value }}.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

import yaml

from alerts import thresholds as T

RULE_FILES = {
    "recording": "alerts/lockstep-recording.rules.yml",
    "alerting": "alerts/lockstep-alerts.rules.yml",
}
PROMETHEUS_RULE = "deploy/prometheusrule.yaml"


@dataclass(frozen=True)
class Recording:
    record: str
    expr: str


@dataclass(frozen=True)
class Alert:
    name: str
    severity: str  # critical: act now, the job or node is broken; warning: degraded, look today
    for_: str  # how long the condition must hold before the alert fires ("0m": at once)
    expr: str
    summary: str
    description: str

    @property
    def runbook_anchor(self) -> str:
        """The anchor GitHub gives the alert's '## <name>' heading in docs/runbooks.md."""
        return self.name.lower()


@dataclass(frozen=True)
class Group:
    name: str
    rules: tuple[Recording, ...] | tuple[Alert, ...]


# --- PromQL helpers ------------------------------------------------------------------------------


def by(*labels: str) -> str:
    """by (...) over the target labels and the given ones: aggregations keep where it happened."""
    return f"by ({', '.join((*T.TARGET_LABELS, *labels))})"


def on(*labels: str) -> str:
    return f"on ({', '.join((*T.TARGET_LABELS, *labels))})"


def job_by() -> str:
    """A job spans nodes: per-job aggregations are by cluster and job id only."""
    return "by (cluster, job_id)"


JOB_ON = "on (cluster, job_id)"


def num(value: float) -> str:
    """A threshold as PromQL writes it: 0.9, 2, 0.016666..."""
    return repr(float(value)).removesuffix(".0")


def regex(values: Iterable[object]) -> str:
    return "|".join(str(v) for v in values)


def label(name: str) -> str:
    return "{{ $labels." + name + " }}"


# Where an alert fired: the Kubernetes node name when the scrape adds it, else the instance.
WHERE = "{{ with $labels.node }}{{ . }}{{ else }}{{ $labels.instance }}{{ end }}"
VALUE = "{{ $value }}"
VALUE_PERCENT = "{{ $value | humanizePercentage }}"
VALUE_DURATION = "{{ $value | humanizeDuration }}"
VALUE_2F = '{{ printf "%.2f" $value }}'


def percent(ratio: float) -> str:
    return f"{ratio * 100:g} %"


# --- Recording rules -----------------------------------------------------------------------------


def _per_step(seconds_counter: str, name: str) -> Recording:
    """Mean seconds per training step over 5 minutes, per rank: rate(seconds) / rate(steps)."""
    return Recording(
        f"job_rank:lockstep_training_{name}_seconds:mean5m",
        f"rate({seconds_counter}[5m])\n/ (rate(lockstep_training_steps_total[5m]) > 0)",
    )


TRAINING_RECORDING = Group(
    "lockstep-training.recording",
    (
        _per_step("lockstep_training_step_seconds_total", "step"),
        _per_step("lockstep_training_compute_seconds_total", "compute"),
        _per_step("lockstep_training_comm_wait_seconds_total", "comm_wait"),
        _per_step("lockstep_training_data_wait_seconds_total", "data_wait"),
        # Wall step time is the same for every rank of a synchronous job; compute time is what
        # singles out the slow one, so the peer comparison is on compute.
        Recording(
            "job:lockstep_training_compute_seconds:median5m",
            f"quantile {job_by()} (0.5, job_rank:lockstep_training_compute_seconds:mean5m)",
        ),
        Recording(
            "job_rank:lockstep_training_compute_seconds:ratio_to_median5m",
            "job_rank:lockstep_training_compute_seconds:mean5m\n"
            f"/ {JOB_ON} group_left ()\njob:lockstep_training_compute_seconds:median5m",
        ),
        Recording("job:lockstep_training_ranks:count", f"count {job_by()} (lockstep_training_steps_total)"),
        Recording("job:lockstep_training_steps:rate5m", f"max {job_by()} (rate(lockstep_training_steps_total[5m]))"),
    ),
)

GPU_RECORDING = Group(
    "lockstep-gpu.recording",
    (
        # The SM clock of each busy GPU of each Slurm job (a GPU shared by two jobs is in both).
        Recording(
            "job_gpu:lockstep_gpu_sm_clock_hertz:avg5m",
            f"lockstep_slurm_job_gpu_info\n* {on('uuid')} group_left ()\n"
            "(\n  avg_over_time(lockstep_gpu_sm_clock_hertz[5m])\n"
            f"  and avg_over_time(lockstep_gpu_utilization_ratio[5m]) > {num(T.GPU_STRAGGLER_MIN_UTILIZATION)}\n)",
        ),
        Recording(
            "job:lockstep_gpu_sm_clock_hertz:median5m",
            f"quantile {job_by()} (0.5, job_gpu:lockstep_gpu_sm_clock_hertz:avg5m)",
        ),
        Recording(
            "job_gpu:lockstep_gpu_sm_clock_hertz:ratio_to_median5m",
            "job_gpu:lockstep_gpu_sm_clock_hertz:avg5m\n"
            f"/ {JOB_ON} group_left ()\njob:lockstep_gpu_sm_clock_hertz:median5m",
        ),
        Recording("job:lockstep_gpus_busy:count", f"count {job_by()} (job_gpu:lockstep_gpu_sm_clock_hertz:avg5m)"),
    ),
)

INFERENCE_RECORDING = Group(
    "lockstep-inference.recording",
    (
        Recording(
            "endpoint:lockstep_inference_kv_cache_usage_ratio:avg5m",
            "avg_over_time(lockstep_inference_kv_cache_usage_ratio[5m])",
        ),
        Recording(
            "endpoint:lockstep_inference_requests_waiting:avg5m",
            "avg_over_time(lockstep_inference_requests_waiting[5m])",
        ),
        Recording("endpoint:lockstep_inference_preemptions:rate5m", "rate(lockstep_inference_preemptions_total[5m])"),
    ),
)

STORAGE_RECORDING = Group(
    "lockstep-storage.recording",
    (
        Recording(
            "root:lockstep_checkpoint_last_success_timestamp_seconds:age",
            "time() - lockstep_checkpoint_last_success_timestamp_seconds",
        ),
        # Roots configured without expected_interval get the default one.
        Recording(
            "root:lockstep_checkpoint_expected_interval_seconds:or_default",
            "lockstep_checkpoint_expected_interval_seconds\n"
            f"or (0 * lockstep_checkpoint_root_readable + {T.CHECKPOINT_DEFAULT_INTERVAL_SECONDS})",
        ),
        Recording(
            "mountpoint:lockstep_filesystem_available_bytes:ratio",
            "lockstep_filesystem_available_bytes / (lockstep_filesystem_size_bytes > 0)",
        ),
        Recording(
            "instance:lockstep_host_io_full_pressure:ratio5m",
            'rate(lockstep_host_pressure_stalled_seconds_total{resource="io", kind="full"}[5m])',
        ),
    ),
)

FABRIC_RECORDING = Group(
    "lockstep-fabric.recording",
    (
        Recording(
            "port:lockstep_ib_port_transmit_wait:ratio5m",
            "rate(lockstep_ib_port_transmit_wait_total[5m])\n"
            "/ (\n  rate(lockstep_ib_port_transmit_wait_total[5m])\n"
            "  + rate(lockstep_ib_port_transmitted_bytes_total[5m]) / 4\n  > 0\n)",
        ),
        Recording("interface:lockstep_pfc_pause_seconds:ratio5m", "rate(lockstep_pfc_pause_seconds_total[5m])"),
    ),
)

# The fleet dashboard's panels over every GPU of every node: at 1,024 nodes (8,192 GPUs) the raw
# queries over its default 3 hours take seconds (docs/performance.md), these a few milliseconds.
FLEET_RECORDING = Group(
    "lockstep-fleet.recording",
    (
        Recording("cluster:lockstep_gpu_up:sum", "sum by (cluster) (lockstep_gpu_up)"),
        Recording("cluster:lockstep_gpu_utilization_ratio:avg", "avg by (cluster) (lockstep_gpu_utilization_ratio)"),
        Recording("instance:lockstep_gpu_utilization_ratio:avg", f"avg {by()} (lockstep_gpu_utilization_ratio)"),
    ),
)

EXPECTED_INTERVAL = "root:lockstep_checkpoint_expected_interval_seconds:or_default"

RECORDING_GROUPS = (
    TRAINING_RECORDING,
    GPU_RECORDING,
    INFERENCE_RECORDING,
    STORAGE_RECORDING,
    FABRIC_RECORDING,
    FLEET_RECORDING,
)

# --- Alerts --------------------------------------------------------------------------------------

WORKLOAD_ALERTS = Group(
    "lockstep-workloads.alerts",
    (
        Alert(
            "LockstepTrainingStraggler",
            "warning",
            "10m",
            "job_rank:lockstep_training_compute_seconds:ratio_to_median5m"
            f" > {num(T.TRAINING_STRAGGLER_COMPUTE_RATIO)}\n"
            f"and {JOB_ON} job:lockstep_training_ranks:count >= {T.STRAGGLER_MIN_PEERS}",
            f"Rank {label('rank')} of job {label('job_id')} is a straggler",
            f"Rank {label('rank')} of job {label('job_id')} on {WHERE} takes {VALUE_2F}x its job's median compute "
            "time per step (5 min average). Its peers wait for it in communication, so the whole job runs at "
            "its pace. Look at its GPU's clocks and clock event reasons.",
        ),
        Alert(
            "LockstepGPUStraggler",
            "warning",
            "10m",
            f"job_gpu:lockstep_gpu_sm_clock_hertz:ratio_to_median5m < {num(T.GPU_STRAGGLER_SM_CLOCK_RATIO)}\n"
            f"and {JOB_ON} job:lockstep_gpus_busy:count >= {T.STRAGGLER_MIN_PEERS}",
            f"GPU {label('gpu')} on {WHERE} is slower than the rest of job {label('job_id')}",
            f"GPU {label('gpu')} ({label('uuid')}) on {WHERE} runs its SM clock at {VALUE_PERCENT} of the median "
            f"of job {label('job_id')}'s busy GPUs (5 min average). A synchronous job runs at its slowest GPU's "
            "pace: check its clock event reasons (hw_slowdown, thermal, power brake), temperature and power.",
        ),
        Alert(
            "LockstepTrainingStalled",
            "critical",
            "5m",
            f"max {job_by()} (rate(lockstep_training_steps_total[{T.TRAINING_STALL_WINDOW}])) == 0\n"
            f"and {JOB_ON} group {job_by()} (lockstep_training_last_step_timestamp_seconds)",
            f"Training job {label('job_id')} makes no progress",
            f"No rank of job {label('job_id')} completed a training step in the last {T.TRAINING_STALL_WINDOW} "
            "(plus 5 minutes). A hung collective (NCCL), a dead rank, a lost GPU or a stalled filesystem "
            "holds every rank.",
        ),
        Alert(
            "LockstepKVCachePressure",
            "warning",
            "5m",
            f"lockstep_inference_kv_cache_usage_ratio > {num(T.KV_CACHE_USAGE_RATIO)}\n"
            "and lockstep_inference_requests_waiting > 0",
            f"KV cache of {label('endpoint')} is full and requests queue",
            f"The {label('engine')} endpoint {label('endpoint')} ({label('model')}) on {WHERE} has used "
            f"{VALUE_PERCENT} of its KV cache for 5 minutes while requests wait for a slot: time to first token "
            "grows with the queue. Add replicas, lower max concurrency or context length, or free GPU memory.",
        ),
        Alert(
            "LockstepKVCachePreemptions",
            "warning",
            "5m",
            f"rate(lockstep_inference_preemptions_total[5m]) * 60 > {num(T.KV_PREEMPTIONS_PER_MINUTE)}",
            f"{label('endpoint')} keeps preempting requests",
            f"The {label('engine')} endpoint {label('endpoint')} ({label('model')}) on {WHERE} preempts "
            f"{VALUE_2F} requests a minute: it runs out of KV cache blocks mid-generation, evicts requests and "
            "recomputes them later, wasting GPU time and inflating their latency.",
        ),
        Alert(
            "LockstepCheckpointStalled",
            "critical",
            "5m",
            f"lockstep_checkpoint_in_progress_seconds\n> {num(T.CHECKPOINT_STALL_INTERVALS)} * {EXPECTED_INTERVAL}",
            f"Checkpoint save under {label('root')} is stalled",
            f"A save under {label('root')} on {WHERE} has been in progress for {VALUE_DURATION}, longer than the "
            "root's save interval, and has not completed: the job may be blocked writing it and everything since "
            "the last completed save is at risk. Check the filesystem and the job's ranks.",
        ),
        Alert(
            "LockstepCheckpointOverdue",
            "warning",
            "5m",
            # The age is computed here, not taken from the recording rule, which lags by an evaluation.
            "(\n  time() - lockstep_checkpoint_last_success_timestamp_seconds\n"
            f"  > {num(T.CHECKPOINT_OVERDUE_INTERVALS)} * {EXPECTED_INTERVAL}\n)\n"
            "unless\n(\n  lockstep_checkpoint_in_progress_seconds\n"
            f"  > {num(T.CHECKPOINT_STALL_INTERVALS)} * {EXPECTED_INTERVAL}\n)",
            f"No checkpoint completed under {label('root')} for too long",
            f"The last completed save under {label('root')} on {WHERE} finished {VALUE_DURATION} ago, more than "
            f"{num(T.CHECKPOINT_OVERDUE_INTERVALS)} save intervals, and no save is stuck in progress (that would be "
            "LockstepCheckpointStalled): saves fail, or the job stopped saving.",
        ),
    ),
)

GPU_ALERTS = Group(
    "lockstep-gpu.alerts",
    (
        Alert(
            "LockstepGPUFellOffBus",
            "critical",
            "1m",
            f"lockstep_gpu_up == 0\nor\ncount {by()} (lockstep_gpu_info offset 1h) > count {by()} (lockstep_gpu_info)",
            f"GPU lost on {WHERE}",
            "{{ if $labels.uuid }}GPU " + label("gpu") + " (" + label("uuid") + ") on " + WHERE + " no longer "
            "answers NVML (fallen off the bus, XID 79).{{ else }}" + WHERE + " reports fewer GPUs than an hour "
            "ago: a GPU vanished (e.g. not enumerated after a reboot).{{ end }} Jobs on it have failed or hang; "
            "drain the node.",
        ),
        Alert(
            "LockstepGPUXidCritical",
            "critical",
            "0m",
            f'increase(lockstep_gpu_xid_errors_total{{xid=~"{regex(T.CRITICAL_XIDS)}"}}[10m]) > 0\nor\n'
            f'(\n  lockstep_gpu_xid_errors_total{{xid=~"{regex(T.CRITICAL_XIDS)}"}}\n'
            f'  unless lockstep_gpu_xid_errors_total{{xid=~"{regex(T.CRITICAL_XIDS)}"}} offset 10m\n)',
            f"GPU {label('gpu')} on {WHERE} reported XID {label('xid')}",
            f"GPU {label('gpu')} ({label('uuid')}) on {WHERE} reported critical XID {label('xid')} in the last "
            "10 minutes (48 double-bit ECC, 64 row remap failure, 74 NVLink, 94/95 ECC, 119/120 GSP, ...). "
            "Look the code up in NVIDIA's XID catalogue; most need a GPU reset or a drain.",
        ),
        Alert(
            "LockstepGPUUncorrectableECC",
            "critical",
            "0m",
            'increase(lockstep_gpu_ecc_errors_total{type="uncorrected"}[10m]) > 0',
            f"Uncorrectable ECC errors on GPU {label('gpu')} on {WHERE}",
            f"GPU {label('gpu')} ({label('uuid')}) on {WHERE} had uncorrectable (double-bit) memory errors in the "
            "last 10 minutes: the process using the memory got corrupt data or was killed. The GPU needs a reset "
            "to remap the row.",
        ),
        Alert(
            "LockstepGPURowRemapFailure",
            "critical",
            "1m",
            "lockstep_gpu_row_remapping_failed == 1",
            f"GPU {label('gpu')} on {WHERE} has no spare memory rows left",
            f"A row remapping failed on GPU {label('gpu')} ({label('uuid')}) on {WHERE}: its memory has bad rows "
            "it can no longer replace. Drain the node and replace the GPU (RMA).",
        ),
        Alert(
            "LockstepGPUThermalSlowdown",
            "warning",
            "5m",
            'lockstep_gpu_clock_event_active{reason=~"hw_thermal_slowdown|sw_thermal_slowdown"} == 1',
            f"GPU {label('gpu')} on {WHERE} is throttled for heat",
            f"GPU {label('gpu')} ({label('uuid')}) on {WHERE} has had its clocks held down by "
            f"{label('reason')} for 5 minutes: it runs slower than its peers and slows its job. Check cooling "
            "(fans, airflow, inlet temperature) and the GPU's temperature.",
        ),
        Alert(
            "LockstepGPUPowerBrake",
            "warning",
            "1m",
            'lockstep_gpu_clock_event_active{reason="hw_power_brake"} == 1',
            f"Power brake holds GPU {label('gpu')} on {WHERE} down",
            f"The hardware power brake of GPU {label('gpu')} ({label('uuid')}) on {WHERE} is engaged: the system "
            "signalled a power supply problem and the GPU runs at minimum clocks. Check the node's power supplies "
            "and BMC event log.",
        ),
        Alert(
            "LockstepNVLinkDown",
            "critical",
            "5m",
            "lockstep_nvlink_up == 0",
            f"NVLink {label('link')} of GPU {label('gpu')} on {WHERE} is down",
            f"NVLink link {label('link')} of GPU {label('gpu')} ({label('uuid')}) on {WHERE} has been inactive "
            "for 5 minutes: traffic to its peers falls back to fewer links or PCIe and collectives slow down.",
        ),
        Alert(
            "LockstepNVLinkErrors",
            "warning",
            "5m",
            f"sum {by('gpu', 'uuid', 'link')} (\n"
            f'  rate(lockstep_nvlink_errors_total{{type!~"{regex(T.NVLINK_IGNORED_ERROR_TYPES)}"}}[10m])\n'
            f") * 60 > {num(T.NVLINK_ERRORS_PER_MINUTE)}\nor\n(\n"
            f"  sum {by('gpu', 'uuid')} (rate(lockstep_gpu_nvlink_errors_total[10m])) * 60"
            f" > {num(T.NVLINK_ERRORS_PER_MINUTE)}\n"
            f"  unless {on('uuid')} group {by('uuid')} (lockstep_nvlink_errors_total)\n)",
            f"NVLink errors on GPU {label('gpu')} on {WHERE}",
            f"GPU {label('gpu')} ({label('uuid')}) on {WHERE} counts {VALUE_2F} NVLink errors a minute"
            "{{ with $labels.link }} on link {{ . }}{{ end }} (replays, recoveries, CRC errors; 10 min average): "
            "a degrading link or NVSwitch port.",
        ),
    ),
)

FABRIC_ALERTS = Group(
    "lockstep-fabric.alerts",
    (
        Alert(
            "LockstepIBPortDown",
            "critical",
            "3m",
            # Not active at any moment of the window: a port that flaps is LockstepIBLinkFlapping's.
            f"max_over_time(lockstep_ib_port_state[2m]) < 4\n"
            f"unless {on('device', 'port')} lockstep_ib_port_physical_state == 3",
            f"InfiniBand port {label('device')}/{label('port')} on {WHERE} is down",
            f"Port {label('device')}/{label('port')} on {WHERE} has not been ACTIVE for 5 minutes (logical state "
            f"{VALUE}: 1 down, 2 init, 3 armed) and is not administratively disabled. The node's rail is cut off: "
            "check the cable, the switch port and the subnet manager.",
        ),
        Alert(
            "LockstepIBLinkFlapping",
            "warning",
            "0m",
            f"increase(lockstep_ib_port_link_downed_total[{T.IB_LINK_FLAP_WINDOW}])\n"
            f"+ increase(lockstep_ib_port_link_error_recovery_total[{T.IB_LINK_FLAP_WINDOW}])\n"
            f">= {T.IB_LINK_FLAP_EVENTS}\nor\n"
            'lockstep_ib_port_saturated{counter=~"link_downed|link_error_recovery"} == 1',
            f"InfiniBand link {label('device')}/{label('port')} on {WHERE} flaps",
            f"Port {label('device')}/{label('port')} on {WHERE} went down or retrained "
            f"{{{{ if $labels.counter }}}}so often its {label('counter')} counter saturated"
            f"{{{{ else }}}}{VALUE_2F} times in {T.IB_LINK_FLAP_WINDOW}{{{{ end }}}}. Every flap stalls the "
            "collectives crossing it: reseat or replace the cable or transceiver.",
        ),
        Alert(
            "LockstepIBSymbolErrors",
            "warning",
            "0m",
            f"increase(lockstep_ib_port_symbol_errors_total[1h]) > {T.IB_SYMBOL_ERRORS_PER_HOUR}\nor\n"
            'lockstep_ib_port_saturated{counter="symbol_error"} == 1',
            f"Symbol errors on InfiniBand port {label('device')}/{label('port')} on {WHERE}",
            f"Port {label('device')}/{label('port')} on {WHERE} "
            "{{ if $labels.counter }}has a saturated symbol_error counter (65535: it no longer counts; reset it "
            "with perfquery -R to see new errors){{ else }}counted " + VALUE_2F + " symbol errors in the last "
            "hour{{ end }}: a marginal cable or transceiver, often before the link starts flapping.",
        ),
        Alert(
            "LockstepIBCongestion",
            "warning",
            "15m",
            f"port:lockstep_ib_port_transmit_wait:ratio5m > {num(T.IB_TRANSMIT_WAIT_RATIO)}",
            f"InfiniBand port {label('device')}/{label('port')} on {WHERE} waits for credits",
            f"Port {label('device')}/{label('port')} on {WHERE} spent {VALUE_PERCENT} of its transmit time "
            "waiting for flow-control credits (port_xmit_wait) for 15 minutes: the fabric behind it is congested "
            "(hot spot, slow receiver, or a misrouted or degraded link).",
        ),
        Alert(
            "LockstepPFCStorm",
            "critical",
            "2m",
            f'max {by("interface")} (rate(lockstep_pfc_pause_seconds_total{{direction="tx"}}[5m]))'
            f" > {num(T.PFC_TX_PAUSE_RATIO)}\nor\n"
            f"sum {by('interface')} (increase(lockstep_pfc_pause_storm_events_total[10m])) > 0",
            f"PFC pause storm from {label('interface')} on {WHERE}",
            f"Interface {label('interface')} on {WHERE} keeps pausing its switch port (transmitted pause over "
            f"{percent(T.PFC_TX_PAUSE_RATIO)} of the time, or the NIC's pause-storm detector fired): its receive "
            "path is stalled and the pause spreads through the lossless fabric, stalling other nodes' RoCE traffic.",
        ),
        Alert(
            "LockstepRoCECongestionControlOff",
            "warning",
            "15m",
            f"max {by('interface', 'role')} (lockstep_roce_dcqcn_enabled) == 0\nor\n"
            f"rate(lockstep_roce_cnp_ignored_total[10m]) > {num(T.ROCE_CNP_IGNORED_PER_SECOND)}",
            f"RoCE congestion control is off on {WHERE}",
            "{{ if $labels.interface }}DCQCN "
            + label("role")
            + " is disabled on every priority of "
            + label("interface")
            + "{{ else }}"
            + label("device")
            + "/"
            + label("port")
            + " ignores "
            + VALUE_2F
            + " congestion notifications a second{{ end }} on "
            + WHERE
            + ": senders do not slow down when the fabric marks congestion, so it turns into PFC pause "
            "and drops instead.",
        ),
    ),
)

STORAGE_ALERTS = Group(
    "lockstep-storage.alerts",
    (
        Alert(
            "LockstepFilesystemHung",
            "critical",
            "1m",
            f"lockstep_filesystem_responsive == 0\nor {on('mountpoint')}\n"
            f"sum {by('mountpoint')} (rate(lockstep_nfs_major_timeouts_total[5m])) > 0",
            f"Filesystem {label('mountpoint')} on {WHERE} does not answer",
            f"{label('mountpoint')} on {WHERE} does not answer: statfs on it did not return within the agent's "
            "deadline, or its NFS requests time out (server not responding). Processes touching it hang in D "
            "state; check the server and the network path to it.",
        ),
        Alert(
            "LockstepFilesystemAlmostFull",
            "warning",
            "30m",
            "(\n"
            f'  mountpoint:lockstep_filesystem_available_bytes:ratio{{fstype!~"{T.SHARED_FSTYPES}"}}'
            f" < {num(T.FILESYSTEM_AVAILABLE_CRITICAL_RATIO)}\n  or\n  (\n"
            f'    mountpoint:lockstep_filesystem_available_bytes:ratio{{fstype!~"{T.SHARED_FSTYPES}"}}'
            f" < {num(T.FILESYSTEM_AVAILABLE_PREDICT_RATIO)}\n"
            f'    and predict_linear(lockstep_filesystem_available_bytes{{fstype!~"{T.SHARED_FSTYPES}"}}'
            f"[{T.FILESYSTEM_PREDICT_WINDOW}], {T.FILESYSTEM_PREDICT_HORIZON_SECONDS}) < 0\n  )\n)\n"
            f"unless {on('mountpoint')} lockstep_filesystem_readonly == 1\nor\n"
            # A shared filesystem is one alert per cluster, not one per node that mounts it.
            f"min by (cluster, mountpoint, fstype) (\n"
            f'  mountpoint:lockstep_filesystem_available_bytes:ratio{{fstype=~"{T.SHARED_FSTYPES}"}}\n'
            f") < {num(T.FILESYSTEM_AVAILABLE_CRITICAL_RATIO)}",
            f"Filesystem {label('mountpoint')} is almost full",
            f"{label('mountpoint')} ({label('fstype')}){{{{ with $labels.instance }}}} on {WHERE}{{{{ end }}}} "
            f"has {VALUE_PERCENT} of its space left"
            f"{{{{ if lt $value {num(T.FILESYSTEM_AVAILABLE_CRITICAL_RATIO)} }}}}{{{{ else }}}} and fills up within "
            "a day at the rate of the last 6 hours{{ end }}. Checkpoint saves and logs fail when it is full.",
        ),
        Alert(
            "LockstepIOStall",
            "warning",
            "10m",
            f"instance:lockstep_host_io_full_pressure:ratio5m > {num(T.IO_FULL_PRESSURE_RATIO)}",
            f"I/O stalls every task on {WHERE}",
            f"For {VALUE_PERCENT} of the time (5 min average) every non-idle task on {WHERE} waited for I/O "
            "(pressure stall information, io full). Training stalls on data loading or checkpoint writes: "
            "check the filesystems' latency and blocked processes.",
        ),
    ),
)

AGENT_ALERTS = Group(
    "lockstep-agent.alerts",
    (
        Alert(
            "LockstepCollectorFailing",
            "warning",
            "10m",
            "lockstep_collector_up == 0",
            f"Collector {label('collector')} on {WHERE} is failing",
            f"The {label('collector')} collector of the agent on {WHERE} has failed or been stuck past its deadline "
            "for 10 minutes: its metrics are missing, and the alerts built on them cannot fire. "
            "`lockstep doctor` and the agent's log say why.",
        ),
        Alert(
            "LockstepAgentDown",
            "critical",
            "5m",
            f'up{{job="{T.AGENT_JOB}"}} == 0\nor\nabsent(up{{job="{T.AGENT_JOB}"}})',
            "{{ if $labels.instance }}Lockstep agent on " + WHERE + " is down{{ else }}No Lockstep agent is scraped"
            "{{ end }}",
            "{{ if $labels.instance }}Prometheus cannot scrape the Lockstep agent on " + WHERE + "{{ else }}"
            f'Prometheus has no target in scrape job "{T.AGENT_JOB}" at all{{{{ end }}}}: no other Lockstep '
            "alert can fire for a node whose agent is not scraped. Check the agent's service "
            "(systemctl status lockstep, or the "
            "DaemonSet's pod) and the network path from Prometheus.",
        ),
    ),
)

ALERT_GROUPS = (WORKLOAD_ALERTS, GPU_ALERTS, FABRIC_ALERTS, STORAGE_ALERTS, AGENT_ALERTS)


def alerts() -> list[Alert]:
    return [rule for group in ALERT_GROUPS for rule in group.rules if isinstance(rule, Alert)]


def recordings() -> list[Recording]:
    return [rule for group in RECORDING_GROUPS for rule in group.rules if isinstance(rule, Recording)]


# --- Rendering -----------------------------------------------------------------------------------

HEADER = (
    "# Generated by `python -m alerts --write` from alerts/rules.py and alerts/thresholds.py:\n"
    "# do not edit by hand (tests/test_alert_rules.py fails when this file is out of date).\n"
)
_DURATION = re.compile(r"^(\d+)([smhd])$")
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


_RANGE = re.compile(r"\[(\d+[smhd])\]|offset (\d+[smhd])")


def scale_duration(duration: str, factor: float, minimum: int = 1) -> str:
    """A Prometheus duration times factor, in whole seconds (at least minimum unless it was 0)."""
    match = _DURATION.match(duration)
    if not match:
        raise ValueError(f"not a simple Prometheus duration: {duration!r}")
    seconds = int(match.group(1)) * _SECONDS[match.group(2)]
    if seconds == 0:
        return "0s"
    return f"{max(minimum, round(seconds * factor))}s"


@dataclass(frozen=True)
class Compression:
    """Test-only changes for running the rules against a demo for a minute or two
    (tests/test_alerts_e2e.py); production renders without any.

    for_scale: every `for:` times this.  range_scale, min_range: every range window ([5m]) and
    offset times range_scale, at least min_range seconds: rate() divides by the whole window, so a
    window longer than the data reads low.  clock_offset: time() reads this many seconds earlier
    (the simulated node's wall clock runs behind the real one)."""

    for_scale: float = 1.0
    range_scale: float = 1.0
    min_range: int = 1
    clock_offset: float = 0.0

    def expr(self, expr: str) -> str:
        if self.range_scale != 1.0:

            def scaled(match: re.Match[str]) -> str:
                if match.group(1):
                    return f"[{scale_duration(match.group(1), self.range_scale, self.min_range)}]"
                return f"offset {scale_duration(match.group(2), self.range_scale, self.min_range)}"

            expr = _RANGE.sub(scaled, expr)
        if self.clock_offset:
            expr = expr.replace("time()", f"(time() - {self.clock_offset:.0f})")
        return expr

    def for_(self, duration: str) -> str:
        return duration if self.for_scale == 1.0 else scale_duration(duration, self.for_scale)


PRODUCTION = Compression()


def rule_dict(rule: Recording | Alert, compression: Compression = PRODUCTION) -> dict[str, object]:
    expr = compression.expr(rule.expr)
    if isinstance(rule, Recording):
        return {"record": rule.record, "expr": expr}
    return {
        "alert": rule.name,
        "expr": expr,
        "for": compression.for_(rule.for_),
        "labels": {"severity": rule.severity},
        "annotations": {
            "summary": rule.summary,
            "description": rule.description,
            "runbook_url": f"{T.RUNBOOK_BASE_URL}#{rule.runbook_anchor}",
        },
    }


def groups_dict(groups: tuple[Group, ...], compression: Compression = PRODUCTION) -> list[dict[str, object]]:
    return [{"name": group.name, "rules": [rule_dict(rule, compression) for rule in group.rules]} for group in groups]


class _Dumper(yaml.SafeDumper):
    """Block style for multi-line strings (PromQL over several lines reads as written)."""

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        # Indent list items under their key, as yamllint (and most hand-written YAML) wants.
        super().increase_indent(flow, False)


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def dump(data: object) -> str:
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, width=1000, allow_unicode=True)


def render_rule_files(compression: Compression = PRODUCTION) -> dict[str, str]:
    """Rule file path (relative to the repository) -> content."""
    return {
        RULE_FILES["recording"]: HEADER + dump({"groups": groups_dict(RECORDING_GROUPS, compression)}),
        RULE_FILES["alerting"]: HEADER + dump({"groups": groups_dict(ALERT_GROUPS, compression)}),
    }


def render_prometheus_rule() -> str:
    """The same groups as a Prometheus Operator PrometheusRule, for deploy/."""
    resource = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "lockstep",
            "namespace": "lockstep",
            "labels": {"app.kubernetes.io/name": "lockstep"},
        },
        "spec": {"groups": groups_dict(RECORDING_GROUPS) + groups_dict(ALERT_GROUPS)},
    }
    return (
        "---\n"
        + HEADER
        + "# For the Prometheus Operator.  If your Prometheus selects rules by label (ruleSelector, e.g.\n"
        "# release: kube-prometheus-stack), add that label here.\n"
        "# yamllint disable rule:line-length\n" + dump(resource)
    )


def render_all() -> dict[str, str]:
    return {**render_rule_files(), PROMETHEUS_RULE: render_prometheus_rule()}
