"""The fake NVML's XID events: event sets, registering GPUs in them, and waiting for the events
that happened after a GPU was registered (as NVML: events before registration are lost).
"""

from __future__ import annotations

import time
from typing import Any

import pynvml

from lockstep.simulation.fake_nvml.capabilities import UINT_MAX
from lockstep.simulation.fake_nvml.state import EventSet, FakeState, address


class XidEvents:
    """The event set calls; the sets themselves are in the shared state (nvmlShutdown ends them)."""

    def __init__(self, state: FakeState) -> None:
        self._state = state

    def nvmlEventSetCreate(self) -> Any:
        with self._state.lock:
            self._state.enter("nvmlEventSetCreate")
            handle = pynvml.c_nvmlEventSet_t(pynvml.struct_c_nvmlEventSet_t())  # keeps its struct alive
            self._state.event_sets[address(handle)] = EventSet()
            return handle

    def _event_set(self, event_set: Any) -> EventSet:
        found = self._state.event_sets.get(address(event_set))
        if found is None:
            raise pynvml.NVMLError_InvalidArgument()
        return found

    def nvmlDeviceRegisterEvents(self, handle: Any, event_types: int, event_set: Any) -> None:
        with self._state.lock:
            index, _ = self._state.gpu(handle, "nvmlDeviceRegisterEvents")
            if event_types & ~pynvml.nvmlEventTypeXidCriticalError:
                raise pynvml.NVMLError_NotSupported()  # this fake only has XID events
            self._event_set(event_set).registered[index] = self._state.next_seq()

    def nvmlEventSetWait_v2(self, event_set: Any, timeout_ms: int) -> pynvml.c_nvmlEventData_t:
        deadline = time.monotonic() + timeout_ms / 1000
        with self._state.lock:
            self._state.enter("nvmlEventSetWait_v2")
            while True:
                if self._state.refcount == 0:
                    raise pynvml.NVMLError_Uninitialized()  # NVML was shut down during the wait
                state = self._event_set(event_set)
                self._state.happen(self._state.t, inclusive=True)
                for event in self._state.events:
                    registered = state.registered.get(event.gpu)
                    if (
                        event.seq is None
                        or event.seq in state.delivered
                        or registered is None
                        or registered > event.seq
                        or (event.gpu in self._state.lost and not event.loses_gpu)
                    ):
                        continue
                    state.delivered.add(event.seq)
                    if event.loses_gpu:
                        self._state.lost.add(event.gpu)
                    data = pynvml.c_nvmlEventData_t()
                    data.device = self._state.handles[event.gpu]
                    data.eventType = pynvml.nvmlEventTypeXidCriticalError
                    data.eventData = event.xid
                    data.gpuInstanceId = data.computeInstanceId = UINT_MAX
                    return data
                if any(self._state.gone(gpu) for gpu in state.registered):
                    raise pynvml.NVMLError_GpuIsLost()
                remaining = deadline - time.monotonic()
                if self._state.real_time:
                    future = [e.at - self._state.t for e in self._state.events if e.seq is None]
                    if future:
                        remaining = min(remaining, min(future) + 0.001)
                if deadline - time.monotonic() <= 0:
                    raise pynvml.NVMLError_Timeout()
                self._state.changed.wait(max(0.0, remaining))

    def nvmlEventSetFree(self, event_set: Any) -> None:
        with self._state.lock:
            self._state.enter("nvmlEventSetFree")
            self._event_set(event_set)
            del self._state.event_sets[address(event_set)]
            self._state.changed.notify_all()
