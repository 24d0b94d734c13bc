"""Calls into NVML for one GPU that may be unsupported or fail: an unsupported call (or field)
is remembered per GPU and not asked again, any other failure is counted per (GPU, error) for
``lockstep_gpu_nvml_errors_total``.  A lost GPU or an unusable NVML is raised to the caller,
so a round never serves a GPU's values partially.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pynvml

from lockstep.collectors.gpu.nvml import GPU_GONE, LIFECYCLE, UNSUPPORTED, error_name
from lockstep.collectors.gpu.state import GpuState


class NvmlCalls:
    """The GPU collector's guarded NVML calls and its count of NVML errors, kept across sessions."""

    def __init__(self, log: logging.Logger) -> None:
        self.log = log
        self.errors: dict[tuple[int, str, str], int] = {}  # (index, uuid, error) -> count

    def optional(self, gpu: GpuState, name: str, function: Callable[..., Any], *args: Any) -> Any:
        """Call NVML; None if the GPU does not support it (remembered: not asked again) or it
        failed this time (counted).  A lost GPU or a broken NVML raises."""
        if name in gpu.unsupported:
            return None
        try:
            return function(*args)
        except UNSUPPORTED as exc:
            self.unsupported(gpu, name, exc)
        except GPU_GONE + LIFECYCLE:
            raise
        except pynvml.NVMLError as exc:
            self.count_error(gpu, exc)
        return None

    def unsupported(self, gpu: GpuState, name: str, exc: BaseException) -> None:
        gpu.unsupported.add(name)
        self.log.debug("GPU %d: %s: %s; no longer asked for", gpu.index, name, exc)

    def count_error(self, gpu: GpuState, exc: BaseException, name: str | None = None) -> None:
        key = (gpu.index, gpu.uuid, name or error_name(exc))
        self.errors[key] = self.errors.get(key, 0) + 1
