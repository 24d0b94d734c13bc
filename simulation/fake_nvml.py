"""A fake NVML: the part of pynvml's surface the GPU collector uses, driven by a spec.

NVML has no simulator and needs a GPU, so the collector's tests, ``lockstep demo`` and
``lockstep run/once --gpu.fake-nvml SPEC`` use this instead.  It is faithful where the
collector depends on NVML's behaviour:

- it raises pynvml's own exception classes (``pynvml.NVMLError_NotSupported``,
  ``NVMLError_GpuIsLost``, ``NVMLError_Timeout``, ``NVMLError_Uninitialized``, ...);
- it returns pynvml's own structures where the collector reads them: device handles are
  real ``c_nvmlDevice_t`` pointers, ``nvmlDeviceGetFieldValues`` returns an array of
  ``c_nvmlFieldValue_t`` with each field's own ``nvmlReturn`` and ``valueType``, events
  are ``c_nvmlEventData_t``, PCI info is ``nvmlPciInfo_t``, processes are pynvml's
  friendly objects (``usedGpuMemory`` None when not available);
- ``nvmlInit``/``nvmlShutdown`` are reference counted, and every call outside an
  initialised session raises ``NVMLError_Uninitialized``;
- XID events reach an event set only if they happen after the GPU was registered in it
  (events before registration are lost, as with NVML); a wait with
  nothing to deliver raises ``NVMLError_Timeout``; a set with a lost GPU raises
  ``NVMLError_GpuIsLost`` from the wait;
- a lost GPU (fallen off the bus) raises ``NVMLError_GpuIsLost`` from every call,
  including ``nvmlDeviceGetHandleByIndex``, while ``nvmlDeviceGetCount`` still counts it.

Values are a pure function of the spec and the fake's time ``t`` (seconds): counters grow
with ``t`` at the rates the spec gives.  The time comes from ``set_time`` (the simulated
node) or, with ``real_time=True``, from the seconds since the fake was made.

Every call is counted per GPU in ``calls`` (``(function, gpu_index)`` -> count; the
index is None for calls that concern no GPU), so tests can assert that an unsupported call
was made once and the benchmark can report calls per GPU per round.

The spec format is documented in docs/gpu.md.  ``load_spec(path)`` reads a YAML file and
``parse_spec(data)`` a mapping; both raise ``FakeSpecError`` naming what is wrong and where.
"""

from __future__ import annotations

import ctypes
import dataclasses
import math
import re
import threading
import time
import uuid as uuidlib
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pynvml

