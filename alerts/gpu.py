"""GPU alerts: a GPU lost, XIDs, ECC and row remapping, throttling (lockstep-gpu.alerts); NVLink
links down or erroring (lockstep-nvlink.alerts); GPUs idle while held, driver recovery actions,
a degraded NVSwitch fabric (lockstep-gpu-verdicts.alerts)."""

from __future__ import annotations

from alerts.model import Alert, Group
from alerts.promql import VALUE_2F, VALUE_DURATION, VALUE_PERCENT, WHERE, by, label, num, on, percent, regex
from alerts.recording import SM_ACTIVE
from lockstep import thresholds as T

GPU_COLLECTOR_STUCK = 'lockstep_collector_state{collector="gpu", state="stuck"} == 1'
THERMAL_REASONS = ("hw_thermal_slowdown", "sw_thermal_slowdown")


def throttled_share(reasons: tuple[str, ...]) -> str:
    """The share of the window in which any of the clock event reasons held the GPU down.

    The rate of the cumulative time (lockstep_gpu_clock_event_seconds_total): a GPU hovering at
    its limit flickers in and out of it, so the flag at each evaluation says little.  GPUs that
    do not report that time fall back to the flag (which then has to hold through the 'for')."""
    selector = f'{{reason=~"{regex(reasons)}"}}'
    return (
        f"sum without (reason) (rate(lockstep_gpu_clock_event_seconds_total{selector}[{T.GPU_THROTTLE_WINDOW}]))\n"
        f"  > {num(T.GPU_THROTTLE_TIME_RATIO)}\n"
        f"or\n(\n  max without (reason) (lockstep_gpu_clock_event_active{selector}) == 1\n"
        f"  unless {on('uuid')} group {by('uuid')} (lockstep_gpu_clock_event_seconds_total{selector})\n)"
    )


GPU_ALERTS = Group(
    "lockstep-gpu.alerts",
    (
        Alert(
            "LockstepGPUFellOffBus",
            "critical",
            "1m",
            # On a node running a single Slurm job (the usual exclusive allocation) the alert carries
            # that job's job_id, so Alertmanager can inhibit the job's stall and straggler alerts that
            # the lost GPU causes (alerts/alertmanager.yml).  NVML no longer names the lost GPU's job.
            "(\n  (lockstep_gpu_up == 0)\n"
            f"  * {on()} group_left (job_id)\n"
            f"  (\n    max {by('job_id')} (lockstep_slurm_job_info)\n"
            f"    unless {on()} count {by()} (lockstep_slurm_job_info) > 1\n  )\n"
            f"  or {on('uuid')}\n  lockstep_gpu_up == 0\n)\n"
            # Fewer GPUs than an hour ago, none counting as fewer while the agent is scraped.
            f"or\ncount {by()} (lockstep_gpu_info offset 1h)\n"
            f"  > (count {by()} (lockstep_gpu_info) or {on()} 0 * group {by()} (lockstep_build_info))\n"
            f"  unless {on()} {GPU_COLLECTOR_STUCK}\n"
            "or\n"
            # NVML hangs after GPU faults: the GPU collector is stuck in it and every GPU series
            # of the node ages out.  That is the lost GPU's signal, and it does not vanish.
            f'lockstep_collector_duration_seconds{{collector="gpu"}}\n  and {on()} {GPU_COLLECTOR_STUCK}',
            f"GPU lost on {WHERE}",
            "{{ if $labels.uuid }}GPU " + label("gpu") + " (" + label("uuid") + ") on " + WHERE + " no longer "
            "answers NVML (fallen off the bus, XID 79).{{ else if $labels.collector }}NVML on " + WHERE + " has "
            "not answered for " + VALUE_DURATION + ": the GPU collector is stuck in it. NVML hangs after a GPU "
            "fault (fallen off the bus, XID 79), and every GPU metric of the node is missing while it does."
            "{{ else }}" + WHERE + " reports fewer GPUs than an hour ago: a GPU vanished (e.g. not enumerated "
            "after a reboot, or NVML no longer finds any).{{ end }} Jobs on it have failed or hang"
            "{{ with $labels.job_id }} (Slurm job {{ . }}){{ end }}; drain the node.",
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
            throttled_share(THERMAL_REASONS),
            f"GPU {label('gpu')} on {WHERE} is throttled for heat",
            f"GPU {label('gpu')} ({label('uuid')}) on {WHERE} had its clocks held down for heat (thermal slowdown) "
            f"{VALUE_PERCENT} of the last {T.GPU_THROTTLE_WINDOW}, for 5 minutes: it runs slower than its peers and "
            "slows its job. Check cooling (fans, airflow, inlet temperature) and the GPU's temperature.",
        ),
        Alert(
            "LockstepGPUPowerBrake",
            "warning",
            "1m",
            throttled_share(("hw_power_brake",)),
            f"Power brake holds GPU {label('gpu')} on {WHERE} down",
            f"The hardware power brake of GPU {label('gpu')} ({label('uuid')}) on {WHERE} was engaged "
            f"{VALUE_PERCENT} of the last {T.GPU_THROTTLE_WINDOW}: the system signalled a power supply problem and "
            "the GPU runs at minimum clocks. Check the node's power supplies and BMC event log.",
        ),
    ),
)

