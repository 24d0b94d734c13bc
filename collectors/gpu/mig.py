"""MIG devices of a GPU in MIG mode: their identity (cached per MIG UUID) and memory, and
which of the GPU's compute processes run in each.
"""

from __future__ import annotations

from collections.abc import Sequence

import pynvml

from lockstep.agent.gpus import GpuProcess, MigDevice
from lockstep.collectors.gpu.calls import NvmlCalls
from lockstep.collectors.gpu.metrics import MIG_INFO, MIG_MEMORY_TOTAL, MIG_MEMORY_USED, MIG_PROCESSES
from lockstep.collectors.gpu.nvml import GPU_GONE, LIFECYCLE, text
from lockstep.collectors.gpu.provider import NvmlProvider
from lockstep.collectors.gpu.state import GpuState, Sample


def read_mig(
    calls: NvmlCalls,
    nvml: NvmlProvider,
    gpu: GpuState,
    out: list[Sample],
    processes: Sequence[GpuProcess],
) -> tuple[MigDevice, ...]:
    """The GPU's MIG devices and their memory (samples appended to ``out``).  Utilization is
    not available per MIG device (it would need GPM), so it is omitted rather than faked."""
    count = calls.optional(gpu, "nvmlDeviceGetMaxMigDeviceCount", nvml.nvmlDeviceGetMaxMigDeviceCount, gpu.handle)
    devices = []
    for slot in range(count or 0):
        try:
            mig_handle = nvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu.handle, slot)
        except pynvml.NVMLError_NotFound:
            continue  # an empty slot
        except GPU_GONE + LIFECYCLE:
            raise
        except pynvml.NVMLError as exc:
            calls.count_error(gpu, exc)
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
            calls.count_error(gpu, exc)
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
