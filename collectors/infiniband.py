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

import errno
import fnmatch
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from prometheus_client.core import Metric

from lockstep.agent.collector import Collector, CollectorContext, MetricSpec, NothingHere, Option
from lockstep.agent.config import parse_string_list
from lockstep.agent.files import read_text

LABELS = ("device", "port")

PORT_INFO = MetricSpec(
    "lockstep_ib_port_info",
    "gauge",
    "One series per InfiniBand/RDMA port, valued 1, with its descriptive labels: link layer "
    "(InfiniBand or Ethernet for RoCE/iWARP), the RoCE port's network interface, the HCA's node GUID, "
    "firmware version, board id, HCA type and the rate as the kernel words it.",
    ("device", "port", "link_layer", "netdev", "node_guid", "firmware_version", "board_id", "hca_type", "rate"),
)
PORT_STATE = MetricSpec(
    "lockstep_ib_port_state",
    "gauge",
    "Logical port state: 0 NOP, 1 DOWN, 2 INIT, 3 ARMED, 4 ACTIVE, 5 ACTIVE_DEFER.",
    LABELS,
)
PORT_PHYSICAL_STATE = MetricSpec(
    "lockstep_ib_port_physical_state",
    "gauge",
    "Physical port state: 1 Sleep, 2 Polling, 3 Disabled, 4 PortConfigurationTraining, 5 LinkUp, "
    "6 LinkErrorRecovery, 7 PhyTest.",
    LABELS,
)
PORT_RATE = MetricSpec(
    "lockstep_ib_port_rate_bytes_per_second",
    "gauge",
    "Signalling rate the port negotiated (ports/N/rate, e.g. 400 Gb/sec), in bytes per second.",
    LABELS,
    unit="bytes per second",
)
SATURATED = MetricSpec(
    "lockstep_ib_port_saturated",
    "gauge",
    "1 for a PMA counter of the port (label counter: its counters/ file name) stuck at its maximum: IB PMA "
    "counters saturate instead of wrapping, so it no longer counts and its rate reads 0 whatever happens. "
    "Present only for such counters.",
    ("device", "port", "counter"),
)
UNPARSEABLE = MetricSpec(
    "lockstep_ib_port_unparseable_values_total",
    "counter",
    "Values of the port that were skipped because their file did not hold what the kernel writes there "
    "(a counter that is not a number, a state or rate in an unknown format) or failed to read for a "
    "reason other than the counter being unsupported. The warning log names the file.",
    LABELS,
)
GENERIC_HW_STAT = MetricSpec(
    "lockstep_rdma_hw_stats_total",
    "counter",
    "A driver counter from ports/N/hw_counters that has no dedicated metric, by its file name; only those "
    "the collector's hw_stats option names (none by default).",
    ("device", "port", "counter"),
)


def _counter(name: str, help: str, unit: str = "") -> MetricSpec:
    return MetricSpec(name, "counter", help, LABELS, unit=unit)


