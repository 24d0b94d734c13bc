"""The fake NVML's library life (init and shutdown, reference counted) and its GPUs' identity:
count, handles, UUID, name, PCI info, minor number, VBIOS version.
"""

from __future__ import annotations

from typing import Any

import pynvml

from lockstep.simulation.fake_nvml.state import FakeState


class Devices:
    """nvmlInit .. nvmlShutdown, the driver version and what identifies each GPU."""

    def __init__(self, state: FakeState) -> None:
        self._state = state

    # --- library life ---

    def nvmlInit(self) -> None:
        with self._state.lock:
            self._state.enter("nvmlInit", needs_init=False)
            if not self._state.spec.driver_loaded:
                raise pynvml.NVMLError_DriverNotLoaded()
            self._state.refcount += 1

    def nvmlShutdown(self) -> None:
        with self._state.lock:
            self._state.enter("nvmlShutdown")
            self._state.refcount -= 1
            if self._state.refcount == 0:
                self._state.event_sets.clear()
                self._state.changed.notify_all()

    def nvmlSystemGetDriverVersion(self) -> str:
        with self._state.lock:
            self._state.enter("nvmlSystemGetDriverVersion")
            return self._state.spec.driver_version

    # --- identity ---

    def nvmlDeviceGetCount(self) -> int:
        with self._state.lock:
            self._state.enter("nvmlDeviceGetCount")
            return len(self._state.present)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        """NVML indexes the GPUs present; ``calls`` counts by the GPU's position in the spec."""
        with self._state.lock:
            if not 0 <= index < len(self._state.present):
                self._state.enter("nvmlDeviceGetHandleByIndex")
                raise pynvml.NVMLError_InvalidArgument()
            gpu = self._state.present[index]
            self._state.enter("nvmlDeviceGetHandleByIndex", gpu)
            return self._state.handles[gpu]

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        with self._state.lock:
            _, gpu, mig = self._state.mig(handle, "nvmlDeviceGetUUID")
            return mig.uuid if mig else gpu.uuid

    def nvmlDeviceGetName(self, handle: Any) -> str:
        with self._state.lock:
            _, gpu, mig = self._state.mig(handle, "nvmlDeviceGetName")
            return f"{gpu.model} MIG {mig.profile}" if mig else gpu.model

    def nvmlDeviceGetPciInfo(self, handle: Any) -> pynvml.nvmlPciInfo_t:
        with self._state.lock:
            _, gpu = self._state.gpu(handle, "nvmlDeviceGetPciInfo")
            info = pynvml.nvmlPciInfo_t()
            domain, bus, rest = gpu.pci_bus_id.split(":")
            info.busId = gpu.pci_bus_id.encode()
            info.busIdLegacy = f"{int(domain, 16):04X}:{bus}:{rest}".encode()
            info.domain, info.bus, info.device = int(domain, 16), int(bus, 16), int(rest.split(".")[0], 16)
            info.pciDeviceId = 0x233010DE  # device 0x2330 (H100 SXM5), vendor 0x10de
            return info

    def nvmlDeviceGetMinorNumber(self, handle: Any) -> int:
        with self._state.lock:
            _, gpu = self._state.gpu(handle, "nvmlDeviceGetMinorNumber")
            return gpu.minor_number or 0

    def nvmlDeviceGetVbiosVersion(self, handle: Any) -> str:
        with self._state.lock:
            return self._state.gpu(handle, "nvmlDeviceGetVbiosVersion")[1].vbios_version
