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
published in agent/gpus.py, where the Slurm, Kubernetes and inference collectors attribute
GPUs to jobs, pods and engines.  PIDs are not exported as labels.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from prometheus_client.core import Metric

from lockstep.agent import gpus
from lockstep.agent.collector import Families, MetricSpec
from lockstep.collectors.gpu.fields import omitted_metrics
from lockstep.collectors.gpu.metrics import INFO, METRICS, NVML_ERRORS, UP
from lockstep.collectors.gpu.nvml import GPU_GONE, LIFECYCLE
from lockstep.collectors.gpu.pcie import PCIE_LINK_METRICS
from lockstep.collectors.gpu.session import NvmlSessions


class GpuCollector(NvmlSessions):
    name = "gpu"
    help = "NVIDIA GPUs and NVLink through NVML: utilization, memory, clocks and their throttling, power, XID errors."
    default_interval = 10.0
    hotplug_subsystems = ("pci",)
    metrics = METRICS + PCIE_LINK_METRICS
    # How long the first round waits for the XID listener to be registered, so an XID
    # right at start is not missed and the first exposition already has it.
    listener_ready_timeout = 3.0

    # --- one round ---

    def collect(self) -> Iterator[Metric]:
        try:
            session, new = self._ensure_session()
        except BaseException:
            gpus.publish(())  # no NVML: nothing to attribute, rather than last round's GPUs
            raise
        if new and session.listener is not None:
            session.listener.ready.wait(self.listener_ready_timeout)
        samples: list[tuple[MetricSpec, tuple[str, ...], float]] = []
        published = []
        for gpu in session.gpus:
            if not gpu.lost:
                try:
                    reading, processes, migs = self._read_gpu(session.nvml, gpu)
                except GPU_GONE as exc:
                    self.log.warning("GPU %d (%s) is lost: %s", gpu.index, gpu.uuid or "uuid unknown", exc)
                    self._lose(gpu, exc, None)
                    if not session.reinit_wanted:
                        session.reinit_wanted = True
                        self._schedule_reinit(time.monotonic())
                except LIFECYCLE as exc:
                    gpus.publish(())
                    self._end_session()
                    delay = self._schedule_reinit(time.monotonic())
                    self._broken = f"NVML: {exc}"
                    raise RuntimeError(f"NVML: {exc} (re-initialising in {delay:g}s)") from None
                else:
                    samples += reading
                    published.append(self._published(gpu, True, processes, migs))
            if gpu.lost:
                published.append(self._published(gpu, False, (), ()))
            if gpu.uuid or not gpu.lost:
                info = (gpu.pci_bus_id, gpu.model, session.driver_version, gpu.vbios_version)
                minor = "" if gpu.minor_number is None else str(gpu.minor_number)
                samples.append((INFO, (*gpu.labels, *info, minor), 1))
            samples.append((UP, gpu.labels, 0 if gpu.lost else 1))
        samples += self._xids.samples(session.gpus)
        samples += [(NVML_ERRORS, (str(i), u, e), n) for (i, u, e), n in sorted(self._errors.items())]
        gpus.publish(tuple(published))
        families = Families(self.metrics)
        for spec, labels, value in samples:
            families[spec].add_metric(list(labels), value)
        yield from families.with_samples()

    def check(self) -> str:
        try:
            for _ in self.collect():
                pass
            session = self._session
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
        self._end_session()
