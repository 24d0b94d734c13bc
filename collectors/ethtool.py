"""RoCE NIC statistics: PFC/pause frames and time, pause storms, NIC drops, FEC, link flaps.

The numbers are the driver's ethtool statistics (what ``ethtool -S`` prints), read with the
SIOCETHTOOL ioctl: the string set size (ETHTOOL_GSSET_INFO), the names (ETHTOOL_GSTRINGS)
and the values (ETHTOOL_GSTATS).  No ``ethtool`` process per scrape.

The name list is read again every round, because mlx5 adds and removes the per-priority PFC
statistics (and so shifts every index after them) when PFC is reconfigured.  Names are
stripped (one kernel had a trailing space in ``tx_pause_storm_warning_events``).
Per-queue statistics (``rx3_packets``, ``tx_queue_0_bytes``, ...) are dropped unless
``per_queue`` is set: a 64-channel NIC has thousands.

Interfaces: the RDMA network interfaces (RoCE/iWARP ports under class/infiniband) by default,
plus ``interfaces_include`` glob patterns over class/net, minus ``interfaces_exclude``.

The ioctl reader sits behind a small interface (``StatsReader``): the simulated node, which
has no NIC, supplies its own through the seam ``ETHTOOL``.  An interface in another
network namespace is invisible to the ioctl, which always answers for the namespace of the
agent's socket: run the agent in the host's network namespace (``hostNetwork: true``).
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import fnmatch
import os
import re
import socket
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from lockstep.agent.collector import Collector, CollectorContext, Families, MetricSpec, NothingHere
from lockstep.agent.families import Metric
from lockstep.agent.options import option, parse_bool, parse_string_list
from lockstep.agent.seams import Seam
from lockstep.collectors.toolkit.sysfs import rdma_netdevs, read_attribute

# --- the ioctl reader ---

SIOCETHTOOL = 0x8946
ETHTOOL_GDRVINFO = 0x03
ETHTOOL_GSTRINGS = 0x1B
ETHTOOL_GSTATS = 0x1D
ETHTOOL_GSSET_INFO = 0x37
ETH_SS_STATS = 1
ETH_GSTRING_LEN = 32
IFNAMSIZ = 16
_IFREQ = struct.Struct("16sP16x")  # struct ifreq on 64-bit Linux: name, ifr_data pointer, rest of the union
_DRVINFO_SIZE = 196  # struct ethtool_drvinfo


@dataclass(frozen=True)
class DriverInfo:
    driver: str
    version: str
    firmware_version: str
    bus_info: str


class StatsReader(Protocol):
    """What the collector needs from a NIC.  Errors are OSError with the kernel's errno."""

    def driver_info(self, interface: str) -> DriverInfo: ...

    def statistics(self, interface: str) -> list[tuple[str, int]]:
        """Every ethtool statistic of the interface, (name as the driver spells it, value), in the driver's order."""
        ...

    def close(self) -> None: ...


# The simulated node's NICs (it has none a real ioctl could read); IoctlStatsReader when not replaced.
ETHTOOL = Seam[StatsReader]("ethtool", "a NIC's driver info and ethtool statistics")


