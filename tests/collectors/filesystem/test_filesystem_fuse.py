"""A real hung mount: a FUSE filesystem whose statfs blocks until the test releases it.

The agent runs as a real process (`lockstep run`) with the filesystem collector.  While the
mount hangs: scrapes keep answering, the mount is reported unresponsive, and exactly one
thread of the agent is blocked in the kernel on it (counted from /proc/<pid>/task/*/stack,
not from the agent's own word).  After release it recovers by itself.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import REPO, AgentProcess, require_real, samples, wait_until

# Tier: a real FUSE mount, in the host's mount table (tests/conftest.py).
pytestmark = pytest.mark.machine

HELPER = REPO / "tests" / "support" / "fuse_hanging_fs.py"


def fuse_available() -> tuple[bool, str]:
    if os.geteuid() != 0:
        return False, "not root"
    if not os.path.exists("/dev/fuse"):
        return False, "no /dev/fuse"
    if shutil.which("fusermount3") is None:
        return False, "no fusermount3 (Debian fuse3)"
    probe = subprocess.run([sys.executable, "-c", "import mfusepy"], capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        return False, f"mfusepy cannot load libfuse: {probe.stderr.strip().splitlines()[-1:]}"
    return True, ""


def mounted(mountpoint: Path) -> bool:
    with open("/proc/self/mountinfo") as table:
        return any(line.split(" ")[4] == str(mountpoint) for line in table)


def threads_blocked_in_fuse_statfs(pid: int) -> int:
    """Threads of ``pid`` inside the kernel's FUSE statfs, waiting for the daemon's answer."""
    count = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stack") as f:
                if "fuse_statfs" in f.read():
                    count += 1
                continue
        except OSError:
            pass  # no stack without CAP_SYS_ADMIN: fall back to the wait channel
        try:
            with open(f"/proc/{pid}/task/{tid}/wchan") as f:
                count += f.read().strip() == "request_wait_answer"
        except OSError:
            continue
    return count


@pytest.fixture
def hanging_mount(tmp_path: Path) -> Iterator[tuple[Path, subprocess.Popen[str]]]:
    available, why = fuse_available()
    require_real(f"a FUSE mount (root, /dev/fuse, fuse3, mfusepy){': ' + why if why else ''}", available)
    mountpoint = tmp_path / "hangfs"
    mountpoint.mkdir()
    fs = subprocess.Popen(
        [sys.executable, str(HELPER), str(mountpoint)],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        wait_until(lambda: mounted(mountpoint), timeout=20, what=f"the FUSE filesystem to mount on {mountpoint}")
        yield mountpoint, fs
    finally:
        # Release first, so nothing stays blocked on it, then unmount (lazily: never wait on it).
        try:
            assert fs.stdin is not None
            fs.stdin.write("release\n")
            fs.stdin.flush()
        except (OSError, ValueError):
            pass
        subprocess.run(["fusermount3", "-u", "-z", str(mountpoint)], capture_output=True, timeout=30)
        if mounted(mountpoint):
            subprocess.run(["umount", "-l", str(mountpoint)], capture_output=True, timeout=30)
        try:
            fs.wait(timeout=10)
        except subprocess.TimeoutExpired:
            fs.kill()
            fs.wait(timeout=10)


def test_hung_fuse_mount_is_reported_and_never_hangs_the_agent(
    hanging_mount: tuple[Path, subprocess.Popen[str]], tmp_path: Path
) -> None:
    mountpoint, fs = hanging_mount
    config = tmp_path / "lockstep.yml"
    config.write_text(
        "collectors:\n"
        "  filesystem:\n"
        "    interval: 500ms\n"
        "    deadline: 10s\n"
        "    stat_timeout: 1s\n"
        f"    mountpoints_include: [{str(mountpoint)!r}]\n"
    )
    labels = frozenset({("mountpoint", str(mountpoint)), ("fstype", "fuse.hangfs")})

    def metric(text: str, name: str, key: frozenset = labels) -> float | None:
        return samples(text).get((name, key))

    with AgentProcess(
        "run", "--config", str(config), "--collector.disable-defaults", "--collector.filesystem"
    ) as agent:
        assert agent.proc is not None
        pid = agent.proc.pid
        wait_until(
            lambda: metric(agent.metrics(), "lockstep_filesystem_responsive") == 1, timeout=20, what="a first stat"
        )
        text = agent.metrics()
        assert metric(text, "lockstep_filesystem_size_bytes") == 262144 * 4096
        assert metric(text, "lockstep_filesystem_available_bytes") == 131072 * 4096
        assert metric(text, "lockstep_filesystem_files_free") == 900

        assert fs.stdin is not None
        fs.stdin.write("hang\n")
        fs.stdin.flush()
        wait_until(
            lambda: metric(agent.metrics(), "lockstep_filesystem_responsive") == 0,
            timeout=20,
            what="the mount to be reported unresponsive",
        )
        # Several collector rounds (interval 0.5 s) while it hangs: scrapes answer, one thread waits.
        latencies = []
        stop = time.monotonic() + 4.0
        while time.monotonic() < stop:
            started = time.monotonic()
            text = agent.metrics()  # http_get's own 5 s timeout is the generous bound
            latencies.append(time.monotonic() - started)
            assert metric(text, "lockstep_filesystem_responsive") == 0
            assert metric(text, "lockstep_filesystem_stat_calls_in_flight", frozenset()) == 1
            assert metric(text, "lockstep_collector_up", frozenset({("collector", "filesystem")})) == 1
            assert threads_blocked_in_fuse_statfs(pid) == 1
            time.sleep(0.1)
        print(
            f"\nscrapes while the FUSE mount hangs: {len(latencies)}, "
            f"p50 {statistics.median(latencies) * 1000:.2f} ms, max {max(latencies) * 1000:.2f} ms"
        )

        fs.stdin.write("release\n")
        fs.stdin.flush()
        wait_until(
            lambda: metric(agent.metrics(), "lockstep_filesystem_responsive") == 1,
            timeout=20,
            what="the mount to recover",
        )
        text = agent.metrics()
        assert metric(text, "lockstep_filesystem_size_bytes") == 262144 * 4096
        wait_until(lambda: threads_blocked_in_fuse_statfs(pid) == 0, timeout=10, what="no thread left in statfs")
        code, stderr = agent.stop()
        assert code == 0
        assert "unresponsive" in stderr and "responsive again" in stderr
