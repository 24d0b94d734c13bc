"""The agent's logs (agent/logs.py): what third-party libraries log is passed on, except their known noise."""

from __future__ import annotations

import json
import logging

import pytest

from lockstep.agent.logs import setup_logging


def test_watchdogs_stopped_emitter_race_is_not_logged_as_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    """Every shutdown logged watchdog's 'queue_events() called when the thread is inactive'
    ERROR (a race inside watchdog when an observer stops mid-read); its other messages pass."""
    setup_logging("info", "json")
    try:
        inotify = logging.getLogger("watchdog.observers.inotify")
        inotify.error("InotifyEmitter.queue_events() called when the thread is inactive")
        inotify.error("Unable to rebuild recursive inotify watches below '/x'")
        lines = [json.loads(line)["msg"] for line in capsys.readouterr().err.splitlines()]
    finally:
        logging.getLogger().handlers.clear()
    assert lines == ["Unable to rebuild recursive inotify watches below '/x'"]
