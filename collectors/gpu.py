"""GPU collector: NVML through pynvml (the official nvidia-ml-py binding).

What it reads per GPU and round (steady state, 11 NVML calls on a GPU without MIG): one
``nvmlDeviceGetFieldValues`` batch with every field-based value (energy, memory
temperature, ECC, row remapping or page retirement, PCIe replays and bytes, clock event
durations, the GPU's NVLink error totals, and per NVLink link - scopeId = link - its
state, traffic and error counters), then utilization, memory, SM and memory clocks, power
and its limit, temperature, clock event reasons, compute processes and MIG mode.

Traps handled (see docs/gpu.md):
- a call or field the GPU does not support is probed once and remembered per GPU; each
  field of a batch is checked by its own return code and read by its own value type;
- a GPU that fell off the bus (GPU_IS_LOST) reports ``lockstep_gpu_up 0`` while the
  others keep reporting, and none of its values (stale or partial) are served;
- NVML is re-initialised with backoff after a lost GPU and after lifecycle errors
  (uninitialized, driver not loaded, library/driver mismatch); a PCI hotplug event for an
  NVIDIA GPU re-initialises at once;
- XID errors come from a dedicated thread (``nvmlEventSetWait_v2``) as counters per code,
  which survives timeouts and lost GPUs by re-registering with backoff;
- NVLink traffic is reported by NVML in KiB and exported in bytes; energy in mJ -> J.

After each round the GPUs, their identity and their compute processes' host PIDs are
published in agent/gpus.py, where the Slurm, Kubernetes and inference collectors attribute
GPUs to jobs, pods and engines.  PIDs are not exported as labels.
"""

from __future__ import annotations

import ctypes
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pynvml
from prometheus_client.core import Metric

from lockstep.agent import gpus
from lockstep.agent.collector import Collector, CollectorContext, MetricSpec, NothingHere, Option
from lockstep.agent.config import parse_string
from lockstep.agent.files import read_text
from lockstep.agent.gpus import GpuProcess, MigDevice, PublishedGpu

GPU = ("gpu", "uuid")
LINK = ("gpu", "uuid", "link")
MIG = ("gpu", "uuid", "gpu_instance_id", "compute_instance_id")

