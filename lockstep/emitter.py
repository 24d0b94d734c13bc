"""Write a training rank's per-step timings as JSON lines, for Lockstep's training collector.

Standard library only, and no other Lockstep import: a training job imports it with
Lockstep installed (``from lockstep.emitter import StepLog, StepTimer``) or
copies this one file next to its own code.  docs/workloads.md has a PyTorch example.

The format is the per-rank record format used on Slurm clusters: one JSON object per
line, one metric per line, for example::

    {"ts": "2026-01-02T00:00:01.600Z", "job_id": "4242", "rank": 3, "host": "node001",
     "step": 120, "metric": "compute_time_sec", "value": 1.3, "unit": "s"}

The lines of one step share ``ts`` and ``step``; ``step_time_sec`` is written last.  All
lines of a step go to the file in one ``write()`` on a file opened with O_APPEND, so a
reader sees whole steps (or, while the write is in progress, a partial last line, which
the collector keeps until the rest arrives).

What to measure, and why compute time matters more than step time for finding a
straggler: docs/workloads.md.
"""

from __future__ import annotations

import json
import math
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

# The metrics this module writes, in the order they are written; step_time_sec last.
METRICS = (
    ("data_time_sec", "s"),
    ("compute_time_sec", "s"),
    ("comm_wait_time_sec", "s"),
    ("tokens", "tokens"),
    ("samples", "samples"),
    ("step_time_sec", "s"),
)


def format_timestamp(unix_seconds: float) -> str:
    """RFC 3339 UTC with milliseconds: '2026-01-02T00:00:01.600Z'."""
    moment = datetime.fromtimestamp(unix_seconds, tz=timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def _checked(name: str, value: float | None) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return value


def step_lines(
    *,
    job_id: str,
    rank: int,
    host: str,
    step: int,
    ts: float,
    step_time: float,
    compute_time: float | None = None,
    comm_wait_time: float | None = None,
    data_time: float | None = None,
    tokens: float | None = None,
    samples: float | None = None,
) -> str:
    """The JSON lines of one step (each ending in a newline), step_time_sec last.

    Times are seconds; ``tokens``/``samples`` are what this rank processed in the step.
    Metrics given as None are left out.
    """
    values = {
        "data_time_sec": _checked("data_time", data_time),
        "compute_time_sec": _checked("compute_time", compute_time),
        "comm_wait_time_sec": _checked("comm_wait_time", comm_wait_time),
        "tokens": _checked("tokens", tokens),
        "samples": _checked("samples", samples),
        "step_time_sec": _checked("step_time", step_time),
    }
    stamp = format_timestamp(ts)
    lines = []
    for metric, unit in METRICS:
        value = values[metric]
        if value is None:
            continue
        record = {
            "ts": stamp,
            "job_id": str(job_id),
            "rank": int(rank),
            "host": host,
            "step": int(step),
            "metric": metric,
            "value": round(float(value), 6),
            "unit": unit,
        }
        lines.append(json.dumps(record, separators=(",", ":")) + "\n")
    return "".join(lines)


def _default_rank() -> int:
    for variable in ("RANK", "SLURM_PROCID"):
        if os.environ.get(variable, "").isdigit():
            return int(os.environ[variable])
    return 0


class StepLog:
    """Appends one rank's steps to ``<directory>/rank-NNN.metrics.jsonl``.

    Defaults come from the environment a launcher sets: ``job_id`` from SLURM_JOB_ID,
    ``rank`` from RANK (torchrun) or SLURM_PROCID, ``host`` from the short host name,
    ``directory`` from LOCKSTEP_TRAINING_LOG_DIR or the current directory.  Point the
    agent's ``--training.logs`` glob at these files.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str] | None = None,
        *,
        path: str | os.PathLike[str] | None = None,
        job_id: str | None = None,
        rank: int | None = None,
        host: str | None = None,
    ) -> None:
        self.job_id = job_id if job_id is not None else os.environ.get("SLURM_JOB_ID", "local")
        self.rank = rank if rank is not None else _default_rank()
        self.host = host if host is not None else socket.gethostname().split(".")[0]
        if path is None:
            base = Path(directory if directory is not None else os.environ.get("LOCKSTEP_TRAINING_LOG_DIR", "."))
            path = base / f"rank-{self.rank:03d}.metrics.jsonl"
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._next_step = 0

    def step(
        self,
        step_time: float,
        *,
        compute_time: float | None = None,
        comm_wait_time: float | None = None,
        data_time: float | None = None,
        tokens: float | None = None,
        samples: float | None = None,
        step: int | None = None,
        ts: float | None = None,
    ) -> None:
        """Record one finished step; ``step`` defaults to counting from 0."""
        if self._fd is None:
            raise ValueError(f"{self.path}: StepLog is closed")
        number = self._next_step if step is None else step
        self._next_step = number + 1
        text = step_lines(
            job_id=self.job_id,
            rank=self.rank,
            host=self.host,
            step=number,
            ts=time.time() if ts is None else ts,
            step_time=step_time,
            compute_time=compute_time,
            comm_wait_time=comm_wait_time,
            data_time=data_time,
            tokens=tokens,
            samples=samples,
        )
        os.write(self._fd, text.encode())  # one write, O_APPEND: the step lands whole

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> StepLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class StepTimer:
    """Times the phases of one training step with ``time.perf_counter``.

    ::

        timer = StepTimer()              # the step starts now
        with timer.phase("data"):
            batch = next(loader)
        with timer.phase("compute"):
            loss = model(batch); loss.backward(); torch.cuda.synchronize()
        with timer.phase("comm_wait"):
            all_reduce_gradients(); torch.cuda.synchronize()
        log.step(**timer.finish())       # step_time = now - start; the next step starts

    GPU work is asynchronous: synchronise (``torch.cuda.synchronize()``) at the end of a
    phase, or the time lands in whichever later phase happens to wait for it.
    """

    PHASES = ("data", "compute", "comm_wait")

    def __init__(self) -> None:
        self._start = time.perf_counter()
        self._phases: dict[str, float] = {}  # only the phases entered in this step

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if name not in self.PHASES:
            raise ValueError(f"unknown phase {name!r} (known: {', '.join(self.PHASES)})")
        started = time.perf_counter()
        try:
            yield
        finally:
            self._phases[name] = self._phases.get(name, 0.0) + time.perf_counter() - started

    def finish(self) -> dict[str, float]:
        """This step's times as StepLog.step() keyword arguments; starts the next step.

        Only what was measured: a phase not entered in this step is left out (not 0.0), so
        the record does not claim "no compute" for a loop that never times compute, and the
        collector derives it (step time minus communication and data wait) instead."""
        now = time.perf_counter()
        result = {"step_time": now - self._start}
        for name, seconds in self._phases.items():
            result[f"{name}_time"] = seconds
        self._start = now
        self._phases = {}
        return result
