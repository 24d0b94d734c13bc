"""Which NVML field or call feeds which metric, and the scale to base units: the mapping
as data, read by the per-GPU reading and by doctor's note on what a GPU cannot give.
"""

from __future__ import annotations

from lockstep.agent.collector import MetricSpec
from lockstep.collectors.gpu.metrics import (
    CLOCK_EVENT_ACTIVE,
    CLOCK_EVENT_SECONDS,
    ECC_AGGREGATE_ERRORS,
    ECC_ERRORS,
    ENERGY,
    FABRIC_HEALTH,
    FABRIC_STATE,
    GPU_NVLINK_ERRORS,
    LAST_XID,
    MEMORY_CLOCK,
    MEMORY_TEMPERATURE,
    MEMORY_TOTAL,
    MEMORY_USED,
    MEMORY_UTILIZATION,
    MIG_MODE,
    NVLINK_ERRORS,
    NVLINK_RECEIVED,
    NVLINK_TRANSMITTED,
    PAGE_RETIREMENT_PENDING,
    PCIE_RECEIVED,
    PCIE_REPLAYS,
    PCIE_TRANSMITTED,
    POWER,
    POWER_LIMIT,
    PROCESS_MEMORY,
    PROCESSES,
    RECOVERY_ACTION,
    REMAPPED_ROWS,
    RETIRED_PAGES,
    ROW_REMAPPING_FAILED,
    ROW_REMAPPING_PENDING,
    SM_CLOCK,
    SM_CLOCK_MAX,
    TEMPERATURE,
    UTILIZATION,
    XID_ERRORS,
)
from lockstep.collectors.gpu.pcie import PCIE_LINK_CALLS
from lockstep.collectors.gpu.state import FieldUse, GpuState

RECOVERY_ACTION_FIELD = "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION"
DEVICE_FIELDS = (
    FieldUse("NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION", ENERGY, scale=1e-3),  # mJ
    FieldUse("NVML_FI_DEV_MEMORY_TEMP", MEMORY_TEMPERATURE),
    FieldUse("NVML_FI_DEV_ECC_SBE_VOL_TOTAL", ECC_ERRORS, ("corrected",)),
    FieldUse("NVML_FI_DEV_ECC_DBE_VOL_TOTAL", ECC_ERRORS, ("uncorrected",)),
    FieldUse("NVML_FI_DEV_ECC_SBE_AGG_TOTAL", ECC_AGGREGATE_ERRORS, ("corrected",)),
    FieldUse("NVML_FI_DEV_ECC_DBE_AGG_TOTAL", ECC_AGGREGATE_ERRORS, ("uncorrected",)),
    FieldUse(RECOVERY_ACTION_FIELD, None),  # a state set: decoded in reading.py
    FieldUse("NVML_FI_DEV_REMAPPED_COR", REMAPPED_ROWS, ("correctable",)),
    FieldUse("NVML_FI_DEV_REMAPPED_UNC", REMAPPED_ROWS, ("uncorrectable",)),
    FieldUse("NVML_FI_DEV_REMAPPED_PENDING", ROW_REMAPPING_PENDING),
    FieldUse("NVML_FI_DEV_REMAPPED_FAILURE", ROW_REMAPPING_FAILED),
    FieldUse("NVML_FI_DEV_RETIRED_SBE", RETIRED_PAGES, ("single_bit_ecc",)),
    FieldUse("NVML_FI_DEV_RETIRED_DBE", RETIRED_PAGES, ("double_bit_ecc",)),
    FieldUse("NVML_FI_DEV_RETIRED_PENDING", PAGE_RETIREMENT_PENDING),
    FieldUse("NVML_FI_DEV_PCIE_REPLAY_COUNTER", PCIE_REPLAYS),
    FieldUse("NVML_FI_DEV_PCIE_COUNT_TX_BYTES", PCIE_TRANSMITTED),
    FieldUse("NVML_FI_DEV_PCIE_COUNT_RX_BYTES", PCIE_RECEIVED),
    # Accumulated clock event durations, in nanoseconds like nvmlViolationTime_t.
    FieldUse("NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP", CLOCK_EVENT_SECONDS, ("sw_power_cap",), 1e-9),
    FieldUse("NVML_FI_DEV_CLOCKS_EVENT_REASON_SYNC_BOOST", CLOCK_EVENT_SECONDS, ("sync_boost",), 1e-9),
    FieldUse("NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN", CLOCK_EVENT_SECONDS, ("sw_thermal_slowdown",), 1e-9),
    FieldUse("NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN", CLOCK_EVENT_SECONDS, ("hw_thermal_slowdown",), 1e-9),
    FieldUse("NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN", CLOCK_EVENT_SECONDS, ("hw_power_brake",), 1e-9),
)
# Asked for only on GPUs with NVLink.
NVLINK_TOTAL_FIELDS = (
    FieldUse("NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", GPU_NVLINK_ERRORS, ("crc_flit",)),
    FieldUse("NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", GPU_NVLINK_ERRORS, ("crc_data",)),
    FieldUse("NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", GPU_NVLINK_ERRORS, ("replay",)),
    FieldUse("NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", GPU_NVLINK_ERRORS, ("recovery",)),
)
LINK_STATE_FIELD = "NVML_FI_DEV_NVLINK_GET_STATE"
# Per link: scopeId = link number.
LINK_FIELDS = (
    FieldUse(LINK_STATE_FIELD, None),
    FieldUse("NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX", NVLINK_TRANSMITTED, scale=1024.0),  # KiB
    FieldUse("NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX", NVLINK_RECEIVED, scale=1024.0),
    FieldUse("NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY", NVLINK_ERRORS, ("replay",)),
    FieldUse("NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY", NVLINK_ERRORS, ("recovery",)),
    FieldUse("NVML_FI_DEV_NVLINK_ERROR_DL_CRC", NVLINK_ERRORS, ("crc_flit",)),
    # Blackwell and newer: the DL counters above are gone, these replace them.
    FieldUse("NVML_FI_DEV_NVLINK_COUNT_SYMBOL_ERRORS", NVLINK_ERRORS, ("symbol_errors",)),
    FieldUse("NVML_FI_DEV_NVLINK_COUNT_EFFECTIVE_ERRORS", NVLINK_ERRORS, ("effective_errors",)),
    FieldUse("NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_SUCCESSFUL_EVENTS", NVLINK_ERRORS, ("link_recovery_successful",)),
    FieldUse("NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_FAILED_EVENTS", NVLINK_ERRORS, ("link_recovery_failed",)),
    FieldUse("NVML_FI_DEV_NVLINK_COUNT_RCV_ERRORS", NVLINK_ERRORS, ("receive_errors",)),
    FieldUse("NVML_FI_DEV_NVLINK_COUNT_XMIT_DISCARDS", NVLINK_ERRORS, ("transmit_discards",)),
    FieldUse("NVML_FI_DEV_NVLINK_COUNT_MALFORMED_PACKET_ERRORS", NVLINK_ERRORS, ("malformed_packets",)),
    FieldUse("NVML_FI_DEV_NVLINK_COUNT_BUFFER_OVERRUN_ERRORS", NVLINK_ERRORS, ("buffer_overruns",)),
    FieldUse("NVML_FI_DEV_NVLINK_COUNT_LOCAL_LINK_INTEGRITY_ERRORS", NVLINK_ERRORS, ("local_link_integrity_errors",)),
)
LINK_USES = frozenset(LINK_FIELDS)


