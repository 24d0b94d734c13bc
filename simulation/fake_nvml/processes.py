"""The fake NVML's compute processes and their per-process utilisation samples, one a second
from PROCESS_SAMPLES_EPOCH_US (capabilities.py).
"""

from __future__ import annotations

import math
from typing import Any

import pynvml

from lockstep.simulation.fake_nvml.capabilities import (
    PROCESS_SAMPLE_PERIOD_US,
    PROCESS_SAMPLES_EPOCH_US,
    PROCESSES_UTILIZATION_INFO_DRIVER,
    UINT_MAX,
)
from lockstep.simulation.fake_nvml.spec import ProcessSpec
from lockstep.simulation.fake_nvml.state import FakeState


class Processes:
    """nvmlDeviceGetComputeRunningProcesses and the two per-process utilisation calls."""

    def __init__(self, state: FakeState) -> None:
        self._state = state

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        with self._state.lock:
            _, gpu = self._state.gpu(handle, "nvmlDeviceGetComputeRunningProcesses")
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
        _, gpu = self._state.gpu(handle, function)
        latest = PROCESS_SAMPLES_EPOCH_US + math.floor(self._state.t) * PROCESS_SAMPLE_PERIOD_US
        busy = [p for p in gpu.processes if p.sm_util_percent or p.memory_util_percent]
        if latest <= since or not busy:
            raise pynvml.NVMLError_NotFound()
        return [(p, latest) for p in busy]

    def nvmlDeviceGetProcessUtilization(self, handle: Any, timeStamp: int) -> list[Any]:  # noqa: N803 (pynvml's name)
        with self._state.lock:
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
        with self._state.lock:
            if int(self._state.spec.driver_version.split(".")[0]) < PROCESSES_UTILIZATION_INFO_DRIVER:
                self._state.calls[("nvmlDeviceGetProcessesUtilizationInfo", self._state.device(handle)[0])] += 1
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
