"""Reading an RDMA device's sysfs tree: attributes, counter files relative to an open directory, netdevs."""

from __future__ import annotations

import errno
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from lockstep.agent.files import read_regular_file

# Errors that mean "this counter is not available here": skip it quietly.
UNAVAILABLE_ERRNOS = frozenset({errno.ENOENT, errno.EINVAL, errno.EOPNOTSUPP})
# Errors that mean "this user may not read it": skipped too, but doctor says so (it is fixable).
DENIED_ERRNOS = frozenset({errno.EACCES, errno.EPERM})
# A sysfs attribute is at most one page.
SYSFS_ATTRIBUTE_BYTES = 4096
# The widest counter the hardware has (extended PMA and hw_counters are 64-bit): a larger
# number is not a reading.
COUNTER_MAX = (1 << 64) - 1

INFINIBAND_CLASS = Path("class") / "infiniband"


class CounterFile(NamedTuple):
    """Where one PMA counter of a port is, and how to read it; decided at discovery."""

    directory: str  # "counters" or "counters_ext"
    filename: str
    name: str  # the counters/ name it stands for (the metric and the saturation label)
    multiplier: int  # 4 for the data counters (4-byte words)
    ceiling: int | None  # the value at which a legacy counter is stuck, None if it cannot saturate


@dataclass(frozen=True)
class Port:
    """What discovery learns about one port: everything that does not change while it exists."""

    device: str
    number: str
    path: str  # .../class/infiniband/<device>/ports/<number>
    link_layer: str
    netdev: str
    node_guid: str
    firmware_version: str
    board_id: str
    hca_type: str
    # In a fixed order; counters_ext/ files replace their 32-bit counters/ namesakes.
    counter_files: tuple[CounterFile, ...]


@dataclass(frozen=True)
class Discovery:
    # The listing of class/infiniband it was made from, with each device's ports/ listing: a
    # port directory removed and restored with the device list unchanged is rediscovered.
    devices: tuple[tuple[str, tuple[str, ...]], ...]
    ports: tuple[Port, ...]


def read_line(path: Path) -> str:
    """A one-line sysfs attribute, stripped; '' if it is absent, unreadable or longer than the
    page a sysfs attribute can hold (a 100 MB ``fw_ver`` must not become a 100 MB label)."""
    try:
        return read_regular_file(path, SYSFS_ATTRIBUTE_BYTES).decode("utf-8", "replace").strip()
    except OSError:
        return ""


def read_at(directory: int, name: str) -> bytes:
    """A counter-sized sysfs attribute, relative to an open directory.

    The hot path of a round (hundreds of files): opening relative to the directory spares
    the kernel the walk down the whole path, and one read is enough because sysfs hands
    over an attribute (at most a page) whole in the first read.  Together a quarter faster
    than ``lockstep.agent.files.read_text`` on the benchmark tree; discovery uses read_line.
    """
    fd = os.open(name, os.O_RDONLY, dir_fd=directory)
    try:
        return os.read(fd, SYSFS_ATTRIBUTE_BYTES)
    finally:
        os.close(fd)


def open_dir(name: str, parent: int | None = None) -> int:
    return os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=parent)


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


def parse_state(text: str) -> int:
    """'4: ACTIVE' -> 4."""
    number, colon, _ = text.partition(":")
    if not colon or not number.strip().isdigit():
        raise ValueError(f"expected '<number>: <NAME>', got {text.strip()!r}")
    return int(number)


def parse_rate(text: str) -> float:
    """'100 Gb/sec (4X EDR)' -> 12.5e9 bytes per second."""
    parts = text.split()
    if len(parts) < 2 or parts[1] != "Gb/sec":
        raise ValueError(f"expected '<number> Gb/sec ...', got {text.strip()!r}")
    try:
        gigabits = float(parts[0])
    except ValueError:
        raise ValueError(f"expected '<number> Gb/sec ...', got {text.strip()!r}") from None
    if not math.isfinite(gigabits) or gigabits < 0:
        raise ValueError(f"expected a rate of zero or more Gb/sec, got {text.strip()!r}")
    return gigabits * 1e9 / 8
