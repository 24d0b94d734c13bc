"""The GPU collector's metrics: every family it emits, declared once (name, type, help, labels).

``METRICS`` is the collector's ``metrics`` tuple; its order is the order families are
emitted in (the golden expositions depend on it).
"""

from __future__ import annotations

from lockstep.agent.collector import MetricSpec

GPU = ("gpu", "uuid")
LINK = ("gpu", "uuid", "link")
MIG = ("gpu", "uuid", "gpu_instance_id", "compute_instance_id")
# GPM activity: the whole GPU (gpu_instance_id empty, so the label is absent in Prometheus) or
# one MIG GPU instance (gpu_instance_id set); sum by (gpu) adds a partitioned GPU's instances.
GPM = ("gpu", "uuid", "gpu_instance_id")

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
    "lockstep_gpu_sm_clock_max_hertz",
    "gauge",
    "Maximum SM clock of the GPU (what an unthrottled GPU reaches).",
    GPU,
    unit="hertz",
)
MEMORY_CLOCK = MetricSpec("lockstep_gpu_memory_clock_hertz", "gauge", "Current memory clock.", GPU, unit="hertz")
POWER = MetricSpec(
    "lockstep_gpu_power_watts",
    "gauge",
    "Power draw (NVML: averaged over 1 s on Ampere and newer, except GA100 (A100), which, like older GPUs, "
    "reports instantaneous power).",
    GPU,
    unit="watts",
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
ECC_AGGREGATE_ERRORS = MetricSpec(
    "lockstep_gpu_ecc_aggregate_errors_total",
    "counter",
    "Memory ECC errors over the GPU's lifetime (NVML aggregate counts, kept in the GPU's InfoROM across "
    "reboots and driver reloads), by type: corrected (single-bit) or uncorrected (double-bit).",
    (*GPU, "type"),
)
RECOVERY_ACTION = MetricSpec(
    "lockstep_gpu_recovery_action",
    "gauge",
    "What the driver says must be done for the GPU to be usable again (NVML GPU recovery action), as a "
    "state set: 1 for the current action among none, gpu_reset, node_reboot, drain_p2p, drain_and_reset, "
    "recover_imex_domain, bus_reset, system_reboot (docs/gpu.md).",
    (*GPU, "action"),
)
FABRIC_STATE = MetricSpec(
    "lockstep_gpu_fabric_state",
    "gauge",
    "The GPU's NVSwitch fabric registration (NVML GPU fabric info), as a state set: 1 for the current "
    "state among not_started, in_progress, completed.  Absent on GPUs without an NVSwitch fabric.",
    (*GPU, "state"),
)
FABRIC_HEALTH = MetricSpec(
    "lockstep_gpu_fabric_health",
    "gauge",
    "1 while the condition holds on the GPU's NVSwitch fabric, 0 when not: registration_failed (registration "
    "completed with an error), degraded_bandwidth, route_recovery (in progress), route_unhealthy, "
    "access_timeout_recovery (in progress).  Conditions the driver does not report are absent.",
    (*GPU, "condition"),
)
SM_CYCLES = MetricSpec(
    "lockstep_gpu_sm_cycles_total",
    "counter",
    "SM cycles elapsed since boot (NVML GPM, Hopper and newer with a driver that has cumulative GPM metrics): "
    "the denominator of SM and pipe activity, e.g. rate(lockstep_gpu_sm_active_cycles_total[5m]) / "
    "rate(lockstep_gpu_sm_cycles_total[5m]).",
    GPM,
)
SM_ACTIVE_CYCLES = MetricSpec(
    "lockstep_gpu_sm_active_cycles_total",
    "counter",
    "SM cycles in which an SM had at least one warp assigned, since boot (NVML GPM).",
    GPM,
)
PIPE_ACTIVE_CYCLES = MetricSpec(
    "lockstep_gpu_pipe_active_cycles_total",
    "counter",
    "SM cycles in which the pipe was busy, since boot (NVML GPM), by pipe: tensor (any MMA), tensor_hmma, "
    "tensor_imma, tensor_dmma, tensor_dfma, fp64, fp32, fp16, integer.",
    (*GPM, "pipe"),
)
SM_ACTIVE = MetricSpec(
    "lockstep_gpu_sm_active_ratio",
    "gauge",
    "Fraction of SM cycles with at least one warp assigned, averaged over the collector's interval (NVML GPM "
    "SM_UTIL).  Only where the driver lacks the cumulative lockstep_gpu_sm_active_cycles_total.",
    GPM,
    unit="ratio",
)
PIPE_ACTIVE = MetricSpec(
    "lockstep_gpu_pipe_active_ratio",
    "gauge",
    "Fraction of SM cycles in which the pipe was busy, averaged over the collector's interval (NVML GPM "
    "*_UTIL), by pipe as in lockstep_gpu_pipe_active_cycles_total.  Only for pipes whose cumulative counter "
    "the driver lacks.",
    (*GPM, "pipe"),
    unit="ratio",
)
SM_OCCUPANCY = MetricSpec(
    "lockstep_gpu_sm_occupancy_ratio",
    "gauge",
    "Resident warps as a fraction of the SMs' maximum, averaged over the collector's interval (NVML GPM SM_OCCUPANCY).",
    GPM,
    unit="ratio",
)
DRAM_BANDWIDTH_USED = MetricSpec(
    "lockstep_gpu_dram_bandwidth_used_ratio",
    "gauge",
    "Device memory bandwidth used as a fraction of its maximum, averaged over the collector's interval (NVML "
    "GPM DRAM_BW_UTIL).",
    GPM,
    unit="ratio",
)
REMAPPED_ROWS = MetricSpec(
    "lockstep_gpu_remapped_rows",
    "gauge",
    "Memory rows remapped to spare rows (Ampere and newer), by the errors that caused it: correctable or "
    "uncorrectable.",
    (*GPU, "cause"),
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

# Every metric above, in emission order.
METRICS = (
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
    ECC_AGGREGATE_ERRORS,
    RECOVERY_ACTION,
    FABRIC_STATE,
    FABRIC_HEALTH,
    SM_CYCLES,
    SM_ACTIVE_CYCLES,
    PIPE_ACTIVE_CYCLES,
    SM_ACTIVE,
    PIPE_ACTIVE,
    SM_OCCUPANCY,
    DRAM_BANDWIDTH_USED,
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

# Averages between two rounds' GPM samples: a collector's first round (``lockstep once``, the
# one-round golden expositions) cannot have them.  tests/simulation/test_exposition.py checks them on a
# second round instead.
SECOND_ROUND_ONLY = (SM_ACTIVE, PIPE_ACTIVE, SM_OCCUPANCY, DRAM_BANDWIDTH_USED)
