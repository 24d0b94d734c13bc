"""The NVML session: initialisation and shutdown, the GPUs it finds (a GPU that does not
answer is kept, reported down), re-initialisation with backoff after a lost GPU or a
lifecycle error, and re-discovery at once when a PCI hotplug event concerns an NVIDIA GPU.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import pynvml

from lockstep.agent.collector import NothingHere
from lockstep.collectors.gpu.calls import NvmlCalls
from lockstep.collectors.gpu.fields import DEVICE_FIELDS, LINK_FIELDS, NVLINK_TOTAL_FIELDS
from lockstep.collectors.gpu.gpm import first_sample, free_gpm, start_gpm
from lockstep.collectors.gpu.nvml import (
    GPU_GONE,
    LIFECYCLE,
    driver_major,
    field_id,
    field_number,
    pci_key,
    text,
)
from lockstep.collectors.gpu.provider import NvmlProvider
from lockstep.collectors.gpu.state import GpuState
from lockstep.collectors.gpu.xid import XidCounts, XidListener


@dataclass
class Session:
    """One nvmlInit .. nvmlShutdown."""

    nvml: NvmlProvider
    driver_version: str
    gpus: list[GpuState]
    listener: XidListener | None = None
    reinit_wanted: bool = False


@dataclass(frozen=True)
class SessionTimings:
    """How long the session manager waits (seconds, unless named otherwise)."""

    # Re-initialisation backoff: doubles after each attempt that still finds a problem, back
    # to the start once all GPUs answer.
    reinit_backoff_initial: float
    reinit_backoff_max: float
    # The XID listener's wait per call into NVML, and its backoff (initial, maximum) after an error.
    listener_wait_ms: int
    listener_backoff: tuple[float, float]


class NvmlSessions:
    """The GPU collector's NVML sessions: the current one, when to open the next, and what is
    known of the GPUs across sessions."""

    def __init__(
        self,
        nvml: NvmlProvider,
        calls: NvmlCalls,
        xids: XidCounts,
        timings: SessionTimings,
        log: logging.Logger,
        gpm_clock: Callable[[], float],
    ) -> None:
        self.nvml = nvml  # pynvml, or the fake NVML of Seams.nvml
        self.calls = calls
        self.xids = xids  # the XID counts, kept across sessions; each session's listener records into them
        self.timings = timings
        self.log = log
        self.gpm_clock = gpm_clock  # the clock GPM's sample spacing is measured on (gpm.py)
        self.session: Session | None = None
        self._retry_at = 0.0  # monotonic time before which NVML is not re-initialised
        self.retry_delay = timings.reinit_backoff_initial
        self._broken = ""  # why the last attempt to use NVML as a whole failed
        self._rediscover = threading.Event()  # set by a hotplug event
        # Identity of the GPUs seen, kept across sessions: by NVML index (to label a GPU that
        # is lost when NVML is initialised) and by UUID (to report one that vanished).
        self._known: dict[int, GpuState] = {}
        self._seen: dict[str, GpuState] = {}
        self._known_pci: set[tuple[int, int, int, int]] = set()

    # --- NVML session ---

    def _start_session(self) -> Session:
        nvml = self.nvml
        try:
            nvml.nvmlInit()
        except pynvml.NVMLError_LibraryNotFound:
            raise NothingHere("libnvidia-ml.so.1 not found (no NVIDIA driver installed): no GPUs to collect") from None
        except pynvml.NVMLError_DriverNotLoaded:
            raise NothingHere("the NVIDIA kernel driver is not loaded (NVML: Driver Not Loaded)") from None
        gpus: list[GpuState] = []
        try:
            count = nvml.nvmlDeviceGetCount()
            if count == 0:
                raise NothingHere("NVML found no GPUs")
            driver = text(nvml.nvmlSystemGetDriverVersion())
            driver_numbering = driver_major(driver)
            for index in range(count):
                gpus.append(self._enumerate(nvml, index, driver_numbering))
        except BaseException:
            self._free_gpm(nvml, gpus)  # those enumerated before the failure
            self._shutdown(nvml)
            raise
        # A GPU seen before that NVML no longer lists (removed from the bus) stays reported down.
        listed = {g.uuid for g in gpus}
        for uuid, seen in self._seen.items():
            if uuid not in listed:
                gone = GpuState(index=seen.index, handle=None, uuid=uuid, pci_bus_id=seen.pci_bus_id, lost=True)
                gone.minor_number, gone.model, gone.vbios_version = seen.minor_number, seen.model, seen.vbios_version
                gpus.append(gone)
        self._seen.update({g.uuid: g for g in gpus if g.uuid and not g.lost})
        session = Session(nvml, driver, gpus)
        self._known_pci = {key for g in gpus if (key := pci_key(g.pci_bus_id)) is not None}
        if any(g.lost for g in gpus):
            session.reinit_wanted = True
        session.listener = XidListener(
            self.xids,
            nvml,
            [g for g in gpus if not g.lost],
            self.log,
            self.timings.listener_wait_ms,
            self.timings.listener_backoff,
        )
        try:
            session.listener.start()
        except RuntimeError:
            # No thread can be created (the process at its task limit): close NVML again and
            # fail the round, so the next one opens a whole session, not one without XIDs.
            self._free_gpm(nvml, gpus)
            self._shutdown(nvml)
            raise
        return session

    def _enumerate(self, nvml: NvmlProvider, index: int, driver: int | None) -> GpuState:
        """A GPU's identity and static facts; a GPU that does not answer is kept, lost."""
        known = self._known.get(index)
        gpu = GpuState(index=index, handle=None)
        try:
            gpu.handle = nvml.nvmlDeviceGetHandleByIndex(index)
            gpu.uuid = text(nvml.nvmlDeviceGetUUID(gpu.handle))
            gpu.pci_bus_id = text(nvml.nvmlDeviceGetPciInfo(gpu.handle).busId)
            gpu.model = text(self.calls.optional(gpu, "nvmlDeviceGetName", nvml.nvmlDeviceGetName, gpu.handle) or "")
            gpu.vbios_version = text(
                self.calls.optional(gpu, "nvmlDeviceGetVbiosVersion", nvml.nvmlDeviceGetVbiosVersion, gpu.handle) or ""
            )
            gpu.minor_number = self.calls.optional(
                gpu, "nvmlDeviceGetMinorNumber", nvml.nvmlDeviceGetMinorNumber, gpu.handle
            )
            max_mhz = self.calls.optional(
                gpu, "nvmlDeviceGetMaxClockInfo", nvml.nvmlDeviceGetMaxClockInfo, gpu.handle, pynvml.NVML_CLOCK_SM
            )
            gpu.sm_clock_max_hz = None if max_mhz is None else max_mhz * 1e6
            gpu.links = self._link_count(nvml, gpu)
            start_gpm(self.calls, nvml, gpu)
            first_sample(self.calls, nvml, gpu, self.gpm_clock())
        except GPU_GONE as exc:
            self.lose(gpu, exc, known)
        except pynvml.NVMLError as exc:
            if isinstance(exc, LIFECYCLE):
                raise
            self.log.warning("GPU %d does not answer NVML (%s): reported down", index, exc)
            self.lose(gpu, exc, known)
        if not gpu.lost:
            uses = [(use, 0) for use in DEVICE_FIELDS]
            if gpu.links:
                uses += [(use, 0) for use in NVLINK_TOTAL_FIELDS]
                uses += [(use, link) for link in range(gpu.links) for use in LINK_FIELDS]
            ids = {use.field: field_id(use.field, driver) for use, _ in uses}
            known_ids = {name: fid for name, fid in ids.items() if fid is not None}  # the binding may lack some
            gpu.field_uses = [(use, known_ids[use.field], scope) for use, scope in uses if use.field in known_ids]
            self._known[index] = gpu
        return gpu

    def lose(self, gpu: GpuState, exc: BaseException, known: GpuState | None = None) -> None:
        """Mark the GPU down, keeping what is known of its identity for its labels."""
        gpu.lost = True
        if known is not None and not gpu.uuid:
            gpu.uuid, gpu.pci_bus_id, gpu.minor_number = known.uuid, known.pci_bus_id, known.minor_number
            gpu.model, gpu.vbios_version = known.model, known.vbios_version
        self.calls.count_error(gpu, exc)

    def _link_count(self, nvml: NvmlProvider, gpu: GpuState) -> int:
        values = nvml.nvmlDeviceGetFieldValues(gpu.handle, [pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT])
        fv = values[0]
        if fv.nvmlReturn == pynvml.NVML_ERROR_GPU_IS_LOST:
            raise pynvml.NVMLError_GpuIsLost()
        if fv.nvmlReturn != pynvml.NVML_SUCCESS:
            return 0  # no NVLink (or not reported): no link metrics
        return int(field_number(fv) or 0)

    def _free_gpm(self, nvml: NvmlProvider, gpus: list[GpuState]) -> None:
        """The GPUs' GPM sample buffers, freed before NVML is shut down."""
        for gpu in gpus:
            free_gpm(nvml, gpu)

    def _shutdown(self, nvml: NvmlProvider) -> None:
        try:
            nvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass  # shutting down a broken session: nothing more to do

    def end(self) -> bool:
        """Stop the listener and shut NVML down; False if the listener is stuck in NVML."""
        session = self.session
        if session is None:
            return True
        if session.listener is not None and not session.listener.stop(
            timeout=2 * self.timings.listener_wait_ms / 1000 + 1
        ):
            self.log.warning("XID listener still blocked in NVML: re-initialisation postponed")
            return False
        self._free_gpm(session.nvml, session.gpus)
        self._shutdown(session.nvml)
        self.session = None
        return True

    def schedule_reinit(self, now: float) -> float:
        """When NVML will next be re-initialised; the delay doubles each time, up to its maximum."""
        delay = self.retry_delay
        self._retry_at = now + delay
        self.retry_delay = min(delay * 2, self.timings.reinit_backoff_max)
        return delay

    def gpu_lost(self, gpu: GpuState, exc: BaseException) -> None:
        """A GPU was lost in a round: reported down, NVML re-initialised after the backoff."""
        self.lose(gpu, exc)
        session = self.session
        if session is not None and not session.reinit_wanted:
            session.reinit_wanted = True
            self.schedule_reinit(time.monotonic())

    def nvml_broken(self, exc: BaseException) -> float:
        """NVML as a whole failed in a round: the session ends, a new one opens after the
        backoff (returned, in seconds)."""
        self.end()
        delay = self.schedule_reinit(time.monotonic())
        self._broken = f"NVML: {exc}"
        return delay

    def ensure(self) -> tuple[Session, bool]:
        """The NVML session to read from, (re)initialised when due; and whether it is new."""
        now = time.monotonic()
        if self._rediscover.is_set():
            self._rediscover.clear()
            self._retry_at = now  # a GPU came or went: look now, not after the backoff
            if self.session is not None:
                self.session.reinit_wanted = True
        if self.session is not None and self.session.reinit_wanted and now >= self._retry_at:
            self.end()
        if self.session is not None:
            return self.session, False
        if self._broken and now < self._retry_at:
            raise RuntimeError(f"{self._broken}; re-initialising in {self._retry_at - now:.0f}s")
        try:
            session = self._start_session()
        except pynvml.NVMLError as exc:
            delay = self.schedule_reinit(now)
            self._broken = f"NVML: {exc}"
            raise RuntimeError(f"NVML initialisation failed: {exc} (retrying in {delay:g}s)") from None
        self._broken = ""
        if session.reinit_wanted:
            self.schedule_reinit(now)
        else:
            self.retry_delay = self.timings.reinit_backoff_initial
        self.session = session
        return session, True

    # --- hotplug ---

    def knows_pci_device(self, name: str) -> bool:
        """Whether a PCI address ('0000:3b:00.0') is that of a GPU found in the last session."""
        return pci_key(name) in self._known_pci

    def rediscover(self) -> None:
        """A GPU came or went (hotplug thread): the next round re-enumerates at once."""
        self._rediscover.set()
