"""Reads shared by the collectors' rounds run together (agent/collector.py shared_read): the
process table read once for the inference, slurm and host collectors of one batch."""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path

import pytest

from lockstep.agent.collector import CollectorContext, NothingHere, Paths, shared_read, shared_reads
from lockstep.agent.options import NoOptions
from lockstep.agent.scheduler import _Runner
from lockstep.collectors.host import HostCollector
from lockstep.collectors.inference import InferenceCollector
from lockstep.collectors.inference.collector import InferenceOptions
from lockstep.collectors.slurm import SlurmCollector
from lockstep.collectors.slurm.collector import SlurmOptions
from lockstep.collectors.toolkit import procs
from tests.support import FIXTURES, collected, context


class Counter:
    def __init__(self) -> None:
        self.reads = 0

    def __call__(self) -> int:
        self.reads += 1
        return self.reads


def test_a_batch_reads_each_key_once_and_outside_one_every_call_reads() -> None:
    read = Counter()
    assert [shared_read(("k",), read), shared_read(("k",), read)] == [1, 2]
    with shared_reads():
        assert [shared_read(("k",), read), shared_read(("k",), read), shared_read(("other",), read)] == [3, 3, 4]
    assert shared_read(("k",), read) == 5


def test_a_batch_is_its_threads_own() -> None:
    read = Counter()
    seen = []
    with shared_reads():
        assert shared_read(("k",), read) == 1
        thread = threading.Thread(target=lambda: seen.append(shared_read(("k",), read)))
        thread.start()
        thread.join(5)
    assert seen == [2]  # the other thread runs outside any batch: it reads


class FakeScheduler:
    clock = staticmethod(lambda: 0.0)

    def wake(self) -> None:
        pass


def test_the_rounds_queued_together_are_one_batch() -> None:
    read = Counter()
    answers: list[int] = []
    runner = _Runner(FakeScheduler(), "test-runner")  # type: ignore[arg-type]
    done = threading.Event()
    runner.submit(lambda: answers.append(shared_read(("table",), read)))
    runner.submit(lambda: answers.append(shared_read(("table",), read)))
    runner.submit(done.set)
    runner.thread.start()
    assert done.wait(5)
    runner.submit(lambda: answers.append(shared_read(("table",), read)))  # a later round: a new batch
    runner.submit(done.clear)
    for _ in range(100):
        if len(answers) == 3 and not done.is_set():
            break
        threading.Event().wait(0.05)
    runner.retire()
    assert answers == [1, 1, 2]


def test_host_slurm_and_inference_read_the_process_table_once_a_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    real = procs._read_process_table

    def counted(procfs: Path | str) -> dict[int, procs.Process]:
        calls.append(str(procfs))
        return real(procfs)

    asked: list[str] = []

    def shared(key, read):  # type: ignore[no-untyped-def]
        asked.append(key[0])
        return shared_read(key, read)

    monkeypatch.setattr(procs, "_read_process_table", counted)
    monkeypatch.setattr(procs, "shared_read", shared)
    monkeypatch.delenv("SLURM_CONF", raising=False)
    proc = FIXTURES / "host" / "proc"
    paths = Paths(sysfs=tmp_path / "sys", procfs=proc, rootfs=tmp_path)  # no slurm.conf in this root

    def on_the_tree(options: object) -> CollectorContext:
        return dataclasses.replace(context(options=options), paths=paths)

    with shared_reads():
        host = collected(HostCollector(on_the_tree(NoOptions())))
        # No slurm.conf, no slurmd and no inference server in the tree: nothing here for either,
        # found from the process table.
        with pytest.raises(NothingHere, match="slurmd"):
            collected(SlurmCollector(on_the_tree(SlurmOptions())))
        with pytest.raises(NothingHere, match="server found among this node's processes"):
            collected(InferenceCollector(on_the_tree(InferenceOptions())))
    assert asked == ["process_table"] * 3  # host, slurm, inference
    assert calls == [str(proc)]
    # The table's states: 88 (one thread) in D; 300's thread 301 in D, read from its tasks.
    assert host[("lockstep_host_processes_blocked", frozenset())] == 2
