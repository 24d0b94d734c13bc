"""The fake GPUs' clocks over time: which clock event reasons hold a GPU down at time t, how
long each has held it down by then, and a clock's speed by NVML clock type.
"""

from __future__ import annotations

import pynvml

from lockstep.simulation.fake_nvml.spec import GpuSpec


def active_reasons(gpu: GpuSpec, t: float) -> tuple[str, ...]:
    """The clock event reasons holding the GPU down at t."""
    cycling = tuple(
        reason
        for reason, (start, period, on) in gpu.clock_event_duty.items()
        if t >= start and (t - start) % period < on
    )
    return (*gpu.clock_event_reasons, *cycling)


def event_seconds(gpu: GpuSpec, reason: str, t: float) -> float:
    """Time the reason has held the GPU down, by t."""
    seconds = gpu.clock_event_seconds.get(reason, 0.0)
    if reason in gpu.clock_event_reasons:
        seconds += t
    if reason in gpu.clock_event_duty:
        start, period, on = gpu.clock_event_duty[reason]
        if t > start:
            cycles, into = divmod(t - start, period)
            seconds += cycles * on + min(into, on)
    return seconds


def clock_mhz(gpu: GpuSpec, clock_type: int, sm_mhz: int) -> int:
    """A clock's speed: ``sm_mhz`` for the SM (and graphics) clock, the memory clock from the spec."""
    if clock_type in (pynvml.NVML_CLOCK_SM, pynvml.NVML_CLOCK_GRAPHICS):
        return sm_mhz
    if clock_type == pynvml.NVML_CLOCK_MEM:
        return gpu.memory_clock_mhz
    raise pynvml.NVMLError_NotSupported()
