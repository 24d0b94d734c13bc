"""GPU collector: NVML through pynvml (the official nvidia-ml-py binding).

What it reads per GPU and round (steady state; docs/gpu.md "Cost" counts the calls): one
``nvmlDeviceGetFieldValues`` batch with every field-based value (energy, memory
temperature, ECC, row remapping or page retirement, PCIe replays and bytes, clock event
durations, the GPU's NVLink error totals, and per NVLink link - scopeId = link - its
state, traffic and error counters), then utilization, memory, SM and memory clocks, power
and its limit, temperature, clock event reasons, compute processes, their utilisation
(processes.py; only where there are compute processes) and MIG mode.

Traps handled (see docs/gpu.md):
- a call or field the GPU does not support is probed once and remembered per GPU; each
  field of a batch is checked by its own return code and read by its own value type;
- a GPU that fell off the bus (GPU_IS_LOST) reports ``lockstep_gpu_up 0`` while the
  others keep reporting, and none of its values (stale or partial) are served;
- NVML is re-initialised with backoff after a lost GPU and after lifecycle errors
  (uninitialized, driver not loaded, library/driver mismatch); a PCI hotplug event for an
  NVIDIA GPU re-initialises at once;
- XID errors come from a dedicated thread (``nvmlEventSetWait_v2``) as counters per code,
  which survives timeouts and lost GPUs by re-registering with backoff;
- NVLink traffic is reported by NVML in KiB and exported in bytes; energy in mJ -> J.

After each round the GPUs, their identity and their compute processes' host PIDs are
published in the GPU inventory (agent/gpus.py, ``context.gpu_inventory``), where the Slurm,
Kubernetes and inference collectors attribute
GPUs to jobs, pods and engines.  PIDs are not exported as labels.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from lockstep.agent.collector import Collector, CollectorContext, Families, NothingHere
from lockstep.agent.families import Metric
from lockstep.agent.files import read_text
from lockstep.agent.gpus import GpuProcess, MigDevice, PublishedGpu
from lockstep.agent.seams import MONOTONIC_CLOCK, WALL_CLOCK
from lockstep.collectors.gpu.fields import omitted_metrics
from lockstep.collectors.gpu.metrics import INFO, METRICS, NVML_ERRORS, UP
from lockstep.collectors.gpu.pcie import PCIE_LINK_METRICS
from lockstep.collectors.gpu.provider import NVML, NvmlProvider
from lockstep.collectors.gpu.state import GpuState, Sample

if TYPE_CHECKING:
    from lockstep.collectors.gpu.calls import NvmlCalls
    from lockstep.collectors.gpu.reading import GpuReader
    from lockstep.collectors.gpu.session import NvmlSessions
    from lockstep.collectors.gpu.xid import XidCounts

# What pynvml loads (its _LoadNvmlLibrary on Linux, nvidia-ml-py 12.x-13.x): where it is absent,
# the collector finds nothing without importing pynvml and its modules (2.5 MiB; issue 47).
NVML_LIBRARY = "libnvidia-ml.so.1"
NVIDIA_PCI_VENDOR = "0x10de"


class GpuCollector(Collector):
    """The GPU collector: owns the NVML sessions (session.py), the per-GPU reader (reading.py)
    and the XID counts (xid.py), and turns each round into metrics and the GPU inventory."""

    name = "gpu"
    help = "NVIDIA GPUs and NVLink through NVML: utilization, memory, clocks and their throttling, power, XID errors."
    default_interval = 10.0
    hotplug_subsystems = ("pci",)
    metrics = METRICS + PCIE_LINK_METRICS
    # Timings, read when the collector is made (tests shorten them in a subclass).
    # Re-initialisation backoff (seconds): doubles after each attempt that still finds a
    # problem, back to the start once all GPUs answer.
    reinit_backoff_initial = 5.0
    reinit_backoff_max = 300.0
    # The XID listener's wait per call into NVML, and its backoff (initial, maximum) after an error.
    listener_wait_ms = 1000
    listener_backoff = (0.5, 30.0)
    # How long the first round waits for the XID listener to be registered, so an XID
    # right at start is not missed and the first exposition already has it.
    listener_ready_timeout = 3.0
    # GPM's windowed metrics need their two samples at least this far apart (seconds; NVML
    # refreshes GPM samples every 100 ms): collectors/gpu/gpm.py.
    gpm_min_interval = 0.1

    # Made with NVML (_open_nvml): at once for a fake NVML, else at the first round that finds the library.
    calls: NvmlCalls  # its error counts are kept across sessions
    xids: XidCounts  # kept across sessions
    sessions: NvmlSessions
    reader: GpuReader

    def __init__(self, context: CollectorContext) -> None:
        super().__init__(context)
        self._nvml_open = False
        # The fake NVML a test, the simulated node or ``--gpu.fake-nvml`` put in the seams, else pynvml.
        fake = context.seams.get(NVML)
        if fake is not None:
            self._open_nvml(fake)

    def _open_nvml(self, nvml: NvmlProvider) -> None:
        from lockstep.collectors.gpu.calls import NvmlCalls
        from lockstep.collectors.gpu.reading import GpuReader
        from lockstep.collectors.gpu.session import NvmlSessions, SessionTimings
        from lockstep.collectors.gpu.xid import XidCounts

        self.calls = NvmlCalls(self.log)
        self.xids = XidCounts(self.context.seams.get(WALL_CLOCK) or time.time, self.context.run_now)
        timings = SessionTimings(
            self.reinit_backoff_initial, self.reinit_backoff_max, self.listener_wait_ms, self.listener_backoff
        )
        gpm_clock = self.context.seams.get(MONOTONIC_CLOCK) or time.monotonic
        self.sessions = NvmlSessions(nvml, self.calls, self.xids, timings, self.log, gpm_clock)
        self.reader = GpuReader(self.calls, self.gpm_min_interval, gpm_clock)
        self._nvml_open = True

    # --- one round ---

    def collect(self) -> Iterator[Metric]:
        if not self._nvml_open:
            try:
                ctypes.CDLL(NVML_LIBRARY)
            except OSError:
                raise NothingHere(
                    f"{NVML_LIBRARY} not found (no NVIDIA driver installed): no GPUs to collect"
                ) from None
            import pynvml

            self._open_nvml(pynvml)
        from lockstep.collectors.gpu.nvml import GPU_GONE, LIFECYCLE

        try:
            session, new = self.sessions.ensure()
        except BaseException:
            self.context.gpu_inventory.publish(())  # no NVML: nothing to attribute, rather than last round's GPUs
            raise
        if new and session.listener is not None:
            session.listener.ready.wait(self.listener_ready_timeout)
        samples: list[Sample] = []
        published = []
        for gpu in session.gpus:
            if not gpu.lost:
                try:
                    reading, processes, migs = self.reader.read(session.nvml, gpu)
                except GPU_GONE as exc:
                    self.log.warning("GPU %d (%s) is lost: %s", gpu.index, gpu.uuid or "uuid unknown", exc)
                    self.sessions.gpu_lost(gpu, exc)
                except LIFECYCLE as exc:
                    self.context.gpu_inventory.publish(())
                    delay = self.sessions.nvml_broken(exc)
                    raise RuntimeError(f"NVML: {exc} (re-initialising in {delay:g}s)") from None
                else:
                    samples += reading
                    published.append(published_gpu(gpu, True, processes, migs))
            if gpu.lost:
                published.append(published_gpu(gpu, False, (), ()))
            if gpu.uuid or not gpu.lost:
                info = (gpu.pci_bus_id, gpu.model, session.driver_version, gpu.vbios_version)
                minor = "" if gpu.minor_number is None else str(gpu.minor_number)
                samples.append((INFO, (*gpu.labels, *info, minor), 1))
            samples.append((UP, gpu.labels, 0 if gpu.lost else 1))
        samples += self.xids.samples(session.gpus)
        samples += [(NVML_ERRORS, (str(i), u, e), n) for (i, u, e), n in sorted(self.calls.errors.items())]
        self.context.gpu_inventory.publish(tuple(published))
        families = Families(self.metrics)
        for spec, labels, value in samples:
            families[spec].add_metric(list(labels), value)
        yield from families.with_samples()

    def check(self) -> str:
        try:
            for _ in self.collect():
                pass
            session = self.sessions.session if self._nvml_open else None
            if session is None:
                return ""
            notes = []
            lost = [str(g.index) for g in session.gpus if g.lost]
            if lost:
                notes.append(f"GPU {', '.join(lost)} not answering (fallen off the bus?): reported down")
            omitted: dict[tuple[str, ...], list[str]] = {}
            for gpu in session.gpus:
                if not gpu.lost:
                    names = tuple(sorted(s.name for s in omitted_metrics(gpu)))
                    if names:
                        omitted.setdefault(names, []).append(str(gpu.index))
            for names, gpus in omitted.items():
                notes.append(f"GPU {', '.join(gpus)}: not supported by the GPU or driver, omitted: {', '.join(names)}")
            no_gpm: dict[str, list[str]] = {}
            for gpu in session.gpus:
                if not gpu.lost and gpu.gpm is None and gpu.gpm_absent:
                    no_gpm.setdefault(gpu.gpm_absent, []).append(str(gpu.index))
            for why, gpus in no_gpm.items():
                notes.append(f"GPU {', '.join(gpus)}: no SM, tensor or DRAM activity metrics: {why}")
            return "; ".join(notes)
        finally:
            self.close()

    def close(self) -> None:
        if self._nvml_open:
            self.sessions.end()

    # --- hotplug ---

    def on_hotplug(self, action: str, subsystem: str, sys_path: str) -> None:
        """A PCI device came or went: if it is (or was) an NVIDIA GPU, re-enumerate at once."""
        name = sys_path.rstrip("/").rsplit("/", 1)[-1]
        if not self._nvml_open:
            return  # the next round looks for NVML anyway
        if self.sessions.knows_pci_device(name) or is_nvidia_gpu(self.paths.sysfs, sys_path):
            self.log.info("PCI %s of NVIDIA GPU %s: re-enumerating GPUs", action, name)
            self.sessions.rediscover()


def is_nvidia_gpu(sysfs: Path, sys_path: str) -> bool:
    """Whether the PCI device at sys_path (a /sys path of the hotplug event) is an NVIDIA GPU."""
    path = Path(sys_path)
    if path.is_relative_to("/sys"):
        path = sysfs / path.relative_to("/sys")  # the host's sysfs may be mounted elsewhere
    try:
        vendor = read_text(path / "vendor").strip()
        device_class = read_text(path / "class").strip()
    except OSError:
        return False  # removed already (then it is matched by its known PCI address) or not a device
    return vendor == NVIDIA_PCI_VENDOR and device_class.startswith("0x03")  # display controller


def published_gpu(
    gpu: GpuState, up: bool, processes: tuple[GpuProcess, ...], migs: tuple[MigDevice, ...]
) -> PublishedGpu:
    """A GPU as the inventory shows it to the collectors that attribute GPUs."""
    return PublishedGpu(gpu.index, gpu.uuid, gpu.pci_bus_id, gpu.minor_number, gpu.model, up, processes, migs)
