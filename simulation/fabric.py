"""The simulated node's fabric: 8 InfiniBand HCAs and 2 RoCE ports with their netdevs.

- ``mlx5_0`` .. ``mlx5_7``: ConnectX-7 InfiniBand HCAs, one NDR port each, one per GPU
  (rail-optimised), busy with collective traffic.
- ``mlx5_8``, ``mlx5_9``: the two ports of a ConnectX-6 Dx (two PCI functions, so two
  devices) running RoCE on netdevs ``ens3f0np0`` and ``ens3f1np1``.  ``ens3f0np0`` runs PFC
  on priority 3 (DCQCN enabled on it); ``ens3f1np1`` is configured with 802.3x global pause
  instead, so its pause statistics are ``rx_global_pause*``.

The sysfs files are written under ``node.paths.sysfs``; the ethtool statistics come from
``SimulatedEthtool`` through the seam ``ETHTOOL`` (the collector's ioctl reader interface).
Every value is a pure function of (scenario, t): counters are a day's worth of traffic
plus a rate times t.

Scenarios:
- ``pfc-storm``: ``ens3f0np0``'s receive path is stalled, so it keeps sending PFC pause on
  priority 3 (tx pause frames and pause time rising, pause-storm warning events).
- ``fabric-faults``: port ``mlx5_1``/1 is down (polling: no cable or a dead transceiver);
  ``mlx5_2``/1 is congested (its traffic collapsed and it waits for credits a quarter of its
  transmit time), ``mlx5_4``/1 mildly so (5 %, below the alert); DCQCN is disabled on
  every priority of ``ens3f1np1``.
- ``leaf-switch-down``: the rail-0 leaf switch is dead, so ``mlx5_0``'s port is down (and stays
  down) on every node behind it; run several demos of it to see one alert group.
- ``straggler-pfc`` (defined by the workloads area): from its onset ``ens3f0np0`` storms as in
  ``pfc-storm``.
- ``link-flap``: ``mlx5_3``'s cable is failing: link_downed and link_error_recovery keep
  increasing, symbol_error has saturated at 65535, and the port is down 10 s of every minute.
"""

from __future__ import annotations

import errno
from pathlib import Path
from typing import TYPE_CHECKING

from lockstep.collectors.ethtool import ETHTOOL
from lockstep.simulation import Scenario, Writer
from lockstep.simulation.pcie import link_device, pci_function
from lockstep.simulation.timeline import SLOW_ONSET

if TYPE_CHECKING:
    from lockstep.agent.collector import Paths
    from lockstep.simulation import SimulatedNode

SCENARIOS = (
    Scenario(
        "pfc-storm",
        "RoCE interface ens3f0np0 stalls and storms PFC pause on priority 3: tx pause frames and time rise, "
        "pause-storm warning events fire.",
    ),
    Scenario(
        "fabric-faults",
        "InfiniBand port mlx5_1/1 is down (polling, cable pulled), mlx5_2/1 waits for credits a quarter of its "
        "transmit time, DCQCN is disabled on ens3f1np1; mlx5_4/1 waits 5 % of the time (no alert).",
    ),
    Scenario(
        "leaf-switch-down",
        "The leaf switch of rail 0 failed: InfiniBand port mlx5_0/1 is down (DOWN, Polling) here and on every "
        "node behind that switch.",
    ),
    Scenario(
        "link-flap",
        "InfiniBand port mlx5_3/1 flaps: link_downed and link_error_recovery keep rising, symbol_error is "
        "saturated at 65535, the port is down 10 s of every minute.",
    ),
)

LEAF_DOWN = "mlx5_0"
UPTIME = 86_400.0  # the node has been up a day when the demo starts
IB_HCAS = 8
ROCE_NETDEVS = ("ens3f0np0", "ens3f1np1")
FLAPPING = "mlx5_3"
STORMING = "ens3f0np0"
PFC_PRIORITY = 3
# fabric-faults: a port down, congested ports (transmit-wait ticks per transmitted word, since
# CONGESTION_SINCE; their traffic collapses to CONGESTED_WORDS a second), DCQCN off.
DOWN_PORT = "mlx5_1"
CONGESTED = {"mlx5_2": 0.33, "mlx5_4": 0.05}
CONGESTED_WORDS = 5e6
CONGESTION_SINCE = -300.0
DCQCN_OFF = "ens3f1np1"


