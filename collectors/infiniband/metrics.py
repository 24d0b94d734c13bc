"""The InfiniBand collector's metrics, and the tables that map sysfs counter files to them."""

from __future__ import annotations

from lockstep.agent.collector import MetricSpec

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
    unit="bytes_per_second",
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


# counters/ file -> its metric.  The *_data files are multiplied by 4 (see MULTIPLIER).
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
MULTIPLIER = {"port_xmit_data": 4, "port_rcv_data": 4}
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
        "lockstep_rdma_out_of_sequence_total", "Out-of-order packets received: loss upstream in a 'lossless' fabric."
    ),
    "packet_seq_err": _counter(
        "lockstep_rdma_packet_sequence_errors_total", "NAK-sequence-error packets received (before the retry limit)."
    ),
    "local_ack_timeout_err": _counter(
        "lockstep_rdma_local_ack_timeouts_total", "Times a QP's ack timer expired at the sender (recoverable)."
    ),
    "implied_nak_seq_err": _counter(
        "lockstep_rdma_implied_nak_sequence_errors_total", "NAKs the requester inferred from a later ACK."
    ),
    "duplicate_request": _counter(
        "lockstep_rdma_duplicate_requests_total", "Duplicate requests received: retransmissions reaching the responder."
    ),
    "rnr_nak_retry_err": _counter(
        "lockstep_rdma_rnr_naks_received_total", "Receiver-not-ready NAKs received (before the retry limit)."
    ),
    "out_of_buffer": _counter(
        "lockstep_rdma_out_of_buffer_drops_total",
        "Packets dropped because the QP had no posted receive buffer (the application is not keeping up).",
    ),
    "req_transport_retries_exceeded": _counter(
        "lockstep_rdma_transport_retries_exceeded_total", "QPs that ran out of transport retries (fatal: QP error)."
    ),
    "req_rnr_retries_exceeded": _counter(
        "lockstep_rdma_rnr_retries_exceeded_total", "QPs that ran out of RNR retries (fatal: QP error)."
    ),
    "rx_icrc_encapsulated": _counter(
        "lockstep_roce_icrc_errors_total", "RoCE packets received with an invariant CRC error (corruption)."
    ),
}
# Files in hw_counters/ that are settings, not counters.
HW_SETTINGS = frozenset({"lifespan"})