# counters/ file -> its metric.  The *_data files are multiplied by 4 (see _MULTIPLIER).
PMA_COUNTERS: dict[str, MetricSpec] = {
    "port_xmit_data": _counter(
        "lockstep_ib_port_transmitted_bytes_total",
        "Bytes transmitted on all VLs (port_xmit_data × 4: the PMA counts 4-byte words; on RoCE, RDMA traffic only).",
        "bytes",
    ),
    "port_rcv_data": _counter(
        "lockstep_ib_port_received_bytes_total",
        "Bytes received on all VLs (port_rcv_data × 4: the PMA counts 4-byte words; on RoCE, RDMA traffic only).",
        "bytes",
    ),
    "port_xmit_packets": _counter(
        "lockstep_ib_port_transmitted_packets_total", "Packets transmitted on all VLs (port_xmit_packets)."
    ),
    "port_rcv_packets": _counter(
        "lockstep_ib_port_received_packets_total", "Packets received on all VLs, including errored ones."
    ),
    "unicast_xmit_packets": _counter(
        "lockstep_ib_port_unicast_transmitted_packets_total", "Unicast packets transmitted."
    ),
    "unicast_rcv_packets": _counter("lockstep_ib_port_unicast_received_packets_total", "Unicast packets received."),
    "multicast_xmit_packets": _counter(
        "lockstep_ib_port_multicast_transmitted_packets_total", "Multicast packets transmitted."
    ),
    "multicast_rcv_packets": _counter(
        "lockstep_ib_port_multicast_received_packets_total", "Multicast packets received."
    ),
    "symbol_error": _counter(
        "lockstep_ib_port_symbol_errors_total",
        "Minor link errors on any lane (symbol_error): a bad cable or transceiver. Saturates at 65535.",
    ),
    "link_downed": _counter(
        "lockstep_ib_port_link_downed_total",
        "Times the link failed to recover from errors and went down (link_downed). Saturates at 255.",
    ),
    "link_error_recovery": _counter(
        "lockstep_ib_port_link_error_recovery_total",
        "Times the link retrained successfully after errors (link_error_recovery). Saturates at 255.",
    ),
    "port_xmit_wait": _counter(
        "lockstep_ib_port_transmit_wait_total",
        "Ticks during which the port had data to send but no flow-control credits (congestion; "
        "port_xmit_wait). Saturates at 4294967295.",
    ),
    "port_xmit_discards": _counter(
        "lockstep_ib_port_transmit_discards_total",
        "Outbound packets discarded because the port was down or congested (port_xmit_discards).",
    ),
    "port_rcv_errors": _counter(
        "lockstep_ib_port_receive_errors_total", "Received packets with errors, e.g. bad CRC (port_rcv_errors)."
    ),
    "port_rcv_remote_physical_errors": _counter(
        "lockstep_ib_port_receive_remote_physical_errors_total",
        "Received packets marked bad by an upstream hop (EBP; port_rcv_remote_physical_errors).",
    ),
    "port_rcv_switch_relay_errors": _counter(
        "lockstep_ib_port_receive_switch_relay_errors_total",
        "Received packets a switch could not forward (port_rcv_switch_relay_errors).",
    ),
    "port_xmit_constraint_errors": _counter(
        "lockstep_ib_port_transmit_constraint_errors_total",
        "Outbound packets dropped by partition or raw filtering (port_xmit_constraint_errors).",
    ),
    "port_rcv_constraint_errors": _counter(
        "lockstep_ib_port_receive_constraint_errors_total",
        "Inbound packets dropped by partition or raw filtering (port_rcv_constraint_errors).",
    ),
    "local_link_integrity_errors": _counter(
        "lockstep_ib_port_local_link_integrity_errors_total",
        "Times the local physical error threshold was exceeded (local_link_integrity_errors). Saturates at 15.",
    ),
    "excessive_buffer_overrun_errors": _counter(
        "lockstep_ib_port_excessive_buffer_overrun_errors_total",
        "Consecutive flow-control buffer overruns (excessive_buffer_overrun_errors). Saturates at 15.",
    ),
    "VL15_dropped": _counter("lockstep_ib_port_vl15_dropped_total", "Subnet management packets (VL15) dropped."),
}
# counters_ext/ (kernels before 4.5): the 64-bit values, replacing their counters/ namesakes.
EXT_COUNTERS = {
    "port_xmit_data_64": "port_xmit_data",
    "port_rcv_data_64": "port_rcv_data",
    "port_xmit_packets_64": "port_xmit_packets",
    "port_rcv_packets_64": "port_rcv_packets",
    "port_unicast_xmit_packets": "unicast_xmit_packets",
    "port_unicast_rcv_packets": "unicast_rcv_packets",
    "port_multicast_xmit_packets": "multicast_xmit_packets",
    "port_multicast_rcv_packets": "multicast_rcv_packets",
}
_MULTIPLIER = {"port_xmit_data": 4, "port_rcv_data": 4}
# Width in bits of the legacy PortCounters fields, which saturate at 2**width - 1.  The data
# and packet counters are 32 bits only on ports without the extended (64-bit) counters.
LEGACY_WIDTH = {
    "symbol_error": 16,
    "link_error_recovery": 8,
    "link_downed": 8,
    "port_rcv_errors": 16,
    "port_rcv_remote_physical_errors": 16,
    "port_rcv_switch_relay_errors": 16,
    "port_xmit_discards": 16,
    "port_xmit_constraint_errors": 8,
    "port_rcv_constraint_errors": 8,
    "local_link_integrity_errors": 4,
    "excessive_buffer_overrun_errors": 4,
    "VL15_dropped": 16,
    "port_xmit_wait": 32,
}
LEGACY_DATA_WIDTH = {"port_xmit_data": 32, "port_rcv_data": 32, "port_xmit_packets": 32, "port_rcv_packets": 32}

