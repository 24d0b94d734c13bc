"""Structured logging: JSON lines when stderr is not a terminal, readable lines when it is.

Built on the standard library's logging rather than structlog: libraries the agent uses
(watchdog, urllib3, ...) log through it anyway, and a twenty-line formatter is all the
structure needed.  Each component logs through its own named logger
(``lockstep.collector.<name>``, ``lockstep.http``, ...); fields passed with ``extra=``
appear as JSON keys.
"""

from __future__ import annotations

import json
import logging
import sys
import time

# Attributes every LogRecord has; anything else on a record came from extra= and is a field.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


class JSONFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class ConsoleFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s: %(message)s", "%H:%M:%S")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        fields = {k: v for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")}
        if fields:
            text += " " + " ".join(f"{k}={v}" for k, v in fields.items())
        return text


def setup_logging(level: str = "info", fmt: str = "auto") -> None:
    use_json = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JSONFormatter() if use_json else ConsoleFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)  # third-party libraries: warnings and up
    logging.getLogger("lockstep").setLevel(level.upper())
    inotify = logging.getLogger("watchdog.observers.inotify")
    if not any(isinstance(f, _StoppedEmitterFilter) for f in inotify.filters):
        inotify.addFilter(_StoppedEmitterFilter())


class _StoppedEmitterFilter(logging.Filter):
    """Drops watchdog's "queue_events() called when the thread is inactive" ERROR.

    watchdog (7.x) logs it when an observer is stopped while its emitter thread is reading an
    event: a race inside watchdog at every shutdown, harmless (the event is of a watch being
    removed), and an ERROR in the agent's log on every stop would teach operators to ignore
    errors.  Its other messages pass."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "called when the thread is inactive" not in record.getMessage()


def collector_logger(name: str) -> logging.Logger:
    return logging.getLogger(f"lockstep.collector.{name}")
