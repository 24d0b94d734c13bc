"""Per-process GPU utilisation: each compute process's share of the GPU's SM time and memory
bandwidth, from NVML's per-process samples.

The GPU collector attaches it to the processes it publishes (agent/gpus.py); the Kubernetes and
Slurm collectors attribute it to containers and jobs.  It is never exported per PID: PIDs
churn, and a series per PID is unbounded.

NVML has two calls for it:
- ``nvmlDeviceGetProcessesUtilizationInfo`` (drivers from R550): a versioned struct with an
  array of ``nvmlProcessUtilizationInfo_v1_t``;
- ``nvmlDeviceGetProcessUtilization`` (older drivers, Maxwell and newer GPUs): an array of
  ``nvmlProcessUtilizationSample_t``.
The newer is tried first; a driver without it raises ``NVMLError_FunctionNotFound`` and it is
not asked again on that GPU.  Both are unsupported in MIG mode (``NVMLError_NotSupported``).

Traps handled:
- both return only samples newer than the timestamp passed (microseconds of the CPU clock).
  Each GPU asks from the newest sample its round before the last one saw: a round that comes
  right after another (one an XID event triggers), before NVML took a new sample, gets the same
  samples again instead of none; a process's value is its newest sample of the last two rounds;
- a process that used the GPU in none of those samples is not returned at all, and when no
  process did, the call fails with ``NVMLError_NotFound``: both mean utilisation 0, not an error;
- a process may come back with several samples; the newest counts.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pynvml

from lockstep.agent.gpus import GpuProcess
from lockstep.collectors.gpu.calls import NvmlCalls
from lockstep.collectors.gpu.nvml import GPU_GONE, LIFECYCLE, UNSUPPORTED
from lockstep.collectors.gpu.provider import NvmlProvider
from lockstep.collectors.gpu.state import GpuState

# Newest first: the older call is asked only where the newer is missing or unsupported.
CALLS = ("nvmlDeviceGetProcessesUtilizationInfo", "nvmlDeviceGetProcessUtilization")


def with_utilization(
    calls: NvmlCalls, nvml: NvmlProvider, gpu: GpuState, processes: tuple[GpuProcess, ...]
) -> tuple[GpuProcess, ...]:
    """The GPU's compute processes, each with its SM and memory-bandwidth share since the last
    round (0 without a sample), or unchanged (None) where NVML cannot say."""
    if not processes:
        return processes  # nothing to attribute: no call
    samples = _samples(calls, nvml, gpu)
    if samples is None:
        return processes
    newest: dict[int, Any] = {}
    for sample in samples:
        if sample.pid not in newest or sample.timeStamp > newest[sample.pid].timeStamp:
            newest[sample.pid] = sample
    out = []
    for process in processes:
        sample = newest.get(process.pid)
        sm, memory = (sample.smUtil / 100, sample.memUtil / 100) if sample is not None else (0.0, 0.0)
        out.append(dataclasses.replace(process, sm_utilization=sm, memory_utilization=memory))
    return tuple(out)


def _samples(calls: NvmlCalls, nvml: NvmlProvider, gpu: GpuState) -> list[Any] | None:
    """The samples since the GPU's last one ([] when there are none), None when NVML cannot say."""
    for name in CALLS:
        if name in gpu.unsupported:
            continue
        try:
            samples = list(getattr(nvml, name)(gpu.handle, gpu.process_samples_since))
        except pynvml.NVMLError_NotFound:
            gpu.process_samples_since = gpu.process_samples_newest
            return []  # no process used the GPU since then
        except UNSUPPORTED as exc:
            calls.unsupported(gpu, name, exc)
            continue
        except GPU_GONE + LIFECYCLE:
            raise
        except pynvml.NVMLError as exc:
            calls.count_error(gpu, exc)
            return None
        gpu.process_samples_since = gpu.process_samples_newest
        gpu.process_samples_newest = max([gpu.process_samples_newest, *(int(s.timeStamp) for s in samples)])
        return samples
    return None