# hw_counters/ file -> its metric (mlx5 names).  Other files go to GENERIC_HW_STAT.
HW_COUNTERS: dict[str, MetricSpec] = {
    "np_ecn_marked_roce_packets": _counter(
        "lockstep_roce_ecn_marked_packets_total",
        "RoCEv2 packets received with ECN congestion-experienced set (this host as notification point).",
    ),
    "np_cnp_sent": _counter(
        "lockstep_roce_cnp_sent_total", "Congestion notification packets this host sent back (notification point)."
    ),
    "rp_cnp_handled": _counter(
        "lockstep_roce_cnp_handled_total",
        "Congestion notification packets received and used to slow the sending QP (reaction point, DCQCN).",
    ),
    "rp_cnp_ignored": _counter(
        "lockstep_roce_cnp_ignored_total",
        "Congestion notification packets received and ignored; rising means congestion control is off.",
    ),
    "out_of_sequence": _counter(
        "lockstep_roce_out_of_sequence_total", "Out-of-order packets received: loss upstream in a 'lossless' fabric."
    ),
    "packet_seq_err": _counter(
        "lockstep_roce_packet_sequence_errors_total", "NAK-sequence-error packets received (before the retry limit)."
    ),
    "local_ack_timeout_err": _counter(
        "lockstep_roce_local_ack_timeouts_total", "Times a QP's ack timer expired at the sender (recoverable)."
    ),
    "implied_nak_seq_err": _counter(
        "lockstep_roce_implied_nak_sequence_errors_total", "NAKs the requester inferred from a later ACK."
    ),
    "duplicate_request": _counter(
        "lockstep_roce_duplicate_requests_total", "Duplicate requests received: retransmissions reaching the responder."
    ),
    "rnr_nak_retry_err": _counter(
        "lockstep_roce_rnr_naks_received_total", "Receiver-not-ready NAKs received (before the retry limit)."
    ),
    "out_of_buffer": _counter(
        "lockstep_roce_out_of_buffer_drops_total",
        "Packets dropped because the QP had no posted receive buffer (the application is not keeping up).",
    ),
    "req_transport_retries_exceeded": _counter(
        "lockstep_roce_transport_retries_exceeded_total", "QPs that ran out of transport retries (fatal: QP error)."
    ),
    "req_rnr_retries_exceeded": _counter(
        "lockstep_roce_rnr_retries_exceeded_total", "QPs that ran out of RNR retries (fatal: QP error)."
    ),
    "rx_icrc_encapsulated": _counter(
        "lockstep_roce_icrc_errors_total", "RoCE packets received with an invariant CRC error (corruption)."
    ),
}
# Files in hw_counters/ that are settings, not counters.
HW_SETTINGS = frozenset({"lifespan"})

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


def _read_line(path: Path) -> str:
    """A one-line sysfs attribute, stripped; '' if it is absent or unreadable."""
    try:
        return read_text(path).strip()
    except OSError:
        return ""


def _read_at(directory: int, name: str) -> bytes:
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


