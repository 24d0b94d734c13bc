"""InfiniBand / RDMA collector: port state, rate and counters, and RDMA hw_counters, from sysfs.

Reads ``class/infiniband/<device>/ports/<port>/`` under --path.sysfs (see
docs/fabric.md and the reference in the design notes for what each file means):

- ``counters/``: the IB PerfMgt (PMA) port counters.  ``port_xmit_data``/``port_rcv_data``
  count 4-byte words by the IB spec's definition, on every link width and on RoCE too,
  so bytes are exactly ×4.  Kernels before 4.5 kept the 64-bit data and packet counters
  in ``counters_ext/``; where that directory exists its values replace the 32-bit ones.
- The legacy PMA counters do not wrap: they stop at their maximum (4, 8, 16 or 32 bits),
  and a pegged counter then has rate 0 forever.  Such counters are flagged by
  ``lockstep_ib_port_saturated``.
- ``hw_counters/``: driver counters (mlx5 congestion, retransmission, ...).  The known ones
  get their own names.  The others (mlx5 has ~13 a port: rx_write_requests, resp_cqe_error,
  ...; new firmware adds more) are exported as ``lockstep_rdma_hw_stats_total{counter=...}``
  only when the ``hw_stats`` option names them: no rule or dashboard reads them, and at 13
  series a port they would be the largest family after NVLink (docs/performance.md).
  The kernel caches a port's hw_counters for ``lifespan`` ms, so they are read back to back
  to get one consistent snapshot from one firmware query.

A counter file that says ``N/A (no PMA)`` (iWARP, old kernels) or fails with ENOENT,
EINVAL, EOPNOTSUPP or EACCES is skipped alone; a value that is not a number is skipped and
counted in ``lockstep_ib_port_unparseable_values_total``.  The rest of the port and device
still report.

Discovery (devices, ports, info labels, which counter files exist) is cached: it is redone
when the list of devices changes, and on every ``infiniband`` or ``net`` hotplug event.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Iterator
from dataclasses import dataclass

from lockstep.agent.collector import Collector, CollectorContext, Families, NothingHere
from lockstep.agent.families import Metric
from lockstep.agent.options import option, parse_string_list
from lockstep.collectors.infiniband.metrics import (
    EXT_COUNTERS,
    GENERIC_HW_STAT,
    HW_COUNTERS,
    HW_SETTINGS,
    LEGACY_DATA_WIDTH,
    LEGACY_WIDTH,
    MULTIPLIER,
    PMA_COUNTERS,
    PORT_INFO,
    PORT_PHYSICAL_STATE,
    PORT_RATE,
    PORT_STATE,
    SATURATED,
    UNPARSEABLE,
)
from lockstep.collectors.infiniband.sysfs import (
    DENIED_ERRNOS,
    UNAVAILABLE_ERRNOS,
    CounterFile,
    Discovery,
    Port,
    open_dir,
    parse_rate,
    parse_state,
    read_at,
)
from lockstep.collectors.toolkit.sysfs import COUNTER_MAX, INFINIBAND_CLASS, read_line, resolve_netdev


@dataclass(frozen=True)
class InfinibandOptions:
    hw_stats: tuple[str, ...] = option(
        (),
        parse_string_list,
        "glob patterns of hw_counters files without a dedicated metric to export as "
        "lockstep_rdma_hw_stats_total ('*': all; none by default)",
        flag="--infiniband.hw-stat",
        repeatable=True,
    )


class InfinibandCollector(Collector[InfinibandOptions]):
    name = "infiniband"
    help = "InfiniBand/RDMA ports: state, rate, PMA counters and RDMA hw_counters, from sysfs."
    default_interval = 15.0
    metrics = (
        PORT_INFO,
        PORT_STATE,
        PORT_PHYSICAL_STATE,
        PORT_RATE,
        *PMA_COUNTERS.values(),
        SATURATED,
        UNPARSEABLE,
        *HW_COUNTERS.values(),
        GENERIC_HW_STAT,
    )
    options_class = InfinibandOptions
    hotplug_subsystems = ("infiniband", "net")

    def __init__(self, context: CollectorContext) -> None:
        super().__init__(context)
        self.root = self.paths.sysfs / INFINIBAND_CLASS
        self._discovery: Discovery | None = None
        # (device, port) -> values skipped as unparseable so far; survives rediscovery.
        self._unparseable: dict[tuple[str, str], int] = {}
        self._warned: set[tuple[str, str, str]] = set()  # warn once per bad file
        # (device, port) -> counters skipped as not provided by the hardware, for doctor
        self._unavailable: dict[tuple[str, str], set[str]] = {}
        # (device, port) -> counters skipped because this user may not read them, for doctor
        self._denied: dict[tuple[str, str], set[str]] = {}

    def on_hotplug(self, action: str, subsystem: str, sys_path: str) -> None:
        self._discovery = None  # an HCA or its netdev came, went or changed: discover again

    def check(self) -> str:
        super().check()
        notes = []
        for skipped, why in (
            (self._unavailable, "not provided by the hardware or driver (skipped)"),
            (self._denied, "permission denied, run as root to read them (skipped)"),
        ):
            if skipped:
                ports = (
                    f"{device} port {port}: {', '.join(sorted(names)) if len(names) <= 3 else f'{len(names)} counters'}"
                    for (device, port), names in sorted(skipped.items())
                )
                notes.append(f"{why}: " + "; ".join(ports))
        return "; ".join(notes)

    # --- discovery ---

    def _discover(self) -> Discovery:
        try:
            devices = tuple(sorted(os.listdir(self.root)))
        except FileNotFoundError:
            raise NothingHere(
                f"no {self.root}: no InfiniBand or RDMA devices on this machine (or their drivers are not loaded)"
            ) from None
        if not devices:
            raise NothingHere(f"{self.root} is empty: no InfiniBand or RDMA devices on this machine")
        listing = tuple((device, self._port_numbers(device)) for device in devices)
        cached = self._discovery
        if cached is not None and cached.devices == listing:
            return cached
        ports: list[Port] = []
        for device, numbers in listing:
            ports.extend(self._discover_device(device, numbers))
        discovery = Discovery(listing, tuple(ports))
        self._discovery = discovery
        return discovery

    def _port_numbers(self, device: str) -> tuple[str, ...]:
        try:
            return tuple(sorted((p for p in os.listdir(self.root / device / "ports") if p.isdigit()), key=int))
        except OSError:
            return ()  # vanished meanwhile, or not a device with ports

    def _discover_device(self, device: str, numbers: tuple[str, ...]) -> Iterator[Port]:
        device_dir = self.root / device
        if not numbers:
            return
        node_guid = read_line(device_dir / "node_guid")
        firmware = read_line(device_dir / "fw_ver")
        board_id = read_line(device_dir / "board_id")
        hca_type = read_line(device_dir / "hca_type")
        for number in numbers:
            port_dir = device_dir / "ports" / number
            link_layer = read_line(port_dir / "link_layer")
            netdev = resolve_netdev(device_dir, number) if link_layer == "Ethernet" else ""
            locations: dict[str, tuple[str, str]] = {}  # counters/ name -> (directory, file) holding it
            try:
                names = os.listdir(port_dir / "counters")
            except OSError:
                names = []
            for name in sorted(names):
                if name in PMA_COUNTERS:
                    locations[name] = ("counters", name)
            try:
                ext_names = os.listdir(port_dir / "counters_ext")
            except OSError:
                ext_names = []
            for name in sorted(ext_names):
                if name in EXT_COUNTERS:
                    locations[EXT_COUNTERS[name]] = ("counters_ext", name)
            # 64-bit data and packet counters (extended PMA, or counters_ext/) cannot saturate.
            extended = "unicast_xmit_packets" in names or bool(ext_names)
            counter_files = []
            for name, (directory, filename) in locations.items():
                width = LEGACY_WIDTH.get(name) or (None if extended else LEGACY_DATA_WIDTH.get(name))
                ceiling = None if width is None else (1 << width) - 1
                counter_files.append(CounterFile(directory, filename, name, MULTIPLIER.get(name, 1), ceiling))
            yield Port(
                device=device,
                number=number,
                path=str(port_dir),
                link_layer=link_layer,
                netdev=netdev,
                node_guid=node_guid,
                firmware_version=firmware,
                board_id=board_id,
                hca_type=hca_type,
                counter_files=tuple(counter_files),
            )

    # --- one round ---

    def collect(self) -> Iterator[Metric]:
        discovery = self._discover()
        families = Families(self.metrics)
        vanished = False
        for port in discovery.ports:
            labels = [port.device, port.number]
            try:
                port_fd = open_dir(port.path)
            except OSError:
                vanished = True  # the port went away since discovery: rediscover next round
                continue
            try:
                texts = {}
                for attribute in ("state", "phys_state", "rate"):
                    try:
                        texts[attribute] = read_at(port_fd, attribute).decode("utf-8", "replace").strip()
                    except OSError:
                        texts[attribute] = ""  # the driver does not provide it
                counters = self._read_counters(port, port_fd)
                hw_counters = self._read_hw_counters(port, port_fd)
            finally:
                os.close(port_fd)
            self._gauge(families[PORT_STATE], labels, port, "state", texts["state"], parse_state)
            self._gauge(families[PORT_PHYSICAL_STATE], labels, port, "phys_state", texts["phys_state"], parse_state)
            self._gauge(families[PORT_RATE], labels, port, "rate", texts["rate"], parse_rate)
            families[PORT_INFO].add_metric(
                [
                    port.device,
                    port.number,
                    port.link_layer,
                    port.netdev,
                    port.node_guid,
                    port.firmware_version,
                    port.board_id,
                    port.hca_type,
                    texts["rate"],
                ],
                1,
            )
            for counter, value in counters:
                families[PMA_COUNTERS[counter.name]].add_metric(labels, value * counter.multiplier)
                if counter.ceiling is not None and value >= counter.ceiling:
                    families[SATURATED].add_metric([*labels, counter.name], 1)
            for name, value in hw_counters:
                spec = HW_COUNTERS.get(name)
                if spec is not None and spec.name.startswith("lockstep_roce_") and port.link_layer != "Ethernet":
                    spec = None  # RoCE's own counters mean nothing on an InfiniBand port: kept, but generic
                if spec is not None:
                    families[spec].add_metric(labels, value)
                elif any(fnmatch.fnmatchcase(name, pattern) for pattern in self.options.hw_stats):
                    families[GENERIC_HW_STAT].add_metric([*labels, name], value)
            families[UNPARSEABLE].add_metric(labels, self._unparseable.get((port.device, port.number), 0))
        if vanished:
            self._discovery = None
        yield from families.all()

    def _read_counters(self, port: Port, port_fd: int) -> list[tuple[CounterFile, int]]:
        """The PMA counters of the port with their raw values, unavailable ones left out."""
        values = []
        directories: dict[str, int | None] = {}
        try:
            for counter in port.counter_files:
                directory, filename, name = counter.directory, counter.filename, counter.name
                if directory not in directories:
                    try:
                        directories[directory] = open_dir(directory, port_fd)
                    except OSError:
                        directories[directory] = None
                directory_fd = directories[directory]
                if directory_fd is None:
                    continue
                try:
                    raw = read_at(directory_fd, filename)
                except OSError as exc:
                    self._skip(port, name, f"{port.path}/{directory}/{filename}", exc)
                    continue
                number = self._number(port, name, raw)
                if number is not None:
                    values.append((counter, number))
        finally:
            for fd in directories.values():
                if fd is not None:
                    os.close(fd)
        return values

    def _read_hw_counters(self, port: Port, port_fd: int) -> list[tuple[str, int]]:
        """The port's hw_counters, listed afresh every round (drivers and `rdma statistic` add some)."""
        try:
            directory_fd = open_dir("hw_counters", port_fd)
        except OSError:
            return []  # this driver has none
        try:
            names = sorted(n for n in os.listdir(directory_fd) if n not in HW_SETTINGS)
            # Back to back, nothing in between: the kernel serves them all from one snapshot
            # taken within its `lifespan` cache period.
            raws: list[bytes | OSError] = []
            for name in names:
                try:
                    raws.append(read_at(directory_fd, name))
                except OSError as exc:
                    raws.append(exc)
        except OSError:
            return []
        finally:
            os.close(directory_fd)
        values = []
        for name, raw in zip(names, raws):
            if isinstance(raw, OSError):
                self._skip(port, name, f"{port.path}/hw_counters/{name}", raw)
                continue
            number = self._number(port, name, raw)
            if number is not None:
                values.append((name, number))
        return values

    def _number(self, port: Port, name: str, raw: bytes) -> int | None:
        """A counter file's value, or None (counted, logged once) if it is not a 64-bit count."""
        text = raw.strip()
        if not text.isdigit():  # bytes.isdigit: ASCII digits only
            self._not_a_number(port, name, text)
            return None
        if len(text) > 20 or int(text) > COUNTER_MAX:
            self._count_unparseable(port, name, f"{text[:24].decode()}... is wider than a 64-bit counter")
            return None
        return int(text)

    def _not_a_number(self, port: Port, name: str, text: bytes) -> None:
        """'N/A (no PMA)': the hardware does not have it; anything else is garbage, counted."""
        if text.startswith(b"N/A"):
            self._unavailable.setdefault((port.device, port.number), set()).add(name)
        else:
            self._count_unparseable(port, name, f"not a number: {text[:40]!r}")

    def _skip(self, port: Port, name: str, path: str, exc: OSError) -> None:
        if exc.errno in DENIED_ERRNOS:
            # Skipped, not an error of the data: but the operator can fix it, so doctor says so.
            self._denied.setdefault((port.device, port.number), set()).add(name)
        elif exc.errno in UNAVAILABLE_ERRNOS:
            self._unavailable.setdefault((port.device, port.number), set()).add(name)
        else:
            self._count_unparseable(port, name, f"{os.strerror(exc.errno or 0).lower()} reading {path}")

    def _gauge(self, family, labels, port: Port, what: str, text: str, parse) -> None:  # type: ignore[no-untyped-def]
        if not text:
            return  # the driver does not provide it
        try:
            family.add_metric(labels, parse(text))
        except ValueError as exc:
            self._count_unparseable(port, what, str(exc))

    def _count_unparseable(self, port: Port, counter: str, why: str) -> None:
        key = (port.device, port.number)
        self._unparseable[key] = self._unparseable.get(key, 0) + 1
        if (port.device, port.number, counter) not in self._warned:
            self._warned.add((port.device, port.number, counter))
            self.log.warning(
                "skipping a value that is not a number",
                extra={"device": port.device, "port": port.number, "counter": counter, "reason": why},
            )
