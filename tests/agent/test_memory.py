"""Freed memory handed back to the kernel after the collectors' rounds (agent/memory.py)."""

from __future__ import annotations

import ctypes
import logging

import pytest

from lockstep.agent import memory, scheduler
from lockstep.agent.collector import Collector, MetricSpec
from lockstep.agent.scheduler import Scheduler, Worker
from tests.support import context, wait_until

KIB = 1024
MIB = 1024 * KIB


def resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096


def has_malloc_trim() -> bool:
    try:
        ctypes.CDLL(None).malloc_trim  # noqa: B018 (looked up: glibc has it, musl does not)
    except (OSError, AttributeError):
        return False
    return True


@pytest.mark.skipif(not has_malloc_trim(), reason="a C library without malloc_trim: nothing to hand back this way")
def test_pages_freed_in_the_middle_of_the_heap_go_back_to_the_kernel() -> None:
    # 64-KiB blocks come from the heap (below glibc's mmap threshold); one kept in eight pins the
    # heap's top, so freeing the rest gives nothing back on its own.
    blocks = [bytearray(64 * KIB) for _ in range(1024)]
    kept = blocks[::8]
    del blocks
    before = resident_bytes()
    memory.release_freed_memory()
    after = resident_bytes()
    assert before - after >= 32 * MIB, (before, after)  # of the 56 MiB freed
    assert len(kept) == 128


class Quiet(Collector):
    name = "quiet"
    metrics = (MetricSpec("lockstep_quiet_value", "gauge", "A value."),)

    def collect(self):  # type: ignore[no-untyped-def]
        family = self.metrics[0].family()
        family.add_metric([], 1)
        return iter([family])


def test_the_runner_hands_freed_memory_back_once_the_rounds_due_are_done(monkeypatch: pytest.MonkeyPatch) -> None:
    released = []
    monkeypatch.setattr(scheduler, "release_freed_memory", lambda: released.append(True))
    shared = Scheduler("test-memory")
    worker = Worker(Quiet(context()), 60, 5, staleness_intervals=3, log=logging.getLogger("test"), scheduler=shared)
    worker.start()
    worker.first_run_done.wait(5)
    wait_until(lambda: released, timeout=5, what="the memory released after the first round")
    worker.stop()
    assert worker.view().runs_total == 1
    assert released == [True]