def _open_dir(name: str, parent: int | None = None) -> int:
    return os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=parent)


def _resolve_netdev(device_dir: Path, port: str) -> str:
    """The network interface of a RoCE/iWARP port: the netdev of GID 0, else the device's netdev
    for this port (dev_port is 0-based), else ''."""
    netdev = _read_line(device_dir / "ports" / port / "gid_attrs" / "ndevs" / "0")
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
        if _read_line(net_dir / name / "dev_port") == str(int(port) - 1):
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
            if port.isdigit() and _read_line(root / device / "ports" / port / "link_layer") == "Ethernet":
                netdev = _resolve_netdev(root / device, port)
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


class InfinibandCollector(Collector):
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
    options = (
        Option(
            "hw_stats",
            parse_string_list,
            (),
            "glob patterns of hw_counters files without a dedicated metric to export as "
            "lockstep_rdma_hw_stats_total ('*': all; none by default)",
            flag="--infiniband.hw-stat",
            repeatable=True,
        ),
    )
    hotplug_subsystems = ("infiniband", "net")

    def __init__(self, context: CollectorContext) -> None:
        super().__init__(context)
        self.root = self.paths.sysfs / INFINIBAND_CLASS
        self.hw_stats: tuple[str, ...] = tuple(context.options.get("hw_stats", ()))
        self._discovery: Discovery | None = None
        # (device, port) -> values skipped as unparseable so far; survives rediscovery.
        self._unparseable: dict[tuple[str, str], int] = {}
        self._warned: set[tuple[str, str, str]] = set()  # warn once per bad file
        # (device, port) -> counters skipped as not provided by the hardware, for doctor
        self._unavailable: dict[tuple[str, str], set[str]] = {}

    def on_hotplug(self, action: str, subsystem: str, sys_path: str) -> None:
        self._discovery = None  # an HCA or its netdev came, went or changed: discover again

    def check(self) -> str:
        super().check()
        if not self._unavailable:
            return ""
        ports = (
            f"{device} port {port}: {', '.join(sorted(names)) if len(names) <= 3 else f'{len(names)} counters'}"
            for (device, port), names in sorted(self._unavailable.items())
        )
        return "not provided by the hardware or driver (skipped): " + "; ".join(ports)

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
        cached = self._discovery
        if cached is not None and cached.devices == devices:
            return cached
        ports: list[Port] = []
        for device in devices:
            ports.extend(self._discover_device(device))
        discovery = Discovery(devices, tuple(ports))
        self._discovery = discovery
        return discovery

    def _discover_device(self, device: str) -> Iterator[Port]:
        device_dir = self.root / device
        try:
            numbers = sorted((p for p in os.listdir(device_dir / "ports") if p.isdigit()), key=int)
        except OSError:
            return  # vanished meanwhile, or not a device with ports
        node_guid = _read_line(device_dir / "node_guid")
        firmware = _read_line(device_dir / "fw_ver")
        board_id = _read_line(device_dir / "board_id")
        hca_type = _read_line(device_dir / "hca_type")
        for number in numbers:
            port_dir = device_dir / "ports" / number
            link_layer = _read_line(port_dir / "link_layer")
            netdev = _resolve_netdev(device_dir, number) if link_layer == "Ethernet" else ""
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
                counter_files.append(CounterFile(directory, filename, name, _MULTIPLIER.get(name, 1), ceiling))
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
        info = PORT_INFO.family()
        state, physical, rate = PORT_STATE.family(), PORT_PHYSICAL_STATE.family(), PORT_RATE.family()
        pma = {name: spec.family() for name, spec in PMA_COUNTERS.items()}
        hw = {name: spec.family() for name, spec in HW_COUNTERS.items()}
        saturated, unparseable, generic = SATURATED.family(), UNPARSEABLE.family(), GENERIC_HW_STAT.family()
        vanished = False
        for port in discovery.ports:
            labels = [port.device, port.number]
            try:
                port_fd = _open_dir(port.path)
            except OSError:
                vanished = True  # the port went away since discovery: rediscover next round
                continue
            try:
                texts = {}
                for attribute in ("state", "phys_state", "rate"):
                    try:
                        texts[attribute] = _read_at(port_fd, attribute).decode("utf-8", "replace").strip()
                    except OSError:
                        texts[attribute] = ""  # the driver does not provide it
                counters = self._read_counters(port, port_fd)
                hw_counters = self._read_hw_counters(port, port_fd)
            finally:
                os.close(port_fd)
            self._gauge(state, labels, port, "state", texts["state"], parse_state)
            self._gauge(physical, labels, port, "phys_state", texts["phys_state"], parse_state)
            self._gauge(rate, labels, port, "rate", texts["rate"], parse_rate)
            info.add_metric(
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
                pma[counter.name].add_metric(labels, value * counter.multiplier)
                if counter.ceiling is not None and value >= counter.ceiling:
                    saturated.add_metric([*labels, counter.name], 1)
            for name, value in hw_counters:
                family = hw.get(name)
                if family is not None:
                    family.add_metric(labels, value)
                elif any(fnmatch.fnmatchcase(name, pattern) for pattern in self.hw_stats):
                    generic.add_metric([*labels, name], value)
            unparseable.add_metric(labels, self._unparseable.get((port.device, port.number), 0))
        if vanished:
            self._discovery = None
        yield from (info, state, physical, rate)
        yield from pma.values()
        yield from (saturated, unparseable)
        yield from hw.values()
        yield generic

    def _read_counters(self, port: Port, port_fd: int) -> list[tuple[CounterFile, int]]:
        """The PMA counters of the port with their raw values, unavailable ones left out."""
        values = []
        directories: dict[str, int | None] = {}
        try:
            for counter in port.counter_files:
                directory, filename, name = counter.directory, counter.filename, counter.name
                if directory not in directories:
                    try:
                        directories[directory] = _open_dir(directory, port_fd)
                    except OSError:
                        directories[directory] = None
                directory_fd = directories[directory]
                if directory_fd is None:
                    continue
                try:
                    raw = _read_at(directory_fd, filename)
                except OSError as exc:
                    self._skip(port, name, f"{port.path}/{directory}/{filename}", exc)
                    continue
                text = raw.strip()
                if text.isdigit():  # bytes.isdigit: ASCII digits only
                    values.append((counter, int(text)))
                else:
                    self._not_a_number(port, name, text)
        finally:
            for fd in directories.values():
                if fd is not None:
                    os.close(fd)
        return values

    def _read_hw_counters(self, port: Port, port_fd: int) -> list[tuple[str, int]]:
        """The port's hw_counters, listed afresh every round (drivers and `rdma statistic` add some)."""
        try:
            directory_fd = _open_dir("hw_counters", port_fd)
        except OSError:
            return []  # this driver has none
        try:
            names = sorted(n for n in os.listdir(directory_fd) if n not in HW_SETTINGS)
            # Back to back, nothing in between: the kernel serves them all from one snapshot
            # taken within its `lifespan` cache period.
            raws: list[bytes | OSError] = []
            for name in names:
                try:
                    raws.append(_read_at(directory_fd, name))
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
            text = raw.strip()
            if text.isdigit():
                values.append((name, int(text)))
            else:
                self._not_a_number(port, name, text)
        return values

    def _not_a_number(self, port: Port, name: str, text: bytes) -> None:
        """'N/A (no PMA)': the hardware does not have it; anything else is garbage, counted."""
        if text.startswith(b"N/A"):
            self._unavailable.setdefault((port.device, port.number), set()).add(name)
        else:
            self._count_unparseable(port, name, f"not a number: {text[:40]!r}")

    def _skip(self, port: Port, name: str, path: str, exc: OSError) -> None:
        if exc.errno in UNAVAILABLE_ERRNOS:
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