# mlx5 RDMA hw_counters: the Q counters every port has, then the RoCE-only ones.
Q_COUNTERS = (
    "rx_write_requests",
    "rx_read_requests",
    "rx_atomic_requests",
    "rx_dct_connect",
    "out_of_buffer",
    "out_of_sequence",
    "duplicate_request",
    "rnr_nak_retry_err",
    "packet_seq_err",
    "implied_nak_seq_err",
    "local_ack_timeout_err",
    "resp_local_length_error",
    "resp_cqe_error",
    "req_cqe_error",
    "req_remote_invalid_request",
    "req_remote_access_errors",
    "resp_remote_access_errors",
    "resp_cqe_flush_error",
    "req_cqe_flush_error",
    "req_transport_retries_exceeded",
    "req_rnr_retries_exceeded",
)
ROCE_COUNTERS = (
    "roce_adp_retrans",
    "roce_adp_retrans_to",
    "roce_slow_restart",
    "roce_slow_restart_cnps",
    "roce_slow_restart_trans",
    "rp_cnp_ignored",
    "rp_cnp_handled",
    "np_ecn_marked_roce_packets",
    "np_cnp_sent",
    "rx_icrc_encapsulated",
)
# Per second, for the counters that move on a healthy node.
HW_RATES = {
    "rx_write_requests": 52_000,
    "rx_read_requests": 1_900,
    "duplicate_request": 0.002,
    "out_of_sequence": 0.004,
    "packet_seq_err": 0.001,
    "local_ack_timeout_err": 0.0005,
    "np_ecn_marked_roce_packets": 40,
    "np_cnp_sent": 39,
    "rp_cnp_handled": 55,
}


def _count(rate: float, t: float, base: float = 0.0) -> int:
    return int(base + rate * (UPTIME + t))


