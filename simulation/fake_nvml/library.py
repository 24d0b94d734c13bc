"""The fake NVML library: ``FakeNvml``, the object the GPU collector calls as it would call
pynvml, made of one part per area of NVML over one shared state (state.py):

- devices.py: library life and the GPUs' identity;
- measurements.py: utilization, memory, clocks, power, temperature, PCIe link, NVLink state, fabric;
- processes.py: compute processes and their utilisation samples;
- fields.py: ``nvmlDeviceGetFieldValues``;
- gpm.py: GPU Performance Monitoring;
- mig.py: MIG mode and MIG devices;
- events.py: XID event sets.

Each ``nvml*`` method here hands the call to its area.  The other methods are the controls
tests and the simulated node use (time, losing and restoring GPUs, XIDs, failures, call counts).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pynvml

from lockstep.collectors.gpu.provider import NvmlProvider
from lockstep.simulation.fake_nvml.capabilities import XID_FALLEN_OFF_THE_BUS
from lockstep.simulation.fake_nvml.devices import Devices
from lockstep.simulation.fake_nvml.events import XidEvents
from lockstep.simulation.fake_nvml.fields import FieldValues
from lockstep.simulation.fake_nvml.gpm import Gpm
from lockstep.simulation.fake_nvml.measurements import Measurements
from lockstep.simulation.fake_nvml.mig import Mig
from lockstep.simulation.fake_nvml.processes import Processes
from lockstep.simulation.fake_nvml.spec import FakeSpec, GpuSpec, with_defaults
from lockstep.simulation.fake_nvml.spec_yaml import load_spec
from lockstep.simulation.fake_nvml.state import FakeState, InjectedFailure, XidEvent


class FakeNvml:
    """The fake library.  Use its ``nvml*`` methods where the collector would use pynvml's."""

    def __init__(self, spec: FakeSpec, real_time: bool = False) -> None:
        self._state = FakeState(spec, real_time)
        self._devices = Devices(self._state)
        self._measurements = Measurements(self._state)
        self._processes = Processes(self._state)
        self._fields = FieldValues(self._state)
        self.gpm = Gpm(self._state)  # tests look at its sample buffers
        self._mig = Mig(self._state)
        self._events = XidEvents(self._state)

    # --- controls for tests and the simulated node ---

    @property
    def spec(self) -> FakeSpec:
        return self._state.spec

    @spec.setter
    def spec(self, spec: FakeSpec) -> None:
        """Serve a changed spec from now on (the same GPUs: handles and capabilities stay as made)."""
        self._state.spec = spec

    @property
    def calls(self) -> Counter[tuple[str, int | None]]:
        """Every call counted: (function, GPU's spec position or None for calls about no GPU) -> count."""
        return self._state.calls

    @property
    def field_requests(self) -> Counter[tuple[int, str]]:
        """How often each field was asked for in nvmlDeviceGetFieldValues: (gpu, field name) -> count."""
        return self._fields.requests

    @property
    def t(self) -> float:
        """The fake's time (seconds): set by set_time, or since the fake was made with real_time."""
        return self._state.t

    def set_time(self, t: float) -> None:
        with self._state.lock:
            self._state.manual_t = t
            # Scheduled events now in the past have happened, listened to or not.  One due at
            # exactly t happens at the next wait, so a set registered at t still gets it.
            self._state.happen(t, inclusive=False)
            self._state.changed.notify_all()

    def lose_gpu(self, index: int) -> None:
        """The GPU falls off the bus now: XID 79 to the event sets it is in, then GPU_IS_LOST."""
        with self._state.lock:
            lost = XidEvent(index, XID_FALLEN_OFF_THE_BUS, self._state.t, loses_gpu=True, seq=self._state.next_seq())
            self._state.events.append(lost)
            self._state.lost.add(index)
            self._state.changed.notify_all()

    def remove_gpu(self, index: int) -> None:
        """The GPU is gone from the PCI bus: lost, and no longer counted (later GPUs' NVML
        indexes shift down).  ``index`` is its position in the spec."""
        with self._state.lock:
            self.lose_gpu(index)
            self._state.present.remove(index)

    def restore_gpu(self, index: int) -> None:
        """The GPU is back (e.g. after a reset or a PCI rescan): calls on it answer again."""
        with self._state.lock:
            if index not in self._state.present:
                self._state.present = sorted([*self._state.present, index])
            self._state.lost.discard(index)
            self._state.restored.add(index)
            self._state.events = [e for e in self._state.events if not (e.loses_gpu and e.gpu == index)]

    def inject_xid(self, index: int, xid: int) -> None:
        with self._state.lock:
            self._state.events.append(XidEvent(index, xid, self._state.t, seq=self._state.next_seq()))
            self._state.changed.notify_all()

    def fail(self, function: str, error: type[pynvml.NVMLError], gpu: int | None = None, times: int = 1) -> None:
        """Make the next ``times`` calls of ``function`` (on ``gpu``, or any) raise ``error``."""
        with self._state.lock:
            self._state.failures.setdefault(function, []).append(InjectedFailure(error, gpu, times))

    def fail_field(self, gpu: int, field_name: str, code: int) -> None:
        """From now on, answer the field (an NVML_FI_* name) on ``gpu`` with this NVML return code."""
        with self._state.lock:
            self._fields.failures[(gpu, field_name)] = code

    def fail_gpm_metric(self, gpu: int, metric_name: str, code: int) -> None:
        """From now on, answer the GPM metric (an NVML_GPM_METRIC_* name) of ``gpu`` in
        ``nvmlGpmMetricsGet`` with this NVML return code (the call itself succeeds)."""
        with self._state.lock:
            self.gpm.metric_failures[(gpu, getattr(pynvml, metric_name))] = code

    def calls_for(self, gpu: int | None = None, function: str | None = None) -> int:
        """Calls counted so far, on one GPU and/or of one function (None: all)."""
        return sum(n for (f, g), n in self._state.calls.items() if gpu in (None, g) and function in (None, f))

    def reset_calls(self) -> None:
        with self._state.lock:
            self._state.calls.clear()
            self._fields.requests.clear()

    # --- Library life and identity (devices.py) ---

    def nvmlInit(self) -> None:
        self._devices.nvmlInit()

    def nvmlShutdown(self) -> None:
        self._devices.nvmlShutdown()

    def nvmlSystemGetDriverVersion(self) -> str:
        return self._devices.nvmlSystemGetDriverVersion()

    def nvmlDeviceGetCount(self) -> int:
        return self._devices.nvmlDeviceGetCount()

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        return self._devices.nvmlDeviceGetHandleByIndex(index)

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        return self._devices.nvmlDeviceGetUUID(handle)

    def nvmlDeviceGetName(self, handle: Any) -> str:
        return self._devices.nvmlDeviceGetName(handle)

    def nvmlDeviceGetPciInfo(self, handle: Any) -> pynvml.nvmlPciInfo_t:
        return self._devices.nvmlDeviceGetPciInfo(handle)

    def nvmlDeviceGetMinorNumber(self, handle: Any) -> int:
        return self._devices.nvmlDeviceGetMinorNumber(handle)

    def nvmlDeviceGetVbiosVersion(self, handle: Any) -> str:
        return self._devices.nvmlDeviceGetVbiosVersion(handle)

    # --- Measurements (measurements.py) ---

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> pynvml.c_nvmlUtilization_t:
        return self._measurements.nvmlDeviceGetUtilizationRates(handle)

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> pynvml.c_nvmlMemory_t:
        return self._measurements.nvmlDeviceGetMemoryInfo(handle)

    def nvmlDeviceGetClockInfo(self, handle: Any, clock_type: int) -> int:
        return self._measurements.nvmlDeviceGetClockInfo(handle, clock_type)

    def nvmlDeviceGetMaxClockInfo(self, handle: Any, clock_type: int) -> int:
        return self._measurements.nvmlDeviceGetMaxClockInfo(handle, clock_type)

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        return self._measurements.nvmlDeviceGetPowerUsage(handle)

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int:
        return self._measurements.nvmlDeviceGetEnforcedPowerLimit(handle)

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        return self._measurements.nvmlDeviceGetTemperature(handle, sensor)

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        return self._measurements.nvmlDeviceGetCurrentClocksEventReasons(handle)

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: Any) -> int:
        return self._measurements.nvmlDeviceGetCurrPcieLinkGeneration(handle)

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: Any) -> int:
        return self._measurements.nvmlDeviceGetCurrPcieLinkWidth(handle)

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: Any) -> int:
        return self._measurements.nvmlDeviceGetMaxPcieLinkGeneration(handle)

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: Any) -> int:
        return self._measurements.nvmlDeviceGetMaxPcieLinkWidth(handle)

    def nvmlDeviceGetNvLinkState(self, handle: Any, link: int) -> int:
        return self._measurements.nvmlDeviceGetNvLinkState(handle, link)

    def nvmlDeviceGetGpuFabricInfoV(self, handle: Any, info_ref: Any) -> int:
        return self._measurements.nvmlDeviceGetGpuFabricInfoV(handle, info_ref)

    # --- Compute processes (processes.py) ---

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        return self._processes.nvmlDeviceGetComputeRunningProcesses(handle)

    def nvmlDeviceGetProcessUtilization(self, handle: Any, timeStamp: int) -> list[Any]:  # noqa: N803 (pynvml's name)
        return self._processes.nvmlDeviceGetProcessUtilization(handle, timeStamp)

    def nvmlDeviceGetProcessesUtilizationInfo(self, handle: Any, timeStamp: int) -> list[Any]:  # noqa: N803
        return self._processes.nvmlDeviceGetProcessesUtilizationInfo(handle, timeStamp)

    # --- Field values (fields.py) ---

    def nvmlDeviceGetFieldValues(self, handle: Any, field_ids: Sequence[int | tuple[int, int]]) -> Any:
        return self._fields.nvmlDeviceGetFieldValues(handle, field_ids)

    # --- GPM (gpm.py) ---

    def nvmlGpmQueryDeviceSupport(self, handle: Any) -> Any:
        return self.gpm.nvmlGpmQueryDeviceSupport(handle)

    def nvmlGpmSampleAlloc(self) -> Any:
        return self.gpm.nvmlGpmSampleAlloc()

    def nvmlGpmSampleFree(self, sample: Any) -> None:
        self.gpm.nvmlGpmSampleFree(sample)

    def nvmlGpmSampleGet(self, handle: Any, sample: Any) -> Any:
        return self.gpm.nvmlGpmSampleGet(handle, sample)

    def nvmlGpmMigSampleGet(self, handle: Any, gpu_instance_id: int, sample: Any) -> Any:
        return self.gpm.nvmlGpmMigSampleGet(handle, gpu_instance_id, sample)

    def nvmlGpmMetricsGet(self, request: Any) -> Any:
        return self.gpm.nvmlGpmMetricsGet(request)

    # --- MIG (mig.py) ---

    def nvmlDeviceGetMigMode(self, handle: Any) -> list[int]:
        return self._mig.nvmlDeviceGetMigMode(handle)

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any) -> int:
        return self._mig.nvmlDeviceGetMaxMigDeviceCount(handle)

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, mig_index: int) -> Any:
        return self._mig.nvmlDeviceGetMigDeviceHandleByIndex(handle, mig_index)

    def nvmlDeviceGetGpuInstanceId(self, handle: Any) -> int:
        return self._mig.nvmlDeviceGetGpuInstanceId(handle)

    def nvmlDeviceGetComputeInstanceId(self, handle: Any) -> int:
        return self._mig.nvmlDeviceGetComputeInstanceId(handle)

    # --- XID events (events.py) ---

    def nvmlEventSetCreate(self) -> Any:
        return self._events.nvmlEventSetCreate()

    def nvmlDeviceRegisterEvents(self, handle: Any, event_types: int, event_set: Any) -> None:
        self._events.nvmlDeviceRegisterEvents(handle, event_types, event_set)

    def nvmlEventSetWait_v2(self, event_set: Any, timeout_ms: int) -> pynvml.c_nvmlEventData_t:
        return self._events.nvmlEventSetWait_v2(event_set, timeout_ms)

    def nvmlEventSetFree(self, event_set: Any) -> None:
        self._events.nvmlEventSetFree(event_set)


def fake_from_gpus(gpus: Iterable[GpuSpec], **spec: Any) -> FakeNvml:
    """A manual-clock fake from GPU specs (identity filled in from their positions)."""
    return FakeNvml(FakeSpec(gpus=tuple(with_defaults(g, i) for i, g in enumerate(gpus)), **spec))


def from_spec_file(path: Path | str) -> NvmlProvider:
    """The fake NVML of ``lockstep run|once|doctor --gpu.fake-nvml SPEC``: the spec file loaded
    and checked (FakeSpecError names file:line), its counters running with real time.

    Typed as the GPU collector's ``NvmlProvider``: mypy checks here that the fake conforms."""
    return FakeNvml(load_spec(path), real_time=True)
