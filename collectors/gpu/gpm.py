"""GPU Performance Monitoring (GPM, Hopper and newer): SM, tensor and other pipe activity, SM
occupancy and DRAM bandwidth, for a whole GPU or per MIG GPU instance.

NVML computes GPM metrics from two samples (``nvmlGpmMetricsGet`` on ``sample1`` and
``sample2``).  Each GPU (or GPU instance) has two sample buffers, allocated once per NVML
session: every round takes one sample into the older buffer and asks for the metrics between
the previous round's sample and this one, so a round costs two calls (``nvmlGpmSampleGet`` or
``nvmlGpmMigSampleGet``, and ``nvmlGpmMetricsGet``) and never sleeps.

- Cumulative metrics (``*_CYCLES_ELAPSED``/``*_CYCLES_ACTIVE``, drivers that have them) are
  counts since boot at ``sample2``: exported as counters, and already in the first round, from
  a sample taken when the GPU was enumerated.  ``rate()`` of them gives exact activity over any
  window.
- Windowed metrics (``*_UTIL``, ``SM_OCCUPANCY``) are averages between the two samples: exported
  as ratio gauges, averaged over the collector's interval, from the second round on.  NVML
  wants the samples at least 100 ms apart: a round sooner than that (run at once after an XID)
  reads the counters only and keeps its window's start.  A windowed metric whose cumulative counterpart the
  driver has is asked for once and then no more (the counter says the same, exactly).
- Each metric has its own return code: one the driver does not support is dropped for good.

PCIe and NVLink traffic are not read from GPM: the field counters
(``lockstep_gpu_pcie_*_bytes_total``, ``lockstep_nvlink_*_bytes_total``) already give exact
byte counts on every GPU that has GPM.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pynvml

from lockstep.collectors.gpu.calls import NvmlCalls
from lockstep.collectors.gpu.metrics import (
    DRAM_BANDWIDTH_USED,
    PIPE_ACTIVE,
    PIPE_ACTIVE_CYCLES,
    SM_ACTIVE,
    SM_ACTIVE_CYCLES,
    SM_CYCLES,
    SM_OCCUPANCY,
)
from lockstep.collectors.gpu.nvml import GPU_GONE, LIFECYCLE, UNSUPPORTED
from lockstep.collectors.gpu.provider import NvmlProvider
from lockstep.collectors.gpu.state import GpmState, GpmTarget, GpmUse, GpuState, Sample

ELAPSED = "NVML_GPM_METRIC_SM_CYCLES_ELAPSED"


def _pipe(name: str, pipe: str, util: str) -> tuple[GpmUse, GpmUse]:
    cycles = f"NVML_GPM_METRIC_{name}_CYCLES_ACTIVE"
    return (
        GpmUse(cycles, PIPE_ACTIVE_CYCLES, (pipe,), cumulative=True),
        GpmUse(f"NVML_GPM_METRIC_{util}", PIPE_ACTIVE, (pipe,), covered_by=cycles),
    )


GPM_USES: tuple[GpmUse, ...] = (
    GpmUse(ELAPSED, SM_CYCLES, cumulative=True),
    GpmUse("NVML_GPM_METRIC_SM_CYCLES_ACTIVE", SM_ACTIVE_CYCLES, cumulative=True),
    GpmUse("NVML_GPM_METRIC_SM_UTIL", SM_ACTIVE, covered_by="NVML_GPM_METRIC_SM_CYCLES_ACTIVE"),
    *_pipe("MMA", "tensor", "ANY_TENSOR_UTIL"),
    *_pipe("HMMA", "tensor_hmma", "HMMA_TENSOR_UTIL"),
    *_pipe("IMMA", "tensor_imma", "IMMA_TENSOR_UTIL"),
    *_pipe("DMMA", "tensor_dmma", "DMMA_TENSOR_UTIL"),
    *_pipe("DFMA", "tensor_dfma", "DFMA_TENSOR_UTIL"),
    *_pipe("FP64", "fp64", "FP64_UTIL"),
    *_pipe("FP32", "fp32", "FP32_UTIL"),
    *_pipe("FP16", "fp16", "FP16_UTIL"),
    *_pipe("INTEGER", "integer", "INTEGER_UTIL"),
    GpmUse("NVML_GPM_METRIC_SM_OCCUPANCY", SM_OCCUPANCY),
    GpmUse("NVML_GPM_METRIC_DRAM_BW_UTIL", DRAM_BANDWIDTH_USED),
)
GPM_SPECS = tuple(dict.fromkeys(use.spec for use in GPM_USES))
# What a GPU without GPM lacks, for doctor's note.
WHY_NO_GPM_DEVICE = "the GPU has no GPM (Hopper and newer have it)"
WHY_NO_GPM_DRIVER = "the driver has no GPM (R520 and newer have it)"


def start_gpm(calls: NvmlCalls, nvml: NvmlProvider, gpu: GpuState) -> None:
    """At enumeration: does the GPU have GPM?  If so, allocate its buffers and take a first sample."""
    support = calls.optional(gpu, "nvmlGpmQueryDeviceSupport", nvml.nvmlGpmQueryDeviceSupport, gpu.handle)
    if support is None:
        gpu.gpm_absent = WHY_NO_GPM_DRIVER
        return
    if not support.isSupportedDevice:
        gpu.gpm_absent = WHY_NO_GPM_DEVICE
        return
    ids = [(use, getattr(pynvml, use.metric, None)) for use in GPM_USES]
    gpu.gpm = GpmState(uses=[(use, mid) for use, mid in ids if mid is not None])  # the binding may lack some


def _target(
    calls: NvmlCalls, nvml: NvmlProvider, gpu: GpuState, state: GpmState, instance: int | None
) -> GpmTarget | None:
    target = state.targets.get(instance)
    if target is None:
        try:
            target = GpmTarget(instance, nvml.nvmlGpmSampleAlloc(), nvml.nvmlGpmSampleAlloc())
        except GPU_GONE + LIFECYCLE:
            raise
        except pynvml.NVMLError as exc:
            calls.count_error(gpu, exc)
            return None
        state.targets[instance] = target
    return target


def _sample(
    calls: NvmlCalls, nvml: NvmlProvider, gpu: GpuState, target: GpmTarget, into: Any, at_enumeration: bool = False
) -> bool:
    """A sample of the GPU or instance into the buffer; False if there is none this time."""
    name = "nvmlGpmSampleGet" if target.gpu_instance_id is None else "nvmlGpmMigSampleGet"
    try:
        if target.gpu_instance_id is None:
            nvml.nvmlGpmSampleGet(gpu.handle, into)
        else:
            nvml.nvmlGpmMigSampleGet(gpu.handle, target.gpu_instance_id, into)
    except UNSUPPORTED as exc:
        if at_enumeration:
            # A GPU in MIG mode is sampled per GPU instance, not whole: whether it is in MIG mode
            # is known only in the round, which decides.
            return False
        calls.unsupported(gpu, name, exc)
        free_gpm(nvml, gpu)
        gpu.gpm, gpu.gpm_absent = None, f"{name}: {exc}"
        return False
    except GPU_GONE + LIFECYCLE:
        raise
    except pynvml.NVMLError as exc:
        calls.count_error(gpu, exc)
        return False
    return True


def first_sample(calls: NvmlCalls, nvml: NvmlProvider, gpu: GpuState, now: float) -> None:
    """The whole GPU's first sample, taken at enumeration (``now`` on the collector's monotonic
    clock), so the first round has the counters."""
    if gpu.gpm is None:
        return
    target = _target(calls, nvml, gpu, gpu.gpm, None)
    if target is not None:
        target.sampled = _sample(calls, nvml, gpu, target, target.previous, at_enumeration=True)
        target.sampled_at = now


def read_gpm(
    calls: NvmlCalls,
    nvml: NvmlProvider,
    gpu: GpuState,
    instances: list[int] | None,
    min_interval: float,
    clock: Callable[[], float],
) -> list[Sample]:
    """This round's GPM values of the GPU (``instances`` None) or of its MIG GPU instances;
    windowed ones only from two samples at least ``min_interval`` seconds apart on ``clock`` (the
    collector's monotonic clock)."""
    state = gpu.gpm
    if state is None:
        return []
    wanted: list[int | None] = [None] if instances is None else list(instances)
    for gone in [k for k in state.targets if k not in wanted]:  # an instance destroyed, or MIG toggled
        ended = state.targets.pop(gone)
        _free(nvml, (ended.previous, ended.current))
    out: list[Sample] = []
    for instance in wanted:
        target = _target(calls, nvml, gpu, state, instance)
        if target is None:
            continue
        if not target.sampled:  # a new instance: its first sample now, its counters from this round on
            target.sampled = _sample(calls, nvml, gpu, target, target.previous)
            target.sampled_at = clock()
            if gpu.gpm is None:
                return []
            if not target.sampled:
                continue
        if not _sample(calls, nvml, gpu, target, target.current):
            if gpu.gpm is None:
                return []
            continue
        now = clock()
        # Windowed metrics between two rounds' samples (the first pair spans the enumeration), at
        # least min_interval apart: NVML refreshes its samples every 100 ms.  A round that comes
        # sooner (one asked for at once, after an XID or a hotplug) reads the counters only and keeps
        # its window's start, so the next round's averages cover the whole time since.
        windowed = target.rounds > 0 and now - target.sampled_at >= min_interval
        out += _metrics(calls, nvml, gpu, state, target, windowed)
        if windowed or target.rounds == 0:
            target.previous, target.current = target.current, target.previous
            target.sampled_at = now
            target.rounds += 1
    return out


def _metrics(
    calls: NvmlCalls, nvml: NvmlProvider, gpu: GpuState, state: GpmState, target: GpmTarget, windowed: bool
) -> list[Sample]:
    asked = [(use, mid) for use, mid in state.uses if use.cumulative or windowed]
    if not asked:
        return []
    request = pynvml.c_nvmlGpmMetricsGet_t()
    request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
    request.numMetrics = len(asked)
    request.sample1, request.sample2 = target.previous, target.current
    for i, (_, mid) in enumerate(asked):
        request.metrics[i].metricId = mid
    try:
        nvml.nvmlGpmMetricsGet(request)
    except GPU_GONE + LIFECYCLE:
        raise
    except pynvml.NVMLError as exc:
        calls.count_error(gpu, exc)
        return []
    instance = "" if target.gpu_instance_id is None else str(target.gpu_instance_id)
    labels = (*gpu.labels, instance)
    answered: dict[str, tuple[GpmUse, float]] = {}
    dropped: set[str] = set()
    for i, (use, _) in enumerate(asked):
        metric = request.metrics[i]
        if metric.nvmlReturn in (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND):
            dropped.add(use.metric)
            calls.log.debug("GPU %d: GPM %s not supported, no longer asked for", gpu.index, use.metric)
        elif metric.nvmlReturn != pynvml.NVML_SUCCESS:
            calls.count_error(gpu, pynvml.NVMLError(metric.nvmlReturn))
        else:
            answered[use.metric] = (use, metric.value)
    out = []
    for name, (use, value) in answered.items():
        covered = use.covered_by and use.covered_by in answered and ELAPSED in answered
        if covered:
            dropped.add(name)  # the counter says it exactly: no need to ask again
        else:
            out.append((use.spec, (*labels, *use.labels), use.value(value)))
    if dropped:
        state.uses = [(use, mid) for use, mid in state.uses if use.metric not in dropped]
    return out


def _free(nvml: NvmlProvider, buffers: tuple[Any, ...] | list[Any]) -> None:
    for buffer in buffers:
        try:
            nvml.nvmlGpmSampleFree(buffer)
        except pynvml.NVMLError:
            pass  # freeing at the end of a session or of an instance: nothing more to do


def free_gpm(nvml: NvmlProvider, gpu: GpuState) -> None:
    """Free the GPU's sample buffers (before NVML is shut down)."""
    if gpu.gpm is not None:
        _free(nvml, gpu.gpm.buffers())
        gpu.gpm.targets.clear()