INFO = MetricSpec(
    "lockstep_gpu_info",
    "gauge",
    "GPU identity: NVML index (gpu), UUID, PCI bus id, model, driver and VBIOS versions, and the minor "
    "number of its /dev/nvidiaN (NVML index, minor number and Slurm GRES index can differ).",
    ("gpu", "uuid", "pci_bus_id", "model", "driver_version", "vbios_version", "minor_number"),
)
UP = MetricSpec(
    "lockstep_gpu_up",
    "gauge",
    "1 if NVML answers for the GPU; 0 if it fell off the bus (GPU_IS_LOST) or cannot be reached, "
    "in which case its other metrics are omitted.",
    GPU,
)
UTILIZATION = MetricSpec(
    "lockstep_gpu_utilization_ratio",
    "gauge",
    "Fraction of the last sample period in which a kernel ran on the GPU (NVML utilization.gpu). "
    "Not available on a GPU in MIG mode.",
    GPU,
    unit="ratio",
)
MEMORY_UTILIZATION = MetricSpec(
    "lockstep_gpu_memory_utilization_ratio",
    "gauge",
    "Fraction of the last sample period in which device memory was read or written.",
    GPU,
    unit="ratio",
)
MEMORY_USED = MetricSpec("lockstep_gpu_memory_used_bytes", "gauge", "Device memory in use.", GPU, unit="bytes")
MEMORY_TOTAL = MetricSpec("lockstep_gpu_memory_total_bytes", "gauge", "Device memory in total.", GPU, unit="bytes")
SM_CLOCK = MetricSpec("lockstep_gpu_sm_clock_hertz", "gauge", "Current SM clock.", GPU, unit="hertz")
SM_CLOCK_MAX = MetricSpec(
    "lockstep_gpu_sm_clock_max_hertz", "gauge", "Maximum SM clock of the GPU (what an unthrottled GPU reaches).", GPU
)
MEMORY_CLOCK = MetricSpec("lockstep_gpu_memory_clock_hertz", "gauge", "Current memory clock.", GPU, unit="hertz")
POWER = MetricSpec(
    "lockstep_gpu_power_watts", "gauge", "Power draw (NVML: averaged over 1 s on Ampere and newer).", GPU, unit="watts"
)
POWER_LIMIT = MetricSpec(
    "lockstep_gpu_power_limit_watts", "gauge", "Power limit the driver enforces.", GPU, unit="watts"
)
ENERGY = MetricSpec(
    "lockstep_gpu_energy_joules_total",
    "counter",
    "Energy consumed since the driver was loaded (NVML reports mJ).",
    GPU,
    unit="joules",
)
TEMPERATURE = MetricSpec("lockstep_gpu_temperature_celsius", "gauge", "GPU core temperature.", GPU, unit="celsius")
MEMORY_TEMPERATURE = MetricSpec(
    "lockstep_gpu_memory_temperature_celsius", "gauge", "Device memory (HBM) temperature.", GPU, unit="celsius"
)
CLOCK_EVENT_ACTIVE = MetricSpec(
    "lockstep_gpu_clock_event_active",
    "gauge",
    "1 while the reason holds the GPU's clocks down (NVML clock event reasons, formerly throttle reasons): "
    "hw_slowdown, hw_thermal_slowdown, hw_power_brake, sw_power_cap, sw_thermal_slowdown, sync_boost, idle, ...",
    (*GPU, "reason"),
)
CLOCK_EVENT_SECONDS = MetricSpec(
    "lockstep_gpu_clock_event_seconds_total",
    "counter",
    "Time the reason has held the GPU's clocks down, where the GPU reports it (NVML reports nanoseconds).",
    (*GPU, "reason"),
    unit="seconds",
)
XID_ERRORS = MetricSpec(
    "lockstep_gpu_xid_errors_total",
    "counter",
    "XID errors (critical GPU errors, e.g. 79 fallen off the bus, 48 double-bit ECC, 74 NVLink) reported "
    "by NVML since the agent started, by XID code.",
    (*GPU, "xid"),
)
LAST_XID = MetricSpec(
    "lockstep_gpu_last_xid_timestamp_seconds",
    "gauge",
    "Unix time of the GPU's most recent XID error seen by the agent.",
    GPU,
    unit="seconds",
)
ECC_ERRORS = MetricSpec(
    "lockstep_gpu_ecc_errors_total",
    "counter",
    "Memory ECC errors since the driver was loaded (volatile counts), by type: corrected (single-bit) or "
    "uncorrected (double-bit).",
    (*GPU, "type"),
)
REMAPPED_ROWS = MetricSpec(
    "lockstep_gpu_remapped_rows",
    "gauge",
    "Memory rows remapped to spare rows (Ampere and newer), by the errors that caused it: correctable or "
    "uncorrectable.",
    (*GPU, "state"),
)
ROW_REMAPPING_PENDING = MetricSpec(
    "lockstep_gpu_row_remapping_pending",
    "gauge",
    "1 if a row remapping is pending: the GPU needs a reset to apply it.",
    GPU,
)
ROW_REMAPPING_FAILED = MetricSpec(
    "lockstep_gpu_row_remapping_failed",
    "gauge",
    "1 if a row remapping failed (no spare rows left): the GPU should be replaced.",
    GPU,
)
RETIRED_PAGES = MetricSpec(
    "lockstep_gpu_retired_pages",
    "gauge",
    "Memory pages retired (GPUs before Ampere, which have no row remapping), by cause: single_bit_ecc or "
    "double_bit_ecc.",
    (*GPU, "cause"),
)
PAGE_RETIREMENT_PENDING = MetricSpec(
    "lockstep_gpu_page_retirement_pending",
    "gauge",
    "1 if pages are waiting to be retired at the next reboot or reset (GPUs before Ampere).",
    GPU,
)
PCIE_REPLAYS = MetricSpec(
    "lockstep_gpu_pcie_replays_total",
    "counter",
    "PCIe replays (retransmissions after link errors); a growing count points at a bad riser or slot.",
    GPU,
)
PCIE_TRANSMITTED = MetricSpec(
    "lockstep_gpu_pcie_transmitted_bytes_total", "counter", "Bytes the GPU sent over PCIe.", GPU, unit="bytes"
)
PCIE_RECEIVED = MetricSpec(
    "lockstep_gpu_pcie_received_bytes_total", "counter", "Bytes the GPU received over PCIe.", GPU, unit="bytes"
)
NVLINK_UP = MetricSpec(
    "lockstep_nvlink_up", "gauge", "1 if the NVLink link is active (or in a low-power sleep), 0 if inactive.", LINK
)
NVLINK_TRANSMITTED = MetricSpec(
    "lockstep_nvlink_transmitted_bytes_total",
    "counter",
    "Data bytes transmitted on the link (NVML reports KiB).",
    LINK,
    unit="bytes",
)
NVLINK_RECEIVED = MetricSpec(
    "lockstep_nvlink_received_bytes_total",
    "counter",
    "Data bytes received on the link (NVML reports KiB).",
    LINK,
    unit="bytes",
)
NVLINK_ERRORS = MetricSpec(
    "lockstep_nvlink_errors_total",
    "counter",
    "NVLink errors on the link, by type: replay, recovery, crc_flit (data link layer, up to Hopper); "
    "symbol_errors, effective_errors, link_recovery_successful, link_recovery_failed, receive_errors, "
    "transmit_discards, malformed_packets, buffer_overruns, local_link_integrity_errors (Blackwell and newer).",
    (*LINK, "type"),
)
GPU_NVLINK_ERRORS = MetricSpec(
    "lockstep_gpu_nvlink_errors_total",
    "counter",
    "NVLink errors summed over the GPU's links, from NVML's GPU-wide counters, by type: crc_flit, crc_data, "
    "replay, recovery.",
    (*GPU, "type"),
)
MIG_MODE = MetricSpec("lockstep_gpu_mig_mode", "gauge", "1 if the GPU is in MIG mode (partitioned).", GPU)
MIG_INFO = MetricSpec(
    "lockstep_gpu_mig_device_info",
    "gauge",
    "A MIG device of the GPU: its GPU and compute instance ids, profile (e.g. 3g.40gb) and MIG UUID.",
    (*MIG, "profile", "mig_uuid"),
)
MIG_MEMORY_USED = MetricSpec(
    "lockstep_gpu_mig_device_memory_used_bytes", "gauge", "Device memory in use in the MIG device.", MIG, unit="bytes"
)
MIG_MEMORY_TOTAL = MetricSpec(
    "lockstep_gpu_mig_device_memory_total_bytes", "gauge", "Device memory of the MIG device.", MIG, unit="bytes"
)
MIG_PROCESSES = MetricSpec(
    "lockstep_gpu_mig_device_processes", "gauge", "Compute processes running in the MIG device.", MIG
)
PROCESSES = MetricSpec("lockstep_gpu_processes", "gauge", "Compute processes running on the GPU.", GPU)
PROCESS_MEMORY = MetricSpec(
    "lockstep_gpu_processes_memory_used_bytes",
    "gauge",
    "Device memory used by the GPU's compute processes, summed (processes whose use NVML cannot tell are left out).",
    GPU,
    unit="bytes",
)
NVML_ERRORS = MetricSpec(
    "lockstep_gpu_nvml_errors_total",
    "counter",
    "NVML calls for the GPU that failed, by error (gpu_is_lost, timeout, unknown, ...); calls a GPU does not "
    "support are not counted (they are probed once and left out).",
    (*GPU, "error"),
)

