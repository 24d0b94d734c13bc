"""The fake NVML's per-GPU measurements: utilization, memory, clocks and what holds them down,
power, temperature, the PCIe link, NVLink state by call and the NVSwitch fabric.
"""

from __future__ import annotations

from typing import Any

import pynvml

from lockstep.collectors.gpu.nvml import CLOCK_EVENT_REASONS
from lockstep.simulation.fake_nvml.capabilities import FABRIC_HEALTH_FIELDS, FABRIC_STATES
from lockstep.simulation.fake_nvml.clocks import active_reasons, clock_mhz
from lockstep.simulation.fake_nvml.state import FakeState


class Measurements:
    """The values of a GPU now, each from its spec and the fake's time."""

    def __init__(self, state: FakeState) -> None:
        self._state = state

    # --- measurements ---

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> pynvml.c_nvmlUtilization_t:
        with self._state.lock:
            _, gpu = self._state.gpu(handle, "nvmlDeviceGetUtilizationRates")
            return pynvml.c_nvmlUtilization_t(gpu=gpu.utilization_gpu_percent, memory=gpu.utilization_memory_percent)

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> pynvml.c_nvmlMemory_t:
        with self._state.lock:
            _, gpu, mig = self._state.mig(handle, "nvmlDeviceGetMemoryInfo")
            total, used = (
                (mig.memory_total_bytes, mig.memory_used_bytes)
                if mig
                else (gpu.memory_total_bytes, gpu.memory_used_bytes)
            )
            return pynvml.c_nvmlMemory_t(total=total, free=total - used, used=used)

    def nvmlDeviceGetClockInfo(self, handle: Any, clock_type: int) -> int:
        with self._state.lock:
            _, gpu = self._state.gpu(handle, "nvmlDeviceGetClockInfo")
            return clock_mhz(gpu, clock_type, gpu.sm_clock_mhz)

    def nvmlDeviceGetMaxClockInfo(self, handle: Any, clock_type: int) -> int:
        with self._state.lock:
            _, gpu = self._state.gpu(handle, "nvmlDeviceGetMaxClockInfo")
            return clock_mhz(gpu, clock_type, gpu.sm_clock_max_mhz)

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        with self._state.lock:
            return round(self._state.gpu(handle, "nvmlDeviceGetPowerUsage")[1].power_watts * 1000)  # mW

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int:
        with self._state.lock:
            return round(self._state.gpu(handle, "nvmlDeviceGetEnforcedPowerLimit")[1].power_limit_watts * 1000)

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        with self._state.lock:
            _, gpu = self._state.gpu(handle, "nvmlDeviceGetTemperature")
            if sensor != pynvml.NVML_TEMPERATURE_GPU:
                raise pynvml.NVMLError_InvalidArgument()
            return gpu.temperature_celsius

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        with self._state.lock:
            _, gpu = self._state.gpu(handle, "nvmlDeviceGetCurrentClocksEventReasons")
            mask = 0
            for reason in active_reasons(gpu, self._state.t):
                mask |= CLOCK_EVENT_REASONS[reason]
            return mask

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: Any) -> int:
        with self._state.lock:
            return self._state.gpu(handle, "nvmlDeviceGetCurrPcieLinkGeneration")[1].pcie_link_generation

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: Any) -> int:
        with self._state.lock:
            return self._state.gpu(handle, "nvmlDeviceGetCurrPcieLinkWidth")[1].pcie_link_width

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: Any) -> int:
        with self._state.lock:
            return self._state.gpu(handle, "nvmlDeviceGetMaxPcieLinkGeneration")[1].pcie_max_link_generation

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: Any) -> int:
        with self._state.lock:
            return self._state.gpu(handle, "nvmlDeviceGetMaxPcieLinkWidth")[1].pcie_max_link_width

    def nvmlDeviceGetNvLinkState(self, handle: Any, link: int) -> int:
        with self._state.lock:
            _, gpu = self._state.gpu(handle, "nvmlDeviceGetNvLinkState")
            if not 0 <= link < gpu.nvlink_links:
                raise pynvml.NVMLError_InvalidArgument()
            return pynvml.NVML_FEATURE_DISABLED if link in gpu.nvlink_down else pynvml.NVML_FEATURE_ENABLED

    # --- NVSwitch fabric ---

    def nvmlDeviceGetGpuFabricInfoV(self, handle: Any, info_ref: Any) -> int:
        """Fills the caller's c_nvmlGpuFabricInfoV_t (passed by reference), as NVML does."""
        with self._state.lock:
            _, gpu = self._state.gpu(handle, "nvmlDeviceGetGpuFabricInfoV")
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
