"""The GPU's PCIe link from NVML (collectors/gpu/pcie.py), against the fake NVML."""

from __future__ import annotations

from collections.abc import Iterator

import pynvml
import pytest

from lockstep.collectors.gpu import GpuCollector
from lockstep.simulation.fake_nvml import FakeSpecError, GpuSpec, fake_from_gpus, parse_spec
from tests.support.gpu import collect, key, started

LINK = (
    "lockstep_gpu_pcie_link_generation",
    "lockstep_gpu_pcie_link_max_generation",
    "lockstep_gpu_pcie_link_width_lanes",
    "lockstep_gpu_pcie_link_max_width_lanes",
)


@pytest.fixture
def collectors() -> Iterator[list[GpuCollector]]:
    """Collectors made by a test, closed after it (their XID listener threads stop)."""
    made: list[GpuCollector] = []
    yield made
    for collector in made:
        collector.close()


def link_values(samples: dict, index: int, uuid: str) -> tuple[float | None, ...]:
    return tuple(samples.get(key(name, gpu=str(index), uuid=uuid)) for name in LINK)


def test_current_and_maximum_generation_and_width(collectors: list[GpuCollector]) -> None:
    fake = fake_from_gpus(
        [
            GpuSpec(),  # Gen5 x16 of Gen5 x16
            GpuSpec(pcie_link_width=8),  # trained at x8
            GpuSpec(pcie_link_generation=4, pcie_max_link_generation=4),  # a Gen5 GPU in a Gen4 slot: at its maximum
            GpuSpec(utilization_gpu_percent=0, pcie_link_generation=1),  # idle: its link down at Gen1 to save power
        ]
    )
    s = collect(started(collectors, fake))
    uuids = [g.uuid for g in fake.spec.gpus]
    assert [link_values(s, i, u) for i, u in enumerate(uuids)] == [
        (5, 5, 16, 16),
        (5, 5, 8, 16),
        (4, 4, 16, 16),
        (1, 5, 16, 16),
    ]


def test_maxima_are_asked_once_per_nvml_session_and_current_values_every_round(collectors: list[GpuCollector]) -> None:
    fake = fake_from_gpus([GpuSpec(), GpuSpec()])
    collector = started(collectors, fake)
    for _ in range(3):
        collect(collector)
    for gpu in (0, 1):
        assert fake.calls[("nvmlDeviceGetCurrPcieLinkGeneration", gpu)] == 3
        assert fake.calls[("nvmlDeviceGetCurrPcieLinkWidth", gpu)] == 3
        assert fake.calls[("nvmlDeviceGetMaxPcieLinkGeneration", gpu)] == 1
        assert fake.calls[("nvmlDeviceGetMaxPcieLinkWidth", gpu)] == 1
    # A new session (after a lost GPU came back) asks for the maxima again: the GPU may have been replaced.
    fake.lose_gpu(1)
    collect(collector)
    fake.restore_gpu(1)
    s = collect(collector)
    assert fake.calls[("nvmlDeviceGetMaxPcieLinkGeneration", 0)] == 2
    assert link_values(s, 1, fake.spec.gpus[1].uuid) == (5, 5, 16, 16)


def test_a_failed_maximum_is_asked_again_and_an_unsupported_call_is_not(collectors: list[GpuCollector]) -> None:
    fake = fake_from_gpus([GpuSpec(unsupported=frozenset({"nvmlDeviceGetCurrPcieLinkWidth"}))])
    uuid = fake.spec.gpus[0].uuid
    fake.fail("nvmlDeviceGetMaxPcieLinkGeneration", pynvml.NVMLError_Unknown, gpu=0)
    collector = started(collectors, fake)
    first = collect(collector)
    assert link_values(first, 0, uuid) == (5, None, None, 16)
    assert first[key("lockstep_gpu_nvml_errors_total", gpu="0", uuid=uuid, error="unknown")] == 1
    second = collect(collector)
    assert link_values(second, 0, uuid) == (5, 5, None, 16)
    assert fake.calls[("nvmlDeviceGetMaxPcieLinkGeneration", 0)] == 2
    assert fake.calls[("nvmlDeviceGetCurrPcieLinkWidth", 0)] == 1  # probed once, remembered
    assert "lockstep_gpu_pcie_link_width_lanes" in collector.check()


def test_the_fake_spec_takes_the_link_keys() -> None:
    spec = parse_spec({"gpus": [{"pcie_link_width": 8, "pcie_link_generation": 1, "pcie_max_link_generation": 4}]})
    gpu = spec.gpus[0]
    assert (gpu.pcie_link_generation, gpu.pcie_max_link_generation, gpu.pcie_link_width, gpu.pcie_max_link_width) == (
        1,
        4,
        8,
        16,
    )
    with pytest.raises(FakeSpecError, match="pcie_link_width"):
        parse_spec({"gpus": [{"pcie_link_width": "x8"}]})
