"""The agent at its task limit, for real: a pids cgroup (what systemd's TasksMax sets) closed
down to no new thread while the agent runs, then opened again.

Scrapes must keep working throughout (the HTTP server makes no thread per connection), and once
threads can be created again every collector must report correct values without a restart:
no call, worker or listener left half-registered by a thread that never started.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import LOCKSTEP, REPO, free_port, http_get, require_real, samples, wait_until

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
        # reload that replaces the host collector's worker cannot start its thread.
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
        assert up == 0.0  # the new host worker could not start: reported, not hidden

        (pids_cgroup / "pids.max").write_text("max")
        wait_until(healthy, timeout=120, what="collectors correct again once threads can be created")
        after = {labels for (name, labels), _ in (scrape() or {}).items() if name == "lockstep_filesystem_responsive"}
        assert after == mounts
    finally:
        agent.terminate()
        _, stderr = agent.communicate(timeout=20)
    assert agent.returncode == 0, stderr
    assert "cannot start the collector's thread" in stderr
