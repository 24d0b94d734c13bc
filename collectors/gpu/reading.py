"""One GPU's values in a round: the batched fields, the per-GPU calls and its compute
processes, each call probed once and remembered when unsupported, failures counted per error
(calls.py).  A lost GPU or an unusable NVML raises, so a round never serves a GPU's values partially.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

import pynvml

from lockstep.agent.collector import MetricSpec
from lockstep.agent.gpus import GpuProcess, MigDevice
from lockstep.collectors.gpu.calls import NvmlCalls
from lockstep.collectors.gpu.fields import LINK_STATE_FIELD, LINK_USES, RECOVERY_ACTION_FIELD
from lockstep.collectors.gpu.gpm import read_gpm
from lockstep.collectors.gpu.metrics import (
    CLOCK_EVENT_ACTIVE,
    FABRIC_HEALTH,
    FABRIC_STATE,
    MEMORY_CLOCK,
    MEMORY_TOTAL,
    MEMORY_USED,
    MEMORY_UTILIZATION,
    MIG_MODE,
    NVLINK_UP,
    POWER,
    POWER_LIMIT,
    PROCESS_MEMORY,
    PROCESSES,
    RECOVERY_ACTION,
    SM_CLOCK,
    SM_CLOCK_MAX,
    TEMPERATURE,
    UTILIZATION,
)
from lockstep.collectors.gpu.mig import read_mig
from lockstep.collectors.gpu.nvml import (
    CLOCK_EVENT_REASONS,
    FABRIC_STATES,
    GPU_GONE,
    LIFECYCLE,
    NO_INSTANCE_ID,
    RECOVERY_ACTIONS,
    UNSUPPORTED,
    fabric_health,
    field_number,
)
from lockstep.collectors.gpu.pcie import read_pcie_link
from lockstep.collectors.gpu.processes import with_utilization
from lockstep.collectors.gpu.provider import NvmlProvider
from lockstep.collectors.gpu.state import GpuState, Sample


class GpuReader:
    """One GPU's values in a round, read through the collector's guarded NVML calls."""

    def __init__(self, calls: NvmlCalls, gpm_min_interval: float, gpm_clock: Callable[[], float]) -> None:
        self.calls = calls
        # GPM's windowed metrics need their two samples at least this far apart (seconds; NVML
        # refreshes GPM samples every 100 ms), on the collector's monotonic clock: collectors/gpu/gpm.py.
        self.gpm_min_interval = gpm_min_interval
        self.gpm_clock = gpm_clock

    def read(
        self, nvml: NvmlProvider, gpu: GpuState
    ) -> tuple[list[Sample], tuple[GpuProcess, ...], tuple[MigDevice, ...]]:
        """All of one GPU's values, or an exception (GPU_GONE, LIFECYCLE): nothing partial."""
        out: list[Sample] = []
        labels = gpu.labels
        h = gpu.handle
        call = self.calls.optional

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
        out += read_pcie_link(self.calls, nvml, gpu)
        processes = self._processes(nvml, gpu)
        if processes is not None:
            processes = with_utilization(self.calls, nvml, gpu, processes)
        if processes is not None:
            put(PROCESSES, len(processes))
            put(PROCESS_MEMORY, sum(p.used_memory_bytes or 0 for p in processes))
        out += self._read_fabric(nvml, gpu)
        migs: tuple[MigDevice, ...] = ()
        mig_enabled = False
        mode = call(gpu, "nvmlDeviceGetMigMode", nvml.nvmlDeviceGetMigMode, h)
        if mode is not None:
            mig_enabled = mode[0] == pynvml.NVML_DEVICE_MIG_ENABLE
            put(MIG_MODE, 1 if mig_enabled else 0)
            if mig_enabled:
                migs = read_mig(self.calls, nvml, gpu, out, processes or ())
        if gpu.gpm is not None:
            instances = sorted({m.gpu_instance_id for m in migs}) if mig_enabled else None
            out += read_gpm(self.calls, nvml, gpu, instances, self.gpm_min_interval, self.gpm_clock)
        return out, processes or (), migs

    def _read_fabric(self, nvml: NvmlProvider, gpu: GpuState) -> list[Sample]:
        """NVSwitch fabric registration state and health (one call); nothing on GPUs without a fabric."""
        name = "nvmlDeviceGetGpuFabricInfoV"
        if name in gpu.unsupported:
            return []
        info = pynvml.c_nvmlGpuFabricInfoV_t()  # sets its own version (v2: state, status, health mask)
        if self.calls.optional(gpu, name, nvml.nvmlDeviceGetGpuFabricInfoV, gpu.handle, ctypes.byref(info)) is None:
            return []
        if info.state == pynvml.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED:
            # A GPU without an NVSwitch fabric (PCIe cards, pre-Hopper): not asked again.
            self.calls.unsupported(gpu, name, ValueError("fabric state: not supported"))
            return []
        out: list[Sample] = [
            (FABRIC_STATE, (*gpu.labels, state), 1 if info.state == value else 0)
            for state, value in FABRIC_STATES.items()
        ]
        if info.state == pynvml.NVML_GPU_FABRIC_STATE_COMPLETED:
            failed = 1 if info.status != pynvml.NVML_SUCCESS else 0
            out.append((FABRIC_HEALTH, (*gpu.labels, "registration_failed"), failed))
        for condition, holds in fabric_health(info.healthMask).items():
            out.append((FABRIC_HEALTH, (*gpu.labels, condition), holds))
        return out

    def _read_fields(self, nvml: NvmlProvider, gpu: GpuState) -> list[Sample]:
        """The batched fields: one call; each field checked by its own return code."""
        if not gpu.field_uses:
            return []
        requests = [(fid, scope) for _, fid, scope in gpu.field_uses]
        try:
            values = nvml.nvmlDeviceGetFieldValues(gpu.handle, requests)
        except UNSUPPORTED as exc:
            self.calls.unsupported(gpu, "nvmlDeviceGetFieldValues", exc)
            gpu.field_uses = []
            return []
        except GPU_GONE + LIFECYCLE:
            raise
        except pynvml.NVMLError as exc:
            self.calls.count_error(gpu, exc)
            return []
        out: list[Sample] = []
        keep = []
        for (use, fid, scope), fv in zip(gpu.field_uses, values):
            code = fv.nvmlReturn
            if code in (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND):
                if use.field not in gpu.unsupported:
                    gpu.unsupported.add(use.field)
                    self.calls.log.debug("GPU %d: %s not supported, no longer asked for", gpu.index, use.field)
                if use.field == LINK_STATE_FIELD:
                    gpu.link_state_by_call = True
                continue
            keep.append((use, fid, scope))
            if code != pynvml.NVML_SUCCESS:
                error = pynvml.NVMLError(code)
                if isinstance(error, GPU_GONE + LIFECYCLE):
                    raise error
                self.calls.count_error(gpu, error)
                continue
            number = field_number(fv)
            if number is None:
                self.calls.count_error(gpu, ValueError(f"{use.field}: unknown value type {fv.valueType}"), "bad_value")
                continue
            link = (str(scope),) if use in LINK_USES else ()
            if use.field == RECOVERY_ACTION_FIELD:
                # A state set; a value this table does not know (a newer driver) leaves every state
                # at 0, so "none" is 0 and the alert still fires.
                for action, action_value in RECOVERY_ACTIONS.items():
                    out.append((RECOVERY_ACTION, (*gpu.labels, action), 1 if number == action_value else 0))
            elif use.spec is None:  # link state
                up = number in (pynvml.NVML_NVLINK_STATE_ACTIVE, pynvml.NVML_NVLINK_STATE_SLEEP)
                out.append((NVLINK_UP, (*gpu.labels, *link), 1 if up else 0))
            else:
                out.append((use.spec, (*gpu.labels, *link, *use.labels), number * use.scale))
        gpu.field_uses = keep
        return out

    def _processes(self, nvml: NvmlProvider, gpu: GpuState) -> tuple[GpuProcess, ...] | None:
        found = self.calls.optional(
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
