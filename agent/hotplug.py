"""Kernel hotplug events (uevents) that make collectors re-discover their devices at once.

One netlink monitor for the whole agent, listening to the union of the subsystems the
running collectors asked for (``Collector.hotplug_subsystems``).  Events are read from the
kernel directly (pyudev ``source="kernel"``), so no udev daemon is needed: containers and
minimal hosts have none.  Without libudev or netlink rights the agent logs a warning and
collectors simply find changes at their next interval.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

log = logging.getLogger("lockstep.hotplug")


class HotplugMonitor:
    def __init__(self, subsystems: Iterable[str], on_event: Callable[[str, str, str], None]) -> None:
        self.subsystems = frozenset(subsystems)
        self._on_event = on_event
        self._observer: Any = None
        self.thread_failed = False  # no thread could be created: start() again later

    def start(self) -> bool:
        """Start listening; False (and a warning) if this machine does not allow it."""
        try:
            import pyudev

            monitor = pyudev.Monitor.from_netlink(pyudev.Context(), source="kernel")
            for subsystem in sorted(self.subsystems):
                monitor.filter_by(subsystem)
            self._observer = pyudev.MonitorObserver(monitor, callback=self._handle, name="hotplug")
            self._observer.daemon = True
            self._observer.start()
        except RuntimeError as exc:  # "can't start new thread": the process is at its task limit
            if not self.thread_failed:
                log.warning("no hotplug events for now (%s); retrying", exc)
            self.thread_failed = True
            self._observer = None
            return False
        except Exception as exc:  # ImportError (no libudev), OSError (no netlink rights), ...
            log.warning("no hotplug events (%s): devices are re-discovered at each interval only", exc)
            return False
        if self.thread_failed:
            log.info("hotplug events resumed")
        self.thread_failed = False
        return True

    def _handle(self, device: Any) -> None:
        try:
            self._on_event(device.action or "", device.subsystem or "", device.sys_path or "")
        except Exception:
            log.exception("hotplug event handler failed")

    def stop(self) -> None:
        if self._observer is not None:
            self._observer.send_stop()
            self._observer = None