from lockstep.agent.yamlfile import LineDict, YamlFileError, load_yaml_file
from lockstep.collectors.gpu.nvml import CLOCK_EVENT_REASONS
from lockstep.collectors.gpu.provider import NvmlProvider

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
# tests/test_gpu.py's comparison of the table with nvml.h's values.
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
_REMAPPED_ROWS = (
    "NVML_FI_DEV_REMAPPED_COR",
    "NVML_FI_DEV_REMAPPED_UNC",
    "NVML_FI_DEV_REMAPPED_PENDING",
    "NVML_FI_DEV_REMAPPED_FAILURE",
)
ARCHITECTURE_UNSUPPORTED: dict[str, tuple[str, ...]] = {
    # Volta: page retirement instead of row remapping, no MIG, NVLink 2 without the
    # throughput, link state and per-link DL error fields, no clock event duration fields.
    "volta": (
        *_REMAPPED_ROWS,
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
    *_REMAPPED_ROWS,
    "NVML_FI_DEV_MEMORY_TEMP",
    "NVML_FI_DEV_PCIE_COUNT_TX_BYTES",
    "NVML_FI_DEV_PCIE_COUNT_RX_BYTES",
    "NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN",
    "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN",
    "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN",
    "nvmlDeviceGetMigMode",
)


class FakeSpecError(Exception):
    """A spec that cannot be used; ``problems`` are 'where: what' strings."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


# --- the spec ---


@dataclass(frozen=True)
class MigDeviceSpec:
    gpu_instance_id: int
    compute_instance_id: int = 0
    profile: str = "1g.10gb"
    uuid: str = ""
    memory_total_bytes: int = 10 * 1024 * MIB
    memory_used_bytes: int = 0
    # GPM of its GPU instance (the first device of a GPU instance speaks for it).
    sm_count: int = 16
    sm_active_percent: int = 0
    tensor_active_percent: int = 0


@dataclass(frozen=True)
class ProcessSpec:
    pid: int
    used_memory_bytes: int | None = None  # None: NVML reports "not available"
    gpu_instance_id: int | None = None  # MIG: the instance the process runs in
    compute_instance_id: int | None = None
    # Its per-process utilisation samples (nvmlDeviceGetProcessUtilization and
    # nvmlDeviceGetProcessesUtilizationInfo): 0 and 0 means it has none, as an idle process.
    sm_util_percent: int = 0
    memory_util_percent: int = 0


@dataclass(frozen=True)
class GpuSpec:
    """One GPU.  Units are in the names; counters are values at t=0 and grow with t."""

    uuid: str = ""
    pci_bus_id: str = ""
    minor_number: int | None = None
    model: str = "NVIDIA H100 80GB HBM3"
    architecture: str = "hopper"  # volta, ampere, hopper, blackwell: decides what NVML supports
    consumer: bool = False  # GeForce-class: ECC, remapping, MIG and more unsupported
    vbios_version: str = "96.00.99.00.01"
    memory_total_bytes: int = 81559 * MIB
    memory_used_bytes: int = 0
    utilization_gpu_percent: int = 0
    utilization_memory_percent: int = 0
    sm_clock_mhz: int = 1980
    sm_clock_max_mhz: int = 1980
    memory_clock_mhz: int = 2619
    power_watts: float = 70.0
    power_limit_watts: float = 700.0
    # How long the driver has been loaded at t=0: counters since then (energy, PCIe and
    # NVLink bytes) stand at rate x (driver_uptime_seconds + t).
    driver_uptime_seconds: float = 0.0
    temperature_celsius: int = 35
    memory_temperature_celsius: int = 40
    clock_event_reasons: tuple[str, ...] = ()  # active now; see CLOCK_EVENT_REASONS
    clock_event_seconds: Mapping[str, float] = field(default_factory=dict)  # at t=0; active ones grow 1 s/s
    # Reasons that come and go: reason -> (from t, period, seconds on at the start of each
    # period), e.g. a GPU hovering at its thermal limit; their seconds grow while on.
    clock_event_duty: Mapping[str, tuple[float, float, float]] = field(default_factory=dict)
    ecc_corrected: int = 0  # volatile counts
    ecc_uncorrected: int = 0
    # Lifetime counts from before this driver load: NVML's aggregate counts are these plus the volatile ones.
    ecc_aggregate_corrected: int = 0
    ecc_aggregate_uncorrected: int = 0
    recovery_action: str = "none"  # see RECOVERY_ACTIONS
    # NVSwitch fabric (Hopper and newer): not_supported (no fabric, e.g. a PCIe card), not_started,
    # in_progress, completed; the health conditions that hold; a registration that completed with an error.
    fabric_state: str = "completed"
    fabric_health: tuple[str, ...] = ()
    fabric_registration_failed: bool = False
    # GPM (Hopper and newer; not on consumer GPUs): activity in percent, constant over time.
    gpm_cumulative: bool = True  # False: a driver with only the windowed (*_UTIL) metrics
    sm_count: int = 132
    sm_active_percent: float = 0.0
    sm_occupancy_percent: float = 0.0
    dram_bandwidth_used_percent: float = 0.0
    pipe_active_percent: Mapping[str, float] = field(default_factory=dict)  # see GPM_PIPES
    retired_pages_single_bit: int = 0  # pre-Ampere
    retired_pages_double_bit: int = 0
    retired_pages_pending: bool = False
    remapped_rows_correctable: int = 0  # Ampere+
    remapped_rows_uncorrectable: int = 0
    remapped_rows_pending: bool = False
    remapped_rows_failed: bool = False
    pcie_replays: int = 0
    pcie_transmitted_bytes_per_second: float = 0.0
    pcie_received_bytes_per_second: float = 0.0
    # The PCIe link: what it runs at now, and the most the GPU and its slot can do together.  An
    # idle GPU runs its link a generation or more down to save power (NVML); a spec says so here.
    pcie_link_generation: int = 5
    pcie_link_width: int = 16
    pcie_max_link_generation: int = 5
    pcie_max_link_width: int = 16
    nvlink_links: int = 0
    nvlink_down: tuple[int, ...] = ()  # links that are inactive
    nvlink_transmitted_bytes_per_second: float = 0.0  # per active link
    nvlink_received_bytes_per_second: float = 0.0
    nvlink_errors: Mapping[str, int] = field(default_factory=dict)  # per link: crc_flit, crc_data, replay, recovery
    nvlink_counters: Mapping[str, int] = field(default_factory=dict)  # per link, Blackwell: see BLACKWELL_NVLINK_FIELDS
    mig_devices: tuple[MigDeviceSpec, ...] = ()  # non-empty: MIG mode on
    processes: tuple[ProcessSpec, ...] = ()
    unsupported: frozenset[str] = frozenset()  # pynvml function names or NVML_FI_* field names
    lost_at: float | None = None  # falls off the bus at this t (XID 79)

    def unsupported_names(self) -> frozenset[str]:
        names = set(self.unsupported) | set(ARCHITECTURE_UNSUPPORTED.get(self.architecture, ()))
        if self.consumer:
            names |= set(CONSUMER_UNSUPPORTED)
        if self.mig_devices:
            # NVML: utilization (per process too) and row remapping are not available on a GPU in MIG mode.
            names |= {"nvmlDeviceGetUtilizationRates", *PROCESS_UTILIZATION_CALLS, *_REMAPPED_ROWS}
        return frozenset(names)


@dataclass(frozen=True)
class XidEventSpec:
    gpu: int
    xid: int
    at: float = 0.0


@dataclass(frozen=True)
class FakeSpec:
    gpus: tuple[GpuSpec, ...]
    driver_version: str = "550.90.07"
    xid_events: tuple[XidEventSpec, ...] = ()
    driver_loaded: bool = True  # False: nvmlInit raises NVMLError_DriverNotLoaded
    # NVML hangs (as it can after a GPU fault): every call made from t=hang_from on blocks
    # until t reaches hang_until (None: for good).
    hang_from: float | None = None
    hang_until: float | None = None
    # One call made at or after t=slow_call_at takes slow_call_seconds (real time) to answer.
    slow_call_at: float | None = None
    slow_call_seconds: float = 0.0


def default_uuid(index: int) -> str:
    return "GPU-" + str(uuidlib.uuid5(uuidlib.NAMESPACE_URL, f"lockstep-fake-nvml/gpu/{index}"))


def default_pci_bus_id(index: int) -> str:
    return f"00000000:{0x18 + 0x10 * index:02X}:00.0"


def with_defaults(gpu: GpuSpec, index: int) -> GpuSpec:
    """Fill in identity fields left empty: uuid, PCI bus id and minor number from the index."""
    return dataclasses.replace(
        gpu,
        uuid=gpu.uuid or default_uuid(index),
        pci_bus_id=gpu.pci_bus_id or default_pci_bus_id(index),
        minor_number=index if gpu.minor_number is None else gpu.minor_number,
        mig_devices=tuple(
            m
            if m.uuid
            else dataclasses.replace(
                m, uuid="MIG-" + str(uuidlib.uuid5(uuidlib.NAMESPACE_URL, f"{gpu.uuid or index}/{m.gpu_instance_id}"))
            )
            for m in gpu.mig_devices
        ),
    )


# --- parsing a spec from YAML / a mapping ---

_GPU_FIELDS = {f.name: f for f in dataclasses.fields(GpuSpec)}
_TOP_KEYS = ("driver_version", "driver_loaded", "defaults", "gpus", "xid_events")
# More GPUs than any node has: `gpus: 100000000` made the fake run out of memory.
MAX_GPUS = 1024
MAX_SPEC_NUMBER = 2**64 - 1
# domain:bus:device.function, as NVML writes it (8 hex digits of domain; 4 accepted too).
_PCI_BUS_ID = re.compile(r"^(?:[0-9A-Fa-f]{4}|[0-9A-Fa-f]{8}):[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]$")


class _Parser:
    def __init__(self, source: str) -> None:
        self.source = source
        self.problems: list[str] = []

    def where(self, mapping: Any, key: Any, path: str) -> str:
        if isinstance(mapping, LineDict):
            return f"{self.source}:{mapping.line_of(key)}: {path}"
        return f"{self.source}: {path}"

    def fail(self, mapping: Any, key: Any, path: str, message: str) -> None:
        self.problems.append(f"{self.where(mapping, key, path)}: {message}")

    def mapping(self, value: Any, parent: Any, key: Any, path: str) -> Mapping[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            self.fail(parent, key, path, f"expected a mapping, got {value!r}")
            return {}
        return value

    def number(self, value: Any, parent: Any, key: Any, path: str, whole: bool) -> Any:
        ok = isinstance(value, int) if whole else isinstance(value, (int, float))
        kind = "a whole number" if whole else "a number"
        if isinstance(value, bool) or not ok or value < 0:
            self.fail(parent, key, path, f"expected {kind} of at least 0, got {value!r}")
            return None
        if not value <= MAX_SPEC_NUMBER:  # NaN fails this too; the bound is NVML's unsigned 64 bits
            shown = value if not isinstance(value, int) or value < 10**30 else f"a {len(str(value))}-digit number"
            self.fail(parent, key, path, f"expected {kind} from 0 to 2**64 - 1, got {shown!r}")
            return None
        return value

    def gpu(self, data: Mapping[str, Any], defaults: Mapping[str, Any], path: str) -> GpuSpec:
        values: dict[str, Any] = {}
        merged = {**defaults, **data}
        for key, value in merged.items():
            source = data if key in data else defaults
            where = f"{path}.{key}"
            if key not in _GPU_FIELDS:
                self.fail(source, key, where, f"unknown key (known: {', '.join(_GPU_FIELDS)})")
                continue
            parsed = self.gpu_value(key, value, source, where)
            if parsed is not None or key in ("minor_number", "lost_at"):
                values[key] = parsed
        return GpuSpec(**values)

    def gpu_value(self, key: str, value: Any, source: Any, where: str) -> Any:
        default = _GPU_FIELDS[key].default
        if key in ("minor_number",):
            return None if value is None else self.number(value, source, key, where, whole=True)
        if key == "lost_at":
            return None if value is None else self.number(value, source, key, where, whole=False)
        if key == "architecture":
            if value not in ARCHITECTURE_UNSUPPORTED:
                self.fail(source, key, where, f"expected one of {', '.join(ARCHITECTURE_UNSUPPORTED)}, got {value!r}")
                return None
            return value
        if isinstance(default, bool):
            if not isinstance(value, bool):
                self.fail(source, key, where, f"expected true or false, got {value!r}")
                return None
            return value
        if isinstance(default, str) and key not in ("recovery_action", "fabric_state"):
            if not isinstance(value, str):
                self.fail(source, key, where, f"expected a string, got {value!r}")
                return None
            if key == "pci_bus_id" and not _PCI_BUS_ID.match(value):
                self.fail(source, key, where, f"expected a PCI bus id such as 00000000:18:00.0, got {value!r}")
                return None
            return value
        if isinstance(default, (int, float)):
            return self.number(value, source, key, where, whole=isinstance(default, int))
        if key == "clock_event_reasons":
            reasons = value if isinstance(value, list) else [value]
            bad = [r for r in reasons if r not in CLOCK_EVENT_REASONS]
            if bad:
                self.fail(source, key, where, f"unknown reasons {bad} (known: {', '.join(CLOCK_EVENT_REASONS)})")
                return None
            return tuple(reasons)
        if key in ("recovery_action", "fabric_state"):
            choices = RECOVERY_ACTIONS if key == "recovery_action" else FABRIC_STATES
            if value not in choices:
                self.fail(source, key, where, f"expected one of {', '.join(choices)}, got {value!r}")
                return None
            return value
        if key == "fabric_health":
            conditions = value if isinstance(value, list) else [value]
            bad = [c for c in conditions if c not in FABRIC_HEALTH_FIELDS]
            if bad:
                self.fail(source, key, where, f"unknown conditions {bad} (known: {', '.join(FABRIC_HEALTH_FIELDS)})")
                return None
            return tuple(conditions)
        if key == "pipe_active_percent":
            mapping = self.mapping(value, source, key, where)
            pipes = {}
            for pipe, percent in mapping.items():
                number = self.number(percent, mapping, pipe, f"{where}.{pipe}", whole=False)
                if pipe not in GPM_PIPES:
                    self.fail(mapping, pipe, f"{where}.{pipe}", f"unknown pipe (known: {', '.join(GPM_PIPES)})")
                elif number is not None and number > 100:
                    self.fail(mapping, pipe, f"{where}.{pipe}", f"expected a percentage up to 100, got {number!r}")
                elif number is not None:
                    pipes[pipe] = number
            return pipes
        if key == "clock_event_duty":
            duty = {}
            for reason, numbers in self.mapping(value, source, key, where).items():
                ok = isinstance(numbers, list) and len(numbers) == 3
                if reason not in CLOCK_EVENT_DURATION_FIELDS or not ok:
                    self.fail(source, key, f"{where}.{reason}", "expected a reason with a time: [from, period, on]")
                    return None
                duty[reason] = tuple(self.number(n, source, key, where, whole=False) for n in numbers)
            return duty
        if key in ("clock_event_seconds", "nvlink_errors", "nvlink_counters"):
            known = {
                "clock_event_seconds": tuple(CLOCK_EVENT_DURATION_FIELDS),
                "nvlink_errors": NVLINK_ERROR_TYPES,
                "nvlink_counters": tuple(BLACKWELL_NVLINK_FIELDS),
            }[key]
            mapping = self.mapping(value, source, key, where)
            out = {}
            for name, count in mapping.items():
                if name not in known:
                    self.fail(mapping, name, f"{where}.{name}", f"unknown (known: {', '.join(known)})")
                    continue
                number = self.number(count, mapping, name, f"{where}.{name}", whole=key != "clock_event_seconds")
                if number is not None:
                    out[name] = number
            return out
        if key == "nvlink_down":
            links = value if isinstance(value, list) else [value]
            if not all(isinstance(link, int) and not isinstance(link, bool) and link >= 0 for link in links):
                self.fail(source, key, where, f"expected a list of link numbers, got {value!r}")
                return None
            return tuple(links)
        if key == "unsupported":
            names = value if isinstance(value, list) else [value]
            bad = [n for n in names if not isinstance(n, str) or not hasattr(pynvml, n)]
            if bad:
                self.fail(source, key, where, f"not pynvml functions or NVML_FI_* fields: {bad}")
                return None
            return frozenset(names)
        if key == "mig_devices":
            return self.records(value, source, key, where, MigDeviceSpec, required=("gpu_instance_id",))
        if key == "processes":
            return self.records(value, source, key, where, ProcessSpec, required=("pid",))
        raise AssertionError(key)  # every GpuSpec field is handled above

    def records(self, value: Any, source: Any, key: str, where: str, cls: type, required: tuple[str, ...]) -> Any:
        if not isinstance(value, list):
            self.fail(source, key, where, f"expected a list, got {value!r}")
            return None
        known = {f.name: f for f in dataclasses.fields(cls)}
        out = []
        for i, item in enumerate(value):
            item_path = f"{where}[{i}]"
            item_map = self.mapping(item, source, key, item_path)
            kwargs: dict[str, Any] = {}
            for name, raw in item_map.items():
                if name not in known:
                    self.fail(item_map, name, f"{item_path}.{name}", f"unknown key (known: {', '.join(known)})")
                elif isinstance(known[name].default, str):
                    if isinstance(raw, str):
                        kwargs[name] = raw
                    else:
                        self.fail(item_map, name, f"{item_path}.{name}", f"expected a string, got {raw!r}")
                elif raw is not None:
                    number = self.number(raw, item_map, name, f"{item_path}.{name}", whole=True)
                    if number is not None and name.endswith("_percent") and number > 100:
                        self.fail(
                            item_map, name, f"{item_path}.{name}", f"expected a percentage up to 100, got {number!r}"
                        )
                    elif number is not None:
                        kwargs[name] = number
            missing = [name for name in required if name not in item_map]
            if missing:
                self.fail(source, key, item_path, f"missing {', '.join(missing)}")
                continue
            if any(name not in kwargs for name in required):
                continue  # present but invalid: reported above
            out.append(cls(**kwargs))
        return tuple(out)


def parse_spec(data: Any, source: str = "<spec>") -> FakeSpec:
    """A FakeSpec from a mapping (as loaded from YAML); FakeSpecError naming every problem."""
    p = _Parser(source)
    if not isinstance(data, Mapping):
        raise FakeSpecError([f"{source}: the spec must be a mapping with a 'gpus' key, got {type(data).__name__}"])
    for key in data:
        if key not in _TOP_KEYS:
            p.fail(data, key, str(key), f"unknown key (known: {', '.join(_TOP_KEYS)})")
    defaults = p.mapping(data.get("defaults"), data, "defaults", "defaults")
    raw_gpus = data.get("gpus")
    if isinstance(raw_gpus, int) and not isinstance(raw_gpus, bool) and 0 <= raw_gpus <= MAX_GPUS:
        raw_gpus = [{} for _ in range(raw_gpus)]
    if not isinstance(raw_gpus, list):
        shown = raw_gpus if not isinstance(raw_gpus, int) or raw_gpus < 10**30 else "a larger number"
        p.fail(data, "gpus", "gpus", f"expected a list of GPUs or a number of GPUs up to {MAX_GPUS}, got {shown!r}")
        raw_gpus = []
    elif len(raw_gpus) > MAX_GPUS:
        p.fail(data, "gpus", "gpus", f"at most {MAX_GPUS} GPUs, got {len(raw_gpus)}")
        raw_gpus = []
    gpus = []
    for index, raw in enumerate(raw_gpus):
        gpu_map = p.mapping(raw, data, "gpus", f"gpus[{index}]")
        gpus.append(with_defaults(p.gpu(gpu_map, defaults, f"gpus[{index}]"), index))
    xids = []
    raw_xids = data.get("xid_events") or []
    if not isinstance(raw_xids, list):
        p.fail(data, "xid_events", "xid_events", f"expected a list, got {raw_xids!r}")
        raw_xids = []
    for i, raw in enumerate(raw_xids):
        event = p.records([raw], data, "xid_events", f"xid_events[{i}]", XidEventSpec, required=("gpu", "xid"))
        if event and event[0].gpu >= len(gpus):
            p.fail(data, "xid_events", f"xid_events[{i}].gpu", f"no GPU {event[0].gpu} (the spec has {len(gpus)})")
        elif event:
            xids.append(event[0])
    version = data.get("driver_version", FakeSpec.driver_version)
    if not isinstance(version, str):
        p.fail(data, "driver_version", "driver_version", f"expected a string, got {version!r}")
    loaded = data.get("driver_loaded", True)
    if not isinstance(loaded, bool):
        p.fail(data, "driver_loaded", "driver_loaded", f"expected true or false, got {loaded!r}")
    if p.problems:
        raise FakeSpecError(p.problems)
    return FakeSpec(gpus=tuple(gpus), driver_version=version, xid_events=tuple(xids), driver_loaded=loaded)


def load_spec(path: Path | str) -> FakeSpec:
    """Read and check a YAML spec file; FakeSpecError names file:line and the field."""
    try:
        data = load_yaml_file(Path(path))
    except YamlFileError as exc:
        raise FakeSpecError(exc.problems) from None
    return parse_spec(data, str(path))


# --- the fake library ---


@dataclass
class _Event:
    gpu: int
    xid: int
    at: float
    loses_gpu: bool = False
    # When it happened, on the fake's sequence of happenings (registrations and events);
    # None while a scheduled event is still due.  A set gets the events that happened
    # after it registered the GPU.
    seq: int | None = None


@dataclass
class _EventSet:
    registered: dict[int, int] = field(default_factory=dict)  # gpu -> sequence number of its registration
    delivered: set[int] = field(default_factory=set)  # sequence numbers of the events already delivered


@dataclass
class _GpmSample:
    """A GPM sample buffer: what was sampled (GPU, GPU instance or None), when, and its counters."""

    struct: Any  # the struct_c_nvmlGpmSample_t the handle points at, kept alive here
    gpu: int | None = None
    gpu_instance_id: int | None = None
    t: float = 0.0
    counters: dict[int, float] = field(default_factory=dict)  # metric id -> integral since boot
    cumulative: bool = True  # the driver has the cumulative metrics
    percents: dict[int, float] = field(default_factory=dict)  # windowed metrics' values at this moment


@dataclass
class _Failure:
    error: type[pynvml.NVMLError]
    gpu: int | None
    times: int


class FakeNvml:
    """The fake library.  Use its ``nvml*`` methods where the collector would use pynvml's."""

    def __init__(self, spec: FakeSpec, real_time: bool = False) -> None:
        self.spec = spec
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)  # an event arrived or time moved
        self._started = time.monotonic()
        self._real_time = real_time
        self._t = 0.0
        self._refcount = 0
        self._lost: set[int] = set()
        self._restored: set[int] = set()  # back after a loss: their lost_at no longer applies
        self._present = list(range(len(spec.gpus)))  # spec positions of the GPUs on the bus
        self._events: list[_Event] = [_Event(e.gpu, e.xid, e.at) for e in spec.xid_events]
        self._events += [
            _Event(i, XID_FALLEN_OFF_THE_BUS, g.lost_at, loses_gpu=True)
            for i, g in enumerate(spec.gpus)
            if g.lost_at is not None
        ]
        self._seq = 0
        self._sets: dict[int, _EventSet] = {}
        self._failures: dict[str, list[_Failure]] = {}
        self.calls: Counter[tuple[str, int | None]] = Counter()
        # How often each field was asked for in nvmlDeviceGetFieldValues: (gpu, field name) -> count.
        self.field_requests: Counter[tuple[int, str]] = Counter()
        self._field_failures: dict[tuple[int, str], int] = {}
        # Real ctypes handles, kept alive here: the collector may compare their addresses.
        self._device_structs = [pynvml.struct_c_nvmlDevice_t() for _ in spec.gpus]
        self._handles = [pynvml.c_nvmlDevice_t(s) for s in self._device_structs]
        self._mig_structs = {
            (i, m): pynvml.struct_c_nvmlDevice_t() for i, g in enumerate(spec.gpus) for m in range(len(g.mig_devices))
        }
        self._by_address: dict[int, tuple[int, int | None]] = {
            _address(h): (i, None) for i, h in enumerate(self._handles)
        }
        self._by_address.update({ctypes.addressof(s): key for key, s in self._mig_structs.items()})
        self._unsupported = [g.unsupported_names() for g in spec.gpus]
        self._field_names = field_names(spec.driver_version)
        self._slow_call_done = False
        self._gpm_samples: dict[int, _GpmSample] = {}
        self._gpm_failures: dict[tuple[int, int], int] = {}  # (gpu, metric id) -> return code
        self._gpm_cumulative_ids = frozenset(getattr(pynvml, name) for name in _GPM_CUMULATIVE)

    # --- controls for tests and the simulated node ---

    @property
    def t(self) -> float:
        return time.monotonic() - self._started if self._real_time else self._t

    def set_time(self, t: float) -> None:
        with self._lock:
            self._t = t
            # Scheduled events now in the past have happened, listened to or not.  One due at
            # exactly t happens at the next wait, so a set registered at t still gets it.
            self._happen(t, inclusive=False)
            self._changed.notify_all()

    def lose_gpu(self, index: int) -> None:
        """The GPU falls off the bus now: XID 79 to the event sets it is in, then GPU_IS_LOST."""
        with self._lock:
            self._events.append(_Event(index, XID_FALLEN_OFF_THE_BUS, self.t, loses_gpu=True, seq=self._next()))
            self._lost.add(index)
            self._changed.notify_all()

    def remove_gpu(self, index: int) -> None:
        """The GPU is gone from the PCI bus: lost, and no longer counted (later GPUs' NVML
        indexes shift down).  ``index`` is its position in the spec."""
        with self._lock:
            self.lose_gpu(index)
            self._present.remove(index)

    def restore_gpu(self, index: int) -> None:
        """The GPU is back (e.g. after a reset or a PCI rescan): calls on it answer again."""
        with self._lock:
            if index not in self._present:
                self._present = sorted([*self._present, index])
            self._lost.discard(index)
            self._restored.add(index)
            self._events = [e for e in self._events if not (e.loses_gpu and e.gpu == index)]

    def inject_xid(self, index: int, xid: int) -> None:
        with self._lock:
            self._events.append(_Event(index, xid, self.t, seq=self._next()))
            self._changed.notify_all()

    def fail(self, function: str, error: type[pynvml.NVMLError], gpu: int | None = None, times: int = 1) -> None:
        """Make the next ``times`` calls of ``function`` (on ``gpu``, or any) raise ``error``."""
        with self._lock:
            self._failures.setdefault(function, []).append(_Failure(error, gpu, times))

    def fail_field(self, gpu: int, field_name: str, code: int) -> None:
        """From now on, answer the field (an NVML_FI_* name) on ``gpu`` with this NVML return code."""
        with self._lock:
            self._field_failures[(gpu, field_name)] = code

    def fail_gpm_metric(self, gpu: int, metric_name: str, code: int) -> None:
        """From now on, answer the GPM metric (an NVML_GPM_METRIC_* name) of ``gpu`` in
        ``nvmlGpmMetricsGet`` with this NVML return code (the call itself succeeds)."""
        with self._lock:
            self._gpm_failures[(gpu, getattr(pynvml, metric_name))] = code

    def calls_for(self, gpu: int | None = None, function: str | None = None) -> int:
        """Calls counted so far, on one GPU and/or of one function (None: all)."""
        return sum(n for (f, g), n in self.calls.items() if gpu in (None, g) and function in (None, f))

    def reset_calls(self) -> None:
        with self._lock:
            self.calls.clear()
            self.field_requests.clear()

    # --- internals ---

    def _next(self) -> int:
        self._seq += 1
        return self._seq

    def _happen(self, t: float, inclusive: bool) -> None:
        """Scheduled events due before t (or at t, if inclusive) happen now."""
        for event in self._events:
            if event.seq is None and (event.at < t or (inclusive and event.at == t)):
                event.seq = self._next()

    def _enter(self, function: str, gpu: int | None = None, needs_init: bool = True) -> None:
        """Count the call, wait while NVML hangs, and raise what NVML would raise before answering it."""
        self.calls[(function, gpu)] += 1
        while self._hanging():
            self._changed.wait()  # releases the lock: time goes on, other callers hang too
        slow_at = self.spec.slow_call_at
        if slow_at is not None and self.t >= slow_at and not self._slow_call_done:
            self._slow_call_done = True
            until = time.monotonic() + self.spec.slow_call_seconds
            while (left := until - time.monotonic()) > 0:
                self._changed.wait(left)
        for failure in self._failures.get(function, []):
            if failure.times > 0 and failure.gpu in (None, gpu):
                failure.times -= 1
                raise failure.error()
        if needs_init and self._refcount == 0:
            raise pynvml.NVMLError_Uninitialized()
        if gpu is not None:
            if self._gone(gpu):
                raise pynvml.NVMLError_GpuIsLost()
            if function in self._unsupported[gpu]:
                raise pynvml.NVMLError_NotSupported()

    def _hanging(self) -> bool:
        start, end = self.spec.hang_from, self.spec.hang_until
        return start is not None and self.t >= start and (end is None or self.t < end)

    def _active(self, gpu: GpuSpec) -> tuple[str, ...]:
        """The clock event reasons holding the GPU down now."""
        cycling = tuple(
            reason
            for reason, (start, period, on) in gpu.clock_event_duty.items()
            if self.t >= start and (self.t - start) % period < on
        )
        return (*gpu.clock_event_reasons, *cycling)

    def _event_seconds(self, gpu: GpuSpec, reason: str) -> float:
        """Time the reason has held the GPU down, by now."""
        seconds = gpu.clock_event_seconds.get(reason, 0.0)
        if reason in gpu.clock_event_reasons:
            seconds += self.t
        if reason in gpu.clock_event_duty:
            start, period, on = gpu.clock_event_duty[reason]
            if self.t > start:
                cycles, into = divmod(self.t - start, period)
                seconds += cycles * on + min(into, on)
        return seconds

    def _gone(self, gpu: int) -> bool:
        """Lost: by lose_gpu, by delivering its XID 79, or past its lost_at (strictly: at lost_at
        it still answers until its XID 79 has been read, so a listener registered by then gets it)."""
        lost_at = self.spec.gpus[gpu].lost_at
        if lost_at is not None and self.t > lost_at and gpu not in self._restored:
            self._lost.add(gpu)
        return gpu in self._lost

    def _device(self, handle: Any) -> tuple[int, int | None]:
        try:
            return self._by_address[_address(handle)]
        except (KeyError, TypeError, ValueError):
            raise pynvml.NVMLError_InvalidArgument() from None

    def _gpu(self, handle: Any, function: str) -> tuple[int, GpuSpec]:
        index, mig = self._device(handle)
        self._enter(function, index)
        if mig is not None:
            raise pynvml.NVMLError_NotSupported()  # GPU-level queries are not answered for a MIG device
        return index, self.spec.gpus[index]

    def _mig(self, handle: Any, function: str) -> tuple[int, GpuSpec, MigDeviceSpec | None]:
        index, mig = self._device(handle)
        self._enter(function, index)
        gpu = self.spec.gpus[index]
        return index, gpu, None if mig is None else gpu.mig_devices[mig]

    def _since_load(self, gpu: GpuSpec, rate: float) -> float:
        """A counter that has grown at ``rate`` per second since the driver was loaded."""
        return rate * (gpu.driver_uptime_seconds + self.t)

    # --- library life ---

    def nvmlInit(self) -> None:
        with self._lock:
            self._enter("nvmlInit", needs_init=False)
            if not self.spec.driver_loaded:
                raise pynvml.NVMLError_DriverNotLoaded()
            self._refcount += 1

    def nvmlShutdown(self) -> None:
        with self._lock:
            self._enter("nvmlShutdown")
            self._refcount -= 1
            if self._refcount == 0:
                self._sets.clear()
                self._changed.notify_all()

    def nvmlSystemGetDriverVersion(self) -> str:
        with self._lock:
            self._enter("nvmlSystemGetDriverVersion")
            return self.spec.driver_version

    # --- identity ---

    def nvmlDeviceGetCount(self) -> int:
        with self._lock:
            self._enter("nvmlDeviceGetCount")
            return len(self._present)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        """NVML indexes the GPUs present; ``calls`` counts by the GPU's position in the spec."""
        with self._lock:
            if not 0 <= index < len(self._present):
                self._enter("nvmlDeviceGetHandleByIndex")
                raise pynvml.NVMLError_InvalidArgument()
            gpu = self._present[index]
            self._enter("nvmlDeviceGetHandleByIndex", gpu)
            return self._handles[gpu]

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        with self._lock:
            _, gpu, mig = self._mig(handle, "nvmlDeviceGetUUID")
            return mig.uuid if mig else gpu.uuid

    def nvmlDeviceGetName(self, handle: Any) -> str:
        with self._lock:
            _, gpu, mig = self._mig(handle, "nvmlDeviceGetName")
            return f"{gpu.model} MIG {mig.profile}" if mig else gpu.model

    def nvmlDeviceGetPciInfo(self, handle: Any) -> pynvml.nvmlPciInfo_t:
        with self._lock:
            _, gpu = self._gpu(handle, "nvmlDeviceGetPciInfo")
            info = pynvml.nvmlPciInfo_t()
            domain, bus, rest = gpu.pci_bus_id.split(":")
            info.busId = gpu.pci_bus_id.encode()
            info.busIdLegacy = f"{int(domain, 16):04X}:{bus}:{rest}".encode()
            info.domain, info.bus, info.device = int(domain, 16), int(bus, 16), int(rest.split(".")[0], 16)
            info.pciDeviceId = 0x233010DE  # device 0x2330 (H100 SXM5), vendor 0x10de
            return info

    def nvmlDeviceGetMinorNumber(self, handle: Any) -> int:
        with self._lock:
            _, gpu = self._gpu(handle, "nvmlDeviceGetMinorNumber")
            return gpu.minor_number or 0

    def nvmlDeviceGetVbiosVersion(self, handle: Any) -> str:
        with self._lock:
            return self._gpu(handle, "nvmlDeviceGetVbiosVersion")[1].vbios_version

    # --- measurements ---

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> pynvml.c_nvmlUtilization_t:
        with self._lock:
            _, gpu = self._gpu(handle, "nvmlDeviceGetUtilizationRates")
            return pynvml.c_nvmlUtilization_t(gpu=gpu.utilization_gpu_percent, memory=gpu.utilization_memory_percent)

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> pynvml.c_nvmlMemory_t:
        with self._lock:
            _, gpu, mig = self._mig(handle, "nvmlDeviceGetMemoryInfo")
            total, used = (
                (mig.memory_total_bytes, mig.memory_used_bytes)
                if mig
                else (gpu.memory_total_bytes, gpu.memory_used_bytes)
            )
            return pynvml.c_nvmlMemory_t(total=total, free=total - used, used=used)

    def nvmlDeviceGetClockInfo(self, handle: Any, clock_type: int) -> int:
        with self._lock:
            _, gpu = self._gpu(handle, "nvmlDeviceGetClockInfo")
            return _clock(gpu, clock_type, gpu.sm_clock_mhz)

    def nvmlDeviceGetMaxClockInfo(self, handle: Any, clock_type: int) -> int:
        with self._lock:
            _, gpu = self._gpu(handle, "nvmlDeviceGetMaxClockInfo")
            return _clock(gpu, clock_type, gpu.sm_clock_max_mhz)

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        with self._lock:
            return round(self._gpu(handle, "nvmlDeviceGetPowerUsage")[1].power_watts * 1000)  # mW

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int:
        with self._lock:
            return round(self._gpu(handle, "nvmlDeviceGetEnforcedPowerLimit")[1].power_limit_watts * 1000)

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        with self._lock:
            _, gpu = self._gpu(handle, "nvmlDeviceGetTemperature")
            if sensor != pynvml.NVML_TEMPERATURE_GPU:
                raise pynvml.NVMLError_InvalidArgument()
            return gpu.temperature_celsius

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        with self._lock:
            _, gpu = self._gpu(handle, "nvmlDeviceGetCurrentClocksEventReasons")
            mask = 0
            for reason in self._active(gpu):
                mask |= CLOCK_EVENT_REASONS[reason]
            return mask

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: Any) -> int:
        with self._lock:
            return self._gpu(handle, "nvmlDeviceGetCurrPcieLinkGeneration")[1].pcie_link_generation

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: Any) -> int:
        with self._lock:
            return self._gpu(handle, "nvmlDeviceGetCurrPcieLinkWidth")[1].pcie_link_width

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: Any) -> int:
        with self._lock:
            return self._gpu(handle, "nvmlDeviceGetMaxPcieLinkGeneration")[1].pcie_max_link_generation

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: Any) -> int:
        with self._lock:
            return self._gpu(handle, "nvmlDeviceGetMaxPcieLinkWidth")[1].pcie_max_link_width

    def nvmlDeviceGetNvLinkState(self, handle: Any, link: int) -> int:
        with self._lock:
            _, gpu = self._gpu(handle, "nvmlDeviceGetNvLinkState")
            if not 0 <= link < gpu.nvlink_links:
                raise pynvml.NVMLError_InvalidArgument()
            return pynvml.NVML_FEATURE_DISABLED if link in gpu.nvlink_down else pynvml.NVML_FEATURE_ENABLED

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        with self._lock:
            _, gpu = self._gpu(handle, "nvmlDeviceGetComputeRunningProcesses")
            out = []
            for p in gpu.processes:
                info = pynvml.c_nvmlProcessInfo_t(
                    pid=p.pid,
                    usedGpuMemory=pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value
                    if p.used_memory_bytes is None
                    else p.used_memory_bytes,
                    gpuInstanceId=UINT_MAX if p.gpu_instance_id is None else p.gpu_instance_id,
                    computeInstanceId=UINT_MAX if p.compute_instance_id is None else p.compute_instance_id,
                )
                obj = pynvml.nvmlStructToFriendlyObject(info)
                if obj.usedGpuMemory == pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value:
                    obj.usedGpuMemory = None  # as pynvml does
                out.append(obj)
            return out

    def _process_samples(self, handle: Any, function: str, since: int) -> list[tuple[ProcessSpec, int]]:
        """The processes with a sample newer than ``since`` (each with its timestamp), as NVML
        keeps them: only processes that used the GPU; none at all raises NVMLError_NotFound."""
        _, gpu = self._gpu(handle, function)
        latest = PROCESS_SAMPLES_EPOCH_US + math.floor(self.t) * PROCESS_SAMPLE_PERIOD_US
        busy = [p for p in gpu.processes if p.sm_util_percent or p.memory_util_percent]
        if latest <= since or not busy:
            raise pynvml.NVMLError_NotFound()
        return [(p, latest) for p in busy]

    def nvmlDeviceGetProcessUtilization(self, handle: Any, timeStamp: int) -> list[Any]:  # noqa: N803 (pynvml's name)
        with self._lock:
            return [
                pynvml.c_nvmlProcessUtilizationSample_t(
                    pid=p.pid,
                    timeStamp=at,
                    smUtil=p.sm_util_percent,
                    memUtil=p.memory_util_percent,
                    encUtil=0,
                    decUtil=0,
                )
                for p, at in self._process_samples(handle, "nvmlDeviceGetProcessUtilization", timeStamp)
            ]

    def nvmlDeviceGetProcessesUtilizationInfo(self, handle: Any, timeStamp: int) -> list[Any]:  # noqa: N803
        with self._lock:
            if int(self.spec.driver_version.split(".")[0]) < PROCESSES_UTILIZATION_INFO_DRIVER:
                self.calls[("nvmlDeviceGetProcessesUtilizationInfo", self._device(handle)[0])] += 1
                raise pynvml.NVMLError_FunctionNotFound()  # pynvml: the driver's library lacks the symbol
            return [
                pynvml.c_nvmlProcessUtilizationInfo_v1_t(
                    timeStamp=at,
                    pid=p.pid,
                    smUtil=p.sm_util_percent,
                    memUtil=p.memory_util_percent,
                    encUtil=0,
                    decUtil=0,
                    jpgUtil=0,
                    ofaUtil=0,
                )
                for p, at in self._process_samples(handle, "nvmlDeviceGetProcessesUtilizationInfo", timeStamp)
            ]

    def nvmlDeviceGetFieldValues(self, handle: Any, field_ids: Sequence[int | tuple[int, int]]) -> Any:
        with self._lock:
            index, gpu = self._gpu(handle, "nvmlDeviceGetFieldValues")
            values = (pynvml.c_nvmlFieldValue_t * len(field_ids))()
            now_us = int(time.time() * 1e6)
            tables = self._field_tables(gpu)
            members = {
                pynvml.NVML_VALUE_TYPE_DOUBLE: "dVal",
                pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
                pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
            }
            for value, requested in zip(values, field_ids):
                field_id, scope = requested if isinstance(requested, tuple) else (requested, 0)
                value.fieldId, value.scopeId, value.timestamp, value.latencyUsec = field_id, scope, now_us, 0
                value.nvmlReturn, value.valueType, number = self._field(index, field_id, scope, tables)
                if value.nvmlReturn == pynvml.NVML_SUCCESS:
                    setattr(value.value, members[value.valueType], number)
            return values

    def _field(
        self, index: int, field_id: int, scope: int, tables: tuple[dict[str, Any], ...]
    ) -> tuple[int, int, float]:
        """(nvmlReturn, valueType, value) of one field."""
        device, link_up, link_down = tables
        name = self._field_names.get(field_id)
        self.field_requests[(index, name or str(field_id))] += 1
        failure = self._field_failures.get((index, name or str(field_id)))
        if failure is not None:
            return failure, 0, 0
        if name is None or name in self._unsupported[index]:
            return pynvml.NVML_ERROR_NOT_SUPPORTED, 0, 0
        if name in device:
            return (pynvml.NVML_SUCCESS, *device[name])
        if name not in link_up:
            return pynvml.NVML_ERROR_NOT_SUPPORTED, 0, 0
        if not 0 <= scope < self.spec.gpus[index].nvlink_links:  # per-link fields: scopeId is the link
            return pynvml.NVML_ERROR_INVALID_ARGUMENT, 0, 0
        table = link_down if scope in self.spec.gpus[index].nvlink_down else link_up
        return (pynvml.NVML_SUCCESS, *table[name])

    def _field_tables(self, gpu: GpuSpec) -> tuple[dict[str, Any], ...]:
        """Every field's (valueType, value) now: GPU-wide, and per link for an up and a down link."""
        ull, uint = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
        links = gpu.nvlink_links
        errors = gpu.nvlink_errors
        device: dict[str, tuple[int, float]] = {
            "NVML_FI_DEV_ECC_SBE_VOL_TOTAL": (ull, gpu.ecc_corrected),
            "NVML_FI_DEV_ECC_DBE_VOL_TOTAL": (ull, gpu.ecc_uncorrected),
            "NVML_FI_DEV_ECC_SBE_AGG_TOTAL": (ull, gpu.ecc_aggregate_corrected + gpu.ecc_corrected),
            "NVML_FI_DEV_ECC_DBE_AGG_TOTAL": (ull, gpu.ecc_aggregate_uncorrected + gpu.ecc_uncorrected),
            "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION": (uint, RECOVERY_ACTIONS[gpu.recovery_action]),
            "NVML_FI_DEV_RETIRED_SBE": (ull, gpu.retired_pages_single_bit),
            "NVML_FI_DEV_RETIRED_DBE": (ull, gpu.retired_pages_double_bit),
            "NVML_FI_DEV_RETIRED_PENDING": (ull, int(gpu.retired_pages_pending)),
            "NVML_FI_DEV_REMAPPED_COR": (uint, gpu.remapped_rows_correctable),
            "NVML_FI_DEV_REMAPPED_UNC": (uint, gpu.remapped_rows_uncorrectable),
            "NVML_FI_DEV_REMAPPED_PENDING": (uint, int(gpu.remapped_rows_pending)),
            "NVML_FI_DEV_REMAPPED_FAILURE": (uint, int(gpu.remapped_rows_failed)),
            "NVML_FI_DEV_MEMORY_TEMP": (uint, gpu.memory_temperature_celsius),
            "NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION": (ull, self._since_load(gpu, gpu.power_watts) * 1000),  # mJ
            "NVML_FI_DEV_PCIE_REPLAY_COUNTER": (ull, gpu.pcie_replays),
            "NVML_FI_DEV_PCIE_COUNT_TX_BYTES": (ull, self._since_load(gpu, gpu.pcie_transmitted_bytes_per_second)),
            "NVML_FI_DEV_PCIE_COUNT_RX_BYTES": (ull, self._since_load(gpu, gpu.pcie_received_bytes_per_second)),
            "NVML_FI_DEV_NVLINK_LINK_COUNT": (uint, links),
            "NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": (ull, links * errors.get("crc_flit", 0)),
            "NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": (ull, links * errors.get("crc_data", 0)),
            "NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": (ull, links * errors.get("replay", 0)),
            "NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": (ull, links * errors.get("recovery", 0)),
        }
        for reason, reason_field in CLOCK_EVENT_DURATION_FIELDS.items():
            device[reason_field] = (ull, self._event_seconds(gpu, reason) * 1e9)  # nanoseconds
        link_up: dict[str, tuple[int, float]] = {
            "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX": (
                ull,
                self._since_load(gpu, gpu.nvlink_transmitted_bytes_per_second) / 1024,
            ),
            "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX": (
                ull,
                self._since_load(gpu, gpu.nvlink_received_bytes_per_second) / 1024,
            ),
            "NVML_FI_DEV_NVLINK_GET_STATE": (uint, pynvml.NVML_NVLINK_STATE_ACTIVE),
            "NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY": (ull, errors.get("replay", 0)),
            "NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY": (ull, errors.get("recovery", 0)),
            "NVML_FI_DEV_NVLINK_ERROR_DL_CRC": (ull, errors.get("crc_flit", 0)),
        }
        for counter, counter_field in BLACKWELL_NVLINK_FIELDS.items():
            link_up[counter_field] = (ull, gpu.nvlink_counters.get(counter, 0))
        link_down = {
            **link_up,
            "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX": (ull, 0),  # a down link carried nothing (in this fake)
            "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX": (ull, 0),
            "NVML_FI_DEV_NVLINK_GET_STATE": (uint, pynvml.NVML_NVLINK_STATE_INACTIVE),
        }
        rounded = tuple(
            {name: (kind, round(number)) for name, (kind, number) in t.items()} for t in (device, link_up, link_down)
        )
        return rounded

    # --- NVSwitch fabric ---

    def nvmlDeviceGetGpuFabricInfoV(self, handle: Any, info_ref: Any) -> int:
        """Fills the caller's c_nvmlGpuFabricInfoV_t (passed by reference), as NVML does."""
        with self._lock:
            _, gpu = self._gpu(handle, "nvmlDeviceGetGpuFabricInfoV")
            info = getattr(info_ref, "_obj", info_ref)  # ctypes.byref(info) or a pointer
            if getattr(info, "version", None) not in (pynvml.nvmlGpuFabricInfo_v2, pynvml.nvmlGpuFabricInfo_v3):
                raise pynvml.NVMLError_ArgumentVersionMismatch()
            info.state = FABRIC_STATES[gpu.fabric_state]
            info.cliqueId = 0
            info.status = pynvml.NVML_SUCCESS
            info.healthMask = 0
            if gpu.fabric_state == "not_supported":
                info.status = pynvml.NVML_ERROR_NOT_SUPPORTED
                return pynvml.NVML_SUCCESS
            if gpu.fabric_state == "completed" and gpu.fabric_registration_failed:
                info.status = pynvml.NVML_ERROR_UNKNOWN
            for condition, shift in FABRIC_HEALTH_FIELDS.items():
                # Every two-bit field: 1 TRUE, 2 FALSE (0 not supported), like DEGRADED_BW's.
                holds = condition in gpu.fabric_health
                value = (
                    pynvml.NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_TRUE
                    if holds
                    else pynvml.NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_FALSE
                )
                info.healthMask |= value << shift
            return pynvml.NVML_SUCCESS

    # --- GPM ---

    def nvmlGpmQueryDeviceSupport(self, handle: Any) -> Any:
        with self._lock:
            _, gpu = self._gpu(handle, "nvmlGpmQueryDeviceSupport")
            support = pynvml.c_nvmlGpmSupport_t()
            support.version = pynvml.NVML_GPM_SUPPORT_VERSION
            support.isSupportedDevice = int(_has_gpm(gpu))
            return support

    def nvmlGpmSampleAlloc(self) -> Any:
        with self._lock:
            self._enter("nvmlGpmSampleAlloc")
            struct = pynvml.struct_c_nvmlGpmSample_t()
            sample = pynvml.c_nvmlGpmSample_t(struct)
            self._gpm_samples[_address(sample)] = _GpmSample(struct)
            return sample

    def _gpm_sample(self, sample: Any) -> _GpmSample:
        try:
            return self._gpm_samples[_address(sample)]
        except (KeyError, TypeError, ValueError):
            raise pynvml.NVMLError_InvalidArgument() from None

    def nvmlGpmSampleFree(self, sample: Any) -> None:
        with self._lock:
            self._enter("nvmlGpmSampleFree")
            self._gpm_sample(sample)
            del self._gpm_samples[_address(sample)]

    def nvmlGpmSampleGet(self, handle: Any, sample: Any) -> Any:
        with self._lock:
            index, gpu = self._gpu(handle, "nvmlGpmSampleGet")
            if not _has_gpm(gpu) or gpu.mig_devices:
                # In MIG mode GPM is read per GPU instance (nvmlGpmMigSampleGet).  NVML's documentation
                # does not say what a whole-GPU sample does then: this fake refuses it, the stricter answer.
                raise pynvml.NVMLError_NotSupported()
            self._take(self._gpm_sample(sample), index, None, gpu.sm_count, gpu)
            return sample

    def nvmlGpmMigSampleGet(self, handle: Any, gpu_instance_id: int, sample: Any) -> Any:
        with self._lock:
            index, gpu = self._gpu(handle, "nvmlGpmMigSampleGet")
            if not _has_gpm(gpu):
                raise pynvml.NVMLError_NotSupported()
            device = next((m for m in gpu.mig_devices if m.gpu_instance_id == gpu_instance_id), None)
            if device is None:
                raise pynvml.NVMLError_InvalidArgument()  # no such GPU instance (or MIG off)
            share = GpuSpec(
                sm_clock_mhz=gpu.sm_clock_mhz,
                driver_uptime_seconds=gpu.driver_uptime_seconds,
                gpm_cumulative=gpu.gpm_cumulative,
                sm_count=device.sm_count,
                sm_active_percent=device.sm_active_percent,
                pipe_active_percent={"tensor": device.tensor_active_percent},
            )
            self._take(self._gpm_sample(sample), index, gpu_instance_id, device.sm_count, share)
            return sample

    def _take(self, sample: _GpmSample, index: int, instance: int | None, sm_count: int, gpu: GpuSpec) -> None:
        """Counters since boot now: cycles (integers, as the hardware counts them) and, for the windowed
        metrics, percent-seconds, whose difference over the interval is the average."""
        since_boot = gpu.driver_uptime_seconds + self.t
        elapsed = round(sm_count * gpu.sm_clock_mhz * 1e6 * since_boot)
        counters: dict[str, float] = {
            "NVML_GPM_METRIC_SM_CYCLES_ELAPSED": elapsed,
            "NVML_GPM_METRIC_SM_CYCLES_ACTIVE": round(elapsed * gpu.sm_active_percent / 100),
            "NVML_GPM_METRIC_GRAPHICS_UTIL": gpu.utilization_gpu_percent * since_boot,
            "NVML_GPM_METRIC_SM_UTIL": gpu.sm_active_percent * since_boot,
            "NVML_GPM_METRIC_SM_OCCUPANCY": gpu.sm_occupancy_percent * since_boot,
            "NVML_GPM_METRIC_DRAM_BW_UTIL": gpu.dram_bandwidth_used_percent * since_boot,
        }
        for pipe, (cycles, util) in GPM_PIPES.items():
            percent = gpu.pipe_active_percent.get(pipe, 0.0)
            counters[cycles] = round(elapsed * percent / 100)
            counters[util] = percent * since_boot
        sample.gpu, sample.gpu_instance_id, sample.t = index, instance, self.t
        sample.counters = {getattr(pynvml, name): value for name, value in counters.items()}
        sample.cumulative = gpu.gpm_cumulative
        sample.percents = {
            mid: value / since_boot if since_boot else 0.0
            for mid, value in sample.counters.items()
            if mid not in self._gpm_cumulative_ids
        }

    def nvmlGpmMetricsGet(self, request: Any) -> Any:
        with self._lock:
            first, second = self._gpm_sample(request.sample1), self._gpm_sample(request.sample2)
            if second.gpu is None or (first.gpu, first.gpu_instance_id) != (second.gpu, second.gpu_instance_id):
                self._enter("nvmlGpmMetricsGet")
                raise pynvml.NVMLError_InvalidArgument()  # not two samples of the same GPU or instance
            self._enter("nvmlGpmMetricsGet", second.gpu)
            if request.version != pynvml.NVML_GPM_METRICS_GET_VERSION:
                raise pynvml.NVMLError_ArgumentVersionMismatch()
            if not 0 < request.numMetrics <= pynvml.NVML_GPM_METRIC_MAX:
                raise pynvml.NVMLError_InvalidArgument()
            cumulative = self._gpm_cumulative_ids
            interval = second.t - first.t
            for i in range(request.numMetrics):
                metric = request.metrics[i]
                mid = metric.metricId
                metric.value = 0.0
                failure = self._gpm_failures.get((second.gpu, mid))
                if failure is not None:
                    metric.nvmlReturn = failure
                elif mid not in second.counters or (mid in cumulative and not second.cumulative):
                    metric.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
                elif mid in cumulative:
                    metric.nvmlReturn, metric.value = pynvml.NVML_SUCCESS, second.counters[mid]
                elif interval <= 0:
                    # Two samples at one moment of the fake's clock (a test that does not move it): the
                    # average over an empty window is the value at that moment.
                    metric.nvmlReturn, metric.value = pynvml.NVML_SUCCESS, second.percents[mid]
                else:
                    metric.nvmlReturn = pynvml.NVML_SUCCESS
                    metric.value = (second.counters[mid] - first.counters[mid]) / interval
            return request

    # --- MIG ---

    def nvmlDeviceGetMigMode(self, handle: Any) -> list[int]:
        with self._lock:
            _, gpu = self._gpu(handle, "nvmlDeviceGetMigMode")
            mode = pynvml.NVML_DEVICE_MIG_ENABLE if gpu.mig_devices else pynvml.NVML_DEVICE_MIG_DISABLE
            return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any) -> int:
        with self._lock:
            _, gpu = self._gpu(handle, "nvmlDeviceGetMaxMigDeviceCount")
            return 7 if gpu.mig_devices else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, mig_index: int) -> Any:
        with self._lock:
            index, gpu = self._gpu(handle, "nvmlDeviceGetMigDeviceHandleByIndex")
            if not gpu.mig_devices:
                raise pynvml.NVMLError_InvalidArgument()
            if not 0 <= mig_index < len(gpu.mig_devices):
                raise pynvml.NVMLError_NotFound()
            return pynvml.c_nvmlDevice_t(self._mig_structs[(index, mig_index)])

    def nvmlDeviceGetGpuInstanceId(self, handle: Any) -> int:
        with self._lock:
            _, _, mig = self._mig(handle, "nvmlDeviceGetGpuInstanceId")
            if mig is None:
                raise pynvml.NVMLError_InvalidArgument()
            return mig.gpu_instance_id

    def nvmlDeviceGetComputeInstanceId(self, handle: Any) -> int:
        with self._lock:
            _, _, mig = self._mig(handle, "nvmlDeviceGetComputeInstanceId")
            if mig is None:
                raise pynvml.NVMLError_InvalidArgument()
            return mig.compute_instance_id

    # --- events ---

    def nvmlEventSetCreate(self) -> Any:
        with self._lock:
            self._enter("nvmlEventSetCreate")
            handle = pynvml.c_nvmlEventSet_t(pynvml.struct_c_nvmlEventSet_t())  # keeps its struct alive
            self._sets[_address(handle)] = _EventSet()
            return handle

    def _event_set(self, event_set: Any) -> _EventSet:
        found = self._sets.get(_address(event_set))
        if found is None:
            raise pynvml.NVMLError_InvalidArgument()
        return found

    def nvmlDeviceRegisterEvents(self, handle: Any, event_types: int, event_set: Any) -> None:
        with self._lock:
            index, _ = self._gpu(handle, "nvmlDeviceRegisterEvents")
            if event_types & ~pynvml.nvmlEventTypeXidCriticalError:
                raise pynvml.NVMLError_NotSupported()  # this fake only has XID events
            self._event_set(event_set).registered[index] = self._next()

    def nvmlEventSetWait_v2(self, event_set: Any, timeout_ms: int) -> pynvml.c_nvmlEventData_t:
        deadline = time.monotonic() + timeout_ms / 1000
        with self._lock:
            self._enter("nvmlEventSetWait_v2")
            while True:
                if self._refcount == 0:
                    raise pynvml.NVMLError_Uninitialized()  # NVML was shut down during the wait
                state = self._event_set(event_set)
                self._happen(self.t, inclusive=True)
                for event in self._events:
                    registered = state.registered.get(event.gpu)
                    if (
                        event.seq is None
                        or event.seq in state.delivered
                        or registered is None
                        or registered > event.seq
                        or (event.gpu in self._lost and not event.loses_gpu)
                    ):
                        continue
                    state.delivered.add(event.seq)
                    if event.loses_gpu:
                        self._lost.add(event.gpu)
                    data = pynvml.c_nvmlEventData_t()
                    data.device = self._handles[event.gpu]
                    data.eventType = pynvml.nvmlEventTypeXidCriticalError
                    data.eventData = event.xid
                    data.gpuInstanceId = data.computeInstanceId = UINT_MAX
                    return data
                if any(self._gone(gpu) for gpu in state.registered):
                    raise pynvml.NVMLError_GpuIsLost()
                remaining = deadline - time.monotonic()
                if self._real_time:
                    future = [e.at - self.t for e in self._events if e.seq is None]
                    if future:
                        remaining = min(remaining, min(future) + 0.001)
                if deadline - time.monotonic() <= 0:
                    raise pynvml.NVMLError_Timeout()
                self._changed.wait(max(0.0, remaining))

    def nvmlEventSetFree(self, event_set: Any) -> None:
        with self._lock:
            self._enter("nvmlEventSetFree")
            self._event_set(event_set)
            del self._sets[_address(event_set)]
            self._changed.notify_all()


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


