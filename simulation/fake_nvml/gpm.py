"""The fake NVML's GPU Performance Monitoring (Hopper and newer): sample buffers, samples of a
whole GPU or of a MIG GPU instance, and the metrics between two samples.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pynvml

from lockstep.simulation.fake_nvml.capabilities import GPM_ARCHITECTURES, GPM_CUMULATIVE_METRICS, GPM_PIPES
from lockstep.simulation.fake_nvml.spec import GpuSpec
from lockstep.simulation.fake_nvml.state import FakeState, address


@dataclass
class GpmSample:
    """A GPM sample buffer: what was sampled (GPU, GPU instance or None), when, and its counters."""

    struct: Any  # the struct_c_nvmlGpmSample_t the handle points at, kept alive here
    gpu: int | None = None
    gpu_instance_id: int | None = None
    t: float = 0.0
    counters: dict[int, float] = field(default_factory=dict)  # metric id -> integral since boot
    cumulative: bool = True  # the driver has the cumulative metrics
    percents: dict[int, float] = field(default_factory=dict)  # windowed metrics' values at this moment


def has_gpm(gpu: GpuSpec) -> bool:
    """Whether the GPU has GPM: Hopper and newer, not consumer GPUs."""
    return gpu.architecture in GPM_ARCHITECTURES and not gpu.consumer


class Gpm:
    """The GPM calls, the sample buffers allocated (by address) and the metric failures a test set."""

    def __init__(self, state: FakeState) -> None:
        self._state = state
        self.samples: dict[int, GpmSample] = {}
        self.metric_failures: dict[tuple[int, int], int] = {}  # (gpu, metric id) -> return code
        self._cumulative_ids = frozenset(getattr(pynvml, name) for name in GPM_CUMULATIVE_METRICS)

    def nvmlGpmQueryDeviceSupport(self, handle: Any) -> Any:
        with self._state.lock:
            _, gpu = self._state.gpu(handle, "nvmlGpmQueryDeviceSupport")
            support = pynvml.c_nvmlGpmSupport_t()
            support.version = pynvml.NVML_GPM_SUPPORT_VERSION
            support.isSupportedDevice = int(has_gpm(gpu))
            return support

    def nvmlGpmSampleAlloc(self) -> Any:
        with self._state.lock:
            self._state.enter("nvmlGpmSampleAlloc")
            struct = pynvml.struct_c_nvmlGpmSample_t()
            sample = pynvml.c_nvmlGpmSample_t(struct)
            self.samples[address(sample)] = GpmSample(struct)
            return sample

    def sample(self, sample: Any) -> GpmSample:
        try:
            return self.samples[address(sample)]
        except (KeyError, TypeError, ValueError):
            raise pynvml.NVMLError_InvalidArgument() from None

    def nvmlGpmSampleFree(self, sample: Any) -> None:
        with self._state.lock:
            self._state.enter("nvmlGpmSampleFree")
            self.sample(sample)
            del self.samples[address(sample)]

    def nvmlGpmSampleGet(self, handle: Any, sample: Any) -> Any:
        with self._state.lock:
            index, gpu = self._state.gpu(handle, "nvmlGpmSampleGet")
            if not has_gpm(gpu) or gpu.mig_devices:
                # In MIG mode GPM is read per GPU instance (nvmlGpmMigSampleGet).  NVML's documentation
                # does not say what a whole-GPU sample does then: this fake refuses it, the stricter answer.
                raise pynvml.NVMLError_NotSupported()
            self._take(self.sample(sample), index, None, gpu.sm_count, gpu)
            return sample

    def nvmlGpmMigSampleGet(self, handle: Any, gpu_instance_id: int, sample: Any) -> Any:
        with self._state.lock:
            index, gpu = self._state.gpu(handle, "nvmlGpmMigSampleGet")
            if not has_gpm(gpu):
                raise pynvml.NVMLError_NotSupported()
            device = next((m for m in gpu.mig_devices if m.gpu_instance_id == gpu_instance_id), None)
            if device is None:
                raise pynvml.NVMLError_InvalidArgument()  # no such GPU instance (or MIG off)
            share = GpuSpec(
                sm_clock_mhz=gpu.sm_clock_mhz,
                driver_uptime_seconds=gpu.driver_uptime_seconds,
                gpm_cumulative=gpu.gpm_cumulative,
                sm_count=device.sm_count,
                sm_active_percent=device.sm_active_percent,
                pipe_active_percent={"tensor": device.tensor_active_percent},
            )
            self._take(self.sample(sample), index, gpu_instance_id, device.sm_count, share)
            return sample

    def _take(self, sample: GpmSample, index: int, instance: int | None, sm_count: int, gpu: GpuSpec) -> None:
        """Counters since boot now: cycles (integers, as the hardware counts them) and, for the windowed
        metrics, percent-seconds, whose difference over the interval is the average."""
        since_boot = gpu.driver_uptime_seconds + self._state.t
        elapsed = round(sm_count * gpu.sm_clock_mhz * 1e6 * since_boot)
        counters: dict[str, float] = {
            "NVML_GPM_METRIC_SM_CYCLES_ELAPSED": elapsed,
            "NVML_GPM_METRIC_SM_CYCLES_ACTIVE": round(elapsed * gpu.sm_active_percent / 100),
            "NVML_GPM_METRIC_GRAPHICS_UTIL": gpu.utilization_gpu_percent * since_boot,
            "NVML_GPM_METRIC_SM_UTIL": gpu.sm_active_percent * since_boot,
            "NVML_GPM_METRIC_SM_OCCUPANCY": gpu.sm_occupancy_percent * since_boot,
            "NVML_GPM_METRIC_DRAM_BW_UTIL": gpu.dram_bandwidth_used_percent * since_boot,
        }
        for pipe, (cycles, util) in GPM_PIPES.items():
            percent = gpu.pipe_active_percent.get(pipe, 0.0)
            counters[cycles] = round(elapsed * percent / 100)
            counters[util] = percent * since_boot
        sample.gpu, sample.gpu_instance_id, sample.t = index, instance, self._state.t
        sample.counters = {getattr(pynvml, name): value for name, value in counters.items()}
        sample.cumulative = gpu.gpm_cumulative
        sample.percents = {
            mid: value / since_boot if since_boot else 0.0
            for mid, value in sample.counters.items()
            if mid not in self._cumulative_ids
        }

    def nvmlGpmMetricsGet(self, request: Any) -> Any:
        with self._state.lock:
            first, second = self.sample(request.sample1), self.sample(request.sample2)
            if second.gpu is None or (first.gpu, first.gpu_instance_id) != (second.gpu, second.gpu_instance_id):
                self._state.enter("nvmlGpmMetricsGet")
                raise pynvml.NVMLError_InvalidArgument()  # not two samples of the same GPU or instance
            self._state.enter("nvmlGpmMetricsGet", second.gpu)
            if request.version != pynvml.NVML_GPM_METRICS_GET_VERSION:
                raise pynvml.NVMLError_ArgumentVersionMismatch()
            if not 0 < request.numMetrics <= pynvml.NVML_GPM_METRIC_MAX:
                raise pynvml.NVMLError_InvalidArgument()
            cumulative = self._cumulative_ids
            interval = second.t - first.t
            for i in range(request.numMetrics):
                metric = request.metrics[i]
                mid = metric.metricId
                metric.value = 0.0
                failure = self.metric_failures.get((second.gpu, mid))
                if failure is not None:
                    metric.nvmlReturn = failure
                elif mid not in second.counters or (mid in cumulative and not second.cumulative):
                    metric.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
                elif mid in cumulative:
                    metric.nvmlReturn, metric.value = pynvml.NVML_SUCCESS, second.counters[mid]
                elif interval <= 0:
                    # Two samples at one moment of the fake's clock (a test that does not move it): the
                    # average over an empty window is the value at that moment.
                    metric.nvmlReturn, metric.value = pynvml.NVML_SUCCESS, second.percents[mid]
                else:
                    metric.nvmlReturn = pynvml.NVML_SUCCESS
                    metric.value = (second.counters[mid] - first.counters[mid]) / interval
            return request
