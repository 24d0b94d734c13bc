"""The simulated node's training job as the agent's writer count sees it: node001's ranks' logs
held open for appending by the job's process while it runs or hangs, node002's by no process
here, and none once the job has ended (simulation/workloads.py).  Read with the collector's
own scan (collectors/training/writers.py), so the simulated procfs is read as a real one is."""

from __future__ import annotations

import pytest

from lockstep.collectors.training.writers import scan_writers
from lockstep.simulation import temporary_node
from lockstep.simulation.timeline import HANG_AT
from lockstep.simulation.workloads import HOSTS, RANKS, RANKS_PER_NODE, log_path


def writers_by_rank(scenario: str, t: float) -> dict[int, int]:
    """Each rank's log's writers on the simulated node rendered at simulated time t."""
    node, directory = temporary_node(scenario)
    with directory:
        node.render(t)
        logs = {rank: log_path(node, rank) for rank in range(RANKS)}
        wanted = {rank: (path.name, path.stat().st_ino) for rank, path in logs.items()}
        scan = scan_writers(node.paths.procfs, set(wanted.values()))
        assert scan.complete
        return {rank: scan.writers[key] for rank, key in wanted.items()}


LOCAL = dict.fromkeys(range(RANKS_PER_NODE), 1) | dict.fromkeys(range(RANKS_PER_NODE, RANKS), 0)


@pytest.mark.parametrize(
    ("scenario", "t"),
    [("healthy", 0.0), ("healthy", 600.0), ("hang-steps", HANG_AT + 900), ("training-hang", 0.0)],
)
def test_a_running_or_hung_job_holds_its_local_ranks_logs_open(scenario: str, t: float) -> None:
    assert HOSTS[0] == "node001"  # ranks 0-7
    assert writers_by_rank(scenario, t) == LOCAL


@pytest.mark.parametrize(("scenario", "t"), [("hang-end", HANG_AT + 60), ("training-finished", 0.0)])
def test_an_ended_job_holds_no_log_open(scenario: str, t: float) -> None:
    assert writers_by_rank(scenario, t) == dict.fromkeys(range(RANKS), 0)


def test_the_job_holds_its_logs_until_it_ends() -> None:
    assert writers_by_rank("hang-end", HANG_AT - 30) == LOCAL
