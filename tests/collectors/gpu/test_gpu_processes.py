"""Per-process GPU utilisation: the fake NVML answers as NVML does, and the GPU collector
publishes each compute process's SM and memory-bandwidth share (collectors/gpu/processes.py)."""

from __future__ import annotations

import dataclasses

import pynvml
import pytest

from lockstep.collectors.gpu import GpuCollector
from lockstep.simulation.fake_nvml import (
    MIB,
    PROCESS_SAMPLE_PERIOD_US,
    PROCESS_SAMPLES_EPOCH_US,
    FakeNvml,
    GpuSpec,
    MigDeviceSpec,
    ProcessSpec,
    fake_from_gpus,
)
from tests.support import collected
from tests.support.gpu import make

ALICE = ProcessSpec(pid=4100, used_memory_bytes=30_000 * MIB, sm_util_percent=55, memory_util_percent=30)
BOB = ProcessSpec(pid=4200, used_memory_bytes=12_000 * MIB, sm_util_percent=20, memory_util_percent=12)
IDLE = ProcessSpec(pid=4300, used_memory_bytes=1_000 * MIB)  # holds memory, runs no kernel
SHARED = GpuSpec(utilization_gpu_percent=75, utilization_memory_percent=42, processes=(ALICE, BOB, IDLE))
NEWER, OLDER = "nvmlDeviceGetProcessesUtilizationInfo", "nvmlDeviceGetProcessUtilization"


def run_round(collector: GpuCollector) -> dict[int, tuple[float | None, float | None]]:
    """One round; pid -> (SM share, memory-bandwidth share) of GPU 0's published processes."""
    list(collector.collect())
    (gpu, *_) = collector.context.gpu_inventory.published()
    return {p.pid: (p.sm_utilization, p.memory_utilization) for p in gpu.processes}


# --- the fake, as NVML answers ---


def test_the_fake_returns_pynvmls_structures_newest_samples_only() -> None:
    fake = fake_from_gpus([SHARED], driver_version="550.90.07")
    fake.nvmlInit()
    handle = fake.nvmlDeviceGetHandleByIndex(0)
    fake.set_time(3.5)
    at = PROCESS_SAMPLES_EPOCH_US + 3 * PROCESS_SAMPLE_PERIOD_US  # a sample a second
    info = fake.nvmlDeviceGetProcessesUtilizationInfo(handle, 0)
    assert [type(s) for s in info] == [pynvml.c_nvmlProcessUtilizationInfo_v1_t] * 2
    assert [(s.pid, s.timeStamp, s.smUtil, s.memUtil) for s in info] == [(4100, at, 55, 30), (4200, at, 20, 12)]
    older = fake.nvmlDeviceGetProcessUtilization(handle, 0)
    assert [type(s) for s in older] == [pynvml.c_nvmlProcessUtilizationSample_t] * 2
    assert [(s.pid, s.timeStamp, s.smUtil, s.memUtil) for s in older] == [(4100, at, 55, 30), (4200, at, 20, 12)]
    # Nothing newer than the newest sample: NVML_ERROR_NOT_FOUND, pynvml's own class.
    with pytest.raises(pynvml.NVMLError_NotFound):
        fake.nvmlDeviceGetProcessesUtilizationInfo(handle, at)
    with pytest.raises(pynvml.NVMLError_NotFound):
        fake.nvmlDeviceGetProcessUtilization(handle, at)
    fake.set_time(4.0)
    assert [s.timeStamp for s in fake.nvmlDeviceGetProcessUtilization(handle, at)] == [at + 1_000_000] * 2
    fake.nvmlShutdown()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        fake.nvmlDeviceGetProcessUtilization(handle, 0)


def test_the_fake_finds_no_samples_on_an_idle_gpu_and_none_in_mig_mode_or_before_r550() -> None:
    idle = GpuSpec(processes=(IDLE,))
    mig = GpuSpec(mig_devices=(MigDeviceSpec(gpu_instance_id=1),), processes=(ALICE,))
    fake = fake_from_gpus([idle, mig, SHARED], driver_version="535.183.06")
    fake.nvmlInit()
    idle_handle, mig_handle, shared_handle = (fake.nvmlDeviceGetHandleByIndex(i) for i in range(3))
    with pytest.raises(pynvml.NVMLError_NotFound):
        fake.nvmlDeviceGetProcessUtilization(idle_handle, 0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        fake.nvmlDeviceGetProcessUtilization(mig_handle, 0)
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):  # the R535 library has no such symbol
        fake.nvmlDeviceGetProcessesUtilizationInfo(shared_handle, 0)
    assert [s.pid for s in fake.nvmlDeviceGetProcessUtilization(shared_handle, 0)] == [4100, 4200]


