"""PCIe collector: link generation and width, and AER errors, of the node's HCAs and NVMe devices.

Why a collector of its own rather than a part of the infiniband collector: it reads PCI
functions, not RDMA ports, and covers NVMe controllers too; a link's training state changes
rarely, so it runs on a slower interval than the port counters; and it can be turned off
(``--no-collector.pcie``) on its own.

Each round lists ``class/infiniband`` and ``class/nvme`` under --path.sysfs and resolves each
device's ``device`` symlink to its PCI function (sysfs links are relative, so a host sysfs
mounted elsewhere resolves within the mount).  Traps handled (see docs/fabric.md):

- a link trains to what both ends can do, so the maximum is the lower of the device's and the
  port above it's: a Gen5 HCA in a Gen4 slot is not degraded at Gen4;
- an SR-IOV virtual function has no link of its own (its link registers are reserved and read
  as ``Unknown``): skipped quietly, doctor says so; so is a class device without a PCI function
  (software RDMA such as rxe, NVMe over fabrics);
- both spellings of the speed (``16.0 GT/s PCIe`` since Linux 5.7, ``16 GT/s`` before);
- a link attribute that is missing, unreadable, ``Unknown`` or no lane count leaves the device's
  four link values out for the round, an AER file that cannot be read or parsed leaves that file's
  counters out; both are counted in ``lockstep_pcie_skipped_reads_total`` and logged once per file;
- AER files are absent for a device without the AER capability: no error, no series.
"""

from __future__ import annotations

from collections.abc import Iterator

from lockstep.agent.collector import Collector, CollectorContext, Families, NothingHere
from lockstep.agent.families import Metric
from lockstep.collectors.pcie.metrics import (
    AER_ERRORS,
    AER_ERRORS_BY_TYPE,
    DEVICE_INFO,
    LINK_GENERATION,
    LINK_MAX_GENERATION,
    LINK_MAX_WIDTH,
    LINK_WIDTH,
    METRICS,
    SKIPPED_READS,
)
from lockstep.collectors.pcie.sysfs import AER_FILES, CLASSES, PcieDevice, Unreadable, find_devices, read_aer, read_link


class PcieCollector(Collector):
    name = "pcie"
    help = "PCIe link generation and width, and AER error counters, of InfiniBand/RDMA HCAs and NVMe devices (sysfs)."
    default_interval = 30.0
    metrics = METRICS

    def __init__(self, context: CollectorContext) -> None:
        super().__init__(context)
        self._skipped: dict[tuple[str, str], int] = {}  # (kind, device) -> reads left out so far
        self._warned: set[tuple[str, str]] = set()  # (device, file): logged once each
        self._notes: list[str] = []  # devices not read, and why (for doctor)
        self._without_aer: set[str] = set()

    def collect(self) -> Iterator[Metric]:
        devices, self._notes, any_class = find_devices(self.paths.sysfs)
        if not devices:
            where = " or ".join(str(self.paths.sysfs / directory) for _, directory in CLASSES)
            if not any_class:
                raise NothingHere(f"no {where}: no InfiniBand/RDMA or NVMe devices on this machine")
            raise NothingHere(f"no PCIe function with a link of its own under {where}: " + "; ".join(self._notes))
        families = Families(self.metrics)
        for device in devices:
            labels = [device.name, device.kind]
            families[DEVICE_INFO].add_metric([*labels, device.address, device.upstream_address], 1)
            try:
                link = read_link(device)
            except Unreadable as exc:
                self._skip(device, exc)
            else:
                families[LINK_GENERATION].add_metric(labels, link.generation)
                families[LINK_MAX_GENERATION].add_metric(labels, link.max_generation)
                families[LINK_WIDTH].add_metric(labels, link.width)
                families[LINK_MAX_WIDTH].add_metric(labels, link.max_width)
            self._read_aer(device, labels, families)
            families[SKIPPED_READS].add_metric(labels, self._skipped.get((device.kind, device.name), 0))
        yield from families.with_samples()

    def _read_aer(self, device: PcieDevice, labels: list[str], families: Families) -> None:
        for severity, filename, total_name in AER_FILES:
            try:
                found = read_aer(device, filename, total_name)
            except Unreadable as exc:
                self._skip(device, exc)
                continue
            if found is None:
                self._without_aer.add(device.name)
                continue
            total, counts = found
            families[AER_ERRORS].add_metric([*labels, severity], total)
            for error, count in counts.items():
                if count:
                    families[AER_ERRORS_BY_TYPE].add_metric([*labels, severity, error], count)

    def _skip(self, device: PcieDevice, problem: Unreadable) -> None:
        key = (device.kind, device.name)
        self._skipped[key] = self._skipped.get(key, 0) + 1
        if (device.name, problem.path) not in self._warned:  # once per file, not every round
            self._warned.add((device.name, problem.path))
            self.log.warning(
                "skipping a PCIe attribute that cannot be read", extra={"device": device.name, "reason": str(problem)}
            )

    def check(self) -> str:
        super().check()
        notes = [f"not read: {'; '.join(self._notes)}"] if self._notes else []
        if self._without_aer:
            notes.append(
                f"no AER counters (no AER capability, or a kernel without CONFIG_PCIEAER): "
                f"{', '.join(sorted(self._without_aer))}"
            )
        skipped = [f"{name} ({count})" for (_, name), count in sorted(self._skipped.items())]
        if skipped:
            notes.append(f"attributes that could not be read (see the log): {', '.join(skipped)}")
        return "; ".join(notes)
