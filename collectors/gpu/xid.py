"""XID errors: the thread that waits for NVML's XID events, and their counts per GPU and
code, kept across NVML sessions (they are counters).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

import pynvml

from lockstep.collectors.gpu.metrics import LAST_XID, XID_ERRORS
from lockstep.collectors.gpu.nvml import UNSUPPORTED, error_name, handle_address
from lockstep.collectors.gpu.provider import NvmlProvider
from lockstep.collectors.gpu.state import GpuState, Sample


class XidCounts:
    """XID errors per (GPU UUID, XID code) and the time of each GPU's last one, kept across
    NVML sessions (they are counters): the listener thread records, the round reads."""

    def __init__(self, wall_clock: Callable[[], float], run_now: Callable[[], None]) -> None:
        self._wall_clock = wall_clock
        self._run_now = run_now
        self._xid_counts: dict[tuple[str, int], int] = {}
        self._xid_last: dict[str, float] = {}
        self._xid_lock = threading.Lock()

    def record(self, uuid: str, xid: int) -> None:
        """Called by the listener thread for each XID event."""
        with self._xid_lock:
            self._xid_counts[(uuid, xid)] = self._xid_counts.get((uuid, xid), 0) + 1
            self._xid_last[uuid] = self._wall_clock()
        # A round now, not at the next interval: an XID often means the GPU is failing (79: it
        # fell off the bus), and on-call should see its state at once.
        self._run_now()

    def samples(self, gpus: Sequence[GpuState]) -> list[Sample]:
        index_of = {g.uuid: str(g.index) for g in gpus}
        with self._xid_lock:
            counts = sorted(self._xid_counts.items())
            last = sorted(self._xid_last.items())
        out: list[Sample] = [(XID_ERRORS, (index_of.get(uuid, ""), uuid, str(xid)), n) for (uuid, xid), n in counts]
        out += [(LAST_XID, (index_of.get(uuid, ""), uuid), at) for uuid, at in last]
        return out


class XidListener:
    """The thread that waits for XID events and counts them in ``XidCounts``.

    It registers every answering GPU for XID events in one event set and waits on it.  A
    timeout is the normal idle case.  Any other error (a GPU lost, a set gone bad) frees
    the set and registers again after a backoff, skipping GPUs that no longer answer.
    """

    def __init__(
        self,
        xids: XidCounts,
        nvml: NvmlProvider,
        gpus: Sequence[GpuState],
        log: logging.Logger,
        wait_ms: int,
        backoff: tuple[float, float],
    ) -> None:
        self.xids = xids
        self.nvml = nvml
        self.gpus = {handle_address(g.handle): g for g in gpus}
        self.wait_ms = wait_ms  # per wait in NVML, so that a stop is noticed within it
        self.backoff = backoff  # (initial, maximum) seconds before registering again after an error
        self.ready = threading.Event()  # the first registration and drain are done
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpu-xid-listener", daemon=True)
        self.log = log

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float) -> bool:
        self._stop.set()
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        initial, maximum = self.backoff
        backoff = initial
        last_problem = ""
        while not self._stop.is_set():
            event_set = None
            try:
                event_set = self.nvml.nvmlEventSetCreate()
                registered = self._register(event_set)
                if not registered:
                    self.log.info("no GPU here reports XID events: XID counters unavailable")
                    return
                self._wait(event_set, 0)  # drain what is already there, then say we are listening
                self.ready.set()
                backoff, last_problem = initial, ""
                while not self._stop.is_set():
                    self._wait(event_set, self.wait_ms)
            except pynvml.NVMLError as exc:
                problem = error_name(exc)
                if problem != last_problem:
                    self.log.info("XID listener: %s; registering again in %gs", exc, backoff)
                    last_problem = problem
            finally:
                self.ready.set()
                if event_set is not None:
                    try:
                        self.nvml.nvmlEventSetFree(event_set)
                    except pynvml.NVMLError:
                        pass
            self._stop.wait(backoff)
            backoff = min(backoff * 2, maximum)

    def _register(self, event_set: Any) -> list[GpuState]:
        """Register every GPU that answers; raise if none does but some may later."""
        registered = []
        failure: pynvml.NVMLError | None = None
        for gpu in self.gpus.values():
            try:
                self.nvml.nvmlDeviceRegisterEvents(gpu.handle, pynvml.nvmlEventTypeXidCriticalError, event_set)
                registered.append(gpu)
            except UNSUPPORTED:
                gpu.unsupported.add("nvmlDeviceRegisterEvents")
            except pynvml.NVMLError as exc:
                self.log.debug("GPU %d: not registered for XID events: %s", gpu.index, exc)
                failure = exc
        if not registered and failure is not None:
            raise failure
        return registered

    def _wait(self, event_set: Any, timeout_ms: int) -> None:
        """Wait for events until a timeout (returns) or an error (raises)."""
        while not self._stop.is_set():
            try:
                data = self.nvml.nvmlEventSetWait_v2(event_set, timeout_ms)
            except pynvml.NVMLError_Timeout:
                return
            if data.eventType & pynvml.nvmlEventTypeXidCriticalError:
                gpu = self.gpus.get(handle_address(data.device))
                xid = int(data.eventData)
                self.log.warning("XID %d on GPU %s", xid, "?" if gpu is None else f"{gpu.index} ({gpu.uuid})")
                self.xids.record("" if gpu is None else gpu.uuid, xid)
