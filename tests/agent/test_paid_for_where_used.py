"""What the agent loads only where it is used (issue 47, docs/performance.md): a round of every
collector on this machine (no GPU, no inference server, no TLS or basic auth configured) loads
neither prometheus_client (its package loads HTTP servers and clients and ssl: 12 MiB) nor ssl
(5 MiB), nor an HTTP client, nor bcrypt, nor importlib.metadata (4.5 MiB with email and
zipfile: the registry reads entry points itself) nor the email package (the Date header), nor,
with no config file, PyYAML (1.7 MiB).  In a fresh interpreter: the test process has loaded
them all."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support import REPO

NEVER_HERE = (
    "prometheus_client",
    "ssl",
    "http.client",
    "urllib.request",
    "http.server",
    "bcrypt",
    "importlib.metadata",
    "email",
    "yaml",
)
ROUND = f"""
import sys
from lockstep.agent.cli import once
body, failures = once(["once"])  # (a collector past its deadline on a busy machine still loaded its modules)
assert body
print(" ".join(m for m in {NEVER_HERE!r} if m in sys.modules))
"""


@pytest.mark.real
def test_a_round_loads_no_http_client_no_ssl_and_no_prometheus_client() -> None:
    result = subprocess.run(
        [sys.executable, "-c", ROUND], capture_output=True, text=True, timeout=120, cwd=REPO, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "\n"
