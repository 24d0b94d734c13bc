"""Reading sysfs attributes within their bounds, and which network interfaces carry RDMA.

A sysfs attribute is one value the kernel formats into at most a page when the file is
read.  The InfiniBand, PCIe and ethtool collectors read such files from a tree that tests,
containers and hostile setups may replace (``--path.sysfs``), so each read is bounded by that
page and refuses what is not a regular file (a FIFO would block the round): a 100 MB
``fw_ver`` must not become a 100 MB label.

``rdma_netdevs`` answers a question two collectors ask of the same tree: the InfiniBand
collector labels a RoCE port with its interface, and the ethtool collector reads the PFC
statistics of exactly those interfaces by default.
"""

from __future__ import annotations

import os
from pathlib import Path

from lockstep.agent.files import read_regular_file

# A sysfs attribute is at most one page.
SYSFS_ATTRIBUTE_BYTES = 4096
# The widest counter the hardware has (extended PMA, hw_counters and AER counts are 64-bit): a
# larger number is not a reading.
COUNTER_MAX = (1 << 64) - 1

# The RDMA devices (InfiniBand HCAs and RoCE/iWARP NICs alike), under sysfs.
INFINIBAND_CLASS = Path("class") / "infiniband"


def read_attribute(path: Path) -> str:
    """A sysfs attribute's text, stripped; OSError if it is absent, unreadable, not a regular
    file or longer than a page (agent/files.py's FileTooLarge, NotRegularFile)."""
    return read_regular_file(path, SYSFS_ATTRIBUTE_BYTES).decode("utf-8", "replace").strip()


def read_line(path: Path) -> str:
    """A one-line sysfs attribute, stripped; '' if it cannot be read (``read_attribute``): for
    descriptive values, where a missing one is an empty label rather than an error."""
    try:
        return read_attribute(path)
    except OSError:
        return ""


def resolve_netdev(device_dir: Path, port: str) -> str:
    """The network interface of a RoCE/iWARP port: the netdev of GID 0, else the device's netdev
    for this port (dev_port is 0-based), else ''."""
    netdev = read_line(device_dir / "ports" / port / "gid_attrs" / "ndevs" / "0")
    if netdev:
        return netdev
    net_dir = device_dir / "device" / "net"
    try:
        candidates = sorted(os.listdir(net_dir))
    except OSError:
        return ""
    if len(candidates) == 1:
        return candidates[0]
    for name in candidates:
        if read_line(net_dir / name / "dev_port") == str(int(port) - 1):
            return name
    return ""


def rdma_netdevs(sysfs: Path) -> set[str]:
    """Network interfaces that carry RDMA (RoCE, iWARP): the ethtool collector's default set."""
    root = sysfs / INFINIBAND_CLASS
    found: set[str] = set()
    try:
        devices = os.listdir(root)
    except OSError:
        return found
    for device in devices:
        try:
            ports = os.listdir(root / device / "ports")
        except OSError:
            continue
        for port in ports:
            if port.isdigit() and read_line(root / device / "ports" / port / "link_layer") == "Ethernet":
                netdev = resolve_netdev(root / device, port)
                if netdev:
                    found.add(netdev)
    return found
