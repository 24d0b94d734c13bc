"""lockstep/emitter.py: what a training loop imports to write its step log."""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lockstep import emitter as training_emitter
from lockstep.collectors.training import TrainingCollector, TrainingOptions
from lockstep.emitter import StepLog, StepTimer, format_timestamp
from tests.support import REPO, collected, context

MODULE = Path(training_emitter.__file__)


def test_uses_the_standard_library_only() -> None:
    tree = ast.parse(MODULE.read_text())
    imported = {
        alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names
    }
    imported |= {
        node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module
    }
    assert sorted(imported - set(sys.stdlib_module_names) - {"__future__"}) == []


def test_writes_one_record_per_metric_with_the_launchers_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("RANK", "5")
    with StepLog(tmp_path, host="node001") as log:
        log.step(1.5, compute_time=1.0, comm_wait_time=0.25, data_time=0.125, tokens=4096, ts=1_767_312_000.25)
        log.step(1.5, ts=1_767_312_001.75)
    path = tmp_path / "rank-005.metrics.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert records[0] == {
        "ts": "2026-01-02T00:00:00.250Z",
        "job_id": "4242",
        "rank": 5,
        "host": "node001",
        "step": 0,
        "metric": "data_time_sec",
        "value": 0.125,
        "unit": "s",
    }
    assert [(r["step"], r["metric"], r["value"]) for r in records] == [
        (0, "data_time_sec", 0.125),
        (0, "compute_time_sec", 1.0),
        (0, "comm_wait_time_sec", 0.25),
        (0, "tokens", 4096),
        (0, "step_time_sec", 1.5),  # last: it closes the step
        (1, "step_time_sec", 1.5),
    ]


def test_rejects_values_that_are_not_times() -> None:
    with pytest.raises(ValueError, match=r"compute_time must be a finite number >= 0, got -1"):
        training_emitter.step_lines(job_id="1", rank=0, host="h", step=0, ts=0, step_time=1, compute_time=-1)
    with pytest.raises(ValueError, match=r"step_time must be a finite number >= 0, got nan"):
        training_emitter.step_lines(job_id="1", rank=0, host="h", step=0, ts=0, step_time=float("nan"))


def test_timestamps_are_utc_with_milliseconds() -> None:
    assert format_timestamp(1_767_312_000.0) == "2026-01-02T00:00:00.000Z"
    assert format_timestamp(1_767_312_061.999) == "2026-01-02T00:01:01.999Z"


def test_step_timer_times_phases_and_starts_the_next_step() -> None:
    timer = StepTimer()
    with timer.phase("data"):
        time.sleep(0.01)
    with timer.phase("compute"):
        time.sleep(0.02)
    first = timer.finish()
    # Only what was measured: comm_wait was never entered, so it is left out (not 0.0).
    assert set(first) == {"step_time", "data_time", "compute_time"}
    assert first["step_time"] >= first["data_time"] + first["compute_time"] > 0
    second = timer.finish()
    assert set(second) == {"step_time"}
    with pytest.raises(ValueError, match="unknown phase 'forward'"):
        with timer.phase("forward"):
            pass


@pytest.mark.real
def test_a_copy_of_the_file_works_without_lockstep_and_the_collector_reads_it(tmp_path: Path) -> None:
    """The documented use without installing Lockstep: copy the file next to the training code."""
    shutil.copy(MODULE, tmp_path / "training_emitter.py")
    (tmp_path / "train.py").write_text(
        "import importlib.util\n"
        "assert importlib.util.find_spec('collectors') is None, 'lockstep must not be importable here'\n"
        "from training_emitter import StepLog\n"
        "log = StepLog('logs', job_id='31', rank=2, host='n1')\n"
        "for k in range(3):\n"
        "    log.step(2.0, compute_time=1.5, comm_wait_time=0.25, data_time=0.25, samples=16)\n"
        "log.close()\n"
    )
    # -S: no site-packages (where Lockstep is installed), -E: no PYTHONPATH.
    subprocess.run([sys.executable, "-S", "-E", "train.py"], cwd=tmp_path, check=True, timeout=60)
    collector = TrainingCollector(
        context(
            options=TrainingOptions(
                logs=(str(tmp_path / "logs" / "rank-*.metrics.jsonl"),), start_at="beginning", idle_timeout=600.0
            )
        )
    )

    s = collected(collector)
    collector.close()
    labels = frozenset({"job_id": "31", "rank": "2", "host": "n1"}.items())
    assert s[("lockstep_training_steps_total", labels)] == 3
    assert s[("lockstep_training_compute_seconds_total", labels)] == 4.5
    assert s[("lockstep_training_samples_total", labels)] == 48


