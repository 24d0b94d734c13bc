"""Reading an RDMA device's sysfs tree: attributes, counter files relative to an open directory, netdevs."""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from lockstep.agent.files import read_text

# Errors that mean "this counter is not available here": skip it quietly.
UNAVAILABLE_ERRNOS = frozenset({errno.ENOENT, errno.EINVAL, errno.EOPNOTSUPP, errno.EACCES})

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
    devices: tuple[str, ...]  # the listing of class/infiniband it was made from
    ports: tuple[Port, ...]


def read_line(path: Path) -> str:
    """A one-line sysfs attribute, stripped; '' if it is absent or unreadable."""
    try:
        return read_text(path).strip()
    except OSError:
        return ""


def read_at(directory: int, name: str) -> bytes:
    """A counter-sized sysfs attribute, relative to an open directory.

    The hot path of a round (hundreds of files): opening relative to the directory spares
    the kernel the walk down the whole path, and one read is enough because sysfs hands
    over an attribute (at most a page) whole in the first read.  Together a quarter faster
    than ``lockstep.agent.files.read_text`` on the benchmark tree; discovery uses read_text.
    """
    fd = os.open(name, os.O_RDONLY, dir_fd=directory)
    try:
        return os.read(fd, 4096)
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
    return float(parts[0]) * 1e9 / 8
