"""What the fake NVML's GPUs can and cannot do, as tables: what each architecture and consumer
GPUs lack, the names of the values a spec sets (clock event reasons with a duration field,
NVLink counters, recovery actions, fabric states and health, GPM pipes), how a driver numbers
the NVML fields, and the constants the fake's answers are built from.
"""

from __future__ import annotations

import pynvml

# Per-process utilisation: NVML keeps samples stamped with the CPU clock in microseconds; the
# fake takes one a second, the first at PROCESS_SAMPLES_EPOCH_US (2026-01-02T00:00:00Z) at t=0.
# nvmlDeviceGetProcessesUtilizationInfo came with the R550 driver: older ones lack the symbol.
PROCESS_UTILIZATION_CALLS = ("nvmlDeviceGetProcessUtilization", "nvmlDeviceGetProcessesUtilizationInfo")
PROCESS_SAMPLES_EPOCH_US = 1_767_312_000_000_000
PROCESS_SAMPLE_PERIOD_US = 1_000_000
PROCESSES_UTILIZATION_INFO_DRIVER = 550
UINT_MAX = 0xFFFFFFFF  # scopeId meaning "all links", and GPU/compute instance id "none"
MIB = 1024 * 1024
XID_FALLEN_OFF_THE_BUS = 79

# Clock event reasons: the fake uses the collector's table (CLOCK_EVENT_REASONS, names as
# exported and as specs write them -> NVML bits) rather than a copy of it.  A copy would be no
# independent check (it was copied, so it repeats any wrong bit); the check of the bits is
# tests/collectors/gpu/test_gpu.py's comparison of the table with nvml.h's values.
# Reasons whose accumulated duration NVML reports as a field (nanoseconds).
CLOCK_EVENT_DURATION_FIELDS = {
    "sw_power_cap": "NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP",
    "sync_boost": "NVML_FI_DEV_CLOCKS_EVENT_REASON_SYNC_BOOST",
    "sw_thermal_slowdown": "NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN",
    "hw_thermal_slowdown": "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN",
    "hw_power_brake": "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN",
}
NVLINK_ERROR_TYPES = ("crc_flit", "crc_data", "replay", "recovery")
# Blackwell's per-link NVLink counters (fields with scopeId = link).
BLACKWELL_NVLINK_FIELDS = {
    "symbol_errors": "NVML_FI_DEV_NVLINK_COUNT_SYMBOL_ERRORS",
    "effective_errors": "NVML_FI_DEV_NVLINK_COUNT_EFFECTIVE_ERRORS",
    "link_recovery_successful": "NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_SUCCESSFUL_EVENTS",
    "link_recovery_failed": "NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_FAILED_EVENTS",
    "receive_errors": "NVML_FI_DEV_NVLINK_COUNT_RCV_ERRORS",
    "transmit_discards": "NVML_FI_DEV_NVLINK_COUNT_XMIT_DISCARDS",
    "malformed_packets": "NVML_FI_DEV_NVLINK_COUNT_MALFORMED_PACKET_ERRORS",
    "buffer_overruns": "NVML_FI_DEV_NVLINK_COUNT_BUFFER_OVERRUN_ERRORS",
    "local_link_integrity_errors": "NVML_FI_DEV_NVLINK_COUNT_LOCAL_LINK_INTEGRITY_ERRORS",
}

RECOVERY_ACTIONS = {
    "none": pynvml.NVML_GPU_RECOVERY_ACTION_NONE,
    "gpu_reset": pynvml.NVML_GPU_RECOVERY_ACTION_GPU_RESET,
    "node_reboot": pynvml.NVML_GPU_RECOVERY_ACTION_NODE_REBOOT,
    "drain_p2p": pynvml.NVML_GPU_RECOVERY_ACTION_DRAIN_P2P,
    "drain_and_reset": pynvml.NVML_GPU_RECOVERY_ACTION_DRAIN_AND_RESET,
    "recover_imex_domain": pynvml.NVML_GPU_RECOVERY_ACTION_RECOVER_IMEX_DOMAIN,
    "bus_reset": pynvml.NVML_GPU_RECOVERY_ACTION_BUS_RESET,
    "system_reboot": pynvml.NVML_GPU_RECOVERY_ACTION_SYSTEM_REBOOT,
}
FABRIC_STATES = {
    "not_supported": pynvml.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED,
    "not_started": pynvml.NVML_GPU_FABRIC_STATE_NOT_STARTED,
    "in_progress": pynvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS,
    "completed": pynvml.NVML_GPU_FABRIC_STATE_COMPLETED,
}
# Health mask fields the fake reports (the others stay 0, "not supported"): name -> shift.
FABRIC_HEALTH_FIELDS = {
    "degraded_bandwidth": pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_DEGRADED_BW,
    "route_recovery": pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ROUTE_RECOVERY,
    "route_unhealthy": pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ROUTE_UNHEALTHY,
    "access_timeout_recovery": pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ACCESS_TIMEOUT_RECOVERY,
}
# GPM pipes: spec name -> (cumulative *_CYCLES_ACTIVE metric, windowed *_UTIL metric), pynvml names.
GPM_PIPES = {
    "tensor": ("NVML_GPM_METRIC_MMA_CYCLES_ACTIVE", "NVML_GPM_METRIC_ANY_TENSOR_UTIL"),
    "tensor_hmma": ("NVML_GPM_METRIC_HMMA_CYCLES_ACTIVE", "NVML_GPM_METRIC_HMMA_TENSOR_UTIL"),
    "tensor_imma": ("NVML_GPM_METRIC_IMMA_CYCLES_ACTIVE", "NVML_GPM_METRIC_IMMA_TENSOR_UTIL"),
    "tensor_dmma": ("NVML_GPM_METRIC_DMMA_CYCLES_ACTIVE", "NVML_GPM_METRIC_DMMA_TENSOR_UTIL"),
    "tensor_dfma": ("NVML_GPM_METRIC_DFMA_CYCLES_ACTIVE", "NVML_GPM_METRIC_DFMA_TENSOR_UTIL"),
    "fp64": ("NVML_GPM_METRIC_FP64_CYCLES_ACTIVE", "NVML_GPM_METRIC_FP64_UTIL"),
    "fp32": ("NVML_GPM_METRIC_FP32_CYCLES_ACTIVE", "NVML_GPM_METRIC_FP32_UTIL"),
    "fp16": ("NVML_GPM_METRIC_FP16_CYCLES_ACTIVE", "NVML_GPM_METRIC_FP16_UTIL"),
    "integer": ("NVML_GPM_METRIC_INTEGER_CYCLES_ACTIVE", "NVML_GPM_METRIC_INTEGER_UTIL"),
}
GPM_ARCHITECTURES = ("hopper", "blackwell")

