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
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from lockstep.agent.collector import CollectorContext, Paths
from lockstep.agent.options import NoOptions

TESTS = Path(__file__).resolve().parent.parent
REPO = TESTS.parent
FIXTURES = TESTS / "fixtures"
GOLDEN = TESTS / "golden"
# The tiers: a test's folder, and the markers tests/conftest.py gives every test in it.
TIERS = {
    "unit": ("unit",),
    "component": ("component", "real"),
    "e2e": ("e2e", "real"),
}
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
    return samples(generate_latest(_Families(list(collector.collect()))).decode())


class _Families:
    """Just enough of a registry for prometheus_client's generate_latest."""

    def __init__(self, families: list[Any]) -> None:
        self.families = families

    def collect(self) -> list[Any]:
        return self.families


def value(text_or_samples: str | dict, name: str, **labels: str) -> float:
    data = samples(text_or_samples) if isinstance(text_or_samples, str) else text_or_samples
    return data[(name, frozenset(labels.items()))]


def names(text: str) -> set[str]:
    return {name for name, _ in samples(text)}


def require_real(what: str, available: bool) -> None:
    """Skip when a real component cannot run here; under CI=true that is a failure instead."""
    if available:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"{what} is required under CI=true but is not available")
    pytest.skip(f"{what} not available on this machine")


def require_promtool() -> str:
    promtool = shutil.which("promtool")
    require_real("promtool (Debian package prometheus)", promtool is not None)
    return promtool  # type: ignore[return-value]


def context(proc: Path | None = None, sys_: Path | None = None, options: object = NoOptions()) -> CollectorContext:
    """A context on the given trees; ``options`` is the collector's options dataclass, e.g. ``SlurmOptions(...)``."""
    paths = Paths(sysfs=sys_ or Path("/sys"), procfs=proc or Path("/proc"))
    return CollectorContext(paths=paths, options=options, log=logging.getLogger("test"))


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