# NVML's clock event reason bits, by the names exported (pynvml keeps the two newest under
# their deprecated "throttle" names only).
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


@dataclass(frozen=True)
class FieldUse:
    """One NVML field and where its value goes: metric, extra label values, scale to base units."""

    field: str  # pynvml constant name, e.g. NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION
    spec: MetricSpec | None  # None: handled specially (link state)
    labels: tuple[str, ...] = ()
    scale: float = 1.0


DEVICE_FIELDS = (
    FieldUse("NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION", ENERGY, scale=1e-3),  # mJ
    FieldUse("NVML_FI_DEV_MEMORY_TEMP", MEMORY_TEMPERATURE),
    FieldUse("NVML_FI_DEV_ECC_SBE_VOL_TOTAL", ECC_ERRORS, ("corrected",)),
    FieldUse("NVML_FI_DEV_ECC_DBE_VOL_TOTAL", ECC_ERRORS, ("uncorrected",)),
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
_LINK_USES = frozenset(LINK_FIELDS)
# NVML renumbered three clock event duration fields in driver R590 (binding 13.590): before,
# they were 251-253, ids that R590 and later give to power smoothing.  They are asked for
# by the driver's numbering, not the binding's, so neither an older binding on a newer
# driver nor the reverse reads power smoothing settings as throttle time.
RENUMBERED_IN_R590 = {
    "NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN": (251, 269),
    "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN": (252, 270),
    "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN": (253, 271),
}


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
    "nvmlDeviceRegisterEvents": (XID_ERRORS, LAST_XID),
}
_VALUE_MEMBERS = {
    pynvml.NVML_VALUE_TYPE_DOUBLE: "dVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT: "usVal",
}
# The GPU is gone: report it down, re-initialise NVML later.
GPU_GONE = (pynvml.NVMLError_GpuIsLost, pynvml.NVMLError_GpuNotFound)
# NVML as a whole is unusable: fail the round, re-initialise with backoff.
LIFECYCLE = (pynvml.NVMLError_Uninitialized, pynvml.NVMLError_DriverNotLoaded, pynvml.NVMLError_LibRmVersionMismatch)
# Not there for this GPU (or this driver): remember and stop asking.
UNSUPPORTED = (pynvml.NVMLError_NotSupported, pynvml.NVMLError_FunctionNotFound)
NO_INSTANCE_ID = 0xFFFFFFFF
NVIDIA_PCI_VENDOR = "0x10de"


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


# --- the collector ---


@dataclass
class GpuState:
    """What the collector knows about one GPU in the current NVML session."""

    index: int
    handle: Any
    uuid: str = ""
    pci_bus_id: str = ""
    minor_number: int | None = None
    model: str = ""
    vbios_version: str = ""
    sm_clock_max_hz: float | None = None
    links: int = 0
    lost: bool = False
    field_uses: list[tuple[FieldUse, int, int]] = field(default_factory=list)  # (use, id, scopeId) still asked for
    unsupported: set[str] = field(default_factory=set)  # calls and fields found unsupported
    link_state_by_call: bool = False  # the link state field is unsupported: ask per link
    mig_cache: dict[str, MigDevice] = field(default_factory=dict)

    @property
    def labels(self) -> tuple[str, str]:
        return (str(self.index), self.uuid)


@dataclass
class Session:
    """One nvmlInit .. nvmlShutdown."""

    nvml: Any
    driver_version: str
    gpus: list[GpuState]
    listener: XidListener | None = None
    reinit_wanted: bool = False


def parse_fake_nvml(value: Any) -> Any:
    """The fake NVML spec file: loaded and checked when the config is (errors name file:line)."""
    from lockstep.simulation.fake_nvml import FakeSpecError, load_spec  # only when asked for

    try:
        return load_spec(parse_string(value))
    except FakeSpecError as exc:
        raise ValueError("; ".join(exc.problems)) from None


