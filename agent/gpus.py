"""This node's GPUs as the GPU collector last saw them, shared with the collectors that
attribute GPUs to jobs, pods and inference engines.

Only the GPU collector talks to NVML.  After each round it publishes the GPUs it found with
their identity (NVML index, UUID, PCI bus id, /dev/nvidiaN minor), their MIG devices and the
host PIDs of their compute processes into a ``GpuInventory``; the Slurm, Kubernetes and
inference collectors read that instead of calling NVML themselves.  The agent makes one
inventory and hands it to every collector it builds (``CollectorContext.gpu_inventory``); a
collector built alone (a test) gets an empty one of its own.  A collector that reads it
declares ``needs = ("gpu",)`` so its first round runs after the GPU collector's first round.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass


@dataclass(frozen=True)
class GpuProcess:
    pid: int  # host PID (a container needs the host PID namespace for it to mean anything)
    used_memory_bytes: int | None
    gpu_instance_id: int | None  # MIG instance the process runs in, else None
    compute_instance_id: int | None
    # Its share of the GPU's SM time and memory bandwidth (0..1) in NVML's latest sample since
    # the previous round (collectors/gpu/processes.py); 0 when it had none (idle), None when
    # NVML cannot say (unsupported call or driver, MIG mode).
    sm_utilization: float | None = None
    memory_utilization: float | None = None


@dataclass(frozen=True)
class MigDevice:
    uuid: str
    gpu_instance_id: int
    compute_instance_id: int
    profile: str


@dataclass(frozen=True)
class PublishedGpu:
    index: int  # NVML index
    uuid: str
    pci_bus_id: str
    minor_number: int | None  # N of /dev/nvidiaN
    model: str
    up: bool
    processes: tuple[GpuProcess, ...]
    mig_devices: tuple[MigDevice, ...]


class GpuInventory:
    """The GPUs of the GPU collector's latest round; written by its worker, read by the others'
    (hence the lock)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._published: tuple[PublishedGpu, ...] = ()

    def publish(self, gpus: tuple[PublishedGpu, ...]) -> None:
        """Replace the table (the GPU collector, after each round; empty when NVML is unusable)."""
        with self._lock:
            self._published = gpus

    def published(self) -> tuple[PublishedGpu, ...]:
        """The GPUs of the GPU collector's latest round; empty until it has run or when it finds none."""
        with self._lock:
            return self._published

    def index_of(self, uuid: str) -> str | None:
        """The NVML index of the GPU with this UUID (or owning this MIG device), None if unknown."""
        for gpu in self.published():
            if gpu.uuid == uuid or any(mig.uuid == uuid for mig in gpu.mig_devices):
                return str(gpu.index)
        return None
