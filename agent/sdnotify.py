"""systemd's notification protocol: READY=1, WATCHDOG=1, STOPPING=1.

A datagram to the socket named by $NOTIFY_SOCKET; a no-op when the variable is unset
(not run by systemd, or not Type=notify).  Written here rather than taken from the
`sdnotify` package, whose last release is from 2017: the protocol is one sendto().
"""

from __future__ import annotations

import os
import socket


class Notifier:
    def __init__(self) -> None:
        address = os.environ.get("NOTIFY_SOCKET", "")
        if address.startswith("@"):  # abstract namespace socket
            address = "\0" + address[1:]
        self._address = address
        usec = os.environ.get("WATCHDOG_USEC", "")
        pid = os.environ.get("WATCHDOG_PID", "")
        watchdog_for_us = usec.isdigit() and (not pid or pid == str(os.getpid()))
        # Ping at half the watchdog timeout, as sd_watchdog_enabled(3) advises.
        self.watchdog_interval: float | None = int(usec) / 2e6 if watchdog_for_us and address else None

    @property
    def enabled(self) -> bool:
        return bool(self._address)

    def notify(self, message: str) -> None:
        if not self._address:
            return
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            try:
                sock.sendto(message.encode(), self._address)
            except OSError:
                pass  # systemd gone or socket unreachable: nothing useful to do
