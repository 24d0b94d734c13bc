"""The GPU & NVLink dashboard: per GPU its load, clocks against its job peers, throttling, power,
temperature, memory errors and driver state; NVLink traffic and errors."""

from __future__ import annotations

from alerts.recording import SM_ACTIVE, TENSOR_ACTIVE
from dashboards.board import Board
from dashboards.panels import (
    HW_REASONS,
    NONE_BAD,
    ORANGE,
    RATE,
    RED,
    SEL,
    Cell,
    above,
    below,
    heatmap,
    stat,
    table,
    timeseries,
)
from lockstep import thresholds as T


def activity() -> list[Cell]:
    """Utilization, SM and tensor activity, DRAM bandwidth."""
    return [
        timeseries(
            "GPU utilization",
            [(f"lockstep_gpu_utilization_ratio{{{SEL}}}", "{{instance}} GPU {{gpu}}")],
            "percentunit",
        ),
        timeseries(
            "SM activity",
            [(f"{SM_ACTIVE}{{{SEL}}}", "{{instance}} GPU {{gpu}} {{gpu_instance_id}}")],
            "percentunit",
            "Share of SM cycles with a warp on the SM (GPM, Hopper and newer; 5 min; per MIG GPU instance "
            "where partitioned). GPU utilization reads 100 % while any kernel runs; this says how much of the "
            f"GPU works. LockstepGPUIdleWhileAllocated fires below {T.GPU_IDLE_ACTIVITY_RATIO:.0%} for "
            f"{T.GPU_IDLE_FOR} on a GPU a job or pod holds.",
            below(T.GPU_IDLE_ACTIVITY_RATIO, bad=ORANGE),
        ),
        timeseries(
            "Tensor activity",
            [(f"{TENSOR_ACTIVE}{{{SEL}}}", "{{instance}} GPU {{gpu}} {{gpu_instance_id}}")],
            "percentunit",
            "Share of SM cycles in which the tensor cores (any MMA) were busy (GPM; 5 min).",
        ),
        timeseries(
            "DRAM bandwidth used",
            [(f"lockstep_gpu_dram_bandwidth_used_ratio{{{SEL}}}", "{{instance}} GPU {{gpu}} {{gpu_instance_id}}")],
            "percentunit",
            "Device memory bandwidth used against its maximum, averaged over the collector's interval (GPM).",
        ),
    ]


def clocks() -> list[Cell]:
    """SM clocks, against the job's median and across GPUs."""
    return [
        timeseries(
            "SM clock",
            [(f"lockstep_gpu_sm_clock_hertz{{{SEL}}}", "{{instance}} GPU {{gpu}}")],
            "hertz",
            "A GPU held below its peers' clock makes its whole job wait.",
        ),
        timeseries(
            "SM clock against the job's median",
            [
                (
                    f"job_gpu:lockstep_gpu_sm_clock_hertz:ratio_to_median5m{{{SEL}}}",
                    "{{instance}} GPU {{gpu}} job {{job_id}}",
                )
            ],
            "percentunit",
            "Each busy GPU's SM clock over the median of its Slurm job's GPUs (5 min). "
            f"LockstepGPUStraggler fires below {T.GPU_STRAGGLER_SM_CLOCK_RATIO:.0%} for 10 minutes.",
            below(T.GPU_STRAGGLER_SM_CLOCK_RATIO),
        ),
        heatmap(
            "SM clock across GPUs",
            f"lockstep_gpu_sm_clock_hertz{{{SEL}}}",
            "hertz",
            "Where the GPUs' clocks sit: a straggler is a lone cell below the band.",
        ),
    ]


def throttling_power_temperature() -> list[Cell]:
    """Clock event reasons, power and temperature."""
    return [
        table(
            "Hardware and thermal throttling now",
            [(f'lockstep_gpu_clock_event_active{{reason=~"{HW_REASONS}", {SEL}}}', "")],
            "none",
            "1 where the reason holds the GPU's clocks down now: LockstepGPUThermalSlowdown (thermal reasons, "
            "5 minutes), LockstepGPUPowerBrake (hw_power_brake, 1 minute).",
            NONE_BAD,
        ),
        timeseries(
            "Time throttled, by reason",
            [
                (
                    f'rate(lockstep_gpu_clock_event_seconds_total{{reason!="idle", {SEL}}}[{RATE}])',
                    "{{instance}} GPU {{gpu}} {{reason}}",
                )
            ],
            "percentunit",
            "Share of time each reason held the clocks down (sw_power_cap at full load is normal).",
        ),
        timeseries(
            "Power",
            [(f"lockstep_gpu_power_watts{{{SEL}}}", "{{instance}} GPU {{gpu}}")],
            "watt",
            "A GPU drawing well below its peers at equal utilization is throttled.",
        ),
        timeseries(
            "Temperature",
            [
                (f"lockstep_gpu_temperature_celsius{{{SEL}}}", "{{instance}} GPU {{gpu}}"),
                (f"lockstep_gpu_memory_temperature_celsius{{{SEL}}}", "{{instance}} GPU {{gpu}} HBM"),
            ],
            "celsius",
            f"The line at {T.GPU_TEMPERATURE_WARNING_CELSIUS} °C is a guide; the alert is on the driver's own "
            "thermal slowdown reasons.",
            above((T.GPU_TEMPERATURE_WARNING_CELSIUS, ORANGE)),
        ),
    ]


