"""NVML facts the GPU collector depends on, apart from any metric: how pynvml's errors are
grouped (GPU gone, NVML unusable, not supported), the clock event reason bits, field ids by
the driver's numbering, field values by their value type, and conversions of NVML strings,
PCI bus ids and device handles.
"""

from __future__ import annotations

import ctypes
import re
from typing import Any

import pynvml

# NVML's clock event reason bits, by the names exported (pynvml keeps the two newest under
# their deprecated "throttle" names only).  The fake NVML sets bits by this same table, so
# tests/collectors/gpu/test_gpu.py checks it against nvml.h's values.
CLOCK_EVENT_REASONS: dict[str, int] = {
    "idle": pynvml.nvmlClocksEventReasonGpuIdle,
    "applications_clocks_setting": pynvml.nvmlClocksEventReasonApplicationsClocksSetting,
    "sw_power_cap": pynvml.nvmlClocksEventReasonSwPowerCap,
    "hw_slowdown": pynvml.nvmlClocksEventReasonHwSlowdown,
    "sync_boost": pynvml.nvmlClocksEventReasonSyncBoost,
    "sw_thermal_slowdown": pynvml.nvmlClocksEventReasonSwThermalSlowdown,
    "hw_thermal_slowdown": pynvml.nvmlClocksEventReasonHwThermalSlowdown,
    "hw_power_brake": pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown,
    "display_clock_setting": pynvml.nvmlClocksEventReasonDisplayClockSetting,
    # Newer bits that bindings before 13.590 do not name (values from nvml.h).
    "board_limit": getattr(pynvml, "nvmlClocksThrottleReasonBoardLimit", 0x200),
    "reliability": getattr(pynvml, "nvmlClocksThrottleReasonReliability", 0x400),
}

# NVML renumbered three clock event duration fields in driver R590 (binding 13.590): before,
# they were 251-253, ids that R590 and later give to power smoothing.  They are asked for
# by the driver's numbering, not the binding's, so neither an older binding on a newer
# driver nor the reverse reads power smoothing settings as throttle time.
RENUMBERED_IN_R590 = {
    "NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN": (251, 269),
    "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN": (252, 270),
    "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN": (253, 271),
}


# NVML_FI_DEV_GET_GPU_RECOVERY_ACTION's values (nvmlDeviceGpuRecoveryAction_t), by the names
# exported as lockstep_gpu_recovery_action{action}.  From nvml.h; bindings before 12.560 lack
# the constants, hence the numbers.
RECOVERY_ACTIONS: dict[str, int] = {
    "none": getattr(pynvml, "NVML_GPU_RECOVERY_ACTION_NONE", 0),
    "gpu_reset": getattr(pynvml, "NVML_GPU_RECOVERY_ACTION_GPU_RESET", 1),
    "node_reboot": getattr(pynvml, "NVML_GPU_RECOVERY_ACTION_NODE_REBOOT", 2),
    "drain_p2p": getattr(pynvml, "NVML_GPU_RECOVERY_ACTION_DRAIN_P2P", 3),
    "drain_and_reset": getattr(pynvml, "NVML_GPU_RECOVERY_ACTION_DRAIN_AND_RESET", 4),
    "recover_imex_domain": getattr(pynvml, "NVML_GPU_RECOVERY_ACTION_RECOVER_IMEX_DOMAIN", 5),
    "bus_reset": getattr(pynvml, "NVML_GPU_RECOVERY_ACTION_BUS_RESET", 6),
    "system_reboot": getattr(pynvml, "NVML_GPU_RECOVERY_ACTION_SYSTEM_REBOOT", 7),
}

# nvmlDeviceGetGpuFabricInfoV: the registration state, and the health mask's two-bit fields
# (shift; the TRUE value; each field is 0 when the driver does not report it).
FABRIC_STATES: dict[str, int] = {
    "not_started": pynvml.NVML_GPU_FABRIC_STATE_NOT_STARTED,
    "in_progress": pynvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS,
    "completed": pynvml.NVML_GPU_FABRIC_STATE_COMPLETED,
}
FABRIC_HEALTH_BITS: dict[str, int] = {
    "degraded_bandwidth": pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_DEGRADED_BW,
    "route_recovery": pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ROUTE_RECOVERY,
    "route_unhealthy": pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ROUTE_UNHEALTHY,
    "access_timeout_recovery": pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ACCESS_TIMEOUT_RECOVERY,
}
FABRIC_HEALTH_NOT_SUPPORTED, FABRIC_HEALTH_TRUE, FABRIC_HEALTH_FALSE = 0, 1, 2  # the same for every field above


def fabric_health(mask: int) -> dict[str, int]:
    """The health mask's conditions the driver reports: name -> 1 (holds) or 0."""
    out = {}
    for name, shift in FABRIC_HEALTH_BITS.items():
        value = (mask >> shift) & 0x3
        if value in (FABRIC_HEALTH_TRUE, FABRIC_HEALTH_FALSE):
            out[name] = 1 if value == FABRIC_HEALTH_TRUE else 0
    return out


def driver_major(version: str) -> int | None:
    """'550.90.07' -> 550."""
    match = re.match(r"\s*(\d+)", version)
    return int(match.group(1)) if match else None


def field_id(name: str, driver: int | None) -> int | None:
    """The NVML field id of a pynvml constant name for this driver; None if the binding lacks it."""
    if name in RENUMBERED_IN_R590 and driver is not None:
        before, since = RENUMBERED_IN_R590[name]
        return since if driver >= 590 else before
    return getattr(pynvml, name, None)


_VALUE_MEMBERS = {
    pynvml.NVML_VALUE_TYPE_DOUBLE: "dVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT: "usVal",
}


def field_number(fv: Any) -> float | None:
    """A field's value by its own value type; None for a type NVML did not document."""
    member = _VALUE_MEMBERS.get(fv.valueType)
    return None if member is None else getattr(fv.value, member)


# The GPU is gone: report it down, re-initialise NVML later.
GPU_GONE = (pynvml.NVMLError_GpuIsLost, pynvml.NVMLError_GpuNotFound)
# NVML as a whole is unusable: fail the round, re-initialise with backoff.
LIFECYCLE = (pynvml.NVMLError_Uninitialized, pynvml.NVMLError_DriverNotLoaded, pynvml.NVMLError_LibRmVersionMismatch)
# Not there for this GPU (or this driver): remember and stop asking.
UNSUPPORTED = (pynvml.NVMLError_NotSupported, pynvml.NVMLError_FunctionNotFound)
NO_INSTANCE_ID = 0xFFFFFFFF


def error_name(exc: BaseException) -> str:
    """NVMLError_GpuIsLost -> gpu_is_lost."""
    name = type(exc).__name__.removeprefix("NVMLError_")
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower() if name != "NVMLError" else "unknown"


def text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def pci_key(bus_id: str) -> tuple[int, int, int, int] | None:
    """'00000000:3B:00.0' (NVML) or '0000:3b:00.0' (sysfs) -> (domain, bus, device, function)."""
    match = re.fullmatch(r"([0-9a-fA-F]+):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])", bus_id.strip())
    return tuple(int(part, 16) for part in match.groups()) if match else None  # type: ignore[return-value]


def handle_address(handle: Any) -> int | None:
    """A device handle's address: how an event's device is matched to a GPU."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return None
