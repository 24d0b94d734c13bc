"""The GPU collector (NVIDIA GPUs and NVLink through NVML), one job per module:

- ``metrics``: the metric declarations;
- ``fields``: which NVML field or call feeds which metric;
- ``nvml``: NVML facts (error groups, clock event reason bits, field ids, value types);
- ``reading``: one GPU's values in a round; ``mig``: its MIG devices;
- ``session``: the NVML session, re-initialisation with backoff, hotplug re-discovery;
- ``xid``: the XID event listener thread and the XID counts;
- ``collector``: ``GpuCollector``, the round and ``lockstep doctor``'s check.
"""

from lockstep.collectors.gpu.collector import GpuCollector

__all__ = ["GpuCollector"]
