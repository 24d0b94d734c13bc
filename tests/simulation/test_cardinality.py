"""The cardinality budget (lockstep/simulation/cardinality.py, docs/performance.md): series per
node, GPU, port and interface on the simulated node, and no label that grows without end.

The expositions are the golden files, which tests/simulation/test_exposition.py keeps equal to what
`lockstep demo --once` prints for each scenario in the default configuration.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lockstep.simulation import cardinality
from lockstep.simulation.snapshot import expositions
from tests.support import GOLDEN as GOLDEN_DIR

GOLDEN = sorted(GOLDEN_DIR.glob("demo-*.prom"))

# Labels the checks flag that are accepted, and why.  Adding one is a decision for review.
ACCEPTED = {
    # One series per serving process (vLLM's API server and its engine core): the pid is how an
    # engine is tied to its GPUs through NVML's process list.  A restart replaces the series.
    ("lockstep_inference_process_info", "pid"),
}


def _accepted(finding: str) -> bool:
    name, _, rest = finding.partition("{")
    return (name, rest.split("=")[0]) in ACCEPTED


@pytest.mark.parametrize("golden", GOLDEN, ids=lambda p: p.stem)
def test_series_within_budget(golden: Path) -> None:
    assert cardinality.budget(cardinality.parse(golden.read_text())).over() == []


def test_simulated_node_figures() -> None:
    """The figures the budget and docs/performance.md quote, on the healthy node."""
    healthy = cardinality.budget(cardinality.parse((GOLDEN[0].parent / "demo-healthy.prom").read_text()))
    # Issue 13's GPU activity and verdicts: +29 per GPU (GPM activity counters, recovery action, fabric
    # state and health, lifetime ECC).
    # + job 4242's SM and memory-bandwidth share of each GPU (issue 14): 2 a GPU.
    # + what hostile input was refused (issue 29): skipped log files, too_many_ranks, skipped
    # checkpoint directories: 3 a node; counters of what was refused or altered: 11 self-metric
    # series (one a collector), 4 host, 1 Slurm.
    # + issue 27's NCCL collectors: their self-metrics (none of their series without an NCCL job).
    # + issue 37's framework_logs: 13 self-metric series, 11 of its own reading, 14 for job 4242's
    # Megatron output (iterations, seconds, saves, straggler report, ...).
    assert (healthy.total, healthy.gpus, healthy.ports, healthy.interfaces) == (2583, 8, 10, 2)
    assert (healthy.per_gpu, healthy.per_port, healthy.per_interface) == (190.0, 38.0, 33.0)


@pytest.mark.parametrize("golden", GOLDEN, ids=lambda p: p.stem)
def test_no_unbounded_label(golden: Path) -> None:
    found = cardinality.unbounded_labels(cardinality.parse(golden.read_text()))
    assert [f for f in found if not _accepted(f)] == []


# checkpoint-stall: saves come and go (file names); kv-pressure: requests, inference processes.
@pytest.mark.parametrize("scenario", ["checkpoint-stall", "kv-pressure"])
def test_same_series_twenty_minutes_later(scenario: str) -> None:
    """A label holding a step, a file name or a time would make new series as time passes
    (20 simulated minutes: two checkpoint intervals, hundreds of training steps)."""
    start, later = (set(cardinality.parse(text)) for text in expositions(scenario, [0.0, 1200.0]))
    assert sorted(str(s) for s in start ^ later) == []


def test_the_checks_catch_what_they_are_for() -> None:
    exposition = (
        'lockstep_gpu_info{gpu="0",uuid="GPU-1"} 1\n'
        + "".join(f'lockstep_x{{gpu="0",link="{i}"}} 1\n' for i in range(cardinality.BUDGET_PER_GPU))
        + 'lockstep_checkpoint_saves_total{root="/ckpt",file="/ckpt/step-100.pt"} 1\n'
        + 'lockstep_request_seconds{request="9f1c2a4e-1b2c-4d3e-8f90-123456789abc"} 1\n'
        + 'lockstep_event{when="1767312599.2"} 1\n'
    )
    series = cardinality.parse(exposition)
    assert cardinality.budget(series).over() == [f"series per GPU: {cardinality.BUDGET_PER_GPU + 1} > budget 195"]
    assert cardinality.unbounded_labels(series) == [
        'lockstep_checkpoint_saves_total{file="/ckpt/step-100.pt"}',
        'lockstep_event{when="1767312599.2"}',
        'lockstep_request_seconds{request="9f1c2a4e-1b2c-4d3e-8f90-123456789abc"}',
    ]
