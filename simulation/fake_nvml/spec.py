"""The fake NVML's spec: the GPUs it has and how they behave over time, as frozen dataclasses
(the YAML form is read by spec_yaml.py; docs/gpu.md documents it).
"""

from __future__ import annotations

import dataclasses
import uuid as uuidlib
from collections.abc import Mapping
from dataclasses import dataclass, field

from lockstep.simulation.fake_nvml.capabilities import (
    ARCHITECTURE_UNSUPPORTED,
    CONSUMER_UNSUPPORTED,
    MIB,
    PROCESS_UTILIZATION_CALLS,
    REMAPPED_ROWS_FIELDS,
)


class FakeSpecError(Exception):
    """A spec that cannot be used; ``problems`` are 'where: what' strings."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


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
            names |= {"nvmlDeviceGetUtilizationRates", *PROCESS_UTILIZATION_CALLS, *REMAPPED_ROWS_FIELDS}
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
