"""A real Prometheus (Debian `prometheus`) for the end-to-end tests: start it on a config, wait
until it is ready, read its alerts, stop everything a test started; backfill its storage from
OpenMetrics text with promtool."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from tests.support import REPO, http_get, require_promtool, wait_until

PROMETHEUS = "/usr/bin/prometheus"


def query_alerts(prometheus: str) -> list[dict[str, Any]]:
    status, body = http_get(f"{prometheus}/api/v1/alerts", timeout=10)
    assert status == 200, body
    return json.loads(body)["data"]["alerts"]


def backfill(openmetrics: Path, tsdb: Path) -> None:
    """`promtool tsdb create-blocks-from openmetrics`: the samples of the file (each series in
    time order) become blocks under tsdb, which start_prometheus then serves (tmp/tsdb)."""
    result = subprocess.run(
        [require_promtool(), "tsdb", "create-blocks-from", "openmetrics", "--quiet", str(openmetrics), str(tsdb)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, f"promtool could not backfill {openmetrics}: {result.stderr[-3000:]}"


def start_logged(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)


def start_prometheus(
    tmp: Path, port: int, processes: list[subprocess.Popen[bytes]], extra_args: tuple[str, ...] = ()
) -> str:
    """Start Prometheus on tmp/prometheus.yml (storage tmp/tsdb, log tmp/prometheus.log), add it
    to processes, and return its URL once it is ready."""
    log = tmp / "prometheus.log"
    prometheus = start_logged(
        [
            PROMETHEUS,
            f"--config.file={tmp / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
            *extra_args,
        ],
        log,
    )
    processes.append(prometheus)
    url = f"http://127.0.0.1:{port}"
    wait_until(lambda: is_ready(f"{url}/-/ready", prometheus, log), timeout=60, what="Prometheus")
    return url


def stop_all(processes: list[subprocess.Popen[bytes]]) -> None:
    """Terminate every process, then wait for each (killing one that does not exit in 15 s)."""
    for proc in processes:
        proc.terminate()
    for proc in processes:
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def is_ready(url: str, proc: subprocess.Popen[bytes], log: Path) -> bool:
    if proc.poll() is not None:
        raise AssertionError(f"{proc.args} exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
    try:
        return http_get(url, timeout=1)[0] == 200
    except OSError:
        return False
