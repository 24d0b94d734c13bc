"""The fake NVML's shared state, which every area of the fake library reads and changes under
one lock: the spec, the fake's time, the GPUs on the bus and those lost, the XID events
scheduled and happened, the event sets, the failures a test asked for, the device handles,
and the count of every call.

``enter`` is the gate every fake NVML call passes first: it counts the call, waits while NVML
hangs, and raises what NVML would raise before answering (an injected failure, an
uninitialised library, a lost GPU, an unsupported call).
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pynvml

from lockstep.simulation.fake_nvml.capabilities import XID_FALLEN_OFF_THE_BUS
from lockstep.simulation.fake_nvml.spec import FakeSpec, GpuSpec, MigDeviceSpec


@dataclass
class XidEvent:
    gpu: int
    xid: int
    at: float
    loses_gpu: bool = False
    # When it happened, on the fake's sequence of happenings (registrations and events);
    # None while a scheduled event is still due.  A set gets the events that happened
    # after it registered the GPU.
    seq: int | None = None


@dataclass
class EventSet:
    registered: dict[int, int] = field(default_factory=dict)  # gpu -> sequence number of its registration
    delivered: set[int] = field(default_factory=set)  # sequence numbers of the events already delivered


@dataclass
class InjectedFailure:
    error: type[pynvml.NVMLError]
    gpu: int | None
    times: int


def address(handle: Any) -> int:
    """A ctypes handle's address: how the fake finds the device, sample or event set it points at."""
    found = ctypes.cast(handle, ctypes.c_void_p).value
    if found is None:
        raise ValueError("null handle")
    return found


class FakeState:
    """Everything the areas of the fake library share (see the module docstring)."""

    def __init__(self, spec: FakeSpec, real_time: bool) -> None:
        self.spec = spec
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)  # an event arrived or time moved
        self._started = time.monotonic()
        self.real_time = real_time
        self.manual_t = 0.0  # the time set_time gave (without real_time)
        self.refcount = 0  # nvmlInit .. nvmlShutdown nesting
        self.lost: set[int] = set()
        self.restored: set[int] = set()  # back after a loss: their lost_at no longer applies
        self.present = list(range(len(spec.gpus)))  # spec positions of the GPUs on the bus
        self.events: list[XidEvent] = [XidEvent(e.gpu, e.xid, e.at) for e in spec.xid_events]
        self.events += [
            XidEvent(i, XID_FALLEN_OFF_THE_BUS, g.lost_at, loses_gpu=True)
            for i, g in enumerate(spec.gpus)
            if g.lost_at is not None
        ]
        self._seq = 0
        self.event_sets: dict[int, EventSet] = {}  # by the address of the set's handle
        self.failures: dict[str, list[InjectedFailure]] = {}
        self.calls: Counter[tuple[str, int | None]] = Counter()
        # Real ctypes handles, kept alive here: the collector may compare their addresses.
        self._device_structs = [pynvml.struct_c_nvmlDevice_t() for _ in spec.gpus]
        self.handles = [pynvml.c_nvmlDevice_t(s) for s in self._device_structs]
        self.mig_structs = {
            (i, m): pynvml.struct_c_nvmlDevice_t() for i, g in enumerate(spec.gpus) for m in range(len(g.mig_devices))
        }
        self._by_address: dict[int, tuple[int, int | None]] = {
            address(h): (i, None) for i, h in enumerate(self.handles)
        }
        self._by_address.update({ctypes.addressof(s): key for key, s in self.mig_structs.items()})
        self.unsupported = [g.unsupported_names() for g in spec.gpus]
        self._slow_call_done = False

    @property
    def t(self) -> float:
        return time.monotonic() - self._started if self.real_time else self.manual_t

    def next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def happen(self, t: float, inclusive: bool) -> None:
        """Scheduled events due before t (or at t, if inclusive) happen now."""
        for event in self.events:
            if event.seq is None and (event.at < t or (inclusive and event.at == t)):
                event.seq = self.next_seq()

    def enter(self, function: str, gpu: int | None = None, needs_init: bool = True) -> None:
        """Count the call, wait while NVML hangs, and raise what NVML would raise before answering it."""
        self.calls[(function, gpu)] += 1
        while self._hanging():
            self.changed.wait()  # releases the lock: time goes on, other callers hang too
        slow_at = self.spec.slow_call_at
        if slow_at is not None and self.t >= slow_at and not self._slow_call_done:
            self._slow_call_done = True
            until = time.monotonic() + self.spec.slow_call_seconds
            while (left := until - time.monotonic()) > 0:
                self.changed.wait(left)
        for failure in self.failures.get(function, []):
            if failure.times > 0 and failure.gpu in (None, gpu):
                failure.times -= 1
                raise failure.error()
        if needs_init and self.refcount == 0:
            raise pynvml.NVMLError_Uninitialized()
        if gpu is not None:
            if self.gone(gpu):
                raise pynvml.NVMLError_GpuIsLost()
            if function in self.unsupported[gpu]:
                raise pynvml.NVMLError_NotSupported()

    def _hanging(self) -> bool:
        start, end = self.spec.hang_from, self.spec.hang_until
        return start is not None and self.t >= start and (end is None or self.t < end)

    def gone(self, gpu: int) -> bool:
        """Lost: by lose_gpu, by delivering its XID 79, or past its lost_at (strictly: at lost_at
        it still answers until its XID 79 has been read, so a listener registered by then gets it)."""
        lost_at = self.spec.gpus[gpu].lost_at
        if lost_at is not None and self.t > lost_at and gpu not in self.restored:
            self.lost.add(gpu)
        return gpu in self.lost

    def device(self, handle: Any) -> tuple[int, int | None]:
        """(GPU's spec position, MIG device's position or None) of a device handle."""
        try:
            return self._by_address[address(handle)]
        except (KeyError, TypeError, ValueError):
            raise pynvml.NVMLError_InvalidArgument() from None

    def gpu(self, handle: Any, function: str) -> tuple[int, GpuSpec]:
        """The GPU a call is about, once the call has passed ``enter``."""
        index, mig = self.device(handle)
        self.enter(function, index)
        if mig is not None:
            raise pynvml.NVMLError_NotSupported()  # GPU-level queries are not answered for a MIG device
        return index, self.spec.gpus[index]

    def mig(self, handle: Any, function: str) -> tuple[int, GpuSpec, MigDeviceSpec | None]:
        """The GPU and MIG device (None for a whole GPU's handle) a call is about."""
        index, mig = self.device(handle)
        self.enter(function, index)
        gpu = self.spec.gpus[index]
        return index, gpu, None if mig is None else gpu.mig_devices[mig]

    def since_load(self, gpu: GpuSpec, rate: float) -> float:
        """A counter that has grown at ``rate`` per second since the driver was loaded."""
        return rate * (gpu.driver_uptime_seconds + self.t)
