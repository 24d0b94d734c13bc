"""Kernel uevents reach the collectors that asked for them: a real veth pair, made by the test."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid

import pytest

from lockstep.agent.config import Overrides, load_config
from lockstep.agent.daemon import Agent, Setup
from lockstep.agent.seams import Seams
from lockstep.agent.webconfig import WebConfig
from tests.support import require_real, wait_until
from tests.support.netwatch import NetWatch

# Tier: veth pairs and the kernel's uevents, seen machine-wide (tests/conftest.py).
pytestmark = pytest.mark.machine


def test_veth_add_and_delete_trigger_rediscovery() -> None:
    require_real("root and iproute2 (to create a veth pair)", os.geteuid() == 0 and shutil.which("ip") is not None)
    available = {"netwatch": NetWatch}
    setup = Setup(None, available, Overrides(disable_defaults=True, enable=frozenset({"netwatch"})), Seams())
    agent = Agent(setup, load_config(None, available, setup.overrides), WebConfig())
    name = "lsv" + uuid.uuid4().hex[:8]
    try:
        assert agent.hotplug is not None and agent.hotplug.subsystems == {"net"}
        wait_until(lambda: NetWatch.runs == 1, what="the first run")
        subprocess.run(["ip", "link", "add", name, "type", "veth", "peer", "name", name + "p"], check=True)
        wait_until(lambda: ("add", "net", f"/sys/devices/virtual/net/{name}") in NetWatch.events, what="add uevent")
        wait_until(lambda: NetWatch.runs >= 2, what="a run triggered by the add event")
        runs_after_add = NetWatch.runs
        subprocess.run(["ip", "link", "del", name], check=True)
        wait_until(lambda: ("remove", "net", f"/sys/devices/virtual/net/{name}") in NetWatch.events, what="remove")
        wait_until(lambda: NetWatch.runs > runs_after_add, what="a run triggered by the remove event")
    finally:
        subprocess.run(["ip", "link", "del", name], capture_output=True)
        agent.stop()
