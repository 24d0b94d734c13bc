"""Daemon life on a real process: reloads (SIGHUP, file change, ConfigMap swap), SIGTERM,
a collector stuck in a real blocking syscall, sd_notify, JSON logs."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import time
from pathlib import Path

import bcrypt
import pytest

from tests.support import FIXTURES, AgentProcess, http_get, samples, wait_until

# Tier: real processes and tools (tests/conftest.py).
pytestmark = pytest.mark.real

HOST_UP = ("lockstep_collector_up", frozenset({("collector", "host")}))


def proc_tree(tmp_path: Path) -> Path:
    proc = tmp_path / "proc"
    shutil.copytree(FIXTURES / "host" / "proc", proc)
    return proc


def threads_waiting_on_fifo(pid: int) -> int:
    """Threads of the process blocked in the kernel opening a FIFO that has no writer."""
    count = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            count += Path(f"/proc/{pid}/task/{task}/wchan").read_text() == "wait_for_partner"
        except OSError:
            continue
    return count


def test_sigterm_exits_cleanly_even_with_a_collector_stuck_in_the_kernel(tmp_path: Path) -> None:
    # /proc/stat is a FIFO nobody writes: open() blocks in the kernel, like a hung mount.
    proc = proc_tree(tmp_path)
    (proc / "stat").unlink()
    os.mkfifo(proc / "stat")
    config = tmp_path / "lockstep.yml"
    config.write_text("collectors:\n  host:\n    interval: 200ms\n    deadline: 500ms\n")
    with AgentProcess("run", "--config", str(config), "--path.procfs", str(proc)) as agent:
        stuck = ("lockstep_collector_state", frozenset({("collector", "host"), ("state", "stuck")}))
        wait_until(lambda: samples(agent.metrics()).get(stuck) == 1, what="host reported stuck")
        assert threads_waiting_on_fifo(agent.proc.pid) == 1  # type: ignore[union-attr]
        started = time.monotonic()
        s = samples(agent.metrics())
        assert time.monotonic() - started < 2  # the scrape does not wait for the collector
        assert s[HOST_UP] == 0
        assert s[("lockstep_collector_runs_total", frozenset({("collector", "host")}))] == 0
        time.sleep(1.0)  # five intervals: no second call into the stuck collector
        assert threads_waiting_on_fifo(agent.proc.pid) == 1  # type: ignore[union-attr]
        started = time.monotonic()
        returncode, stderr = agent.stop(timeout=10)
        assert returncode == 0
        assert time.monotonic() - started < 5
    logs = [json.loads(line) for line in stderr.splitlines()]  # JSON: stderr is not a terminal
    stuck_logs = [entry for entry in logs if entry["msg"].startswith("collector stuck")]
    assert len(stuck_logs) == 1 and stuck_logs[0]["logger"] == "lockstep.collector.host"
    assert logs[-1]["msg"] == "stopping"


def test_bad_config_on_disk_and_sighup_keep_the_running_one(tmp_path: Path) -> None:
    proc = proc_tree(tmp_path)
    config = tmp_path / "lockstep.yml"
    config.write_text("collectors:\n  host:\n    interval: 200ms\n")
    with AgentProcess("run", "--config", str(config), "--path.procfs", str(proc)) as agent:
        wait_until(lambda: samples(agent.metrics()).get(HOST_UP) == 1, what="host up")
        config.write_text("collectors:\n  host:\n    interval: often\n")  # the file watcher sees this
        time.sleep(1.5)
        agent.proc.send_signal(signal.SIGHUP)  # type: ignore[union-attr]
        time.sleep(1.0)
        # Still the old config: host up and running every 200 ms (the default would be 15 s).
        runs = ("lockstep_collector_runs_total", frozenset({("collector", "host")}))
        before = samples(agent.metrics())[runs]
        wait_until(lambda: samples(agent.metrics())[runs] >= before + 3, timeout=5, what="runs at 200 ms")
        assert samples(agent.metrics())[HOST_UP] == 1
        returncode, stderr = agent.stop()
    assert returncode == 0
    logs = [json.loads(line) for line in stderr.splitlines()]
    reloads = [entry["reason"] for entry in logs if entry["msg"] == "reloading configuration"]
    assert reloads == ["file changed", "SIGHUP"]  # the write's burst of events made one reload
    rejected = [entry for entry in logs if "rejected" in entry["msg"]]
    assert len(rejected) == 2
    assert rejected[0]["msg"] == (
        "new configuration rejected, keeping the running one: "
        f"{config}:3: collectors.host.interval: expected a duration such as 15s, 500ms or 2m, got 'often'"
    )


def test_sighup_reloads_web_config(tmp_path: Path) -> None:
    web = tmp_path / "web.yml"
    web.write_text("{}\n")
    config = tmp_path / "lockstep.yml"
    config.write_text(f"web_config_file: {web}\n")
    with AgentProcess("run", "--config", str(config), "--path.procfs", str(proc_tree(tmp_path))) as agent:
        assert http_get(agent.url + "/metrics")[0] == 200
        hashed = bcrypt.hashpw(b"pw", bcrypt.gensalt(rounds=4)).decode()
        web.write_text(f"basic_auth_users:\n  prom: '{hashed}'\n")  # not watched: needs SIGHUP
        agent.proc.send_signal(signal.SIGHUP)  # type: ignore[union-attr]
        wait_until(lambda: http_get(agent.url + "/metrics")[0] == 401, what="basic auth after SIGHUP")
        assert agent.stop()[0] == 0


def test_kubernetes_configmap_symlink_swap_triggers_reload(tmp_path: Path) -> None:
    # The layout kubelet gives a mounted ConfigMap: config.yml -> ..data/config.yml, ..data -> ..<timestamp>
    mount = tmp_path / "config"
    (mount / "..2026_11_21_00_00_00.1").mkdir(parents=True)
    (mount / "..2026_11_21_00_00_00.1" / "config.yml").write_text("collectors:\n  host:\n    interval: 200ms\n")
    os.symlink("..2026_11_21_00_00_00.1", mount / "..data")
    os.symlink("..data/config.yml", mount / "config.yml")
    proc = proc_tree(tmp_path)
    with AgentProcess("run", "--config", str(mount / "config.yml"), "--path.procfs", str(proc)) as agent:
        wait_until(lambda: samples(agent.metrics()).get(HOST_UP) == 1, what="host up")
        new = mount / "..2026_11_21_00_05_00.2"
        new.mkdir()
        (new / "config.yml").write_text("collectors:\n  host:\n    enabled: false\n")
        os.symlink(new.name, mount / "..data_tmp")
        os.rename(mount / "..data_tmp", mount / "..data")  # atomic swap; config.yml itself untouched
        shutil.rmtree(mount / "..2026_11_21_00_00_00.1")
        wait_until(lambda: HOST_UP not in samples(agent.metrics()), what="host collector removed by reload")
        assert not [name for name, _ in samples(agent.metrics()) if name.startswith("lockstep_host_")]
        assert agent.stop()[0] == 0


def test_sd_notify_ready_watchdog_stopping(tmp_path: Path) -> None:
    path = str(tmp_path / "notify.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(path)
        sock.settimeout(10)
        env = {"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "400000"}
        with AgentProcess("run", "--path.procfs", str(proc_tree(tmp_path)), env=env) as agent:
            messages = [sock.recv(256).decode() for _ in range(3)]
            assert messages[0] == "READY=1"
            assert messages[1:] == ["WATCHDOG=1", "WATCHDOG=1"]  # every 0.2 s: half the timeout
            agent.stop()
            rest = []
            sock.settimeout(0.5)
            try:
                while True:
                    rest.append(sock.recv(256).decode())
            except TimeoutError:
                pass
            assert rest[-1] == "STOPPING=1"


def test_demo_serves_simulated_node() -> None:
    with AgentProcess("demo", "--scenario", "healthy") as agent:
        # The collectors' first rounds run one after another on the agent's runner, after
        # /healthz answers (the simulated GPUs' first round waits for their XID listener, and
        # keeps the runner 1 s at most): the host's data comes within seconds, not at once.
        s = wait_until(
            lambda: (got := samples(agent.metrics())).get(HOST_UP) == 1 and got,
            timeout=20,
            what="the host collector's first round",
        )
        assert s[("lockstep_host_cpus", frozenset())] == 16
        assert s[HOST_UP] == 1
        assert agent.stop()[0] == 0
