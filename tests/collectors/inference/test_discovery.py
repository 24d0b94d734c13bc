"""Hostile input, round two (issue 29 items 6 and 7, and issue 26's log flood): look-alike engine
processes any user can start neither grow the series quadratically nor starve a real engine.

Real processes (tests/support/lookalikes.py: one ``vllm serve`` process forking N children, each
listening on its own port), read through a procfs view that shows only them, so every count is
exact whatever else runs on the machine.  Scaled down from the issue's N=400 (bench/hostile_input.py
runs that): the bound is what makes the point.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from lockstep.collectors.inference import InferenceCollector, InferenceOptions
from lockstep.collectors.inference.discovery import (
    MAX_DISCOVERED_TARGETS,
    MAX_PROBES_PER_ROUND,
    LocalEngine,
    Rotation,
    Trust,
    trust_of,
)
from tests.support import collected, context
from tests.support.lookalikes import LookalikeEngines, procfs_view


@pytest.fixture
def started() -> Iterator[list[LookalikeEngines]]:
    engines: list[LookalikeEngines] = []
    yield engines
    for group in engines:
        group.stop()


def _collector(proc: Path, timeout: float = 3.0) -> InferenceCollector:
    return InferenceCollector(context(proc=proc, options=InferenceOptions(timeout=timeout)))


def _of(values: dict, name: str) -> dict[frozenset, float]:
    return {labels: v for (n, labels), v in values.items() if n == name}


def _states(values: dict) -> dict[str, float]:
    return {dict(labels)["category"]: v for labels, v in _of(values, "lockstep_inference_discovered_processes").items()}


def _real(values: dict, url: str) -> tuple[float | None, float | None]:
    labels = frozenset({"engine": "vllm", "server": url, "model": "llama"}.items())
    return (
        values.get(("lockstep_inference_up", labels)),
        values.get(("lockstep_inference_requests_running", labels)),
    )


@pytest.mark.real
def test_look_alikes_forked_by_one_process_are_bounded_and_listed_once(
    tmp_path: Path, started: list[LookalikeEngines]
) -> None:
    """40 answering look-alikes under one parent: each was listed with all 41 processes
    (1,640 process_info series, N x (N+1)); now each process once, at most 32 engines."""
    count = 40
    group = LookalikeEngines(tmp_path / "lookalikes", count, "answer", first_port=21000)
    started.append(group)
    collector = _collector(procfs_view(tmp_path / "proc", group.pids))
    rounds = math.ceil(MAX_DISCOVERED_TARGETS / MAX_PROBES_PER_ROUND)  # 4 rounds of 8 probes
    try:
        for _ in range(rounds + 1):
            values = collected(collector)
    finally:
        collector.close()
    info = _of(values, "lockstep_inference_process_info")
    pids = [dict(labels)["pid"] for labels in info]
    assert len(pids) == len(set(pids)) == MAX_DISCOVERED_TARGETS + 1  # 32 engines and their parent, once each
    assert str(group.process.pid) in pids
    assert len(_of(values, "lockstep_inference_up")) == MAX_DISCOVERED_TARGETS
    assert all(v == 1 for v in _of(values, "lockstep_inference_up").values())
    assert _states(values) == {"engine": 32, "probing": 0, "over_cap": 8, "unreadable": 0, "other_namespace": 0}


@pytest.mark.real
def test_silent_look_alikes_on_lower_ports_never_starve_a_found_engine(
    tmp_path: Path, started: list[LookalikeEngines], caplog: pytest.LogCaptureFixture
) -> None:
    """A real engine found, then 40 silent look-alikes on lower ports: it stayed up 1 with its
    values every round (was: up 0, its series gone, every probe queued ahead of it)."""
    real = LookalikeEngines(tmp_path / "real", 1, "answer", first_port=45000)
    started.append(real)
    url = real.urls()[0]
    view = procfs_view(tmp_path / "proc", real.pids)
    collector = _collector(view, timeout=1.0)
    try:
        assert _real(collected(collector), url) == (1, 7)
        silent = LookalikeEngines(tmp_path / "silent", 40, "silent", first_port=31000)
        started.append(silent)
        assert max(silent.ports) < real.ports[0]
        procfs_view(view, silent.pids)
        with caplog.at_level(logging.INFO, logger="test"):
            for _ in range(3):
                began = time.monotonic()
                values = collected(collector)
                assert _real(values, url) == (1, 7)
                assert time.monotonic() - began < 2.5  # probes take 1 s at most, 8 at a time
    finally:
        collector.close()
    assert _states(values) == {"engine": 1, "probing": 40, "over_cap": 0, "unreadable": 0, "other_namespace": 0}
    # Silent look-alikes are not engines: no series of theirs, and one summary line per round
    # at most, none per process (issue 26: ~1,600 warning lines).
    assert len(_of(values, "lockstep_inference_up")) == 1
    messages = [r.getMessage() for r in caplog.records]
    assert not [m for m in messages if m.startswith("inference target down")]
    assert [m.split(" (e.g.")[0] for m in messages] == [
        "8 processes that look like inference engines do not answer as one",
        "16 processes that look like inference engines do not answer as one",
        "24 processes that look like inference engines do not answer as one",
    ]


@pytest.mark.real
def test_a_new_engine_among_silent_look_alikes_is_found_in_turn(
    tmp_path: Path, started: list[LookalikeEngines]
) -> None:
    """40 silent look-alikes on lower ports, then a real engine: probed in turn, 8 per round, it
    is found in round 6 and stays (was: never, every round's probes queued ahead of it)."""
    silent = LookalikeEngines(tmp_path / "silent", 40, "silent", first_port=32000)
    started.append(silent)
    real = LookalikeEngines(tmp_path / "real", 1, "answer", first_port=46000)
    started.append(real)
    url = real.urls()[0]
    collector = _collector(procfs_view(tmp_path / "proc", silent.pids + real.pids), timeout=1.0)
    seen = []
    try:
        for _ in range(7):
            seen.append(_real(collected(collector), url))
    finally:
        collector.close()
    assert seen == [(None, None)] * 5 + [(1, 7)] * 2


def test_trust_comes_from_what_a_process_cannot_change(tmp_path: Path) -> None:
    """The owner of /proc/PID and a Slurm job's cgroup, never SLURM_JOB_ID in the environment."""
    for pid, owner, cgroup, environ in (
        (10, os.geteuid(), "0::/user.slice\n", b""),
        (11, 65534, "0::/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0\n", b""),
        (12, 65534, "0::/user.slice/user-65534.slice\n", b"SLURM_JOB_ID=4242\0"),
    ):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cgroup").write_text(cgroup)
        (tmp_path / str(pid) / "environ").write_bytes(environ)
        os.chown(tmp_path / str(pid), owner, owner)
    assert [trust_of(tmp_path, pid) for pid in (10, 11, 12)] == [Trust.AGENT_USER, Trust.SLURM_JOB, Trust.OTHER]


def _candidate(port: int, trust: Trust) -> LocalEngine:
    return LocalEngine("vllm", pid=port, root=port, host="127.0.0.1", port=port, trust=trust)


def test_probes_go_to_trusted_candidates_first_then_in_turn() -> None:
    others = [_candidate(port, Trust.OTHER) for port in range(20000, 20020)]  # lower ports
    job = _candidate(30000, Trust.SLURM_JOB)
    ours = _candidate(40000, Trust.AGENT_USER)
    rotation = Rotation()
    plan = rotation.plan([*others, job, ours], now=0.0)
    assert [c.port for c in plan.probe] == [40000, 30000, *range(20000, 20006)]
    for candidate in plan.probe:
        rotation.record(candidate, answered=candidate is ours, now=0.0)
    # Next round: the engine that answered is scraped, the silent ones wait out their backoff
    # (15 s) and the candidates not probed yet go first.
    plan = rotation.plan([*others, job, ours], now=10.0)
    assert [c.port for c in plan.scrape] == [40000]
    assert [c.port for c in plan.probe] == list(range(20006, 20014))
    for candidate in plan.probe:
        rotation.record(candidate, answered=False, now=10.0)
    # 20 s: the candidates probed at 0 are due again, those probed at 10 are not; trusted first,
    # then the one probed longest ago (never, before 0).
    plan = rotation.plan([*others, job, ours], now=20.0)
    assert [c.port for c in plan.probe] == [30000, *range(20014, 20020), 20000]
    assert rotation.census([*others, job, ours]) == {"engine": 1, "probing": 21, "over_cap": 0}


@pytest.mark.real
@pytest.mark.skipif(os.geteuid() != 0, reason="starts processes as another user (needs root)")
def test_another_users_look_alikes_never_delay_the_agent_users_engine(started: list[LookalikeEngines]) -> None:
    """40 silent look-alikes of user nobody on lower ports: the root-run engine is probed first
    and found in the first round (was: never, queued behind them)."""
    shared = Path(tempfile.mkdtemp(prefix="lockstep-lookalikes-"))  # readable by nobody, unlike tmp_path
    try:
        shared.chmod(0o755)
        silent = LookalikeEngines(shared / "silent", 40, "silent", first_port=33000, user=65534)
        started.append(silent)
        real = LookalikeEngines(shared / "real", 1, "answer", first_port=47000)
        started.append(real)
        assert Path(f"/proc/{silent.children[0]}").stat().st_uid == 65534
        collector = _collector(procfs_view(shared / "proc", silent.pids + real.pids), timeout=1.0)
        try:
            assert _real(collected(collector), real.urls()[0]) == (1, 7)
        finally:
            collector.close()
    finally:
        for group in started:
            group.stop()
        shutil.rmtree(shared)