_GPM_CUMULATIVE = (
    "NVML_GPM_METRIC_SM_CYCLES_ELAPSED",
    "NVML_GPM_METRIC_SM_CYCLES_ACTIVE",
    *(cycles for cycles, _ in GPM_PIPES.values()),
)


def _has_gpm(gpu: GpuSpec) -> bool:
    return gpu.architecture in GPM_ARCHITECTURES and not gpu.consumer


def _address(handle: Any) -> int:
    address = ctypes.cast(handle, ctypes.c_void_p).value
    if address is None:
        raise ValueError("null handle")
    return address


def _clock(gpu: GpuSpec, clock_type: int, sm_mhz: int) -> int:
    if clock_type in (pynvml.NVML_CLOCK_SM, pynvml.NVML_CLOCK_GRAPHICS):
        return sm_mhz
    if clock_type == pynvml.NVML_CLOCK_MEM:
        return gpu.memory_clock_mhz
    raise pynvml.NVMLError_NotSupported()


def fake_from_gpus(gpus: Iterable[GpuSpec], **spec: Any) -> FakeNvml:
    """A manual-clock fake from GPU specs (identity filled in from their positions)."""
    return FakeNvml(FakeSpec(gpus=tuple(with_defaults(g, i) for i, g in enumerate(gpus)), **spec))


def from_spec_file(path: Path | str) -> NvmlProvider:
    """The fake NVML of ``lockstep run|once|doctor --gpu.fake-nvml SPEC``: the spec file loaded
    and checked (FakeSpecError names file:line), its counters running with real time.

    Typed as the GPU collector's ``NvmlProvider``: mypy checks here that the fake conforms."""
    return FakeNvml(load_spec(path), real_time=True)