def memory_and_errors() -> list[Cell]:
    """Memory used, XID errors, ECC and row remapping."""
    return [
        timeseries(
            "Memory used",
            [
                (
                    f"lockstep_gpu_memory_used_bytes{{{SEL}}} / lockstep_gpu_memory_total_bytes{{{SEL}}}",
                    "{{instance}} GPU {{gpu}}",
                )
            ],
            "percentunit",
        ),
        table(
            "XID errors since the agent started",
            [(f"lockstep_gpu_xid_errors_total{{{SEL}}}", "")],
            "none",
            "By GPU and XID code. LockstepGPUXidCritical fires for 10 minutes after a critical one "
            f"({', '.join(str(x) for x in T.CRITICAL_XIDS)}).",
            NONE_BAD,
        ),
        table(
            "Memory errors and row remapping",
            [
                (f'lockstep_gpu_ecc_errors_total{{type="uncorrected", {SEL}}}', ""),
                (f"lockstep_gpu_row_remapping_pending{{{SEL}}}", ""),
                (f"lockstep_gpu_row_remapping_failed{{{SEL}}}", ""),
            ],
            "none",
            "Uncorrectable ECC errors since the driver loaded (LockstepGPUUncorrectableECC on any increase), "
            "a pending remapping (the GPU needs a reset) and a failed one (LockstepGPURowRemapFailure: "
            "replace it).",
            NONE_BAD,
            hide=("Time", "job"),
        ),
    ]


def driver_and_fabric() -> list[Cell]:
    """The driver's recovery action and the NVSwitch fabric's state and health."""
    return [
        table(
            "Driver recovery action and fabric state",
            [
                (f"lockstep_gpu_recovery_action{{{SEL}}} == 1", ""),
                (f"lockstep_gpu_fabric_state{{{SEL}}} == 1", ""),
            ],
            "none",
            "Per GPU: the action the driver asks for (none when healthy; LockstepGPURecoveryActionRequired "
            f"after {T.GPU_RECOVERY_ACTION_FOR}) and its NVSwitch fabric registration state (completed when "
            f"healthy; LockstepGPUFabricDegraded after {T.GPU_FABRIC_FOR} otherwise).",
            hide=("Time", "__name__", "job", "Value #A", "Value #B"),
        ),
        timeseries(
            "NVSwitch fabric health",
            [(f"lockstep_gpu_fabric_health{{{SEL}}}", "{{instance}} GPU {{gpu}} {{condition}}")],
            "none",
            "1 while the condition holds. LockstepGPUFabricDegraded fires after "
            f"{T.GPU_FABRIC_FOR} of {', '.join(T.GPU_FABRIC_DEGRADED_CONDITIONS)}; route_recovery and "
            "access_timeout_recovery are the driver repairing itself.",
            NONE_BAD,
        ),
    ]


def nvlink() -> list[Cell]:
    """NVLink links down, traffic and errors."""
    return [
        stat(
            "NVLink links down",
            f"sum(1 - lockstep_nvlink_up{{{SEL}}})",
            "none",
            "Inactive NVLink links (LockstepNVLinkDown after 5 minutes).",
            NONE_BAD,
        ),
        timeseries(
            "NVLink transmit",
            [
                (
                    f"sum by (instance, gpu) (rate(lockstep_nvlink_transmitted_bytes_total{{{SEL}}}[{RATE}]))",
                    "{{instance}} GPU {{gpu}}",
                )
            ],
            "Bps",
            width=8,
        ),
        timeseries(
            "NVLink errors per minute",
            [
                (
                    f"sum by (instance, gpu, link) (rate(lockstep_nvlink_errors_total"
                    f'{{type!~"{"|".join(T.NVLINK_IGNORED_ERROR_TYPES)}", {SEL}}}[{RATE}])) * 60',
                    "{{instance}} GPU {{gpu}} link {{link}}",
                )
            ],
            "cpm",
            f"LockstepNVLinkErrors fires above {T.NVLINK_ERRORS_PER_MINUTE:g} a minute (10 min) for 5 minutes.",
            above((T.NVLINK_ERRORS_PER_MINUTE, RED)),
            width=8,
        ),
    ]


def board() -> Board:
    return Board(
        "lockstep-gpu",
        "Lockstep / GPU & NVLink",
        "Per GPU: load, clocks against the GPU's job peers, throttling, power, temperature, memory errors; "
        "NVLink traffic and errors.",
        [
            *activity(),
            *clocks(),
            *throttling_power_temperature(),
            *memory_and_errors(),
            *driver_and_fabric(),
            *nvlink(),
        ],
    )
