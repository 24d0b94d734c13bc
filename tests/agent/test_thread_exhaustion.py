"""The agent at its task limit, for real: a pids cgroup (what systemd's TasksMax sets) closed
down to no new thread while the agent runs, then opened again.

Scrapes must keep working throughout (the HTTP server makes no thread per connection), and once
threads can be created again every collector must report correct values without a restart:
no call, worker or listener left half-registered by a thread that never started.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from lockstep.agent.collector import Collector, CollectorContext, MetricSpec
from lockstep.agent.config import Overrides, load_config
from lockstep.agent.daemon import Agent, Setup
from lockstep.agent.families import Metric
from lockstep.agent.scheduler import State, Worker
from lockstep.agent.seams import Seams
from lockstep.agent.webconfig import WebConfig
from lockstep.simulation.fake_nvml import fake_from_gpus
from tests.support import LOCKSTEP, REPO, collected, context, free_port, http_get, require_real, samples, wait_until

# Tier: a pids cgroup, and the host's mount table compared before and after (tests/conftest.py).
pytestmark = pytest.mark.machine

PIDS_ROOT = Path("/sys/fs/cgroup/pids")  # cgroup v1; v2 has the pids controller at the root


def pids_root() -> Path | None:
    for root in (PIDS_ROOT, Path("/sys/fs/cgroup")):
        if (root / "cgroup.procs").exists() and os.access(root, os.W_OK):
            if root == PIDS_ROOT or "pids" in (root / "cgroup.controllers").read_text().split():
                return root
    return None


@pytest.fixture
def pids_cgroup() -> Iterator[Path]:
    root = pids_root()
    require_real("a writable pids cgroup (root)", root is not None)
    assert root is not None
    group = root / f"lockstep-test-threads-{os.getpid()}"
    group.mkdir()
    try:
        yield group
    finally:
        (group / "pids.max").write_text("max")
        wait_until(lambda: not (group / "cgroup.procs").read_text().strip(), timeout=20, what="the cgroup to empty")
        group.rmdir()


def test_collectors_and_scrapes_survive_thread_exhaustion(pids_cgroup: Path, tmp_path: Path) -> None:
    config = tmp_path / "lockstep.yml"

    def write_config(interval: str) -> None:
        config.write_text(
            "disable_default_collectors: true\n"
            "collectors:\n"
            "  filesystem: {enabled: true, interval: 0.5s}\n"
            f"  host: {{enabled: true, interval: {interval}}}\n"
        )

    write_config("0.5s")
    port = free_port()
    url = f"http://127.0.0.1:{port}"

    def join_cgroup() -> None:
        (pids_cgroup / "cgroup.procs").write_text(str(os.getpid()))

    agent = subprocess.Popen(
        [*LOCKSTEP, "run", "--config", str(config), "--listen", f"127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        preexec_fn=join_cgroup,
    )
    try:

        def scrape() -> dict | None:  # type: ignore[type-arg]
            try:
                status, body = http_get(url + "/metrics", timeout=5)
            except OSError:
                return None
            assert status == 200
            return samples(body)

        def healthy() -> bool:
            got = scrape()
            if got is None:
                return False
            responsive = [v for (name, _), v in got.items() if name == "lockstep_filesystem_responsive"]
            up = {dict(labels)["collector"]: v for (name, labels), v in got.items() if name == "lockstep_collector_up"}
            return bool(responsive) and set(responsive) == {1.0} and up == {"filesystem": 1.0, "host": 1.0}

        wait_until(healthy, timeout=180, what="every mount responsive and both collectors up")
        mounts = {labels for (name, labels), _ in (scrape() or {}).items() if name == "lockstep_filesystem_responsive"}

        # No new task from now on: the filesystem collector's statvfs threads cannot start, and a
        # reload replaces the host collector's worker (which needs no thread: the agent's
        # scheduler runs every collector's rounds).
        (pids_cgroup / "pids.max").write_text("1")
        write_config("0.6s")
        agent.send_signal(signal.SIGHUP)
        exhausted_until = time.monotonic() + 4  # several filesystem rounds at 0.5 s
        during = []
        while time.monotonic() < exhausted_until:
            status, body = http_get(url + "/metrics", timeout=5)
            during.append(status)
            time.sleep(0.2)
        assert set(during) == {200}  # every scrape answered while no thread could be created
        events = (pids_cgroup / "pids.events").read_text() if (pids_cgroup / "pids.events").exists() else ""
        assert events == "" or int(events.split()[-1]) > 0  # thread creation was in fact refused
        status, body = http_get(url + "/metrics", timeout=5)
        up = samples(body)[("lockstep_collector_up", frozenset({("collector", "host")}))]
        assert up == 1.0  # the new host worker runs on the threads the agent has

        (pids_cgroup / "pids.max").write_text("max")
        wait_until(healthy, timeout=120, what="collectors correct again once threads can be created")
        after = {labels for (name, labels), _ in (scrape() or {}).items() if name == "lockstep_filesystem_responsive"}
        assert after == mounts
    finally:
        agent.terminate()
        _, stderr = agent.communicate(timeout=20)
    assert agent.returncode == 0, stderr
    assert "configuration reloaded" in stderr


# --- The other threads the agent starts, each refused once ----------------------------------
# A pids cgroup cannot aim at one thread, so these refuse exactly one thread by its name
# (Thread.start raises RuntimeError, as CPython does at the task limit) and show the owner
# recovering once threads can be created again.


@pytest.fixture
def refuse_thread(monkeypatch: pytest.MonkeyPatch) -> Iterator[set[str]]:
    """Thread names whose start fails with CPython's "can't start new thread" while listed."""
    refused: set[str] = set()
    real_start = threading.Thread.start

    def start(self: threading.Thread) -> None:
        if self.name in refused:
            raise RuntimeError("can't start new thread")
        real_start(self)

    monkeypatch.setattr(threading.Thread, "start", start)
    yield refused


