"""The GPU collector (NVIDIA GPUs and NVLink through NVML), one job per module:

- ``metrics``: the metric declarations;
- ``fields``: which NVML field or call feeds which metric;
- ``nvml``: NVML facts (error groups, clock event reason bits, field ids, value types);
- ``provider``: ``NvmlProvider``, the pynvml functions the collector calls (pynvml or a fake);
- ``state``: ``GpuState``, what is known of one GPU in a session, and the types the readers share;
- ``calls``: ``NvmlCalls``, NVML calls probed once when unsupported, failures counted;
- ``reading``: ``GpuReader``, one GPU's values in a round, with ``pcie`` (its PCIe link),
  ``processes`` (per-process utilisation), ``mig`` (its MIG devices) and ``gpm`` (activity);
- ``session``: ``NvmlSessions``, the NVML session, re-initialisation with backoff, hotplug re-discovery;
- ``xid``: the XID event listener thread and the XID counts;
- ``collector``: ``GpuCollector``, which owns the sessions, the reader and the XID counts, runs
  the round and ``lockstep doctor``'s check, and publishes the GPU inventory.

Imports go one way: ``state`` imports none of the others; the readers import ``state`` and
``calls``; ``reading`` the readers; ``collector`` everything.
"""

from lockstep.collectors.gpu.collector import GpuCollector

__all__ = ["GpuCollector"]