class GpuCollector(Collector):
    name = "gpu"
    help = "NVIDIA GPUs and NVLink through NVML: utilization, memory, clocks and their throttling, power, XID errors."
    default_interval = 10.0
    hotplug_subsystems = ("pci",)
    options = (
        Option(
            "fake_nvml",
            parse_fake_nvml,
            None,
            "use a fake NVML described by this YAML spec instead of the real library (demos, tests; docs/gpu.md)",
            flag="--gpu.fake-nvml",
        ),
    )
    metrics = (
        INFO,
        UP,
        UTILIZATION,
        MEMORY_UTILIZATION,
        MEMORY_USED,
        MEMORY_TOTAL,
        SM_CLOCK,
        SM_CLOCK_MAX,
        MEMORY_CLOCK,
        POWER,
        POWER_LIMIT,
        ENERGY,
        TEMPERATURE,
        MEMORY_TEMPERATURE,
        CLOCK_EVENT_ACTIVE,
        CLOCK_EVENT_SECONDS,
        XID_ERRORS,
        LAST_XID,
        ECC_ERRORS,
        REMAPPED_ROWS,
        ROW_REMAPPING_PENDING,
        ROW_REMAPPING_FAILED,
        RETIRED_PAGES,
        PAGE_RETIREMENT_PENDING,
        PCIE_REPLAYS,
        PCIE_TRANSMITTED,
        PCIE_RECEIVED,
        NVLINK_UP,
        NVLINK_TRANSMITTED,
        NVLINK_RECEIVED,
        NVLINK_ERRORS,
        GPU_NVLINK_ERRORS,
        MIG_MODE,
        MIG_INFO,
        MIG_MEMORY_USED,
        MIG_MEMORY_TOTAL,
        MIG_PROCESSES,
        PROCESSES,
        PROCESS_MEMORY,
        NVML_ERRORS,
    )
    # Re-initialisation backoff (seconds): doubles after each attempt that still finds a
    # problem, back to the start once all GPUs answer.
    reinit_backoff_initial = 5.0
    reinit_backoff_max = 300.0
    # How long the first round waits for the XID listener to be registered, so an XID
    # right at start is not missed and the first exposition already has it.
    listener_ready_timeout = 3.0
    listener_wait_ms = 1000
    listener_backoff = (0.5, 30.0)

    def __init__(self, context: CollectorContext) -> None:
        super().__init__(context)
        self._session: Session | None = None
        self._own_fake: Any = None
        self._retry_at = 0.0  # monotonic time before which NVML is not re-initialised
        self._retry_delay = self.reinit_backoff_initial
        self._broken = ""  # why the last attempt to use NVML as a whole failed
        self._rediscover = threading.Event()  # set by a hotplug event
        # Identity of the GPUs seen, kept across sessions: by NVML index (to label a GPU that
        # is lost when NVML is initialised) and by UUID (to report one that vanished).
        self._known: dict[int, GpuState] = {}
        self._seen: dict[str, GpuState] = {}
        self._known_pci: set[tuple[int, int, int, int]] = set()
        self._errors: dict[tuple[int, str, str], int] = {}  # (index, uuid, error) -> count
        self._xid_counts: dict[tuple[str, int], int] = {}  # kept across sessions: counters
        self._xid_last: dict[str, float] = {}
        self._xid_lock = threading.Lock()
        self._wall_clock: Callable[[], float] = context.seams.wall_clock or time.time

    # --- NVML library and session ---

    def _library(self) -> Any:
        fake = self.context.seams.nvml
        if fake is not None:
            return fake
        spec = self.context.options.get("fake_nvml")
        if spec is not None:
            if self._own_fake is None:
                from lockstep.simulation.fake_nvml import FakeNvml

                self._own_fake = FakeNvml(spec, real_time=True)
            return self._own_fake
        return pynvml

    def _start_session(self) -> Session:
        nvml = self._library()
        try:
            nvml.nvmlInit()
        except pynvml.NVMLError_LibraryNotFound:
            raise NothingHere("libnvidia-ml.so.1 not found (no NVIDIA driver installed): no GPUs to collect") from None
        except pynvml.NVMLError_DriverNotLoaded:
            raise NothingHere("the NVIDIA kernel driver is not loaded (NVML: Driver Not Loaded)") from None
        try:
            count = nvml.nvmlDeviceGetCount()
            if count == 0:
                raise NothingHere("NVML found no GPUs")
            driver = text(nvml.nvmlSystemGetDriverVersion())
            driver_numbering = driver_major(driver)
            gpus = [self._enumerate(nvml, index, driver_numbering) for index in range(count)]
        except BaseException:
            self._shutdown(nvml)
            raise
        # A GPU seen before that NVML no longer lists (removed from the bus) stays reported down.
        listed = {g.uuid for g in gpus}
        for uuid, seen in self._seen.items():
            if uuid not in listed:
                gone = GpuState(index=seen.index, handle=None, uuid=uuid, pci_bus_id=seen.pci_bus_id, lost=True)
                gone.minor_number, gone.model, gone.vbios_version = seen.minor_number, seen.model, seen.vbios_version
                gpus.append(gone)
        self._seen.update({g.uuid: g for g in gpus if g.uuid and not g.lost})
        session = Session(nvml, driver, gpus)
        self._known_pci = {key for g in gpus if (key := pci_key(g.pci_bus_id)) is not None}
        if any(g.lost for g in gpus):
            session.reinit_wanted = True
        session.listener = XidListener(self, nvml, [g for g in gpus if not g.lost])
        session.listener.start()
        return session

    def _enumerate(self, nvml: Any, index: int, driver: int | None) -> GpuState:
        """A GPU's identity and static facts; a GPU that does not answer is kept, lost."""
        known = self._known.get(index)
        gpu = GpuState(index=index, handle=None)
        try:
            gpu.handle = nvml.nvmlDeviceGetHandleByIndex(index)
            gpu.uuid = text(nvml.nvmlDeviceGetUUID(gpu.handle))
            gpu.pci_bus_id = text(nvml.nvmlDeviceGetPciInfo(gpu.handle).busId)
            gpu.model = text(self._optional(gpu, "nvmlDeviceGetName", nvml.nvmlDeviceGetName, gpu.handle) or "")
            gpu.vbios_version = text(
                self._optional(gpu, "nvmlDeviceGetVbiosVersion", nvml.nvmlDeviceGetVbiosVersion, gpu.handle) or ""
            )
            gpu.minor_number = self._optional(
                gpu, "nvmlDeviceGetMinorNumber", nvml.nvmlDeviceGetMinorNumber, gpu.handle
            )
            max_mhz = self._optional(
                gpu, "nvmlDeviceGetMaxClockInfo", nvml.nvmlDeviceGetMaxClockInfo, gpu.handle, pynvml.NVML_CLOCK_SM
            )
            gpu.sm_clock_max_hz = None if max_mhz is None else max_mhz * 1e6
            gpu.links = self._link_count(nvml, gpu)
        except GPU_GONE as exc:
            self._lose(gpu, exc, known)
        except pynvml.NVMLError as exc:
            if isinstance(exc, LIFECYCLE):
                raise
            self.log.warning("GPU %d does not answer NVML (%s): reported down", index, exc)
            self._lose(gpu, exc, known)
        if not gpu.lost:
            uses = [(use, 0) for use in DEVICE_FIELDS]
            if gpu.links:
                uses += [(use, 0) for use in NVLINK_TOTAL_FIELDS]
                uses += [(use, link) for link in range(gpu.links) for use in LINK_FIELDS]
            ids = {use.field: field_id(use.field, driver) for use, _ in uses}
            known_ids = {name: fid for name, fid in ids.items() if fid is not None}  # the binding may lack some
            gpu.field_uses = [(use, known_ids[use.field], scope) for use, scope in uses if use.field in known_ids]
            self._known[index] = gpu
        return gpu

    def _lose(self, gpu: GpuState, exc: BaseException, known: GpuState | None) -> None:
        """Mark the GPU down, keeping what is known of its identity for its labels."""
        gpu.lost = True
        if known is not None and not gpu.uuid:
            gpu.uuid, gpu.pci_bus_id, gpu.minor_number = known.uuid, known.pci_bus_id, known.minor_number
            gpu.model, gpu.vbios_version = known.model, known.vbios_version
        self._count_error(gpu, exc)

    def _link_count(self, nvml: Any, gpu: GpuState) -> int:
        values = nvml.nvmlDeviceGetFieldValues(gpu.handle, [pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT])
        fv = values[0]
        if fv.nvmlReturn == pynvml.NVML_ERROR_GPU_IS_LOST:
            raise pynvml.NVMLError_GpuIsLost()
        if fv.nvmlReturn != pynvml.NVML_SUCCESS:
            return 0  # no NVLink (or not reported): no link metrics
        return int(field_number(fv) or 0)

    def _shutdown(self, nvml: Any) -> None:
        try:
            nvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass  # shutting down a broken session: nothing more to do

    def _end_session(self) -> bool:
        """Stop the listener and shut NVML down; False if the listener is stuck in NVML."""
        session = self._session
        if session is None:
            return True
        if session.listener is not None and not session.listener.stop(timeout=2 * self.listener_wait_ms / 1000 + 1):
            self.log.warning("XID listener still blocked in NVML: re-initialisation postponed")
            return False
        self._shutdown(session.nvml)
        self._session = None
        return True

    def _schedule_reinit(self, now: float) -> float:
        """When NVML will next be re-initialised; the delay doubles each time, up to its maximum."""
        delay = self._retry_delay
        self._retry_at = now + delay
        self._retry_delay = min(delay * 2, self.reinit_backoff_max)
        return delay

    def _ensure_session(self) -> tuple[Session, bool]:
        """The NVML session to read from, (re)initialised when due; and whether it is new."""
        now = time.monotonic()
        if self._rediscover.is_set():
            self._rediscover.clear()
            self._retry_at = now  # a GPU came or went: look now, not after the backoff
            if self._session is not None:
                self._session.reinit_wanted = True
        if self._session is not None and self._session.reinit_wanted and now >= self._retry_at:
            self._end_session()
        if self._session is not None:
            return self._session, False
        if self._broken and now < self._retry_at:
            raise RuntimeError(f"{self._broken}; re-initialising in {self._retry_at - now:.0f}s")
        try:
            session = self._start_session()
        except pynvml.NVMLError as exc:
            delay = self._schedule_reinit(now)
            self._broken = f"NVML: {exc}"
            raise RuntimeError(f"NVML initialisation failed: {exc} (retrying in {delay:g}s)") from None
        self._broken = ""
        if session.reinit_wanted:
            self._schedule_reinit(now)
        else:
            self._retry_delay = self.reinit_backoff_initial
        self._session = session
        return session, True

    # --- one round ---

    def collect(self) -> Iterator[Metric]:
        try:
            session, new = self._ensure_session()
        except BaseException:
            gpus.publish(())  # no NVML: nothing to attribute, rather than last round's GPUs
            raise
        if new and session.listener is not None:
            session.listener.ready.wait(self.listener_ready_timeout)
        samples: list[tuple[MetricSpec, tuple[str, ...], float]] = []
        published = []
        for gpu in session.gpus:
            if not gpu.lost:
                try:
                    reading, processes, migs = self._read_gpu(session.nvml, gpu)
                except GPU_GONE as exc:
                    self.log.warning("GPU %d (%s) is lost: %s", gpu.index, gpu.uuid or "uuid unknown", exc)
                    self._lose(gpu, exc, None)
                    if not session.reinit_wanted:
                        session.reinit_wanted = True
                        self._schedule_reinit(time.monotonic())
                except LIFECYCLE as exc:
                    gpus.publish(())
                    self._end_session()
                    delay = self._schedule_reinit(time.monotonic())
                    self._broken = f"NVML: {exc}"
                    raise RuntimeError(f"NVML: {exc} (re-initialising in {delay:g}s)") from None
                else:
                    samples += reading
                    published.append(self._published(gpu, True, processes, migs))
            if gpu.lost:
                published.append(self._published(gpu, False, (), ()))
            if gpu.uuid or not gpu.lost:
                info = (gpu.pci_bus_id, gpu.model, session.driver_version, gpu.vbios_version)
                minor = "" if gpu.minor_number is None else str(gpu.minor_number)
                samples.append((INFO, (*gpu.labels, *info, minor), 1))
            samples.append((UP, gpu.labels, 0 if gpu.lost else 1))
        samples += self._xid_samples(session)
        samples += [(NVML_ERRORS, (str(i), u, e), n) for (i, u, e), n in sorted(self._errors.items())]
        gpus.publish(tuple(published))
        yield from self._families(samples)

    def _families(self, samples: list[tuple[MetricSpec, tuple[str, ...], float]]) -> Iterator[Metric]:
        by_spec: dict[str, list[tuple[tuple[str, ...], float]]] = {}
        for spec, labels, value in samples:
            by_spec.setdefault(spec.name, []).append((labels, value))
        for spec in self.metrics:
            if spec.name in by_spec:
                family = spec.family()
                for labels, value in by_spec[spec.name]:
                    family.add_metric(list(labels), value)
                yield family

    def _read_gpu(
        self, nvml: Any, gpu: GpuState
    ) -> tuple[list[tuple[MetricSpec, tuple[str, ...], float]], tuple[GpuProcess, ...], tuple[MigDevice, ...]]:
        """All of one GPU's values, or an exception (GPU_GONE, LIFECYCLE): nothing partial."""
        out: list[tuple[MetricSpec, tuple[str, ...], float]] = []
        labels = gpu.labels
        h = gpu.handle
        call = self._optional

        def put(spec: MetricSpec, value: float | None, *extra: str) -> None:
            if value is not None:
                out.append((spec, (*labels, *extra), value))

        out += self._read_fields(nvml, gpu)
        if gpu.link_state_by_call:
            for link in range(gpu.links):
                state = call(gpu, "nvmlDeviceGetNvLinkState", nvml.nvmlDeviceGetNvLinkState, h, link)
                if state is not None:
                    put(NVLINK_UP, 1 if state == pynvml.NVML_FEATURE_ENABLED else 0, str(link))
        utilization = call(gpu, "nvmlDeviceGetUtilizationRates", nvml.nvmlDeviceGetUtilizationRates, h)
        if utilization is not None:
            put(UTILIZATION, utilization.gpu / 100)
            put(MEMORY_UTILIZATION, utilization.memory / 100)
        memory = call(gpu, "nvmlDeviceGetMemoryInfo", nvml.nvmlDeviceGetMemoryInfo, h)
        if memory is not None:
            put(MEMORY_USED, memory.used)
            put(MEMORY_TOTAL, memory.total)
        sm = call(gpu, "nvmlDeviceGetClockInfo", nvml.nvmlDeviceGetClockInfo, h, pynvml.NVML_CLOCK_SM)
        put(SM_CLOCK, None if sm is None else sm * 1e6)
        put(SM_CLOCK_MAX, gpu.sm_clock_max_hz)
        mem_clock = call(gpu, "nvmlDeviceGetClockInfo", nvml.nvmlDeviceGetClockInfo, h, pynvml.NVML_CLOCK_MEM)
        put(MEMORY_CLOCK, None if mem_clock is None else mem_clock * 1e6)
        power = call(gpu, "nvmlDeviceGetPowerUsage", nvml.nvmlDeviceGetPowerUsage, h)
        put(POWER, None if power is None else power / 1000)  # mW
        limit = call(gpu, "nvmlDeviceGetEnforcedPowerLimit", nvml.nvmlDeviceGetEnforcedPowerLimit, h)
        put(POWER_LIMIT, None if limit is None else limit / 1000)
        put(
            TEMPERATURE,
            call(gpu, "nvmlDeviceGetTemperature", nvml.nvmlDeviceGetTemperature, h, pynvml.NVML_TEMPERATURE_GPU),
        )
        reasons = call(gpu, "nvmlDeviceGetCurrentClocksEventReasons", nvml.nvmlDeviceGetCurrentClocksEventReasons, h)
        if reasons is not None:
            for reason, bit in CLOCK_EVENT_REASONS.items():
                put(CLOCK_EVENT_ACTIVE, 1 if reasons & bit else 0, reason)
        processes = self._processes(nvml, gpu)
        if processes is not None:
            put(PROCESSES, len(processes))
            put(PROCESS_MEMORY, sum(p.used_memory_bytes or 0 for p in processes))
        migs: tuple[MigDevice, ...] = ()
        mode = call(gpu, "nvmlDeviceGetMigMode", nvml.nvmlDeviceGetMigMode, h)
        if mode is not None:
            enabled = mode[0] == pynvml.NVML_DEVICE_MIG_ENABLE
            put(MIG_MODE, 1 if enabled else 0)
            if enabled:
                migs = self._read_mig(nvml, gpu, out, processes or ())
        return out, processes or (), migs

    def _read_fields(self, nvml: Any, gpu: GpuState) -> list[tuple[MetricSpec, tuple[str, ...], float]]:
        """The batched fields: one call; each field checked by its own return code."""
        if not gpu.field_uses:
            return []
        requests = [(fid, scope) for _, fid, scope in gpu.field_uses]
        try:
            values = nvml.nvmlDeviceGetFieldValues(gpu.handle, requests)
        except UNSUPPORTED as exc:
            self._unsupported(gpu, "nvmlDeviceGetFieldValues", exc)
            gpu.field_uses = []
            return []
        except GPU_GONE + LIFECYCLE:
            raise
        except pynvml.NVMLError as exc:
            self._count_error(gpu, exc)
            return []
        out: list[tuple[MetricSpec, tuple[str, ...], float]] = []
        keep = []
        for (use, fid, scope), fv in zip(gpu.field_uses, values):
            code = fv.nvmlReturn
            if code in (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND):
                if use.field not in gpu.unsupported:
                    gpu.unsupported.add(use.field)
                    self.log.debug("GPU %d: %s not supported, no longer asked for", gpu.index, use.field)
                if use.field == LINK_STATE_FIELD:
                    gpu.link_state_by_call = True
                continue
            keep.append((use, fid, scope))
            if code != pynvml.NVML_SUCCESS:
                error = pynvml.NVMLError(code)
                if isinstance(error, GPU_GONE + LIFECYCLE):
                    raise error
                self._count_error(gpu, error)
                continue
            number = field_number(fv)
            if number is None:
                self._count_error(gpu, ValueError(f"{use.field}: unknown value type {fv.valueType}"), "bad_value")
                continue
            link = (str(scope),) if use in _LINK_USES else ()
            if use.spec is None:  # link state
                up = number in (pynvml.NVML_NVLINK_STATE_ACTIVE, pynvml.NVML_NVLINK_STATE_SLEEP)
                out.append((NVLINK_UP, (*gpu.labels, *link), 1 if up else 0))
            else:
                out.append((use.spec, (*gpu.labels, *link, *use.labels), number * use.scale))
        gpu.field_uses = keep
        return out

    def _processes(self, nvml: Any, gpu: GpuState) -> tuple[GpuProcess, ...] | None:
        found = self._optional(
            gpu, "nvmlDeviceGetComputeRunningProcesses", nvml.nvmlDeviceGetComputeRunningProcesses, gpu.handle
        )
        if found is None:
            return None

        def instance(value: Any) -> int | None:
            return None if value is None or value == NO_INSTANCE_ID else int(value)

        return tuple(
            GpuProcess(
                pid=int(p.pid),
                used_memory_bytes=None if p.usedGpuMemory is None else int(p.usedGpuMemory),
                gpu_instance_id=instance(getattr(p, "gpuInstanceId", None)),
                compute_instance_id=instance(getattr(p, "computeInstanceId", None)),
            )
            for p in found
        )

    def _read_mig(
        self,
        nvml: Any,
        gpu: GpuState,
        out: list[tuple[MetricSpec, tuple[str, ...], float]],
        processes: Sequence[GpuProcess],
    ) -> tuple[MigDevice, ...]:
        """MIG devices and their memory.  Utilization is not available per MIG device (it would
        need GPM), so it is omitted rather than faked."""
        count = self._optional(gpu, "nvmlDeviceGetMaxMigDeviceCount", nvml.nvmlDeviceGetMaxMigDeviceCount, gpu.handle)
        devices = []
        for slot in range(count or 0):
            try:
                mig_handle = nvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu.handle, slot)
            except pynvml.NVMLError_NotFound:
                continue  # an empty slot
            except GPU_GONE + LIFECYCLE:
                raise
            except pynvml.NVMLError as exc:
                self._count_error(gpu, exc)
                continue
            try:
                mig_uuid = text(nvml.nvmlDeviceGetUUID(mig_handle))
                device = gpu.mig_cache.get(mig_uuid)
                if device is None:
                    name = text(nvml.nvmlDeviceGetName(mig_handle))
                    device = MigDevice(
                        uuid=mig_uuid,
                        gpu_instance_id=int(nvml.nvmlDeviceGetGpuInstanceId(mig_handle)),
                        compute_instance_id=int(nvml.nvmlDeviceGetComputeInstanceId(mig_handle)),
                        profile=name.rsplit(" MIG ", 1)[-1] if " MIG " in name else name,
                    )
                    gpu.mig_cache[mig_uuid] = device
                memory = nvml.nvmlDeviceGetMemoryInfo(mig_handle)
            except GPU_GONE + LIFECYCLE:
                raise
            except pynvml.NVMLError as exc:
                self._count_error(gpu, exc)
                continue
            ids = (str(device.gpu_instance_id), str(device.compute_instance_id))
            out.append((MIG_INFO, (*gpu.labels, *ids, device.profile, device.uuid), 1))
            out.append((MIG_MEMORY_USED, (*gpu.labels, *ids), memory.used))
            out.append((MIG_MEMORY_TOTAL, (*gpu.labels, *ids), memory.total))
            running = [
                p
                for p in processes
                if (p.gpu_instance_id, p.compute_instance_id) == (device.gpu_instance_id, device.compute_instance_id)
            ]
            out.append((MIG_PROCESSES, (*gpu.labels, *ids), len(running)))
            devices.append(device)
        return tuple(devices)

    def _optional(self, gpu: GpuState, name: str, function: Callable[..., Any], *args: Any) -> Any:
        """Call NVML; None if the GPU does not support it (remembered: not asked again) or it
        failed this time (counted).  A lost GPU or a broken NVML raises."""
        if name in gpu.unsupported:
            return None
        try:
            return function(*args)
        except UNSUPPORTED as exc:
            self._unsupported(gpu, name, exc)
        except GPU_GONE + LIFECYCLE:
            raise
        except pynvml.NVMLError as exc:
            self._count_error(gpu, exc)
        return None

    def _unsupported(self, gpu: GpuState, name: str, exc: BaseException) -> None:
        gpu.unsupported.add(name)
        self.log.debug("GPU %d: %s: %s; no longer asked for", gpu.index, name, exc)

    def _count_error(self, gpu: GpuState, exc: BaseException, name: str | None = None) -> None:
        key = (gpu.index, gpu.uuid, name or error_name(exc))
        self._errors[key] = self._errors.get(key, 0) + 1

    def _published(
        self, gpu: GpuState, up: bool, processes: tuple[GpuProcess, ...], migs: tuple[MigDevice, ...]
    ) -> PublishedGpu:
        return PublishedGpu(gpu.index, gpu.uuid, gpu.pci_bus_id, gpu.minor_number, gpu.model, up, processes, migs)

    # --- XID events ---

    def record_xid(self, uuid: str, xid: int) -> None:
        """Called by the listener thread for each XID event."""
        with self._xid_lock:
            self._xid_counts[(uuid, xid)] = self._xid_counts.get((uuid, xid), 0) + 1
            self._xid_last[uuid] = self._wall_clock()
        # A round now, not at the next interval: an XID often means the GPU is failing (79: it
        # fell off the bus), and on-call should see its state at once.
        self.context.run_now()

    def _xid_samples(self, session: Session) -> list[tuple[MetricSpec, tuple[str, ...], float]]:
        index_of = {g.uuid: str(g.index) for g in session.gpus}
        with self._xid_lock:
            counts = sorted(self._xid_counts.items())
            last = sorted(self._xid_last.items())
        out: list[tuple[MetricSpec, tuple[str, ...], float]] = [
            (XID_ERRORS, (index_of.get(uuid, ""), uuid, str(xid)), n) for (uuid, xid), n in counts
        ]
        out += [(LAST_XID, (index_of.get(uuid, ""), uuid), at) for uuid, at in last]
        return out

    # --- hotplug, doctor, close ---

    def on_hotplug(self, action: str, subsystem: str, sys_path: str) -> None:
        """A PCI device came or went: if it is (or was) an NVIDIA GPU, re-enumerate at once."""
        name = sys_path.rstrip("/").rsplit("/", 1)[-1]
        if pci_key(name) in self._known_pci or self._is_nvidia_gpu(sys_path):
            self.log.info("PCI %s of NVIDIA GPU %s: re-enumerating GPUs", action, name)
            self._rediscover.set()

    def _is_nvidia_gpu(self, sys_path: str) -> bool:
        path = Path(sys_path)
        if path.is_relative_to("/sys"):
            path = self.paths.sysfs / path.relative_to("/sys")  # the host's sysfs may be mounted elsewhere
        try:
            vendor = read_text(path / "vendor").strip()
            device_class = read_text(path / "class").strip()
        except OSError:
            return False  # removed already (then it is matched by its known PCI address) or not a device
        return vendor == NVIDIA_PCI_VENDOR and device_class.startswith("0x03")  # display controller

    def check(self) -> str:
        try:
            for _ in self.collect():
                pass
            session = self._session
            if session is None:
                return ""
            notes = []
            lost = [str(g.index) for g in session.gpus if g.lost]
            if lost:
                notes.append(f"GPU {', '.join(lost)} not answering (fallen off the bus?): reported down")
            omitted: dict[tuple[str, ...], list[str]] = {}
            for gpu in session.gpus:
                if not gpu.lost:
                    names = tuple(sorted(s.name for s in omitted_metrics(gpu)))
                    if names:
                        omitted.setdefault(names, []).append(str(gpu.index))
            for names, gpus in omitted.items():
                notes.append(f"GPU {', '.join(gpus)}: not supported by the GPU or driver, omitted: {', '.join(names)}")
            return "; ".join(notes)
        finally:
            self.close()

    def close(self) -> None:
        self._end_session()


