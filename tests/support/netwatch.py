"""A collector that asks for net hotplug events and counts its runs (tests of kernel uevents)."""

from __future__ import annotations

from collections.abc import Iterator

from lockstep.agent.collector import Collector, MetricSpec
from lockstep.agent.families import Metric

SEEN = MetricSpec("lockstep_netwatch_runs", "gauge", "Runs so far.")


class NetWatch(Collector):
    name = "netwatch"
    default_interval = 3600.0  # only a hotplug event can make it run again within the test
    metrics = (SEEN,)
    hotplug_subsystems = ("net",)
    events: list[tuple[str, str, str]] = []
    runs = 0

    def on_hotplug(self, action: str, subsystem: str, sys_path: str) -> None:
        NetWatch.events.append((action, subsystem, sys_path))

    def collect(self) -> Iterator[Metric]:
        NetWatch.runs += 1
        family = SEEN.family()
        family.add_metric([], NetWatch.runs)
        yield family
