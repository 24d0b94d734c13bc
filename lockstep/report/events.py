"""The events section: what happened on the job's nodes (fabric links down and flapping, PFC
storms, NFS timeouts, mounts unresponsive)."""

from __future__ import annotations

from lockstep.report.model import Event
from lockstep.report.scope import (
    Key,
    Scope,
    fill,
    host_of_instance,
    increase_over_job,
    natural,
)

EVENT_COUNTERS: tuple[tuple[str, str, tuple[str, ...], str], ...] = (
    ("fabric", "lockstep_ib_port_link_downed_total", (), "IB {device}/{port} link down"),
    ("fabric", "lockstep_ib_port_link_error_recovery_total", (), "IB {device}/{port} recoveries"),
    ("fabric", "lockstep_ib_port_symbol_errors_total", (), "IB {device}/{port} symbol errors"),
    ("fabric", "lockstep_pfc_pause_storm_events_total", (), "PFC pause storm on {interface}"),
    (
        "filesystem",
        "lockstep_nfs_major_timeouts_total",
        ("instance", "mountpoint"),
        "NFS major timeouts on {mountpoint}",
    ),
)
EVENT_GAUGES = (
    ("fabric", "min_over_time(lockstep_ib_port_state{SEL}[WIN]) < 4", "IB {device}/{port} not active"),
    # Unresponsive at two scrapes or more (one slow statfs on a busy node is no event).
    (
        "filesystem",
        "count_over_time(lockstep_filesystem_responsive{SEL}[WIN])"
        " - sum_over_time(lockstep_filesystem_responsive{SEL}[WIN]) >= 2",
        "{mountpoint} unresponsive",
    ),
)


def event_section(scope: Scope) -> list[Event]:
    if not scope.instances:
        return []
    hosts = host_of_instance(scope)
    selector = scope.nodes("")[1:-1]
    out = []
    for kind, name, by, what in EVENT_COUNTERS:
        counted: dict[Key, float] = {}
        for s in increase_over_job(scope, name):
            key = tuple(sorted((k, v) for k, v in s.labels.items() if not by or k in by))
            counted[key] = counted.get(key, 0.0) + s.value
        for key, value in counted.items():
            labels = dict(key)
            if round(value) > 0:
                out.append(Event(kind, hosts.get(labels.get("instance", ""), ""), fill(what, labels), round(value)))
    for kind, template, what in EVENT_GAUGES:
        for s in scope.at_end(template.replace("SEL", selector).replace("WIN", scope.whole)):
            out.append(Event(kind, hosts.get(s.labels.get("instance", ""), ""), fill(what, s.labels), 0.0))
    return sorted(out, key=lambda e: (e.kind, natural(e.node), e.what))
