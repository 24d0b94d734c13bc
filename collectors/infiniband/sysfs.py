"""An RDMA device's sysfs tree as the InfiniBand collector reads it: what discovery learns of a
port, counter files relative to an open directory, the state and rate attributes.  Attributes
in general and the ports' network interfaces: collectors/toolkit/sysfs.py."""

from __future__ import annotations

import errno
import math
import os
from dataclasses import dataclass
from typing import NamedTuple

from lockstep.collectors.toolkit.sysfs import SYSFS_ATTRIBUTE_BYTES

# Errors that mean "this counter is not available here": skip it quietly.
UNAVAILABLE_ERRNOS = frozenset({errno.ENOENT, errno.EINVAL, errno.EOPNOTSUPP})
# Errors that mean "this user may not read it": skipped too, but doctor says so (it is fixable).
DENIED_ERRNOS = frozenset({errno.EACCES, errno.EPERM})


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


def read_at(directory: int, name: str) -> bytes:
    """A counter-sized sysfs attribute, relative to an open directory.

    The hot path of a round (hundreds of files): opening relative to the directory spares
    the kernel the walk down the whole path, and one read is enough because sysfs hands
    over an attribute (at most a page) whole in the first read.  Together a quarter faster
    than ``lockstep.agent.files.read_text`` on the benchmark tree; discovery uses
    ``lockstep.collectors.toolkit.sysfs.read_line``.
    """
    fd = os.open(name, os.O_RDONLY, dir_fd=directory)
    try:
        return os.read(fd, SYSFS_ATTRIBUTE_BYTES)
    finally:
        os.close(fd)


def open_dir(name: str, parent: int | None = None) -> int:
    return os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=parent)


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