# Which metrics each per-GPU call feeds (for doctor's note on what this machine cannot give).
CALL_METRICS: dict[str, tuple[MetricSpec, ...]] = {
    "nvmlDeviceGetUtilizationRates": (UTILIZATION, MEMORY_UTILIZATION),
    "nvmlDeviceGetMemoryInfo": (MEMORY_USED, MEMORY_TOTAL),
    "nvmlDeviceGetClockInfo": (SM_CLOCK, MEMORY_CLOCK),
    "nvmlDeviceGetMaxClockInfo": (SM_CLOCK_MAX,),
    "nvmlDeviceGetPowerUsage": (POWER,),
    "nvmlDeviceGetEnforcedPowerLimit": (POWER_LIMIT,),
    "nvmlDeviceGetTemperature": (TEMPERATURE,),
    "nvmlDeviceGetCurrentClocksEventReasons": (CLOCK_EVENT_ACTIVE,),
    "nvmlDeviceGetComputeRunningProcesses": (PROCESSES, PROCESS_MEMORY),
    "nvmlDeviceGetMigMode": (MIG_MODE,),
    "nvmlDeviceGetGpuFabricInfoV": (FABRIC_STATE, FABRIC_HEALTH),
    "nvmlDeviceRegisterEvents": (XID_ERRORS, LAST_XID),
    **PCIE_LINK_CALLS,
}


def omitted_metrics(gpu: GpuState) -> set[MetricSpec]:
    """Metrics the GPU cannot give: every call or field that feeds them is unsupported."""
    sources: dict[MetricSpec, set[str]] = {}
    uses = DEVICE_FIELDS + (NVLINK_TOTAL_FIELDS + LINK_FIELDS if gpu.links else ())
    for use in uses:
        if use.spec is not None:
            sources.setdefault(use.spec, set()).add(use.field)
    sources[RECOVERY_ACTION] = {RECOVERY_ACTION_FIELD}
    for call, specs in CALL_METRICS.items():
        for spec in specs:
            sources.setdefault(spec, set()).add(call)
    return {spec for spec, names in sources.items() if names <= gpu.unsupported}
