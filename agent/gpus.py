"""This node's GPUs by UUID -> NVML index, shared between collectors.

Collectors that learn about GPUs from somewhere other than NVML (the kubelet's pod-resources
API names GPUs by UUID only) label their series with the NVML index as ``gpu`` like every
other per-GPU series.  The collector that enumerates GPUs through NVML publishes what it
found with ``publish_indexes``; others look an index up with ``index_of``.  Nothing is
published until that collector has run, and a GPU it does not know gets ``None``: callers
then leave ``gpu`` empty, and a PromQL join on ``uuid`` (``* on(uuid) group_left(gpu)
lockstep_gpu_info``) still attributes the series.

It is a process-wide table because the machine is process-wide: one agent, one set of GPUs.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

_lock = threading.Lock()
_index_by_uuid: dict[str, str] = {}


def publish_indexes(index_by_uuid: Mapping[str, int | str]) -> None:
    """Record GPU (and MIG device) UUIDs with the NVML index of their GPU; replaces the table."""
    table = {uuid: str(index) for uuid, index in index_by_uuid.items()}
    global _index_by_uuid
    with _lock:
        _index_by_uuid = table


def index_of(uuid: str) -> str | None:
    """The NVML index of the GPU with this UUID, or None if no collector has reported it."""
    with _lock:
        return _index_by_uuid.get(uuid)
