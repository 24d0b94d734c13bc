"""Fabric alerts: InfiniBand ports down, flapping, erroring or congested; PFC pause storms; RoCE
congestion control off."""

from __future__ import annotations

from alerts.model import Alert, Group
from alerts.promql import VALUE, VALUE_2F, VALUE_PERCENT, WHERE, by, label, num, on, percent
from lockstep import thresholds as T

FABRIC_ALERTS = Group(
    "lockstep-fabric.alerts",
    (
        Alert(
            "LockstepIBPortDown",
            "critical",
            "3m",
            # Not active at any moment of the window: a port that flaps is LockstepIBLinkFlapping's.
            f"max_over_time(lockstep_ib_port_state[2m]) < 4\n"
            f"unless {on('device', 'port')} lockstep_ib_port_physical_state == 3",
            f"InfiniBand port {label('device')}/{label('port')} on {WHERE} is down",
            f"Port {label('device')}/{label('port')} on {WHERE} has not been ACTIVE for 5 minutes (logical state "
            f"{VALUE}: 1 down, 2 init, 3 armed) and is not administratively disabled. The node's rail is cut off: "
            "check the cable, the switch port and the subnet manager.",
        ),
        Alert(
            "LockstepIBLinkFlapping",
            "warning",
            "0m",
            f"increase(lockstep_ib_port_link_downed_total[{T.IB_LINK_FLAP_WINDOW}])\n"
            f"+ increase(lockstep_ib_port_link_error_recovery_total[{T.IB_LINK_FLAP_WINDOW}])\n"
            f">= {T.IB_LINK_FLAP_EVENTS}\nor\n"
            'lockstep_ib_port_saturated{counter=~"link_downed|link_error_recovery"} == 1',
            f"InfiniBand link {label('device')}/{label('port')} on {WHERE} flaps",
            f"Port {label('device')}/{label('port')} on {WHERE} went down or retrained "
            f"{{{{ if $labels.counter }}}}so often its {label('counter')} counter saturated"
            f"{{{{ else }}}}{VALUE_2F} times in {T.IB_LINK_FLAP_WINDOW}{{{{ end }}}}. Every flap stalls the "
            "collectives crossing it: reseat or replace the cable or transceiver.",
        ),
        Alert(
            "LockstepIBSymbolErrors",
            "warning",
            "0m",
            f"increase(lockstep_ib_port_symbol_errors_total[1h]) > {T.IB_SYMBOL_ERRORS_PER_HOUR}\nor\n"
            'lockstep_ib_port_saturated{counter="symbol_error"} == 1',
            f"Symbol errors on InfiniBand port {label('device')}/{label('port')} on {WHERE}",
            f"Port {label('device')}/{label('port')} on {WHERE} "
            "{{ if $labels.counter }}has a saturated symbol_error counter (65535: it no longer counts; reset it "
            "with perfquery -R to see new errors){{ else }}counted " + VALUE_2F + " symbol errors in the last "
            "hour{{ end }}: a marginal cable or transceiver, often before the link starts flapping.",
        ),
        Alert(
            "LockstepIBCongestion",
            "warning",
            "15m",
            f"port:lockstep_ib_port_transmit_wait:ratio5m > {num(T.IB_TRANSMIT_WAIT_RATIO)}",
            f"InfiniBand port {label('device')}/{label('port')} on {WHERE} waits for credits",
            f"Port {label('device')}/{label('port')} on {WHERE} spent {VALUE_PERCENT} of its transmit time "
            "waiting for flow-control credits (port_xmit_wait) for 15 minutes: the fabric behind it is congested "
            "(hot spot, slow receiver, or a misrouted or degraded link).",
        ),
        Alert(
            "LockstepPFCStorm",
            "critical",
            "2m",
            f'max {by("interface")} (rate(lockstep_pfc_pause_seconds_total{{direction="tx"}}[5m]))'
            f" > {num(T.PFC_TX_PAUSE_RATIO)}\nor\n"
            f"sum {by('interface')} (increase(lockstep_pfc_pause_storm_events_total[10m])) > 0",
            f"PFC pause storm from {label('interface')} on {WHERE}",
            f"Interface {label('interface')} on {WHERE} keeps pausing its switch port (transmitted pause over "
            f"{percent(T.PFC_TX_PAUSE_RATIO)} of the time, or the NIC's pause-storm detector fired): its receive "
            "path is stalled and the pause spreads through the lossless fabric, stalling other nodes' RoCE traffic.",
        ),
        Alert(
            "LockstepRoCECongestionControlOff",
            "warning",
            "15m",
            f"max {by('interface', 'role')} (lockstep_roce_dcqcn_enabled) == 0\nor\n"
            f"rate(lockstep_roce_cnp_ignored_total[10m]) > {num(T.ROCE_CNP_IGNORED_PER_SECOND)}",
            f"RoCE congestion control is off on {WHERE}",
            "{{ if $labels.interface }}DCQCN "
            + label("role")
            + " is disabled on every priority of "
            + label("interface")
            + "{{ else }}"
            + label("device")
            + "/"
            + label("port")
            + " ignores "
            + VALUE_2F
            + " congestion notifications a second{{ end }} on "
            + WHERE
            + ": senders do not slow down when the fabric marks congestion, so it turns into PFC pause "
            "and drops instead.",
        ),
    ),
)