def test_a_loop_that_times_no_compute_gets_the_collectors_derived_compute(tmp_path: Path) -> None:
    """Issue 26: a loop that keeps DDP's overlapped all-reduce times only its data wait.  Its
    records must not claim 0 s of compute and 0 s of communication (the collector would take
    them as measured): they leave both out, and the collector derives compute as step time
    minus data wait."""
    log = StepLog(tmp_path, job_id="26", rank=0, host="n1")
    timer = StepTimer()
    with timer.phase("data"):
        time.sleep(0.01)
    time.sleep(0.02)  # forward, backward with its overlapped all-reduce, optimizer: no phase
    times = timer.finish()
    log.step(**times, step=0)
    log.step(**timer.finish(), step=1)  # a second step closes the first for the collector
    log.close()
    metrics = [json.loads(line)["metric"] for line in (tmp_path / "rank-000.metrics.jsonl").read_text().splitlines()]
    assert metrics == ["data_time_sec", "step_time_sec", "step_time_sec"]
    options = TrainingOptions(logs=(str(tmp_path / "rank-*.metrics.jsonl"),), start_at="beginning")
    collector = TrainingCollector(context(options=options))
    s = collected(collector)
    collector.close()
    labels = frozenset({"job_id": "26", "rank": "0", "host": "n1"}.items())
    step = round(times["step_time"], 6)  # as written: microseconds
    data = round(times["data_time"], 6)
    assert s[("lockstep_training_steps_total", labels)] == 1  # the second step is still open
    assert s[("lockstep_training_compute_seconds_total", labels)] == pytest.approx(step - data, abs=1e-9)
    assert s[("lockstep_training_comm_wait_seconds_total", labels)] == 0
    assert s[("lockstep_training_compute_seconds_total", labels)] > 0.02


def _workloads_snippets() -> list[str]:
    text = (REPO / "docs" / "workloads.md").read_text()
    return [block.split("```", 1)[0] for block in text.split("```python\n")[1:]]


def test_the_documented_loop_that_keeps_ddps_overlap_logs_compute_but_no_comm_wait(tmp_path: Path) -> None:
    """docs/workloads.md's second DDP loop, run as written with stand-ins for torch's calls (the
    loop is bench/ddp_runs.py's overlap mode, run for real with torch): each step's record has
    data, compute (forward + optimizer) and step time, and no comm wait; backward() is in no phase."""
    loop = next(snippet for snippet in _workloads_snippets() if "loss.backward()  # own gradients" in snippet)
    calls: list[str] = []

    class Anything:
        """Whatever the loop calls on torch, a batch, the model or the optimizer: records it."""

        def __init__(self, name: str = "x") -> None:
            self.name = name

        def __getattr__(self, attribute: str) -> Anything:
            return Anything(attribute)

        def __getitem__(self, key: str) -> Anything:
            return Anything(key)

        def __call__(self, *args: object, **kwargs: object) -> Anything:
            calls.append(self.name)
            if self.name == "backward":
                time.sleep(0.02)  # what the rank computes and waits for, in no phase
            return Anything(self.name)

        def numel(self) -> int:
            return 512

        @property
        def shape(self) -> tuple[int, int]:
            return (4, 128)

    log = StepLog(tmp_path, job_id="26", rank=0, host="n1")
    namespace = {
        "torch": Anything("torch"),
        "batches": iter([Anything("batch") for _ in range(3)]),
        "model": Anything("model"),
        "optimizer": Anything("optimizer"),
        "num_steps": 3,
        "timer": StepTimer(),
        "log": log,
    }
    exec(compile(loop, "docs/workloads.md", "exec"), namespace)  # noqa: S102  # the documented loop
    log.close()
    records = [json.loads(line) for line in (tmp_path / "rank-000.metrics.jsonl").read_text().splitlines()]
    assert [r["metric"] for r in records if r["step"] == 0] == [
        "data_time_sec",
        "compute_time_sec",
        "tokens",
        "samples",
        "step_time_sec",
    ]
    assert calls.count("backward") == 3
    for step in range(3):
        values = {r["metric"]: r["value"] for r in records if r["step"] == step}
        # backward() (20 ms here) is in the step but in no phase.
        assert values["step_time_sec"] - values["compute_time_sec"] - values["data_time_sec"] >= 0.02
