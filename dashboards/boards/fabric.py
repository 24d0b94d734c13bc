"""The fabric dashboard: InfiniBand and RoCE ports (state, traffic, link errors and flaps,
congestion), PFC pause and storms, ECN and congestion notifications, DCQCN."""

from __future__ import annotations

from dashboards.board import Board
from dashboards.panels import NONE_BAD, RATE, RED, SEL, Cell, above, below, table, timeseries
from lockstep import thresholds as T


def infiniband_ports() -> list[Cell]:
    """Port state, throughput and utilization."""
    return [
        table(
            "Port state",
            [(f"lockstep_ib_port_state{{{SEL}}}", "")],
            "none",
            "Logical state: 4 ACTIVE (5 ACTIVE_DEFER); 1 DOWN, 2 INIT, 3 ARMED. LockstepIBPortDown fires for a "
            "port not active for 5 minutes that is not administratively disabled.",
            below(4),
        ),
        timeseries(
            "Port throughput",
            [
                (f"rate(lockstep_ib_port_transmitted_bytes_total{{{SEL}}}[{RATE}])", "{{instance}} {{device}} tx"),
                (f"rate(lockstep_ib_port_received_bytes_total{{{SEL}}}[{RATE}])", "{{instance}} {{device}} rx"),
            ],
            "Bps",
        ),
        timeseries(
            "Port utilization (transmit)",
            [
                (
                    f"rate(lockstep_ib_port_transmitted_bytes_total{{{SEL}}}[{RATE}])"
                    f" / lockstep_ib_port_rate_bytes_per_second{{{SEL}}}",
                    "{{instance}} {{device}}",
                )
            ],
            "percentunit",
        ),
    ]


def infiniband_errors_and_congestion() -> list[Cell]:
    """Transmit wait, flaps, symbol errors, saturated counters, receive errors."""
    flaps = (
        f"increase(lockstep_ib_port_link_downed_total{{{SEL}}}[{T.IB_LINK_FLAP_WINDOW}])"
        f" + increase(lockstep_ib_port_link_error_recovery_total{{{SEL}}}[{T.IB_LINK_FLAP_WINDOW}])"
    )
    return [
        timeseries(
            "Transmit wait (congestion)",
            [(f"port:lockstep_ib_port_transmit_wait:ratio5m{{{SEL}}}", "{{instance}} {{device}}")],
            "percentunit",
            "Share of transmit time spent waiting for flow-control credits (port_xmit_wait, 5 min). "
            f"LockstepIBCongestion fires above {T.IB_TRANSMIT_WAIT_RATIO:.0%} for 15 minutes.",
            above((T.IB_TRANSMIT_WAIT_RATIO, RED)),
        ),
        timeseries(
            f"Link downs and retrains ({T.IB_LINK_FLAP_WINDOW})",
            [(flaps, "{{instance}} {{device}}")],
            "short",
            f"LockstepIBLinkFlapping fires at {T.IB_LINK_FLAP_EVENTS} in {T.IB_LINK_FLAP_WINDOW}.",
            above((T.IB_LINK_FLAP_EVENTS, RED)),
        ),
        timeseries(
            "Symbol errors per hour",
            [(f"increase(lockstep_ib_port_symbol_errors_total{{{SEL}}}[1h])", "{{instance}} {{device}}")],
            "short",
            f"LockstepIBSymbolErrors fires above {T.IB_SYMBOL_ERRORS_PER_HOUR} an hour, or when the counter is "
            "saturated (see the table).",
            above((T.IB_SYMBOL_ERRORS_PER_HOUR, RED)),
        ),
        table(
            "Saturated counters",
            [(f"lockstep_ib_port_saturated{{{SEL}}}", "")],
            "none",
            "PMA counters stuck at their maximum: their rate reads 0 whatever happens. Reset them with perfquery -R.",
            NONE_BAD,
        ),
        timeseries(
            "Receive errors and transmit discards",
            [
                (
                    f"rate(lockstep_ib_port_receive_errors_total{{{SEL}}}[{RATE}])",
                    "{{instance}} {{device}} rx errors",
                ),
                (
                    f"rate(lockstep_ib_port_transmit_discards_total{{{SEL}}}[{RATE}])",
                    "{{instance}} {{device}} tx discards",
                ),
            ],
            "cps",
        ),
    ]


def pfc() -> list[Cell]:
    """PFC pause and pause storms."""
    return [
        timeseries(
            "PFC pause (share of time)",
            [
                (
                    f"interface:lockstep_pfc_pause_seconds:ratio5m{{{SEL}}}",
                    "{{instance}} {{interface}} prio {{priority}} {{direction}}",
                )
            ],
            "percentunit",
            "tx: this host paused its switch port (its receive path is filling); rx: it was paused. "
            f"LockstepPFCStorm fires above {T.PFC_TX_PAUSE_RATIO:.0%} tx for 2 minutes.",
            above((T.PFC_TX_PAUSE_RATIO, RED)),
        ),
        timeseries(
            "Pause storm events (10m)",
            [
                (
                    f"increase(lockstep_pfc_pause_storm_events_total{{{SEL}}}[10m])",
                    "{{instance}} {{interface}} {{level}}",
                )
            ],
            "short",
            "The NIC's own storm detector (mlx5): any event fires LockstepPFCStorm.",
            NONE_BAD,
        ),
    ]


def roce() -> list[Cell]:
    """ECN marks, congestion notifications, DCQCN, NIC discards."""
    return [
        timeseries(
            "ECN marks and congestion notifications",
            [
                (
                    f"rate(lockstep_roce_ecn_marked_packets_total{{{SEL}}}[{RATE}])",
                    "{{instance}} {{device}} ECN marked",
                ),
                (f"rate(lockstep_roce_cnp_sent_total{{{SEL}}}[{RATE}])", "{{instance}} {{device}} CNP sent"),
                (f"rate(lockstep_roce_cnp_handled_total{{{SEL}}}[{RATE}])", "{{instance}} {{device}} CNP handled"),
                (f"rate(lockstep_roce_cnp_ignored_total{{{SEL}}}[{RATE}])", "{{instance}} {{device}} CNP ignored"),
            ],
            "pps",
            f"CNPs ignored above {T.ROCE_CNP_IGNORED_PER_SECOND:g}/s fire LockstepRoCECongestionControlOff.",
        ),
        table(
            "DCQCN enabled",
            [(f"max by (cluster, instance, interface, role) (lockstep_roce_dcqcn_enabled{{{SEL}}})", "")],
            "none",
            "1 when DCQCN is enabled on some priority; 0 on every priority fires LockstepRoCECongestionControlOff.",
            below(1),
        ),
        timeseries(
            "NIC discards",
            [(f"rate(lockstep_nic_discards_total{{{SEL}}}[{RATE}])", "{{instance}} {{interface}} {{direction}}")],
            "pps",
            "rx: no receive buffer (a congested adapter, often with PFC pause); tx: link down or paused.",
        ),
    ]


def board() -> Board:
    return Board(
        "lockstep-fabric",
        "Lockstep / Fabric (InfiniBand, RoCE, PFC)",
        "InfiniBand and RoCE ports: state, traffic, link errors and flaps, congestion; PFC pause and storms, "
        "ECN and congestion notifications, DCQCN.",
        [*infiniband_ports(), *infiniband_errors_and_congestion(), *pfc(), *roce()],
    )