def test_a_gpu_session_whose_xid_listener_cannot_start_is_opened_whole_later(refuse_thread: set[str]) -> None:
    from tests.support.gpu import FULL, make, xids

    fake = fake_from_gpus([FULL])
    collector = make(fake)
    try:
        refuse_thread.add("gpu-xid-listener")
        with pytest.raises(RuntimeError, match="can't start new thread"):
            list(collector.collect())  # the round fails: no session without its XID listener
        assert collector.sessions.session is None
        assert fake.calls[("nvmlShutdown", None)] == 1  # NVML closed again, nothing half-open

        refuse_thread.clear()
        values = collected(collector)
        assert values[("lockstep_gpu_up", frozenset({("gpu", "0"), ("uuid", fake.spec.gpus[0].uuid)}))] == 1.0
        assert collector.sessions.session is not None and collector.sessions.session.listener is not None
        wait_until(collector.sessions.session.listener.ready.is_set, what="the XID listener registered")
        fake.inject_xid(0, 48)
        wait_until(lambda: xids(collector) == {("0", "48"): 1}, what="XID 48 counted by the new listener")
    finally:
        collector.close()


class Counting(Collector):
    name = "counting"
    metrics = (MetricSpec("lockstep_counting_rounds", "gauge", "Rounds so far."),)

    def __init__(self, ctx: CollectorContext) -> None:
        super().__init__(ctx)
        self.calls = 0

    def collect(self) -> Iterator[Metric]:
        self.calls += 1
        family = self.metrics[0].family()
        family.add_metric([], self.calls)
        yield family


def test_a_worker_whose_scheduler_cannot_start_fails_visibly_and_runs_once_started(refuse_thread: set[str]) -> None:
    toy = Counting(context())
    w = Worker(toy, interval=3600, deadline=5, staleness_intervals=3, log=logging.getLogger("test"))
    refuse_thread.add("collector-counting")
    assert w.start() is False
    view = w.view()
    assert (view.state, view.reason) == (
        State.FAILED,
        "cannot start the collectors' thread (can't start new thread); retrying",
    )
    refuse_thread.clear()
    assert w.start() is True
    try:
        wait_until(lambda: w.view().state == State.OK, what="the first round once the thread could start")
        assert toy.calls == 1
    finally:
        w.stop()
        assert w.join(5)


def test_hotplug_events_resume_when_the_listener_thread_can_start(refuse_thread: set[str]) -> None:
    require_real("root and iproute2 (to create a veth pair)", os.geteuid() == 0 and shutil.which("ip") is not None)
    from tests.support.netwatch import NetWatch

    available = {"netwatch": NetWatch}
    setup = Setup(None, available, Overrides(disable_defaults=True, enable=frozenset({"netwatch"})), Seams())
    refuse_thread.add("hotplug")
    agent = Agent(setup, load_config(None, available, setup.overrides), WebConfig())
    name = "lsv" + uuid.uuid4().hex[:8]
    try:
        assert agent.hotplug is not None and agent.hotplug.thread_failed  # refused, and known to be
        refuse_thread.clear()
        agent.restart_what_failed_to_start()  # what the agent's main loop does every tick
        assert not agent.hotplug.thread_failed
        subprocess.run(["ip", "link", "add", name, "type", "veth", "peer", "name", name + "p"], check=True)
        wait_until(lambda: ("add", "net", f"/sys/devices/virtual/net/{name}") in NetWatch.events, what="add uevent")
    finally:
        subprocess.run(["ip", "link", "del", name], capture_output=True)
        agent.stop()
