"""Finding the PCI function behind a class device, and parsing its link and AER attributes.

What the kernel writes (drivers/pci/pci-sysfs.c, drivers/pci/pcie/aer.c):

- ``current_link_speed``, ``max_link_speed``: ``16.0 GT/s PCIe`` since Linux 5.7 (one string table
  for every speed), ``16 GT/s`` / ``8 GT/s`` / ``2.5 GT/s`` before; ``Unknown`` (older: ``Unknown
  speed``) for a value it cannot decode, e.g. a virtual function, whose link registers are
  reserved, or a device that answers config reads with all ones.
- ``current_link_width``, ``max_link_width``: the lane count in decimal (``16``).
- ``aer_dev_correctable``, ``aer_dev_nonfatal``, ``aer_dev_fatal``: one ``<name> <count>`` line per
  error the kernel has a name for (``RxErr 0``), ``<array>_bit[<n>] <count>`` for a nameless bit
  that counted, then ``TOTAL_ERR_COR`` / ``TOTAL_ERR_NONFATAL`` / ``TOTAL_ERR_FATAL``.  The files
  exist only for a device with the AER capability on a kernel with CONFIG_PCIEAER.
"""

from __future__ import annotations

import errno
import os
import re
from dataclasses import dataclass
from pathlib import Path

from lockstep.agent.files import read_regular_file
from lockstep.collectors.toolkit.sysfs import COUNTER_MAX, SYSFS_ATTRIBUTE_BYTES
from lockstep.collectors.toolkit.sysfs import read_attribute as read_bounded_attribute

# The classes whose devices are read, as (kind label, directory under sysfs).
CLASSES = (("infiniband", Path("class") / "infiniband"), ("nvme", Path("class") / "nvme"))
# domain:bus:device.function, as sysfs names a PCI function's directory.
PCI_ADDRESS = re.compile(r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
# Transfer rate (GT/s) -> PCIe generation.
GENERATIONS = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6}
# The link widths the PCIe specification defines.
WIDTHS = frozenset({1, 2, 4, 8, 12, 16, 32})
# The AER files, by the severity label they feed, with the name of their total line.
AER_FILES = (
    ("correctable", "aer_dev_correctable", "TOTAL_ERR_COR"),
    ("nonfatal", "aer_dev_nonfatal", "TOTAL_ERR_NONFATAL"),
    ("fatal", "aer_dev_fatal", "TOTAL_ERR_FATAL"),
)
LINK_FILES = ("current_link_speed", "current_link_width", "max_link_speed", "max_link_width")


@dataclass(frozen=True)
class PcieDevice:
    """A class device (mlx5_0, nvme0) and the PCI function it is, found this round."""

    kind: str
    name: str
    path: Path  # the PCI function's directory, symlinks resolved
    address: str  # its PCI address, e.g. 0000:18:00.0
    upstream: Path | None  # the port above it (root port or switch downstream port), if any

    @property
    def upstream_address(self) -> str:
        return self.upstream.name if self.upstream is not None else ""


@dataclass(frozen=True)
class Link:
    generation: int
    max_generation: int
    width: int
    max_width: int