def write_hca(
    write: Writer,
    sysfs: Path,
    index: int,
    t: float,
    *,
    link_layer: str = "InfiniBand",
    netdev: str = "",
    hw_counters: tuple[str, ...] = Q_COUNTERS,
    scenario: str = "healthy",
) -> None:
    """One mlx5 device with one port, as the mlx5 driver lays it out in sysfs."""
    device = f"mlx5_{index}"
    root = sysfs / "class" / "infiniband" / device
    link_device(root, pci_function(sysfs, device))  # device -> its PCI function (the pcie area's files)
    roce = link_layer == "Ethernet"
    write(root / "board_id", "MT_0000000838\n" if not roce else "MT_0000000359\n")
    write(root / "fw_ver", "28.39.1002\n" if not roce else "22.36.1010\n")
    write(root / "hca_type", "MT4129\n" if not roce else "MT4125\n")
    write(root / "node_guid", f"a088:c203:00{index:02x}:1e20\n")
    write(root / "node_type", "1: CA\n")
    port = root / "ports" / "1"
    flapping = scenario == "link-flap" and device == FLAPPING
    faults = scenario == "fabric-faults"
    # leaf-switch-down: the rail-0 leaf switch died before the demo started; its port stays down.
    leaf_down = scenario == "leaf-switch-down" and device == LEAF_DOWN
    down = (flapping and (t % 60) >= 50) or leaf_down or (faults and device == DOWN_PORT)
    write(port / "link_layer", f"{link_layer}\n")
    write(port / "state", "1: DOWN\n" if down else "4: ACTIVE\n")
    write(port / "phys_state", "2: Polling\n" if down else "5: LinkUp\n")
    write(port / "rate", "200 Gb/sec (4X HDR)\n" if roce else "400 Gb/sec (4X NDR)\n")
    if roce:
        write(port / "gid_attrs" / "ndevs" / "0", f"{netdev}\n")
        write(root / "device" / "net" / netdev / "dev_port", "0\n")
    # Collective traffic: ~55 % of 400 Gb/s each way, in 4-byte words; a little skew per HCA.
    words = (400e9 / 8 / 4 * 0.55 if not roce else 200e9 / 8 / 4 * 0.2) * (1 + index / 100)
    packets = words * 4 / 4096
    transmitted = _count(words, t)
    transmit_wait = min(_count(900 + 10 * index, t), 2**32 - 1)
    if faults and device in CONGESTED and t > CONGESTION_SINCE:
        congested_for = t - CONGESTION_SINCE
        transmitted = _count(words, CONGESTION_SINCE) + int(CONGESTED_WORDS * congested_for)
        transmit_wait = min(transmit_wait + int(CONGESTED_WORDS * CONGESTED[device] * congested_for), 2**32 - 1)
    counters = {
        "VL15_dropped": 0,
        "excessive_buffer_overrun_errors": 0,
        "link_downed": (3 + int((t + 60) // 60)) if flapping else 1 if leaf_down else 0,
        "link_error_recovery": (17 + int((t + 20) // 20)) if flapping else 1,
        "local_link_integrity_errors": 0,
        "multicast_rcv_packets": _count(0.5, t),
        "multicast_xmit_packets": _count(0.5, t),
        "port_rcv_constraint_errors": 0,
        "port_rcv_data": _count(words * 0.98, t),
        "port_rcv_errors": 0,
        "port_rcv_packets": _count(packets * 0.98, t),
        "port_rcv_remote_physical_errors": 0,
        "port_rcv_switch_relay_errors": 0,
        "port_xmit_constraint_errors": 0,
        "port_xmit_data": transmitted,
        "port_xmit_discards": 0,
        "port_xmit_packets": _count(packets, t),
        "port_xmit_wait": transmit_wait,
        "symbol_error": 65535 if flapping else 0,
        "unicast_rcv_packets": _count(packets * 0.98, t) - _count(0.5, t),
        "unicast_xmit_packets": _count(packets, t) - _count(0.5, t),
    }
    for name, value in counters.items():
        write(port / "counters" / name, f"{value}\n")
    storm = scenario == "pfc-storm" and netdev == STORMING
    for name in hw_counters:
        rate = HW_RATES.get(name, 0.0)
        if storm and name in ("np_ecn_marked_roce_packets", "np_cnp_sent"):
            rate *= 50
        write(port / "hw_counters" / name, f"{_count(rate, t)}\n")
    write(port / "hw_counters" / "lifespan", "10\n")


def write_ecn(write: Writer, sysfs: Path, netdev: str, scenario: str = "healthy") -> None:
    """MLNX_OFED's DCQCN switches: enabled on the RoCE priority only (fabric-faults: off on DCQCN_OFF)."""
    off = scenario == "fabric-faults" and netdev == DCQCN_OFF
    for directory in ("roce_np", "roce_rp"):
        for priority in range(8):
            enabled = priority == (PFC_PRIORITY if netdev == STORMING else 0) and not off
            write(sysfs / "class" / "net" / netdev / "ecn" / directory / "enable" / str(priority), f"{int(enabled)}\n")


class SimulatedEthtool:
    """The ethtool collector's reader interface (driver_info, statistics), for the two RoCE netdevs."""

    def __init__(self, node: SimulatedNode) -> None:
        self.node = node

    def driver_info(self, interface: str):  # type: ignore[no-untyped-def]
        from lockstep.collectors.ethtool import DriverInfo

        self._check(interface)
        bus = "0000:3b:00.0" if interface == ROCE_NETDEVS[0] else "0000:3b:00.1"
        return DriverInfo(
            driver="mlx5_core", version="6.1.0", firmware_version="22.36.1010 (MT_0000000359)", bus_info=bus
        )

    def statistics(self, interface: str) -> list[tuple[str, int]]:
        self._check(interface)
        return ethtool_statistics(interface, self.node.scenario, self.node.t)

    def close(self) -> None:
        pass

    def _check(self, interface: str) -> None:
        if interface not in ROCE_NETDEVS:
            raise OSError(errno.ENODEV, f"No such device (SIOCETHTOOL on {interface})")


def ethtool_statistics(interface: str, scenario: str, t: float) -> list[tuple[str, int]]:
    """An mlx5 ``ethtool -S`` (abridged), in the driver's order: names as the kernel gives them."""
    # pfc-storm: the storm began two minutes before the demo started; straggler-pfc: at the
    # workloads area's onset.
    began = {"pfc-storm": -120.0, "straggler-pfc": SLOW_ONSET}.get(scenario)
    storm = began is not None and t >= began and interface == STORMING
    storm_seconds = max(0.0, t - began) if began is not None else 0.0
    pfc = interface == STORMING
    prio = f"prio{PFC_PRIORITY}" if pfc else "global"
    stats: list[tuple[str, int]] = [
        ("rx_packets", _count(1_200_000, t)),
        ("rx_bytes", _count(4.9e9, t)),
        ("tx_packets", _count(1_150_000, t)),
        ("tx_bytes", _count(4.7e9, t)),
        ("rx_out_of_buffer", 0),
        # Per-queue statistics: dropped by default.
        ("rx0_packets", _count(600_000, t)),
        ("rx0_bytes", _count(2.45e9, t)),
        ("rx1_packets", _count(600_000, t)),
        ("rx1_bytes", _count(2.45e9, t)),
        ("tx0_packets", _count(575_000, t)),
        ("tx1_packets", _count(575_000, t)),
        # Physical port (PPCNT) statistics.
        ("rx_packets_phy", _count(1_200_100, t)),
        ("rx_discards_phy", 1_811 + (int(storm_seconds * 400) if storm else 0)),
        ("tx_discards_phy", 0),
        ("rx_crc_errors_phy", 0),
        ("rx_symbol_err_phy", 0),
        ("rx_corrected_bits_phy", _count(0.02, t)),
        ("rx_bits_phy", _count(200e9, t)),
        ("link_down_events_phy", 1),
        ("rx_buffer_passed_thres_phy", 3 + (int(storm_seconds * 10) if storm else 0)),
        ("rx_pause_ctrl_phy", _count(2, t)),
        ("tx_pause_ctrl_phy", _count(1, t) + (int(storm_seconds * 15_000) if storm else 0)),
        (f"rx_{prio}_pause", _count(2, t)),
        (f"rx_{prio}_pause_duration", _count(40, t)),
        (f"tx_{prio}_pause", _count(1, t) + (int(storm_seconds * 15_000) if storm else 0)),
        (f"tx_{prio}_pause_duration", _count(20, t) + (int(storm_seconds * 850_000) if storm else 0)),
        (f"rx_{prio}_pause_transition", _count(1, t)),
        ("module_unplug", 0),
        ("module_bus_stuck", 0),
        ("module_high_temp", 0),
        ("module_bad_shorted", 0),
    ]
    if pfc:
        stats += [
            ("tx_pause_storm_warning_events", 2 + (int(storm_seconds // 10) if storm else 0)),
            ("tx_pause_storm_error_events", 0),
        ]
    return stats


def build_infiniband(write: Writer, sysfs: Path, scenario: str, t: float, *, ib_hcas: int, roce_ports: int) -> None:
    for index in range(ib_hcas):
        write_hca(write, sysfs, index, t, scenario=scenario)
    for offset in range(roce_ports):
        netdev = ROCE_NETDEVS[offset]
        write_hca(
            write,
            sysfs,
            ib_hcas + offset,
            t,
            link_layer="Ethernet",
            netdev=netdev,
            hw_counters=Q_COUNTERS + ROCE_COUNTERS,
            scenario=scenario,
        )
        write_ecn(write, sysfs, netdev, scenario)


def build(node: SimulatedNode, t: float) -> None:
    write = node.write_if_changed
    build_infiniband(write, node.paths.sysfs, node.scenario, t, ib_hcas=IB_HCAS, roce_ports=len(ROCE_NETDEVS))
    node.seams.replace(ETHTOOL.replaced_by(SimulatedEthtool(node)))
    # Show a few more ethtool statistics as generic series (the collector's 'statistics' option).
    node.options.setdefault("ethtool", {})["statistics"] = ["rx_buffer_passed_thres_phy", "rx_pause_ctrl_phy"]
    # And two of the generic RDMA hw_counters (the infiniband collector's 'hw_stats' option; none by default).
    node.options.setdefault("infiniband", {})["hw_stats"] = ["rx_write_requests", "rx_read_requests"]


def bench_tree(paths: Paths, hcas: int = 8) -> None:
    """The benchmark's tree: ``hcas`` mlx5 HCAs with every hw_counter node_exporter knows."""

    def write(path: Path, text: str) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)

    # node_exporter's 29 (it knows all but the two *_retries_exceeded), plus lifespan.
    known = tuple(n for n in Q_COUNTERS if not n.endswith("_retries_exceeded")) + ROCE_COUNTERS
    for index in range(hcas):
        write_hca(write, paths.sysfs, index, 0.0, hw_counters=known)
