"""`lockstep health-check` as slurmd or node-problem-detector runs it: the one line on stdout,
the findings on stderr, exit 0 healthy, 1 unhealthy, 2 unknown; the agent found where the
configuration serves it, and one round of the collectors (a fake NVML here) where none answers."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import free_port, lockstep
from tests.support.agent_http import agent, answer, exposition

pytestmark = pytest.mark.real  # the command is a process

LOST = exposition("gpu-lost").encode()


def nobody() -> str:
    return f"http://127.0.0.1:{free_port()}/metrics"


def test_with_no_agent_a_round_of_the_collectors_decides(tmp_path: Path) -> None:
    spec = tmp_path / "gpus.yml"
    spec.write_text("gpus:\n  - {}\n  - {remapped_rows_pending: true}\n")
    only_gpu = ("--collector.disable-defaults", "--collector.gpu", "--gpu.fake-nvml", str(spec))
    result = lockstep("health-check", "--agent", nobody(), *only_gpu)
    assert (result.returncode, result.stdout) == (1, "unhealthy: GPU 1 row remapping pending: reset it\n")
    assert "lockstep: gpu_row_remap_pending: GPU 1 row remapping pending: reset it\n" in result.stderr
    spec.write_text("gpus: 2\n")
    result = lockstep("health-check", "--agent", nobody(), *only_gpu)
    assert (result.returncode, result.stdout) == (
        0,
        "healthy: 2 GPUs (one round of the collectors: no agent answers)\n",
    )


def test_the_agent_is_asked_where_the_configuration_serves_it() -> None:
    with agent(answer(200, LOST)) as url:
        port = url.split(":")[2].split("/")[0]
        result = lockstep("health-check", "--listen", f":{port}")
    assert (result.returncode, result.stdout) == (1, "unhealthy: GPU 5 lost (fell off the bus) (+1 more)\n")


def test_a_configuration_that_cannot_be_read_is_unknown(tmp_path: Path) -> None:
    config = tmp_path / "lockstep.yml"
    config.write_text("collectors:\n  gpu: {interval: soon}\n")
    result = lockstep("health-check", "--config", str(config))
    assert result.returncode == 2
    assert result.stdout.startswith(f"unknown: {config}:2: collectors.gpu.interval")
