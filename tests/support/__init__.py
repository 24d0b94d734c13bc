"""Shared test helpers: exposition parsing, real-component gating, running the agent.

Test modules import these (`from tests.support import samples`); fixtures and pytest hooks live in
tests/conftest.py.  Nothing here is a test, and no test module imports another test module.
"""

from __future__ import annotations

import logging
import os
import resource
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from prometheus_client.parser import text_string_to_metric_families

from lockstep.agent.collector import CollectorContext, Paths
from lockstep.agent.exposition import render_text
from lockstep.agent.options import NoOptions
from lockstep.agent.seams import Seams

TESTS = Path(__file__).resolve().parent.parent
REPO = TESTS.parent
FIXTURES = TESTS / "fixtures"
GOLDEN = TESTS / "golden"
# The tiers, by what a test needs (its marker, not its folder; tests/conftest.py):
#   unit     in-process: fixture trees, the fake NVML, captured output, threads and loopback
#            sockets of its own.  Starts no process (the conftest makes that a failure).  No marker:
#            conftest gives it `unit`.
#   real     real components: processes (the agent as a daemon, promtool, scontrol, ip, a FUSE
#            server), root, Debian packages.  Skips where they are missing, fails under CI=true.
#   e2e      a Prometheus, Alertmanager or VictoriaMetrics server, or the soak (also `real`).
#   machine  changes or reads machine-wide state (mounts, users, network namespaces, cgroups,
#            the host's process table): runs alone, never beside another test (also `real`).
TIERS = ("unit", "real", "e2e", "machine")
# Set while a unit test runs (tests/conftest.py): what only a real test may do checks it.
UNIT_TEST_RUNNING = threading.Event()
LOCKSTEP = [sys.executable, "-m", "lockstep.agent.cli"]


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of an exposition, keyed by (sample name, labels)."""
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return out


def collected(collector: Any) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of one collection round of a collector, rendered as a scrape would be."""
    return samples(render_text(list(collector.collect())).decode())


def value(text_or_samples: str | dict, name: str, **labels: str) -> float:
    data = samples(text_or_samples) if isinstance(text_or_samples, str) else text_or_samples
    return data[(name, frozenset(labels.items()))]


def names(text: str) -> set[str]:
    return {name for name, _ in samples(text)}


def collector_up(text: str, collector: str) -> float:
    """``lockstep_collector_up{collector}`` in an exposition."""
    return samples(text)[("lockstep_collector_up", frozenset({("collector", collector)}))]


def rss_bytes(pid: int) -> int:
    """A process's resident memory, from /proc/PID/status."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS in /proc/{pid}/status")


def alive(pids: list[int]) -> list[int]:
    """The processes among ``pids`` still running (a zombie is not)."""
    running = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            running.append(pid)
    return running


# Generated inputs (hypothesis): enough examples to find what nobody thought of, no per-example
# deadline (a shared machine's pauses are not the parser's), and function-scoped fixtures allowed
# (each example writes its own files under them).
GENERATED = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def require_real(what: str, available: bool) -> None:
    """Skip when a real component cannot run here; under CI=true that is a failure instead.
    Only a test marked `real` (or `e2e`, `machine`) may need one: tests/conftest.py fails a unit
    test that calls this."""
    if UNIT_TEST_RUNNING.is_set():
        pytest.fail(f"a unit test needs {what}: mark it @pytest.mark.real (tests/support/__init__.py TIERS)")
    if available:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"{what} is required under CI=true but is not available")
    pytest.skip(f"{what} not available on this machine")


def require_promtool() -> str:
    promtool = shutil.which("promtool")
    require_real("promtool (Debian package prometheus)", promtool is not None)
    return promtool  # type: ignore[return-value]


def context(
    proc: Path | None = None, sys_: Path | None = None, options: object = NoOptions(), seams: Seams | None = None
) -> CollectorContext:
    """A context on the given trees; ``options`` is the collector's options dataclass, e.g.
    ``SlurmOptions(...)``; ``seams`` the replaced dependencies (a clock, a captured scontrol)."""
    paths = Paths(sysfs=sys_ or Path("/sys"), procfs=proc or Path("/proc"))
    return CollectorContext(paths=paths, options=options, log=logging.getLogger("test"), seams=seams or Seams())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def lockstep(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*LOCKSTEP, *args], capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO)


def http_get(url: str, timeout: float = 5, headers: dict[str, str] | None = None, context=None) -> tuple[int, str]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=context) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def wait_until(predicate, timeout: float = 10, step: float = 0.05, what: str = "condition"):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = predicate()
        if result:
            return result
        time.sleep(step)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


class AgentProcess:
    """`lockstep run` (or demo) as a real subprocess, for daemon-life tests."""

    def __init__(self, *args: str, env: dict[str, str] | None = None, open_files: int | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.args = [*args, "--listen", f"127.0.0.1:{self.port}"]
        self.env = {**os.environ, **(env or {})}
        self.open_files = open_files  # RLIMIT_NOFILE (soft and hard) of the agent, as LimitNOFILE= sets it
        self.proc: subprocess.Popen[str] | None = None

    def _limit_open_files(self) -> None:  # in the child, before exec
        if self.open_files is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (self.open_files, self.open_files))

    def __enter__(self) -> AgentProcess:
        self.proc = subprocess.Popen(
            [*LOCKSTEP, *self.args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=self.env,
            cwd=REPO,
            preexec_fn=self._limit_open_files if self.open_files is not None else None,
        )

        def up() -> bool:
            if self.proc.poll() is not None:  # type: ignore[union-attr]
                raise AssertionError(f"agent exited early: {self.proc.stderr.read()}")  # type: ignore[union-attr]
            try:
                return http_get(self.url + "/healthz", timeout=1)[0] == 200
            except OSError:
                return False

        wait_until(up, timeout=20, what="the agent to serve /healthz")
        return self

    def metrics(self) -> str:
        status, body = http_get(self.url + "/metrics")
        assert status == 200
        return body

    def stop(self, timeout: float = 10) -> tuple[int, str]:
        assert self.proc is not None
        self.proc.terminate()
        _, stderr = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, stderr

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()