def _c_string(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")


class IoctlStatsReader:
    """SIOCETHTOOL on a datagram socket: the same calls ``ethtool -i`` and ``ethtool -S`` make."""

    def __init__(self) -> None:
        self._socket: socket.socket | None = None

    def _ioctl(self, interface: str, buffer: ctypes.Array[ctypes.c_char]) -> None:
        name = interface.encode()
        if not name or len(name) >= IFNAMSIZ:
            raise OSError(errno.ENODEV, f"not an interface name: {interface!r}")
        if self._socket is None:
            self._socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        request = _IFREQ.pack(name, ctypes.addressof(buffer))
        try:
            fcntl.ioctl(self._socket.fileno(), SIOCETHTOOL, request)
        except OSError as exc:
            raise OSError(exc.errno, f"{exc.strerror} (SIOCETHTOOL on {interface})") from None

    def driver_info(self, interface: str) -> DriverInfo:
        buffer = ctypes.create_string_buffer(struct.pack("I", ETHTOOL_GDRVINFO), _DRVINFO_SIZE)
        self._ioctl(interface, buffer)
        raw = buffer.raw
        fields = [_c_string(raw[4 + 32 * i : 4 + 32 * (i + 1)]) for i in range(4)]
        return DriverInfo(*(field.strip() for field in fields))

    def _stats_count(self, interface: str) -> int:
        buffer = ctypes.create_string_buffer(struct.pack("IIQI", ETHTOOL_GSSET_INFO, 0, 1 << ETH_SS_STATS, 0), 24)
        self._ioctl(interface, buffer)
        _, _, mask, count = struct.unpack_from("IIQI", buffer.raw)
        return count if mask & (1 << ETH_SS_STATS) else 0

    def statistics(self, interface: str) -> list[tuple[str, int]]:
        for _ in range(3):  # the set can change between the calls (PFC reconfigured): read again
            count = self._stats_count(interface)
            if count == 0:
                return []
            # The kernel writes as many entries as the driver has *now*, whatever size we
            # pass: leave room for a set that grew since we asked for its size.
            room = 2 * count + 64
            names_buffer = ctypes.create_string_buffer(
                struct.pack("III", ETHTOOL_GSTRINGS, ETH_SS_STATS, count), 12 + room * ETH_GSTRING_LEN
            )
            self._ioctl(interface, names_buffer)
            names_count = struct.unpack_from("I", names_buffer.raw, 8)[0]
            values_buffer = ctypes.create_string_buffer(struct.pack("II", ETHTOOL_GSTATS, count), 8 + room * 8)
            self._ioctl(interface, values_buffer)
            values_count = struct.unpack_from("I", values_buffer.raw, 4)[0]
            if names_count != values_count or names_count > room:
                continue
            names_raw = names_buffer.raw
            names = [
                _c_string(names_raw[12 + i * ETH_GSTRING_LEN : 12 + (i + 1) * ETH_GSTRING_LEN])
                for i in range(names_count)
            ]
            values = struct.unpack_from(f"{values_count}Q", values_buffer.raw, 8)
            return list(zip(names, values))
        raise OSError(errno.EAGAIN, f"the statistics of {interface} kept changing while being read")

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close()
            self._socket = None


# --- metrics ---

PAUSE_FRAMES = MetricSpec(
    "lockstep_pfc_pause_frames_total",
    "counter",
    "Pause frames per priority (priority 0-7 for PFC, 'global' for 802.3x pause); direction rx: "
    "received, the peer paused us; tx: sent, we paused the peer (our receive buffers were filling).",
    ("interface", "priority", "direction"),
)
PAUSE_SECONDS = MetricSpec(
    "lockstep_pfc_pause_seconds_total",
    "counter",
    "Time spent paused per priority (mlx5 *_pause_duration, reported in microseconds); "
    "rate() of it is the fraction of time the priority was paused.",
    ("interface", "priority", "direction"),
    unit="seconds",
)
PAUSE_TRANSITIONS = MetricSpec(
    "lockstep_pfc_pause_transitions_total",
    "counter",
    "Transitions from paused to unpaused (XOFF to XON) of received pause, per priority.",
    ("interface", "priority"),
)
PAUSE_STORMS = MetricSpec(
    "lockstep_pfc_pause_storm_events_total",
    "counter",
    "Pause storm events: level warning, the NIC kept sending pause past the minor watermark (its "
    "receive path stalled); level error, past the critical one: the storm-prevention timeout "
    "disabled pause sending and packets may be dropped.",
    ("interface", "level"),
)
DISCARDS = MetricSpec(
    "lockstep_nic_discards_total",
    "counter",
    "Packets the NIC discarded at the port: rx for lack of receive buffer (congested adapter, "
    "rx_discards_phy), tx because the link was down or paused (tx_discards_phy).",
    ("interface", "direction"),
)
OUT_OF_BUFFER = MetricSpec(
    "lockstep_nic_out_of_buffer_drops_total",
    "counter",
    "Packets dropped because a receive queue had no software buffers: the host is not keeping up (rx_out_of_buffer).",
    ("interface",),
)
FEC_CORRECTED = MetricSpec(
    "lockstep_nic_fec_corrected_bit_errors_total",
    "counter",
    "Bit errors the forward error correction repaired (rx_corrected_bits_phy). The pre-FEC bit error "
    "ratio of the link is its rate divided by 8 × the rate of lockstep_nic_phy_received_bytes_total.",
    ("interface",),
)
PHY_BYTES = MetricSpec(
    "lockstep_nic_phy_received_bytes_total",
    "counter",
    "Data received at the physical layer (rx_bits_phy / 8), the denominator of the bit error ratio.",
    ("interface",),
    unit="bytes",
)
CRC_ERRORS = MetricSpec(
    "lockstep_nic_crc_errors_total", "counter", "Frames received with a bad CRC (rx_crc_errors_phy).", ("interface",)
)
SYMBOL_ERRORS = MetricSpec(
    "lockstep_nic_symbol_errors_total",
    "counter",
    "Symbol errors the FEC could not correct (rx_symbol_err_phy).",
    ("interface",),
)
LINK_DOWN = MetricSpec(
    "lockstep_nic_link_down_events_total",
    "counter",
    "Times the link went down (link_down_events_phy): a flapping cable or transceiver.",
    ("interface",),
)
NIC_INFO = MetricSpec(
    "lockstep_nic_info",
    "gauge",
    "One series per NIC interface read, valued 1: its driver, driver version, firmware version and bus address.",
    ("interface", "driver", "driver_version", "firmware_version", "bus_info"),
)
STATISTIC = MetricSpec(
    "lockstep_ethtool_statistic",
    "unknown",
    "An ethtool statistic chosen with the collector's 'statistics' option, by its ethtool -S name. "
    "Typed unknown: most are counters, but the driver alone knows which; use rate() only on those that are.",
    ("interface", "statistic"),
)
DCQCN_ENABLED = MetricSpec(
    "lockstep_roce_dcqcn_enabled",
    "gauge",
    "1 when DCQCN congestion control is enabled for the priority, per role: notification_point "
    "(sends CNPs for ECN-marked packets it receives) or reaction_point (slows down on CNPs); "
    "from MLNX_OFED's class/net/<interface>/ecn/roce_np|roce_rp/enable/<priority>.",
    ("interface", "role", "priority"),
)

_PRIORITY_PAUSE = re.compile(r"^(rx|tx)_(prio[0-7]|global)_pause(_duration|_transition)?$")
# ethtool name -> (metric, its extra label values, divisor to the metric's unit)
_SIMPLE: dict[str, tuple[MetricSpec, tuple[str, ...], int]] = {
    "tx_pause_storm_warning_events": (PAUSE_STORMS, ("warning",), 1),
    "tx_pause_storm_error_events": (PAUSE_STORMS, ("error",), 1),
    "rx_discards_phy": (DISCARDS, ("rx",), 1),
    "tx_discards_phy": (DISCARDS, ("tx",), 1),
    "rx_out_of_buffer": (OUT_OF_BUFFER, (), 1),
    "rx_corrected_bits_phy": (FEC_CORRECTED, (), 1),
    "rx_bits_phy": (PHY_BYTES, (), 8),
    "rx_crc_errors_phy": (CRC_ERRORS, (), 1),
    "rx_symbol_err_phy": (SYMBOL_ERRORS, (), 1),
    "link_down_events_phy": (LINK_DOWN, (), 1),
}
# Per-queue/per-channel statistics across drivers: mlx5 rx3_packets, ch0_events, ptp_cq0_cqe;
# virtio/veth/ice rx_queue_0_packets; i40e/ixgbe tx-0.packets; bnxt [0]: rx_ucast_packets.
PER_QUEUE = re.compile(r"^(?:\[\d+\]:|(?:rx|tx|ch|xdp|xsk|ptp_cq|ptp_ch|queue)[-_]?(?:queue[-_])?\d+[._-])")

ROLES = {"roce_np": "notification_point", "roce_rp": "reaction_point"}


def is_per_queue(name: str) -> bool:
    return PER_QUEUE.match(name) is not None


@dataclass(frozen=True)
class Interfaces:
    listing: tuple[tuple[str, ...], tuple[str, ...]]  # the class/net and class/infiniband listings it was made from
    names: tuple[str, ...]


@dataclass(frozen=True)
class EthtoolOptions:
    interfaces_include: tuple[str, ...] = option(
        (),
        parse_string_list,
        "glob patterns of network interfaces to read besides the RDMA ones (e.g. 'ens*')",
        flag="--ethtool.interface-include",
        repeatable=True,
    )
    interfaces_exclude: tuple[str, ...] = option(
        (),
        parse_string_list,
        "glob patterns of network interfaces not to read, RDMA ones included",
        flag="--ethtool.interface-exclude",
        repeatable=True,
    )
    statistics: tuple[str, ...] = option(
        (),
        parse_string_list,
        "glob patterns of further ethtool -S names to export as lockstep_ethtool_statistic ('*': all)",
        flag="--ethtool.statistic",
        repeatable=True,
    )
    per_queue: bool = option(False, parse_bool, "also export per-queue statistics matched by 'statistics'")


class EthtoolCollector(Collector[EthtoolOptions]):
    name = "ethtool"
    help = "RoCE NIC statistics (PFC pause, pause storms, drops, FEC, link flaps) via the ethtool ioctl."
    default_interval = 15.0
    metrics = (
        PAUSE_FRAMES,
        PAUSE_SECONDS,
        PAUSE_TRANSITIONS,
        PAUSE_STORMS,
        DISCARDS,
        OUT_OF_BUFFER,
        FEC_CORRECTED,
        PHY_BYTES,
        CRC_ERRORS,
        SYMBOL_ERRORS,
        LINK_DOWN,
        NIC_INFO,
        STATISTIC,
        DCQCN_ENABLED,
    )
    options_class = EthtoolOptions
    hotplug_subsystems = ("infiniband", "net")

    def __init__(self, context: CollectorContext) -> None:
        super().__init__(context)
        self.reader: StatsReader = context.seams.get(ETHTOOL) or IoctlStatsReader()
        self._interfaces: Interfaces | None = None
        self._failing: dict[str, str] = {}  # interface -> why its last read failed (log once per change)

    def on_hotplug(self, action: str, subsystem: str, sys_path: str) -> None:
        self._interfaces = None  # a netdev or HCA came, went or was renamed: discover again

    def close(self) -> None:
        self.reader.close()

    def _discover(self) -> Interfaces:
        sysfs = self.paths.sysfs
        net = _listing(sysfs / "class" / "net")
        key = (net, _listing(sysfs / "class" / "infiniband"))
        cached = self._interfaces
        if cached is not None and cached.listing == key:
            return cached
        names = rdma_netdevs(sysfs)
        names |= {n for n in net if any(fnmatch.fnmatchcase(n, p) for p in self.options.interfaces_include)}
        names = {n for n in names if not any(fnmatch.fnmatchcase(n, p) for p in self.options.interfaces_exclude)}
        interfaces = Interfaces(key, tuple(sorted(names)))
        self._interfaces = interfaces
        return interfaces

    def collect(self) -> Iterator[Metric]:
        interfaces = self._discover()
        if not interfaces.names:
            raise NothingHere(
                "no RDMA network interfaces (RoCE/iWARP ports under "
                f"{self.paths.sysfs / 'class' / 'infiniband'}) and none matched by interfaces_include"
            )
        families = Families(self.metrics)
        missing = []
        for interface in interfaces.names:
            try:
                info = self.reader.driver_info(interface)
                stats = self.reader.statistics(interface)
            except OSError as exc:
                if exc.errno in (errno.ENODEV, errno.ENXIO):
                    missing.append(interface)
                    self._interfaces = None  # gone since discovery, or in another network namespace
                else:
                    self._note_failure(interface, exc)
                continue
            self._failing.pop(interface, None)
            families[NIC_INFO].add_metric(
                [interface, info.driver, info.version, info.firmware_version, info.bus_info], 1
            )
            self._add_statistics(families, interface, stats)
            self._add_dcqcn(families[DCQCN_ENABLED], interface)
        if missing and len(missing) == len(interfaces.names):
            raise NothingHere(
                f"no network interface {', '.join(missing)} in the agent's network namespace: sysfs lists them, "
                "but the kernel does not know them here (run the agent in the host's network namespace)"
            )
        yield from families.all()

    def _note_failure(self, interface: str, exc: OSError) -> None:
        why = exc.strerror or str(exc)
        if self._failing.get(interface) != why:
            self._failing[interface] = why
            self.log.warning("cannot read the interface's statistics", extra={"interface": interface, "reason": why})

    def _add_statistics(self, families: Families, interface: str, stats: Iterable[tuple[str, int]]) -> None:
        for raw_name, value in stats:
            name = raw_name.strip()  # one kernel's string table had "tx_pause_storm_warning_events "
            match = _PRIORITY_PAUSE.match(name)
            if match:
                direction, priority, kind = match.groups()
                priority = priority.removeprefix("prio")
                if kind is None:
                    families[PAUSE_FRAMES].add_metric([interface, priority, direction], value)
                elif kind == "_duration":
                    families[PAUSE_SECONDS].add_metric([interface, priority, direction], value / 1e6)
                elif direction == "rx":
                    families[PAUSE_TRANSITIONS].add_metric([interface, priority], value)
                continue
            simple = _SIMPLE.get(name)
            if simple is not None:
                spec, extra, divisor = simple
                families[spec].add_metric([interface, *extra], value / divisor if divisor != 1 else value)
                continue
            if self.options.statistics and any(fnmatch.fnmatchcase(name, p) for p in self.options.statistics):
                if self.options.per_queue or not is_per_queue(name):
                    families[STATISTIC].add_metric([interface, name], value)

    def _add_dcqcn(self, family: Any, interface: str) -> None:
        ecn = self.paths.sysfs / "class" / "net" / interface / "ecn"
        for directory, role in ROLES.items():
            enable = ecn / directory / "enable"
            try:
                priorities = sorted(p for p in os.listdir(enable) if p.isdigit())
            except OSError:
                continue  # not MLNX_OFED, or not RoCE
            for priority in priorities:
                value = _read_flag(enable / priority)
                if value is not None:
                    family.add_metric([interface, role, priority], value)


def _listing(directory: Path) -> tuple[str, ...]:
    try:
        return tuple(sorted(os.listdir(directory)))
    except OSError:
        return ()


def _read_flag(path: Path) -> int | None:
    try:
        text = read_attribute(path)
    except OSError:
        return None
    return int(text) if text in ("0", "1") else None