class Unreadable(Exception):
    """An attribute that is missing, unreadable or not understood: which file, and why."""

    def __init__(self, path: Path | str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = str(path)


def find_devices(sysfs: Path) -> tuple[list[PcieDevice], list[str], bool]:
    """The class devices that are PCIe functions with a link of their own; notes on the others
    (for doctor); and whether any class directory existed at all."""
    devices: list[PcieDevice] = []
    notes: list[str] = []
    any_class = False
    for kind, directory in CLASSES:
        try:
            names = sorted(os.listdir(sysfs / directory))
        except OSError:
            continue  # no such class here: no driver loaded for it
        any_class = True
        for name in names:
            link = sysfs / directory / name / "device"
            if not os.path.isdir(link):
                notes.append(f"{name}: no PCI device (a software device such as rxe or siw)")
                continue
            path = Path(os.path.realpath(link))
            if not PCI_ADDRESS.match(path.name):
                # An NVMe-over-fabrics controller's device is virtual, an mlx5 sub-function's auxiliary.
                notes.append(f"{name}: its device {path.name} is not a PCI function")
                continue
            if os.path.lexists(path / "physfn"):
                # A virtual function's link registers are reserved: its link is its physical function's.
                notes.append(f"{name}: an SR-IOV virtual function, whose link is its physical function's")
                continue
            upstream = path.parent if PCI_ADDRESS.match(path.parent.name) else None
            devices.append(PcieDevice(kind, name, path, path.name, upstream))
    return devices, notes, any_class


def read_attribute(path: Path) -> str:
    """A sysfs attribute's text, stripped; Unreadable naming the file and why."""
    try:
        return read_bounded_attribute(path)
    except OSError as exc:
        reason = os.strerror(exc.errno).lower() if exc.errno else str(exc)
        raise Unreadable(path, reason) from None


def parse_generation(text: str) -> int:
    """'16.0 GT/s PCIe' or '16 GT/s' -> 4."""
    parts = text.split()
    if len(parts) < 2 or parts[1] != "GT/s":
        raise ValueError(f"expected '<rate> GT/s', got {text[:40]!r}")
    try:
        rate = float(parts[0])
    except ValueError:
        raise ValueError(f"expected '<rate> GT/s', got {text[:40]!r}") from None
    generation = GENERATIONS.get(rate)
    if generation is None:
        raise ValueError(f"{text[:40]!r} is not the speed of a PCIe generation")
    return generation


def parse_width(text: str) -> int:
    """'16' -> 16; a number that is no PCIe lane count (63: all ones from a device that did not
    answer) is refused."""
    if not text.isdigit() or int(text) not in WIDTHS:
        raise ValueError(f"expected a lane count (1, 2, 4, 8, 12, 16 or 32), got {text[:40]!r}")
    return int(text)


def read_link(device: PcieDevice) -> Link:
    """The device's link: current and maximum generation and width.  The maximum is the lower of
    the device's and its upstream port's (the link trains to what both ends can do); an upstream
    port whose maxima cannot be read leaves the device's own."""
    values = {}
    for name in LINK_FILES:
        path = device.path / name
        text = read_attribute(path)
        try:
            values[name] = parse_generation(text) if name.endswith("speed") else parse_width(text)
        except ValueError as exc:
            raise Unreadable(path, str(exc)) from None
    max_generation, max_width = values["max_link_speed"], values["max_link_width"]
    if device.upstream is not None:
        try:
            max_generation = min(max_generation, parse_generation(read_attribute(device.upstream / "max_link_speed")))
            max_width = min(max_width, parse_width(read_attribute(device.upstream / "max_link_width")))
        except (Unreadable, ValueError):
            pass  # the device's own maxima then
    return Link(values["current_link_speed"], max_generation, values["current_link_width"], max_width)


def parse_aer(text: str, total_name: str) -> tuple[int, dict[str, int]]:
    """An aer_dev_* file: (its total, {error name: count}).  ValueError names the line."""
    total: int | None = None
    counts: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split()
        if len(parts) != 2 or not parts[1].isdigit() or len(parts[1]) > 20 or int(parts[1]) > COUNTER_MAX:
            raise ValueError(f"line {number}: expected '<error name> <count>', got {line[:60]!r}")
        name, count = parts[0], int(parts[1])
        if name == total_name:
            total = count
        elif name.startswith("TOTAL_ERR_"):
            raise ValueError(f"line {number}: {name} belongs in another AER file")
        else:
            counts[name] = count
    if total is None:
        raise ValueError(f"no {total_name} line")
    return total, counts


def read_aer(device: PcieDevice, filename: str, total_name: str) -> tuple[int, dict[str, int]] | None:
    """One AER file of the device; None if the device has none (no AER capability, or a kernel
    without CONFIG_PCIEAER); Unreadable if it cannot be read or understood."""
    path = device.path / filename
    try:
        text = read_regular_file(path, SYSFS_ATTRIBUTE_BYTES).decode("utf-8", "replace")
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return None
        reason = os.strerror(exc.errno).lower() if exc.errno else str(exc)
        raise Unreadable(path, reason) from None
    try:
        return parse_aer(text, total_name)
    except ValueError as exc:
        raise Unreadable(path, str(exc)) from None