def field_number(fv: Any) -> float | None:
    """A field's value by its own value type; None for a type NVML did not document."""
    member = _VALUE_MEMBERS.get(fv.valueType)
    return None if member is None else getattr(fv.value, member)


def omitted_metrics(gpu: GpuState) -> set[MetricSpec]:
    """Metrics the GPU cannot give: every call or field that feeds them is unsupported."""
    sources: dict[MetricSpec, set[str]] = {}
    uses = DEVICE_FIELDS + (NVLINK_TOTAL_FIELDS + LINK_FIELDS if gpu.links else ())
    for use in uses:
        if use.spec is not None:
            sources.setdefault(use.spec, set()).add(use.field)
    for call, specs in CALL_METRICS.items():
        for spec in specs:
            sources.setdefault(spec, set()).add(call)
    return {spec for spec, names in sources.items() if names <= gpu.unsupported}


class XidListener:
    """The thread that waits for XID events and counts them in the collector.

    It registers every answering GPU for XID events in one event set and waits on it.  A
    timeout is the normal idle case.  Any other error (a GPU lost, a set gone bad) frees
    the set and registers again after a backoff, skipping GPUs that no longer answer.
    """

    def __init__(self, collector: GpuCollector, nvml: Any, gpus: Sequence[GpuState]) -> None:
        self.collector = collector
        self.nvml = nvml
        self.gpus = {handle_address(g.handle): g for g in gpus}
        self.ready = threading.Event()  # the first registration and drain are done
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpu-xid-listener", daemon=True)
        self.log = collector.log

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float) -> bool:
        self._stop.set()
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        initial, maximum = self.collector.listener_backoff
        backoff = initial
        last_problem = ""
        while not self._stop.is_set():
            event_set = None
            try:
                event_set = self.nvml.nvmlEventSetCreate()
                registered = self._register(event_set)
                if not registered:
                    self.log.info("no GPU here reports XID events: XID counters unavailable")
                    return
                self._wait(event_set, 0)  # drain what is already there, then say we are listening
                self.ready.set()
                backoff, last_problem = initial, ""
                while not self._stop.is_set():
                    self._wait(event_set, self.collector.listener_wait_ms)
            except pynvml.NVMLError as exc:
                problem = error_name(exc)
                if problem != last_problem:
                    self.log.info("XID listener: %s; registering again in %gs", exc, backoff)
                    last_problem = problem
            finally:
                self.ready.set()
                if event_set is not None:
                    try:
                        self.nvml.nvmlEventSetFree(event_set)
                    except pynvml.NVMLError:
                        pass
            self._stop.wait(backoff)
            backoff = min(backoff * 2, maximum)

    def _register(self, event_set: Any) -> list[GpuState]:
        """Register every GPU that answers; raise if none does but some may later."""
        registered = []
        failure: pynvml.NVMLError | None = None
        for gpu in self.gpus.values():
            try:
                self.nvml.nvmlDeviceRegisterEvents(gpu.handle, pynvml.nvmlEventTypeXidCriticalError, event_set)
                registered.append(gpu)
            except UNSUPPORTED:
                gpu.unsupported.add("nvmlDeviceRegisterEvents")
            except pynvml.NVMLError as exc:
                self.log.debug("GPU %d: not registered for XID events: %s", gpu.index, exc)
                failure = exc
        if not registered and failure is not None:
            raise failure
        return registered

    def _wait(self, event_set: Any, timeout_ms: int) -> None:
        """Wait for events until a timeout (returns) or an error (raises)."""
        while not self._stop.is_set():
            try:
                data = self.nvml.nvmlEventSetWait_v2(event_set, timeout_ms)
            except pynvml.NVMLError_Timeout:
                return
            if data.eventType & pynvml.nvmlEventTypeXidCriticalError:
                gpu = self.gpus.get(handle_address(data.device))
                xid = int(data.eventData)
                self.log.warning("XID %d on GPU %s", xid, "?" if gpu is None else f"{gpu.index} ({gpu.uuid})")
                self.collector.record_xid("" if gpu is None else gpu.uuid, xid)


def handle_address(handle: Any) -> int | None:
    """A device handle's address: how an event's device is matched to a GPU."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return None
