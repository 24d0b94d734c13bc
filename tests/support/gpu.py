"""The GPU collector against the fake NVML: a collector made for tests, the full GPU, sample keys.

Shared by the GPU tests (tests/collectors/gpu/) and tests/agent/test_thread_exhaustion.py.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from lockstep.agent.collector import CollectorContext, Paths
from lockstep.agent.gpus import GpuInventory
from lockstep.agent.options import NoOptions
from lockstep.agent.seams import WALL_CLOCK as WALL_CLOCK_SEAM
from lockstep.agent.seams import Seams
from lockstep.collectors.gpu import GpuCollector
from lockstep.collectors.gpu.provider import NVML
from lockstep.simulation.fake_nvml import (
    MIB,
    FakeNvml,
    GpuSpec,
    ProcessSpec,
)
from tests.support import collected

WALL_CLOCK = 1_800_000_000.0


class FastGpuCollector(GpuCollector):
    """The collector with its backoffs and waits shortened for tests."""

    reinit_backoff_initial = 0.0
    listener_wait_ms = 50
    listener_backoff = (0.01, 0.05)
    gpm_min_interval = 0.0  # the fake's clock is set by the test; its rounds come milliseconds apart


def make(
    fake: FakeNvml,
    cls: type[GpuCollector] = FastGpuCollector,
    sysfs: Path | None = None,
    gpu_inventory: GpuInventory | None = None,
) -> GpuCollector:
    """A GPU collector on the fake; it publishes into ``gpu_inventory`` (else one of its own)."""
    context = CollectorContext(
        paths=Paths(sysfs=sysfs or Path("/sys")),
        options=NoOptions(),
        log=logging.getLogger("test.gpu"),
        seams=Seams(NVML.replaced_by(fake), WALL_CLOCK_SEAM.replaced_by(lambda: WALL_CLOCK)),
        gpu_inventory=GpuInventory() if gpu_inventory is None else gpu_inventory,
    )
    return cls(context)


def collect(collector: GpuCollector) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return collected(collector)


def of_gpu(s: dict, index: int) -> dict:
    return {k: v for k, v in s.items() if ("gpu", str(index)) in k[1]}


def key(name: str, **labels: str) -> tuple[str, frozenset[tuple[str, str]]]:
    return (name, frozenset(labels.items()))


def started(made: list[GpuCollector], fake: FakeNvml, **kwargs: Any) -> GpuCollector:
    collector = make(fake, **kwargs)
    made.append(collector)
    return collector


FULL = GpuSpec(
    model="NVIDIA H100 80GB HBM3",
    vbios_version="96.00.AF.00.01",
    memory_total_bytes=81_559 * MIB,
    memory_used_bytes=40_000 * MIB,
    utilization_gpu_percent=97,
    utilization_memory_percent=41,
    sm_clock_mhz=1755,
    sm_clock_max_mhz=1980,
    memory_clock_mhz=2619,
    power_watts=512.5,
    power_limit_watts=700,
    driver_uptime_seconds=100,
    temperature_celsius=64,
    memory_temperature_celsius=71,
    clock_event_reasons=("sw_power_cap", "sync_boost"),
    clock_event_seconds={"sw_power_cap": 2.5, "hw_thermal_slowdown": 0.25},
    ecc_corrected=7,
    ecc_uncorrected=1,
    remapped_rows_correctable=3,
    remapped_rows_uncorrectable=1,
    remapped_rows_pending=True,
    pcie_replays=12,
    pcie_transmitted_bytes_per_second=1000,
    pcie_received_bytes_per_second=3000,
    nvlink_links=2,
    nvlink_down=(1,),
    nvlink_transmitted_bytes_per_second=1024 * 1000,
    nvlink_received_bytes_per_second=1024 * 500,
    nvlink_errors={"crc_flit": 4, "crc_data": 2, "replay": 5, "recovery": 1},
    processes=(ProcessSpec(pid=2200, used_memory_bytes=30_000 * MIB), ProcessSpec(pid=2300)),
    ecc_aggregate_corrected=100,
    ecc_aggregate_uncorrected=2,
    sm_count=132,
    sm_active_percent=75,
    pipe_active_percent={"tensor": 50},
)


def xids(collector: GpuCollector) -> dict[tuple[str, str], float]:
    s = collect(collector)
    return {(dict(k[1])["gpu"], dict(k[1])["xid"]): v for k, v in s.items() if k[0] == "lockstep_gpu_xid_errors_total"}
