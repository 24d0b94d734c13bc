"""The InfiniBand / RDMA collector: port state, rate and counters, and RDMA hw_counters, from sysfs.

One job per module: ``metrics`` (the declarations and the counter-file -> metric tables), ``sysfs``
(reading attributes and counter files, finding a RoCE port's netdev), ``collector`` (discovery and
the collection round).
"""

from lockstep.collectors.infiniband.collector import InfinibandCollector, InfinibandOptions

__all__ = ["InfinibandCollector", "InfinibandOptions"]
