"""The PCIe collector: link generation and width, and AER error counters, of the node's
InfiniBand/RDMA HCAs and NVMe devices, from sysfs.

One job per module: ``metrics`` (the declarations), ``sysfs`` (finding a class device's PCI
function and parsing its link and AER attributes), ``collector`` (the round).  The GPUs' own
links come from NVML, in the GPU collector (collectors/gpu/pcie.py).
"""

from lockstep.collectors.pcie.collector import PcieCollector

__all__ = ["PcieCollector"]