# --- the collector ---


def test_each_process_gets_its_share_and_an_idle_one_zero() -> None:
    fake = fake_from_gpus([SHARED])
    collector = make(fake)
    try:
        assert run_round(collector) == {4100: (0.55, 0.3), 4200: (0.2, 0.12), 4300: (0.0, 0.0)}
        # A round right after (an XID's), before NVML took a new sample: the same samples.
        assert run_round(collector) == {4100: (0.55, 0.3), 4200: (0.2, 0.12), 4300: (0.0, 0.0)}
        # Nothing newer than what the round before the last saw (NVML_ERROR_NOT_FOUND): nobody
        # used the GPU for two rounds.
        assert run_round(collector) == {4100: (0.0, 0.0), 4200: (0.0, 0.0), 4300: (0.0, 0.0)}
        fake.set_time(10.0)
        assert run_round(collector) == {4100: (0.55, 0.3), 4200: (0.2, 0.12), 4300: (0.0, 0.0)}
        assert fake.calls_for(0, NEWER) == 4
        assert fake.calls_for(0, OLDER) == 0
    finally:
        collector.close()


def test_an_older_driver_is_asked_the_older_call_after_one_try_of_the_newer() -> None:
    fake = fake_from_gpus([SHARED], driver_version="535.183.06")
    collector = make(fake)
    try:
        first = run_round(collector)
        fake.set_time(10.0)
        second = run_round(collector)
    finally:
        collector.close()
    assert first == second == {4100: (0.55, 0.3), 4200: (0.2, 0.12), 4300: (0.0, 0.0)}
    assert (fake.calls_for(0, NEWER), fake.calls_for(0, OLDER)) == (1, 2)


def test_mig_mode_leaves_the_share_unknown_and_stops_asking() -> None:
    mig = GpuSpec(mig_devices=(MigDeviceSpec(gpu_instance_id=1),), processes=(dataclasses.replace(ALICE),))
    fake = fake_from_gpus([mig])
    collector = make(fake)
    try:
        assert run_round(collector) == {4100: (None, None)}
        assert run_round(collector) == {4100: (None, None)}
    finally:
        collector.close()
    assert (fake.calls_for(0, NEWER), fake.calls_for(0, OLDER)) == (1, 1)


def test_a_failing_call_is_counted_and_leaves_the_share_unknown() -> None:
    fake = fake_from_gpus([SHARED])
    fake.fail(NEWER, pynvml.NVMLError_Unknown, gpu=0)
    collector = make(fake)
    try:
        assert run_round(collector) == {4100: (None, None), 4200: (None, None), 4300: (None, None)}
        values = collected(collector)
        fake.set_time(10.0)
        assert run_round(collector) == {4100: (0.55, 0.3), 4200: (0.2, 0.12), 4300: (0.0, 0.0)}
    finally:
        collector.close()
    errors = {dict(k[1])["error"]: v for k, v in values.items() if k[0] == "lockstep_gpu_nvml_errors_total"}
    assert errors == {"unknown": 1}


def test_no_gpu_call_without_compute_processes_and_no_pid_label() -> None:
    fake = fake_from_gpus([GpuSpec(), SHARED])
    collector = make(fake)
    try:
        values = collected(collector)
    finally:
        collector.close()
    assert fake.calls_for(0, NEWER) == 0
    assert fake.calls_for(1, NEWER) == 1
    assert [k for k in values if "pid" in dict(k[1])] == []


def test_fake_spec_files_take_the_per_process_utilisation(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from lockstep.simulation.fake_nvml import load_spec

    spec = tmp_path / "nvml.yml"
    spec.write_text("gpus:\n  - processes:\n      - {pid: 7, sm_util_percent: 40, memory_util_percent: 10}\n")
    fake = FakeNvml(load_spec(spec))
    fake.nvmlInit()
    (sample,) = fake.nvmlDeviceGetProcessUtilization(fake.nvmlDeviceGetHandleByIndex(0), 0)
    assert (sample.pid, sample.smUtil, sample.memUtil) == (7, 40, 10)


def test_a_percentage_over_100_is_refused_with_its_place(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from lockstep.simulation.fake_nvml import FakeSpecError, load_spec

    spec = tmp_path / "nvml.yml"
    spec.write_text("gpus:\n  - processes:\n      - pid: 7\n        sm_util_percent: 140\n")
    with pytest.raises(FakeSpecError) as raised:
        load_spec(spec)
    assert raised.value.problems == [
        f"{spec}:4: gpus[0].processes[0].sm_util_percent: expected a percentage up to 100, got 140"
    ]
