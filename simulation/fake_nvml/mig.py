"""The fake NVML's MIG calls: a GPU with MIG devices in its spec is in MIG mode, and each MIG
device has its own handle, UUID, memory and GPU/compute instance ids.
"""

from __future__ import annotations

from typing import Any

import pynvml

from lockstep.simulation.fake_nvml.state import FakeState


class Mig:
    """MIG mode and the MIG devices of the GPUs."""

    def __init__(self, state: FakeState) -> None:
        self._state = state

    def nvmlDeviceGetMigMode(self, handle: Any) -> list[int]:
        with self._state.lock:
            _, gpu = self._state.gpu(handle, "nvmlDeviceGetMigMode")
            mode = pynvml.NVML_DEVICE_MIG_ENABLE if gpu.mig_devices else pynvml.NVML_DEVICE_MIG_DISABLE
            return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any) -> int:
        with self._state.lock:
            _, gpu = self._state.gpu(handle, "nvmlDeviceGetMaxMigDeviceCount")
            return 7 if gpu.mig_devices else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, mig_index: int) -> Any:
        with self._state.lock:
            index, gpu = self._state.gpu(handle, "nvmlDeviceGetMigDeviceHandleByIndex")
            if not gpu.mig_devices:
                raise pynvml.NVMLError_InvalidArgument()
            if not 0 <= mig_index < len(gpu.mig_devices):
                raise pynvml.NVMLError_NotFound()
            return pynvml.c_nvmlDevice_t(self._state.mig_structs[(index, mig_index)])

    def nvmlDeviceGetGpuInstanceId(self, handle: Any) -> int:
        with self._state.lock:
            _, _, mig = self._state.mig(handle, "nvmlDeviceGetGpuInstanceId")
            if mig is None:
                raise pynvml.NVMLError_InvalidArgument()
            return mig.gpu_instance_id

    def nvmlDeviceGetComputeInstanceId(self, handle: Any) -> int:
        with self._state.lock:
            _, _, mig = self._state.mig(handle, "nvmlDeviceGetComputeInstanceId")
            if mig is None:
                raise pynvml.NVMLError_InvalidArgument()
            return mig.compute_instance_id
