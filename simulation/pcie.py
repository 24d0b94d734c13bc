"""The simulated node's PCIe: the PCI functions of its HCAs and NVMe drive, with their link and AER files.

Laid out as the kernel lays out sysfs: each function is a directory below the port above it,
``devices/pci0000:<bus>/0000:<bus>:<port>/<function>/``, and each class device points at its
function with a relative ``device`` symlink (``class/infiniband/mlx5_0/device``, which the fabric
area's HCAs get from ``link_device``; ``class/nvme/nvme0/device``).

- ``mlx5_0`` .. ``mlx5_7``: ConnectX-7, PCIe Gen5 x16, each below a Gen5 x16 switch port;
- ``mlx5_8``, ``mlx5_9``: the two functions of a ConnectX-6 Dx, Gen4 x16;
- ``nvme0``: the boot drive, Gen4 x4, with a few correctable receiver errors since boot (common,
  harmless).

The GPUs' links are NVML's (the gpu area's fake NVML).  Scenario:
- ``pcie-degraded``: GPU 2's link trained at x8 of x16 (gpu area) and ``mlx5_5``'s at Gen4 of Gen5,
  with correctable errors rising (a marginal link, retrained a generation down).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from lockstep.simulation import Scenario

if TYPE_CHECKING:
    from lockstep.simulation import SimulatedNode

SCENARIOS = (
    Scenario(
        "pcie-degraded",
        "GPU 2's PCIe link trained at x8 of x16 and HCA mlx5_5's at Gen4 of Gen5 (correctable AER errors rising): "
        "host-to-device and GPUDirect RDMA bandwidth through them is halved.",
    ),
)

SPEED = {3: "8.0 GT/s PCIe", 4: "16.0 GT/s PCIe", 5: "32.0 GT/s PCIe"}  # as Linux 5.7 and later write it
CORRECTABLE = ("RxErr", "BadTLP", "BadDLLP", "Rollover", "Timeout", "NonFatalErr", "CorrIntErr", "HeaderOF")
UNCORRECTABLE = (
    "Undefined",
    "DLP",
    "SDES",
    "TLP",
    "FCP",
    "CmpltTO",
    "CmpltAbrt",
    "UnxCmplt",
    "RxOF",
    "MalfTLP",
    "ECRC",
    "UnsupReq",
    "ACSViol",
    "UncorrIntErr",
    "BlockedTLP",
    "AtomicOpBlocked",
    "TLPBlockedErr",
    "PoisonTLPBlocked",
)
# The InfiniBand HCAs sit two buses after their rail's GPU (simulation/gpu.py PCI_BUS_IDS).
_IB_BUSES = (0x1A, 0x2C, 0x3C, 0x5F, 0x9C, 0xAD, 0xBC, 0xDD)
# class device -> (PCI function, the port above it, max generation, max width)
FUNCTIONS: dict[str, tuple[str, str, int, int]] = {
    **{f"mlx5_{i}": (f"0000:{bus:02x}:00.0", f"0000:{bus - 1:02x}:02.0", 5, 16) for i, bus in enumerate(_IB_BUSES)},
    "mlx5_8": ("0000:c1:00.0", "0000:c0:01.1", 4, 16),
    "mlx5_9": ("0000:c1:00.1", "0000:c0:01.1", 4, 16),
    "nvme0": ("0000:e1:00.0", "0000:e0:03.1", 4, 4),
}
DEGRADED_HCA = "mlx5_5"  # pcie-degraded: trained a generation down


def pci_function(sysfs: Path, device: str) -> Path:
    """The directory of a class device's PCI function (the port above it is its parent)."""
    function, port, _, _ = FUNCTIONS[device]
    return sysfs / "devices" / f"pci{port[:7]}" / port / function


def link_device(class_dir: Path, function: Path) -> None:
    """Point ``class_dir/device`` at the PCI function with a relative symlink, as sysfs does."""
    link = class_dir / "device"
    if link.is_symlink():
        return
    function.mkdir(parents=True, exist_ok=True)
    class_dir.mkdir(parents=True, exist_ok=True)
    link.symlink_to(os.path.relpath(function, class_dir))


def aer_files(correctable: dict[str, int]) -> dict[str, str]:
    """The three aer_dev_* files of a function with these correctable errors and no uncorrectable ones."""
    return {
        "aer_dev_correctable": "".join(f"{name} {correctable.get(name, 0)}\n" for name in CORRECTABLE)
        + f"TOTAL_ERR_COR {sum(correctable.values())}\n",
        "aer_dev_nonfatal": "".join(f"{name} 0\n" for name in UNCORRECTABLE) + "TOTAL_ERR_NONFATAL 0\n",
        "aer_dev_fatal": "".join(f"{name} 0\n" for name in UNCORRECTABLE) + "TOTAL_ERR_FATAL 0\n",
    }


def build(node: SimulatedNode, t: float) -> None:
    write = node.write_if_changed
    sysfs = node.paths.sysfs
    degraded = node.scenario == "pcie-degraded"
    for device, (_, _, max_generation, max_width) in FUNCTIONS.items():
        function = pci_function(sysfs, device)
        generation = max_generation - 1 if degraded and device == DEGRADED_HCA else max_generation
        for directory, current in ((function.parent, max_generation), (function, generation)):
            write(directory / "current_link_speed", f"{SPEED[current]}\n")
            write(directory / "current_link_width", f"{max_width}\n")
            write(directory / "max_link_speed", f"{SPEED[max_generation]}\n")
            write(directory / "max_link_width", f"{max_width}\n")
        correctable = {}
        if device == "nvme0":
            correctable = {"RxErr": 3}
        elif degraded and device == DEGRADED_HCA:
            # Replays of a marginal link: bad TLPs and DLLPs, receiver errors, rising.
            correctable = {"RxErr": 120 + int(t / 2), "BadTLP": 41 + int(t / 5), "BadDLLP": 17 + int(t / 10)}
        for name, text in aer_files(correctable).items():
            write(function / name, text)
        if device.startswith("nvme"):
            class_dir = sysfs / "class" / "nvme" / device
            write(class_dir / "model", "SAMSUNG MZQL23T8HCLS-00A07\n")
            link_device(class_dir, function)