# The per-link rules in their own group: a node has 18 links per GPU and up to a dozen error
# counters per link (432 series on the simulated H100 node, against 32 GPU-wide).  When
# LockstepNVLinkErrors read every link's counters it took 4.7 s of the GPU group's 6.4 s at 256
# nodes, 66 s at 1,024 (bench/fleet.py, docs/performance.md); it now reads the GPU-wide sums.
# Prometheus evaluates groups side by side, so the per-GPU alerts above (a GPU off the bus,
# XIDs, ECC) do not wait for the per-link ones.
NVLINK_PER_LINK_TYPES = tuple(t for t in T.NVLINK_PER_LINK_ONLY_ERROR_TYPES if t not in T.NVLINK_IGNORED_ERROR_TYPES)
NVLINK_ALERTS = Group(
    "lockstep-nvlink.alerts",
    (
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
            # GPU-wide sums where NVML has them; per link only the types of GPUs without them
            # (a selector over every link's DL counters cost most of the rule groups' time at
            # fleet scale).
            f"sum {by('gpu', 'uuid')} (rate(lockstep_gpu_nvlink_errors_total[10m])) * 60"
            f" > {num(T.NVLINK_ERRORS_PER_MINUTE)}\nor\n(\n"
            f"  sum {by('gpu', 'uuid', 'link')} (\n"
            "    rate(lockstep_nvlink_errors_total"
            f'{{type=~"{regex(NVLINK_PER_LINK_TYPES)}"}}[10m])\n'
            f"  ) * 60 > {num(T.NVLINK_ERRORS_PER_MINUTE)}\n"
            f"  unless {on('uuid')} group {by('uuid')} (lockstep_gpu_nvlink_errors_total)\n)",
            f"NVLink errors on GPU {label('gpu')} on {WHERE}",
            f"GPU {label('gpu')} ({label('uuid')}) on {WHERE} counts {VALUE_2F} NVLink errors a minute"
            "{{ with $labels.link }} on link {{ . }}{{ end }} (replays, recoveries, CRC errors; 10 min average): "
            "a degrading link or NVSwitch port.",
        ),
    ),
)

# A GPU a Slurm job or a pod holds, and whose job (pod) it is: the job's and the pod's GPU info.
HELD_GPUS = "(\n  lockstep_slurm_job_gpu_info\n  or\n  lockstep_k8s_pod_gpu_info\n)"
HOLDER = (
    "{{ with $labels.job_id }}Slurm job {{ . }}{{ else }}pod {{ $labels.k8s_namespace }}/{{ $labels.k8s_pod }}{{ end }}"
)
FABRIC_CONDITIONS = regex(T.GPU_FABRIC_DEGRADED_CONDITIONS)
ACTION = "{{ with $labels.action }}{{ . }}{{ else }}a recovery action this agent does not know{{ end }}"

GPU_VERDICT_ALERTS = Group(
    "lockstep-gpu-verdicts.alerts",
    (
        Alert(
            "LockstepGPUIdleWhileAllocated",
            "warning",
            T.GPU_IDLE_FOR,
            # SM activity where GPM gives it (whole GPUs, not MIG instances), else utilization.
            f"{HELD_GPUS}\n* {on('uuid')} group_left ()\n(\n"
            f'  {SM_ACTIVE}{{gpu_instance_id=""}} < {num(T.GPU_IDLE_ACTIVITY_RATIO)}\n'
            "  or\n"
            f"  (\n    avg_over_time(lockstep_gpu_utilization_ratio[5m]) < {num(T.GPU_IDLE_ACTIVITY_RATIO)}\n"
            f"    unless {on('uuid')} {SM_ACTIVE}\n  )\n)",
            f"GPU {label('gpu')} on {WHERE} is allocated but idle",
            f"GPU {label('gpu')} ({label('uuid')}) on {WHERE} is held by {HOLDER} but has done almost nothing for "
            f"an hour: its SM activity (or, on GPUs without GPM, its utilization) is {VALUE_PERCENT} (5 min "
            f"average), below {percent(T.GPU_IDLE_ACTIVITY_RATIO)}. Nobody else can use it meanwhile.",
        ),
        Alert(
            "LockstepGPURecoveryActionRequired",
            "critical",
            T.GPU_RECOVERY_ACTION_FOR,
            'lockstep_gpu_recovery_action{action!="none"} == 1\n'
            # A value the agent does not know (a newer driver) sets every state to 0, none included.
            # (Not label_replace'd to action="unknown": VictoriaMetrics then loses the action filter.)
            f"or {on('uuid')}\n"
            "max without (action) (lockstep_gpu_recovery_action) == 0",
            f"GPU {label('gpu')} on {WHERE} needs {ACTION}",
            f"The NVIDIA driver asks for {ACTION} for GPU {label('gpu')} ({label('uuid')}) "
            f"on {WHERE}: the GPU is not usable as it is. gpu_reset: reset it once idle; drain_and_reset or "
            "drain_p2p: drain its jobs, then reset; node_reboot, bus_reset, system_reboot: drain the node and "
            "reboot it (docs/gpu.md).",
        ),
        Alert(
            "LockstepGPUFabricDegraded",
            "critical",
            T.GPU_FABRIC_FOR,
            f'lockstep_gpu_fabric_health{{condition=~"{FABRIC_CONDITIONS}"}} == 1\n'
            'or\nlockstep_gpu_fabric_state{state!="completed"} == 1',
            f"NVSwitch fabric of GPU {label('gpu')} on {WHERE} is degraded",
            f"GPU {label('gpu')} ({label('uuid')}) on {WHERE}: "
            "{{ with $labels.condition }}the NVSwitch fabric reports {{ . }}{{ else }}its NVSwitch fabric "
            "registration has been {{ $labels.state }} for 5 minutes{{ end }}. Its NVLink bandwidth to its "
            "peers is reduced or gone: collectives slow down or fail. Check the fabric manager and the "
            "NVSwitches (nvidia-smi -q, section Fabric).",
        ),
    ),
)