# What each architecture lacks (pynvml function names, or NVML_FI_* field names).
_DL_ERROR_FIELDS = (
    "NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY",
    "NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY",
    "NVML_FI_DEV_NVLINK_ERROR_DL_CRC",
)
_BLACKWELL_ONLY = tuple(
    name for name in dir(pynvml) if name.startswith("NVML_FI_DEV_NVLINK_COUNT_") and not name.endswith("_BER")
)
_RETIRED_PAGES = ("NVML_FI_DEV_RETIRED_SBE", "NVML_FI_DEV_RETIRED_DBE", "NVML_FI_DEV_RETIRED_PENDING")
REMAPPED_ROWS_FIELDS = (
    "NVML_FI_DEV_REMAPPED_COR",
    "NVML_FI_DEV_REMAPPED_UNC",
    "NVML_FI_DEV_REMAPPED_PENDING",
    "NVML_FI_DEV_REMAPPED_FAILURE",
)
ARCHITECTURE_UNSUPPORTED: dict[str, tuple[str, ...]] = {
    # Volta: page retirement instead of row remapping, no MIG, NVLink 2 without the
    # throughput, link state and per-link DL error fields, no clock event duration fields.
    "volta": (
        *REMAPPED_ROWS_FIELDS,
        *_DL_ERROR_FIELDS,
        *_BLACKWELL_ONLY,
        "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX",
        "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX",
        "NVML_FI_DEV_NVLINK_GET_STATE",
        "NVML_FI_DEV_PCIE_COUNT_TX_BYTES",
        "NVML_FI_DEV_PCIE_COUNT_RX_BYTES",
        "NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN",
        "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN",
        "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN",
        "nvmlDeviceGetMigMode",
        "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION",
        "nvmlDeviceGetGpuFabricInfoV",
    ),
    # GPU fabric info is for Hopper and newer.
    "ampere": (*_RETIRED_PAGES, *_BLACKWELL_ONLY, "nvmlDeviceGetGpuFabricInfoV"),
    "hopper": (*_RETIRED_PAGES, *_BLACKWELL_ONLY),
    # Blackwell dropped the per-link DL error counters for the NVLINK_COUNT_* fields.
    "blackwell": (*_RETIRED_PAGES, *_DL_ERROR_FIELDS),
}
# GeForce and other consumer GPUs: "limited support" in NVML.
CONSUMER_UNSUPPORTED = (
    "NVML_FI_DEV_ECC_SBE_VOL_TOTAL",
    "NVML_FI_DEV_ECC_DBE_VOL_TOTAL",
    "NVML_FI_DEV_ECC_SBE_AGG_TOTAL",
    "NVML_FI_DEV_ECC_DBE_AGG_TOTAL",
    "nvmlDeviceGetGpuFabricInfoV",
    *_RETIRED_PAGES,
    *REMAPPED_ROWS_FIELDS,
    "NVML_FI_DEV_MEMORY_TEMP",
    "NVML_FI_DEV_PCIE_COUNT_TX_BYTES",
    "NVML_FI_DEV_PCIE_COUNT_RX_BYTES",
    "NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN",
    "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN",
    "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN",
    "nvmlDeviceGetMigMode",
)


# --- how a driver numbers the NVML fields ---


_FIELD_NAMES: dict[int, str] = {
    value: name for name, value in vars(pynvml).items() if name.startswith("NVML_FI_") and isinstance(value, int)
}
# NVML renumbered these in driver R590 (251-253 before, 269-271 since); the fake answers by
# its own driver version's numbering, whatever the installed binding says.
_RENUMBERED_IN_R590 = {
    "NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN": (251, 269),
    "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN": (252, 270),
    "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN": (253, 271),
}


def field_names(driver_version: str) -> dict[int, str]:
    """Field id -> NVML_FI_* name as a driver of this version numbers them."""
    names = {i: n for i, n in _FIELD_NAMES.items() if n not in _RENUMBERED_IN_R590}
    since_r590 = int(driver_version.split(".")[0]) >= 590 if driver_version.split(".")[0].isdigit() else True
    for name, (before, since) in _RENUMBERED_IN_R590.items():
        names[since if since_r590 else before] = name
    return names


# Aliases (CLOCKS_EVENT_REASON_SW_POWER_CAP = PERF_POLICY_POWER, ...): the clock event name wins.
_FIELD_NAMES.update({getattr(pynvml, name): name for name in CLOCK_EVENT_DURATION_FIELDS.values()})


GPM_CUMULATIVE_METRICS = (
    "NVML_GPM_METRIC_SM_CYCLES_ELAPSED",
    "NVML_GPM_METRIC_SM_CYCLES_ACTIVE",
    *(cycles for cycles, _ in GPM_PIPES.values()),
)
