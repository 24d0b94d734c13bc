"""The PCIe collector's metrics: every family it emits, declared once."""

from __future__ import annotations

from lockstep.agent.collector import MetricSpec

# device: the kernel's name in its class (mlx5_0, nvme0), as the infiniband collector's
# `device` label says it; kind: the class it is found in, "infiniband" or "nvme".
LABELS = ("device", "kind")

DEVICE_INFO = MetricSpec(
    "lockstep_pcie_device_info",
    "gauge",
    "One series per PCIe function of an InfiniBand/RDMA device (kind=infiniband) or NVMe controller "
    "(kind=nvme), valued 1: its PCI address (for lspci -vv -s) and the PCI address of the port above it "
    "(a root port or switch port; empty for a device on the root bus).",
    (*LABELS, "pci_address", "upstream_pci_address"),
)
LINK_GENERATION = MetricSpec(
    "lockstep_pcie_link_generation",
    "gauge",
    "PCIe generation the link trained at (current_link_speed: 2.5 GT/s is 1, 5 is 2, 8 is 3, 16 is 4, 32 is 5, "
    "64 is 6).",
    LABELS,
)
LINK_MAX_GENERATION = MetricSpec(
    "lockstep_pcie_link_max_generation",
    "gauge",
    "Highest PCIe generation the link can train at: the lower of the device's max_link_speed and that of the "
    "port above it (a Gen5 card in a Gen4 slot is at its maximum at Gen4).",
    LABELS,
)
LINK_WIDTH = MetricSpec(
    "lockstep_pcie_link_width_lanes",
    "gauge",
    "Lanes the link trained with (current_link_width).",
    LABELS,
)
LINK_MAX_WIDTH = MetricSpec(
    "lockstep_pcie_link_max_width_lanes",
    "gauge",
    "Most lanes the link can train with: the lower of the device's max_link_width and that of the port above it.",
    LABELS,
)
AER_ERRORS = MetricSpec(
    "lockstep_pcie_aer_errors_total",
    "counter",
    "PCIe errors the device reported through Advanced Error Reporting since boot, by severity: correctable "
    "(corrected by the link, e.g. a replayed packet), nonfatal and fatal (uncorrectable) - the TOTAL_ERR_* "
    "lines of aer_dev_correctable, aer_dev_nonfatal and aer_dev_fatal.  Absent for a device without AER.",
    (*LABELS, "severity"),
)
AER_ERRORS_BY_TYPE = MetricSpec(
    "lockstep_pcie_aer_errors_by_type_total",
    "counter",
    "The same AER errors by the kernel's name for them (error: RxErr, BadTLP, BadDLLP, Rollover, Timeout, "
    "... for correctable; DLP, SDES, CmpltTO, MalfTLP, ... for nonfatal and fatal).  Present from the first "
    "error of that name on: a zero count says nothing the severity total does not.",
    (*LABELS, "severity", "error"),
)
SKIPPED_READS = MetricSpec(
    "lockstep_pcie_skipped_reads_total",
    "counter",
    "Reads of the device's PCIe attributes left out because a file was missing, unreadable or not understood "
    "(a link speed of 'Unknown', a width that is no lane count, a malformed AER line); a link's four values "
    "are left out together.  The device's other values still report.",
    LABELS,
)

METRICS = (
    DEVICE_INFO,
    LINK_GENERATION,
    LINK_MAX_GENERATION,
    LINK_WIDTH,
    LINK_MAX_WIDTH,
    AER_ERRORS,
    AER_ERRORS_BY_TYPE,
    SKIPPED_READS,
)
