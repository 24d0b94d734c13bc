"""GPU collector against the fake NVML (which raises pynvml's real exceptions and returns its
real structures), and against the real pynvml on this machine, which has no NVIDIA driver."""

from __future__ import annotations

import ctypes.util
import dataclasses
import logging
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pynvml
import pytest

from lockstep.agent.collector import CollectorContext, NothingHere, Paths
from lockstep.agent.config import Overrides, load_config
from lockstep.agent.daemon import Agent, Setup
from lockstep.agent.gpus import GpuInventory, GpuProcess, MigDevice
from lockstep.agent.options import NoOptions
from lockstep.agent.seams import WALL_CLOCK as WALL_CLOCK_SEAM
from lockstep.agent.seams import Seams
from lockstep.agent.webconfig import WebConfig
from lockstep.collectors.gpu import GpuCollector
from lockstep.collectors.gpu.nvml import CLOCK_EVENT_REASONS, field_id
from lockstep.collectors.gpu.provider import NVML
from lockstep.simulation import gpu as sim_gpu
from lockstep.simulation.fake_nvml import (
    MIB,
    FakeNvml,
    FakeSpec,
    FakeSpecError,
    GpuSpec,
    MigDeviceSpec,
    ProcessSpec,
    default_uuid,
    fake_from_gpus,
    load_spec,
    parse_spec,
    with_defaults,
)
from tests.support import lockstep, samples, wait_until
from tests.support.gpu import FULL, WALL_CLOCK, FastGpuCollector, collect, key, make, of_gpu, started, xids


@pytest.fixture
def collectors() -> Iterator[list[GpuCollector]]:
    """Collectors made by a test, closed after it (their XID listener threads stop)."""
    made: list[GpuCollector] = []
    yield made
    for collector in made:
        collector.close()


# --- values ---


def test_every_value_from_nvml_in_base_units(collectors: list[GpuCollector]) -> None:
    fake = fake_from_gpus([FULL], driver_version="550.90.07")
    fake.set_time(10)
    collector = started(collectors, fake)
    s = collect(collector)
    uuid = fake.spec.gpus[0].uuid
    g = {"gpu": "0", "uuid": uuid}
    info = {
        **g,
        "pci_bus_id": "00000000:18:00.0",
        "model": "NVIDIA H100 80GB HBM3",
        "driver_version": "550.90.07",
        "vbios_version": "96.00.AF.00.01",
        "minor_number": "0",
    }
    expected = {
        key("lockstep_gpu_info", **info): 1,
        key("lockstep_gpu_up", **g): 1,
        key("lockstep_gpu_utilization_ratio", **g): 0.97,
        key("lockstep_gpu_memory_utilization_ratio", **g): 0.41,
        key("lockstep_gpu_memory_used_bytes", **g): 40_000 * MIB,
        key("lockstep_gpu_memory_total_bytes", **g): 81_559 * MIB,
        key("lockstep_gpu_sm_clock_hertz", **g): 1755e6,
        key("lockstep_gpu_sm_clock_max_hertz", **g): 1980e6,
        key("lockstep_gpu_memory_clock_hertz", **g): 2619e6,
        key("lockstep_gpu_power_watts", **g): 512.5,  # NVML: 512500 mW
        key("lockstep_gpu_power_limit_watts", **g): 700,
        key("lockstep_gpu_energy_joules_total", **g): 512.5 * 110,  # NVML: mJ over 100 s + t=10
        key("lockstep_gpu_temperature_celsius", **g): 64,
        key("lockstep_gpu_memory_temperature_celsius", **g): 71,
        # durations: NVML nanoseconds; active reasons grew by t
        key("lockstep_gpu_clock_event_seconds_total", **g, reason="sw_power_cap"): 12.5,
        key("lockstep_gpu_clock_event_seconds_total", **g, reason="sync_boost"): 10,
        key("lockstep_gpu_clock_event_seconds_total", **g, reason="hw_thermal_slowdown"): 0.25,
        key("lockstep_gpu_clock_event_seconds_total", **g, reason="sw_thermal_slowdown"): 0,
        key("lockstep_gpu_clock_event_seconds_total", **g, reason="hw_power_brake"): 0,
        key("lockstep_gpu_ecc_errors_total", **g, type="corrected"): 7,
        key("lockstep_gpu_ecc_errors_total", **g, type="uncorrected"): 1,
        # lifetime: earlier driver loads' counts and this one's
        key("lockstep_gpu_ecc_aggregate_errors_total", **g, type="corrected"): 107,
        key("lockstep_gpu_ecc_aggregate_errors_total", **g, type="uncorrected"): 3,
        key("lockstep_gpu_fabric_state", **g, state="not_started"): 0,
        key("lockstep_gpu_fabric_state", **g, state="in_progress"): 0,
        key("lockstep_gpu_fabric_state", **g, state="completed"): 1,
        key("lockstep_gpu_fabric_health", **g, condition="registration_failed"): 0,
        key("lockstep_gpu_fabric_health", **g, condition="degraded_bandwidth"): 0,
        key("lockstep_gpu_fabric_health", **g, condition="route_recovery"): 0,
        key("lockstep_gpu_fabric_health", **g, condition="route_unhealthy"): 0,
        key("lockstep_gpu_fabric_health", **g, condition="access_timeout_recovery"): 0,
        # GPM counters since boot, already in the first round (a sample at enumeration, one now):
        # 132 SMs x 1755 MHz x (100 s + t=10)
        key("lockstep_gpu_sm_cycles_total", **g, gpu_instance_id=""): 132 * 1755e6 * 110,
        key("lockstep_gpu_sm_active_cycles_total", **g, gpu_instance_id=""): 0.75 * 132 * 1755e6 * 110,
        key("lockstep_gpu_remapped_rows", **g, cause="correctable"): 3,
        key("lockstep_gpu_remapped_rows", **g, cause="uncorrectable"): 1,
        key("lockstep_gpu_row_remapping_pending", **g): 1,
        key("lockstep_gpu_row_remapping_failed", **g): 0,
        key("lockstep_gpu_pcie_replays_total", **g): 12,
        key("lockstep_gpu_pcie_transmitted_bytes_total", **g): 110_000,
        key("lockstep_gpu_pcie_received_bytes_total", **g): 330_000,
        key("lockstep_gpu_pcie_link_generation", **g): 5,  # the fake's default: Gen5 x16 of Gen5 x16
        key("lockstep_gpu_pcie_link_max_generation", **g): 5,
        key("lockstep_gpu_pcie_link_width_lanes", **g): 16,
        key("lockstep_gpu_pcie_link_max_width_lanes", **g): 16,
        key("lockstep_nvlink_up", **g, link="0"): 1,
        key("lockstep_nvlink_up", **g, link="1"): 0,
        key("lockstep_nvlink_transmitted_bytes_total", **g, link="0"): 110_000 * 1024,  # NVML: KiB
        key("lockstep_nvlink_received_bytes_total", **g, link="0"): 55_000 * 1024,
        key("lockstep_nvlink_transmitted_bytes_total", **g, link="1"): 0,
        key("lockstep_nvlink_received_bytes_total", **g, link="1"): 0,
        key("lockstep_gpu_nvlink_errors_total", **g, type="crc_flit"): 8,
        key("lockstep_gpu_nvlink_errors_total", **g, type="crc_data"): 4,
        key("lockstep_gpu_nvlink_errors_total", **g, type="replay"): 10,
        key("lockstep_gpu_nvlink_errors_total", **g, type="recovery"): 2,
        key("lockstep_gpu_mig_mode", **g): 0,
        key("lockstep_gpu_processes", **g): 2,
        key("lockstep_gpu_processes_memory_used_bytes", **g): 30_000 * MIB,  # pid 2300's use is not available
    }
    for link in ("0", "1"):
        for kind, count in (("replay", 5), ("recovery", 1), ("crc_flit", 4)):
            expected[key("lockstep_nvlink_errors_total", **g, link=link, type=kind)] = count
    for reason in CLOCK_EVENT_REASONS:
        expected[key("lockstep_gpu_clock_event_active", **g, reason=reason)] = int(
            reason in ("sw_power_cap", "sync_boost")
        )
    for action in ("none", "gpu_reset", "node_reboot", "drain_p2p", "drain_and_reset"):
        expected[key("lockstep_gpu_recovery_action", **g, action=action)] = int(action == "none")
    for action in ("recover_imex_domain", "bus_reset", "system_reboot"):
        expected[key("lockstep_gpu_recovery_action", **g, action=action)] = 0
    for pipe in ("tensor", "tensor_hmma", "tensor_imma", "tensor_dmma", "tensor_dfma", "fp64", "fp32", "fp16"):
        expected[key("lockstep_gpu_pipe_active_cycles_total", **g, gpu_instance_id="", pipe=pipe)] = (
            0.5 * 132 * 1755e6 * 110 if pipe == "tensor" else 0
        )
    expected[key("lockstep_gpu_pipe_active_cycles_total", **g, gpu_instance_id="", pipe="integer")] = 0
    assert s == expected
    assert collector.context.gpu_inventory.published()[
        0
    ].processes == (  # no per-process samples: idle (tests/collectors/gpu/test_gpu_processes.py)
        GpuProcess(2200, 30_000 * MIB, None, None, sm_utilization=0.0, memory_utilization=0.0),
        GpuProcess(2300, None, None, None, sm_utilization=0.0, memory_utilization=0.0),
    )


def test_clock_event_reason_bits_are_nvml_h_values() -> None:
    """The collector reads the reason bits by this table and the fake sets them by it, so their
    round trip cannot catch a wrong bit: here each name's bit as nvml.h defines it
    (nvmlClocksEventReason*, and nvmlClocksThrottleReasonBoardLimit/Reliability for the two newest)."""
    assert CLOCK_EVENT_REASONS == {
        "idle": 0x1,
        "applications_clocks_setting": 0x2,
        "sw_power_cap": 0x4,
        "hw_slowdown": 0x8,
        "sync_boost": 0x10,
        "sw_thermal_slowdown": 0x20,
        "hw_thermal_slowdown": 0x40,
        "hw_power_brake": 0x80,
        "display_clock_setting": 0x100,
        "board_limit": 0x200,
        "reliability": 0x400,
    }


@pytest.mark.parametrize("driver", ["550.90.07", "590.44.01"])
def test_clock_event_durations_by_the_drivers_field_numbering(driver: str, collectors: list[GpuCollector]) -> None:
    """NVML renumbered three of these fields in R590 (251-253 -> 269-271, which were power
    smoothing ids): the fake answers by its driver's numbering, so asking by the binding's
    would miss them on one of the two drivers."""
    fake = fake_from_gpus([FULL], driver_version=driver)
    s = collect(started(collectors, fake))
    seconds = {dict(k[1])["reason"]: v for k, v in s.items() if k[0] == "lockstep_gpu_clock_event_seconds_total"}
    assert seconds == {
        "sw_power_cap": 2.5,
        "sync_boost": 0,
        "sw_thermal_slowdown": 0,
        "hw_thermal_slowdown": 0.25,
        "hw_power_brake": 0,
    }
    assert field_id("NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN", int(driver[:3])) == (
        252 if driver < "590" else 270
    )


def test_counters_grow_with_time_and_values_are_fresh_each_round(collectors: list[GpuCollector]) -> None:
    fake = fake_from_gpus([FULL])
    collector = started(collectors, fake)
    uuid = fake.spec.gpus[0].uuid
    first = collect(collector)
    fake.set_time(20)
    second = collect(collector)
    energy = key("lockstep_gpu_energy_joules_total", gpu="0", uuid=uuid)
    assert (first[energy], second[energy]) == (512.5 * 100, 512.5 * 120)


def test_blackwell_nvlink_counters_replace_the_dl_counters(collectors: list[GpuCollector]) -> None:
    spec = GpuSpec(
        architecture="blackwell", nvlink_links=1, nvlink_counters={"symbol_errors": 9, "link_recovery_failed": 2}
    )
    fake = fake_from_gpus([spec])
    s = collect(started(collectors, fake))
    errors = {dict(k[1])["type"]: v for k, v in s.items() if k[0] == "lockstep_nvlink_errors_total"}
    assert errors == {
        "symbol_errors": 9,
        "effective_errors": 0,
        "link_recovery_successful": 0,
        "link_recovery_failed": 2,
        "receive_errors": 0,
        "transmit_discards": 0,
        "malformed_packets": 0,
        "buffer_overruns": 0,
        "local_link_integrity_errors": 0,
    }


def test_volta_retired_pages_and_link_state_by_call(collectors: list[GpuCollector]) -> None:
    spec = GpuSpec(
        architecture="volta", nvlink_links=6, nvlink_down=(4,), retired_pages_single_bit=2, retired_pages_pending=True
    )
    fake = fake_from_gpus([spec])
    collector = started(collectors, fake)
    for _ in range(3):
        s = collect(collector)
    uuid = fake.spec.gpus[0].uuid
    assert s[key("lockstep_gpu_retired_pages", gpu="0", uuid=uuid, cause="single_bit_ecc")] == 2
    assert s[key("lockstep_gpu_retired_pages", gpu="0", uuid=uuid, cause="double_bit_ecc")] == 0
    assert s[key("lockstep_gpu_page_retirement_pending", gpu="0", uuid=uuid)] == 1
    up = {dict(k[1])["link"]: v for k, v in s.items() if k[0] == "lockstep_nvlink_up"}
    assert up == {"0": 1, "1": 1, "2": 1, "3": 1, "4": 0, "5": 1}
    names = {k[0] for k in s}
    assert "lockstep_gpu_remapped_rows" not in names and "lockstep_nvlink_transmitted_bytes_total" not in names
    # The link state field was found unsupported in round 1; rounds 2 and 3 ask per link.
    assert fake.field_requests[(0, "NVML_FI_DEV_NVLINK_GET_STATE")] == 6
    assert fake.calls[("nvmlDeviceGetNvLinkState", 0)] == 6 * 3


# --- unsupported calls: probed once ---


def test_consumer_gpu_unsupported_calls_and_fields_are_probed_once(collectors: list[GpuCollector]) -> None:
    fake = fake_from_gpus([GpuSpec(model="NVIDIA GeForce RTX 4090", consumer=True, memory_temperature_celsius=0)])
    collector = started(collectors, fake)
    for _ in range(4):
        s = collect(collector)
    uuid = fake.spec.gpus[0].uuid
    assert fake.calls[("nvmlDeviceGetMigMode", 0)] == 1
    assert fake.calls[("nvmlDeviceGetUtilizationRates", 0)] == 4
    assert fake.field_requests[(0, "NVML_FI_DEV_ECC_SBE_VOL_TOTAL")] == 1
    assert fake.field_requests[(0, "NVML_FI_DEV_REMAPPED_COR")] == 1
    assert fake.field_requests[(0, "NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION")] == 4
    names = {k[0] for k in s}
    for absent in (
        "lockstep_gpu_ecc_errors_total",
        "lockstep_gpu_remapped_rows",
        "lockstep_gpu_mig_mode",
        "lockstep_gpu_nvml_errors_total",
        "lockstep_nvlink_up",
    ):
        assert absent not in names
    assert s[key("lockstep_gpu_up", gpu="0", uuid=uuid)] == 1
    note = collector.check()
    assert note.startswith(
        "GPU 0: not supported by the GPU or driver, omitted: lockstep_gpu_ecc_aggregate_errors_total, "
        "lockstep_gpu_ecc_errors_total, "
    )
    assert "lockstep_gpu_mig_mode" in note and "lockstep_gpu_remapped_rows" in note


def test_each_field_is_checked_by_its_own_return_code(collectors: list[GpuCollector]) -> None:
    fake = fake_from_gpus([FULL])
    fake.fail_field(0, "NVML_FI_DEV_MEMORY_TEMP", pynvml.NVML_ERROR_TIMEOUT)
    collector = started(collectors, fake)
    collect(collector)
    s = collect(collector)
    uuid = fake.spec.gpus[0].uuid
    assert key("lockstep_gpu_memory_temperature_celsius", gpu="0", uuid=uuid) not in s
    assert s[key("lockstep_gpu_temperature_celsius", gpu="0", uuid=uuid)] == 64
    assert s[key("lockstep_gpu_nvml_errors_total", gpu="0", uuid=uuid, error="timeout")] == 2
    # A transient error is not "unsupported": the field is still asked for every round.
    assert fake.field_requests[(0, "NVML_FI_DEV_MEMORY_TEMP")] == 2


# --- a lost GPU ---


def test_lost_gpu_reports_down_and_no_stale_values_while_the_others_go_on(collectors: list[GpuCollector]) -> None:
    fake = fake_from_gpus([FULL, FULL, FULL])
    collector = started(collectors, fake, cls=GpuCollector)  # re-initialisation backoff of 5 s
    # Every round after the first windowed, however far apart they come: with the real 0.1 s, a
    # starved second round (./dev/test's run at nice 19) gave GPU 0 GPM's ratios before the loss
    # and a prompt third none after it, as if the loss had taken them.
    collector.reader.gpm_min_interval = 0.0
    collect(collector)  # the first round: GPM's windowed ratios come from the second on
    before = collect(collector)
    uuid = fake.spec.gpus[1].uuid
    assert before[key("lockstep_gpu_up", gpu="1", uuid=uuid)] == 1
    fake.lose_gpu(1)
    after = collect(collector)
    assert after[key("lockstep_gpu_up", gpu="1", uuid=uuid)] == 0
    assert {k[0] for k in of_gpu(after, 1)} == {
        "lockstep_gpu_info",
        "lockstep_gpu_up",
        "lockstep_gpu_nvml_errors_total",
        "lockstep_gpu_xid_errors_total",  # XID 79, if the listener saw it before the round
        "lockstep_gpu_last_xid_timestamp_seconds",
    } - ({"lockstep_gpu_xid_errors_total", "lockstep_gpu_last_xid_timestamp_seconds"} - {k[0] for k in after})
    assert after[key("lockstep_gpu_nvml_errors_total", gpu="1", uuid=uuid, error="gpu_is_lost")] == 1
    for other in (0, 2):
        assert of_gpu(after, other).keys() == of_gpu(before, other).keys()
    assert [g.up for g in collector.context.gpu_inventory.published()] == [True, False, True]
    # Within the backoff, the lost GPU is not asked again and NVML is not re-initialised.
    calls_on_lost = fake.calls_for(gpu=1)
    collect(collector)
    assert fake.calls_for(gpu=1) == calls_on_lost
    assert fake.calls[("nvmlInit", None)] == 1


def test_reinit_with_backoff_until_the_gpu_is_back(collectors: list[GpuCollector]) -> None:
    fake = fake_from_gpus([FULL, FULL])
    collector = started(collectors, fake)
    collect(collector)
    fake.lose_gpu(0)
    collect(collector)  # finds GPU 0 lost
    assert collector.sessions.retry_delay == 0  # doubling zero: the test's backoff
    s = collect(collector)  # re-initialises: GPU 0 still lost, its identity kept
    assert fake.calls[("nvmlInit", None)] == 2 and fake.calls[("nvmlShutdown", None)] == 1
    uuid0 = fake.spec.gpus[0].uuid
    assert s[key("lockstep_gpu_up", gpu="0", uuid=uuid0)] == 0
    assert (
        key("lockstep_gpu_info", **dict(next(k[1] for k in s if k[0] == "lockstep_gpu_info" and ("gpu", "0") in k[1])))
        in s
    )
    fake.restore_gpu(0)
    s = collect(collector)
    assert fake.calls[("nvmlInit", None)] == 3
    assert s[key("lockstep_gpu_up", gpu="0", uuid=uuid0)] == 1
    assert s[key("lockstep_gpu_temperature_celsius", gpu="0", uuid=uuid0)] == 64
    collect(collector)
    assert fake.calls[("nvmlInit", None)] == 3  # all GPUs answer: no more re-initialisation


def test_gpu_removed_from_the_bus_stays_reported_down(collectors: list[GpuCollector]) -> None:
    fake = fake_from_gpus([FULL, FULL, FULL])
    collector = started(collectors, fake)
    collect(collector)
    uuids = [g.uuid for g in fake.spec.gpus]
    fake.remove_gpu(1)  # NVML now counts 2 GPUs: the third is index 1
    collect(collector)  # finds GPU 1 lost
    s = collect(collector)  # re-initialised: NVML lists two GPUs
    up = {(dict(k[1])["gpu"], dict(k[1])["uuid"]): v for k, v in s.items() if k[0] == "lockstep_gpu_up"}
    assert up == {("0", uuids[0]): 1, ("1", uuids[2]): 1, ("1", uuids[1]): 0}
    fake.restore_gpu(1)
    s = collect(collector)
    up = {(dict(k[1])["gpu"], dict(k[1])["uuid"]): v for k, v in s.items() if k[0] == "lockstep_gpu_up"}
    assert up == {("0", uuids[0]): 1, ("1", uuids[1]): 1, ("2", uuids[2]): 1}


def test_backoff_doubles(collectors: list[GpuCollector]) -> None:
    class Slow(FastGpuCollector):
        reinit_backoff_initial = 60.0

    fake = fake_from_gpus([FULL])
    collector = started(collectors, fake, cls=Slow)
    collect(collector)
    fake.fail("nvmlDeviceGetPowerUsage", pynvml.NVMLError_LibRmVersionMismatch)
    with pytest.raises(
        RuntimeError, match=r"^NVML: RM has detected an NVML/RM version mismatch\. \(re-initialising in 60s\)$"
    ):
        collect(collector)
    with pytest.raises(RuntimeError, match=r"re-initialising in \d+s$"):
        collect(collector)  # within the backoff: NVML is not touched
    assert fake.calls[("nvmlInit", None)] == 1
    assert collector.sessions.retry_delay == 120


def test_lifecycle_error_reinitialises_nvml(collectors: list[GpuCollector]) -> None:
    fake = fake_from_gpus([FULL])
    collector = started(collectors, fake)
    collect(collector)
    fake.fail("nvmlDeviceGetUtilizationRates", pynvml.NVMLError_Uninitialized)
    with pytest.raises(RuntimeError, match="^NVML: Uninitialized"):
        collect(collector)
    s = collect(collector)
    assert fake.calls[("nvmlInit", None)] == 2 and fake.calls[("nvmlShutdown", None)] == 1
    assert s[key("lockstep_gpu_up", gpu="0", uuid=fake.spec.gpus[0].uuid)] == 1


def test_init_failure_is_a_failure_retried_later(collectors: list[GpuCollector]) -> None:
    fake = fake_from_gpus([FULL])
    fake.fail("nvmlInit", pynvml.NVMLError_NoPermission)
    collector = started(collectors, fake)
    with pytest.raises(RuntimeError, match="^NVML initialisation failed: Insufficient Permissions"):
        collect(collector)
    assert collect(collector)[key("lockstep_gpu_up", gpu="0", uuid=fake.spec.gpus[0].uuid)] == 1


def test_hotplug_of_an_nvidia_gpu_reinitialises_at_once(collectors: list[GpuCollector], tmp_path: Path) -> None:
    class Slow(FastGpuCollector):
        reinit_backoff_initial = 3600.0

    fake = fake_from_gpus([FULL, FULL])
    collector = started(collectors, fake, cls=Slow, sysfs=tmp_path)
    collect(collector)
    fake.lose_gpu(1)
    collect(collector)
    collect(collector)
    assert fake.calls[("nvmlInit", None)] == 1  # the backoff holds
    devices = tmp_path / "devices" / "pci0000:00"
    for address, vendor, device_class in (
        ("0000:3b:00.0", "0x15b3", "0x020700"),
        ("0000:5d:00.1", "0x10de", "0x040300"),
    ):
        (devices / address).mkdir(parents=True)
        (devices / address / "vendor").write_text(vendor + "\n")
        (devices / address / "class").write_text(device_class + "\n")
        collector.on_hotplug("add", "pci", f"/sys/devices/pci0000:00/{address}")  # a NIC, a GPU's audio function
    collect(collector)
    assert fake.calls[("nvmlInit", None)] == 1
    # The lost GPU's own PCI address is removed (its sysfs entry is gone by then).
    fake.restore_gpu(1)
    collector.on_hotplug("remove", "pci", "/sys/devices/pci0000:00/0000:28:00.0")
    s = collect(collector)
    assert fake.calls[("nvmlInit", None)] == 2
    assert s[key("lockstep_gpu_up", gpu="1", uuid=fake.spec.gpus[1].uuid)] == 1
    # A new NVIDIA display controller appears.
    (devices / "0000:9a:00.0").mkdir()
    (devices / "0000:9a:00.0" / "vendor").write_text("0x10de\n")
    (devices / "0000:9a:00.0" / "class").write_text("0x030200\n")
    collector.on_hotplug("add", "pci", "/sys/devices/pci0000:00/0000:9a:00.0")
    collect(collector)
    assert fake.calls[("nvmlInit", None)] == 3


# --- XID events ---


class NoReinit(FastGpuCollector):
    """Re-initialisation far off: the XID listener alone must cope with a lost GPU."""

    reinit_backoff_initial = 3600.0


def test_xid_listener_survives_timeouts_and_a_lost_gpu(collectors: list[GpuCollector]) -> None:
    fake = fake_from_gpus([FULL, FULL])
    collector = started(collectors, fake, cls=NoReinit)
    assert xids(collector) == {}
    wait_until(lambda: fake.calls[("nvmlEventSetWait_v2", None)] >= 4, what="a few idle waits (timeouts)")
    fake.inject_xid(0, 48)
    wait_until(lambda: xids(collector) == {("0", "48"): 1}, what="XID 48 counted")
    s = collect(collector)
    assert s[key("lockstep_gpu_last_xid_timestamp_seconds", gpu="0", uuid=fake.spec.gpus[0].uuid)] == WALL_CLOCK
    fake.lose_gpu(1)  # XID 79, then GPU_IS_LOST from the wait: the listener registers again
    wait_until(lambda: fake.calls[("nvmlEventSetCreate", None)] >= 2, what="a new event set")
    wait_until(lambda: xids(collector).get(("1", "79")) == 1, what="XID 79 counted")
    fake.inject_xid(0, 48)
    fake.inject_xid(0, 13)
    wait_until(lambda: xids(collector) == {("0", "48"): 2, ("0", "13"): 1, ("1", "79"): 1}, what="XIDs after loss")
    assert collector.sessions.session is not None and collector.sessions.session.listener is not None
    assert collector.sessions.session.listener._thread.is_alive()


def test_xid_before_registration_is_lost_as_with_nvml(collectors: list[GpuCollector]) -> None:
    fake = FakeNvml(FakeSpec(gpus=(with_defaults(FULL, 0),), xid_events=()))
    fake.set_time(5)
    fake.inject_xid(0, 31)  # at t=5, before the collector registers
    fake.set_time(6)
    collector = started(collectors, fake)
    assert xids(collector) == {}


def test_listener_is_stopped_on_close(collectors: list[GpuCollector]) -> None:
    fake = fake_from_gpus([FULL])
    collector = make(fake)
    collect(collector)
    listener = collector.sessions.session.listener  # type: ignore[union-attr]
    collector.close()
    assert not listener._thread.is_alive()  # type: ignore[union-attr]
    assert fake.calls[("nvmlShutdown", None)] == 1


# --- MIG ---


def test_mig_devices_and_what_nvml_cannot_give_per_mig_device(collectors: list[GpuCollector]) -> None:
    mig_gpu = GpuSpec(
        mig_devices=(
            MigDeviceSpec(
                gpu_instance_id=1,
                profile="3g.40gb",
                uuid="MIG-a",
                memory_total_bytes=40_192 * MIB,
                memory_used_bytes=1000,
            ),
            MigDeviceSpec(
                gpu_instance_id=2, profile="1g.10gb", uuid="MIG-b", memory_total_bytes=9_856 * MIB, memory_used_bytes=0
            ),
        ),
        processes=(
            ProcessSpec(pid=3101, used_memory_bytes=900, gpu_instance_id=1, compute_instance_id=0),
            ProcessSpec(pid=3102, used_memory_bytes=50, gpu_instance_id=1, compute_instance_id=0),
        ),
    )
    fake = fake_from_gpus([mig_gpu])
    collector = started(collectors, fake)
    collect(collector)
    s = collect(collector)
    uuid = fake.spec.gpus[0].uuid
    g = {"gpu": "0", "uuid": uuid}
    a = {**g, "gpu_instance_id": "1", "compute_instance_id": "0"}
    b = {**g, "gpu_instance_id": "2", "compute_instance_id": "0"}
    assert s[key("lockstep_gpu_mig_mode", **g)] == 1
    assert s[key("lockstep_gpu_mig_device_info", **a, profile="3g.40gb", mig_uuid="MIG-a")] == 1
    assert s[key("lockstep_gpu_mig_device_info", **b, profile="1g.10gb", mig_uuid="MIG-b")] == 1
    assert s[key("lockstep_gpu_mig_device_memory_total_bytes", **a)] == 40_192 * MIB
    assert s[key("lockstep_gpu_mig_device_memory_used_bytes", **a)] == 1000
    assert s[key("lockstep_gpu_mig_device_processes", **a)] == 2
    assert s[key("lockstep_gpu_mig_device_processes", **b)] == 0
    assert s[key("lockstep_gpu_processes", **g)] == 2
    # No utilization and no row remapping in MIG mode: omitted, not faked, and asked once.
    names = {k[0] for k in s}
    assert "lockstep_gpu_utilization_ratio" not in names and "lockstep_gpu_remapped_rows" not in names
    assert fake.calls[("nvmlDeviceGetUtilizationRates", 0)] == 1
    # Identity of a MIG device is read once; its memory every round.
    assert fake.calls[("nvmlDeviceGetGpuInstanceId", 0)] == 2
    assert fake.calls[("nvmlDeviceGetMemoryInfo", 0)] == 2 * 2 + 2
    assert collector.context.gpu_inventory.published()[0].mig_devices == (
        MigDevice("MIG-a", 1, 0, "3g.40gb"),
        MigDevice("MIG-b", 2, 0, "1g.10gb"),
    )


# --- no NVML here ---


NO_NVML_PROBE = """
import logging, sys
import lockstep.agent.cli
from lockstep.agent.registry import discover
from lockstep.agent.collector import CollectorContext, NothingHere, Paths
from lockstep.agent.options import NoOptions
discover()
collector = discover().collectors["gpu"].cls(CollectorContext(Paths(), NoOptions(), logging.getLogger("probe")))
try:
    list(collector.collect())
except NothingHere:
    print("NothingHere")
reading = ("pynvml", "calls", "nvml", "session", "reading", "xid", "gpm", "mig", "processes")
print(sorted(m for m in sys.modules if m.rsplit(".", 1)[-1] in reading and ("gpu" in m or m == "pynvml")))
"""


@pytest.mark.real
def test_no_nvml_library_is_nothing_here_with_the_reason() -> None:
    """The real pynvml on this machine: no libnvidia-ml.so.1."""
    if ctypes.util.find_library("nvidia-ml"):
        pytest.skip("this machine has libnvidia-ml: the real-GPU case")
    collector = GpuCollector(CollectorContext(paths=Paths(), options=NoOptions(), log=logging.getLogger("test.gpu")))
    with pytest.raises(NothingHere, match=r"^libnvidia-ml\.so\.1 not found \(no NVIDIA driver installed\)"):
        list(collector.collect())
    # Where the library is absent, neither pynvml nor the modules that read NVML are imported
    # (2.5 MiB of the agent's memory, issue 47): the agent's imports and a round, in a fresh process.
    probe = subprocess.run([sys.executable, "-c", NO_NVML_PROBE], capture_output=True, text=True, timeout=60)
    assert probe.stdout.split("\n")[:2] == ["NothingHere", "[]"], probe.stderr
    result = lockstep("doctor", "--no-collector.host")
    line = next(line for line in result.stdout.splitlines() if line.startswith("gpu "))
    assert line.split(None, 3)[1:] == [
        "yes",
        "nothing",
        "here  libnvidia-ml.so.1 not found (no NVIDIA driver installed): no GPUs to collect",
    ]


def test_driver_not_loaded_is_nothing_here_and_nothing_is_published(collectors: list[GpuCollector]) -> None:
    inventory = GpuInventory()  # one for both, as the agent's
    collect(started(collectors, fake_from_gpus([FULL]), gpu_inventory=inventory))
    assert len(inventory.published()) == 1
    fake = FakeNvml(FakeSpec(gpus=(with_defaults(FULL, 0),), driver_loaded=False))
    with pytest.raises(NothingHere, match="NVIDIA kernel driver is not loaded"):
        collect(started(collectors, fake, gpu_inventory=inventory))
    assert inventory.published() == ()


# --- the fake NVML option and spec ---


@pytest.mark.real
def test_once_with_a_fake_nvml_spec(tmp_path: Path) -> None:
    spec = tmp_path / "gpus.yml"
    spec.write_text(
        textwrap.dedent(
            """\
            driver_version: "560.35.03"
            defaults:
              model: NVIDIA A100-SXM4-80GB
              architecture: ampere
            gpus:
              - processes: [{pid: 4321, used_memory_bytes: 1048576}]
              - uuid: GPU-11111111-2222-3333-4444-555555555555
                minor_number: 3
            """
        )
    )
    result = lockstep("once", "--collector.disable-defaults", "--collector.gpu", "--gpu.fake-nvml", str(spec))
    assert result.returncode == 0, result.stderr
    s = samples(result.stdout)
    assert s[key("lockstep_gpu_up", gpu="1", uuid="GPU-11111111-2222-3333-4444-555555555555")] == 1
    info = [dict(k[1]) for k in s if k[0] == "lockstep_gpu_info"]
    assert [(i["model"], i["minor_number"], i["driver_version"]) for i in info] == [
        ("NVIDIA A100-SXM4-80GB", "0", "560.35.03"),
        ("NVIDIA A100-SXM4-80GB", "3", "560.35.03"),
    ]
    assert s[key("lockstep_gpu_processes", gpu="0", uuid=info[0]["uuid"])] == 1


@pytest.mark.real
def test_bad_fake_nvml_spec_is_reported_with_file_and_line(tmp_path: Path) -> None:
    spec = tmp_path / "gpus.yml"
    spec.write_text("gpus:\n  - power_watts: lots\n    colour: green\n")
    result = lockstep("once", "--gpu.fake-nvml", str(spec))
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"lockstep: --gpu.fake-nvml: {spec}:2: gpus[0].power_watts: expected a number of at least 0, got 'lots'; "
        f"{spec}:3: gpus[0].colour: unknown key (known: {', '.join(f.name for f in dataclasses.fields(GpuSpec))})"
    ]


def test_spec_parsing() -> None:
    spec = parse_spec({"gpus": 2, "defaults": {"nvlink_links": 18}, "xid_events": [{"gpu": 1, "xid": 48, "at": 3}]})
    assert [g.nvlink_links for g in spec.gpus] == [18, 18]
    assert [g.minor_number for g in spec.gpus] == [0, 1]
    assert spec.gpus[0].uuid != spec.gpus[1].uuid and spec.gpus[1].uuid.startswith("GPU-")
    assert spec.xid_events[0].xid == 48
    with pytest.raises(FakeSpecError) as err:
        parse_spec(
            {
                "gpus": [{"unsupported": ["nvmlNoSuchCall"], "architecture": "kepler"}],
                "xid_events": [{"gpu": 4, "xid": 1}],
            }
        )
    assert err.value.problems == [
        "<spec>: gpus[0].unsupported: not pynvml functions or NVML_FI_* fields: ['nvmlNoSuchCall']",
        "<spec>: gpus[0].architecture: expected one of volta, ampere, hopper, blackwell, got 'kepler'",
        "<spec>: xid_events[0].gpu: no GPU 4 (the spec has 1)",
    ]
    with pytest.raises(FakeSpecError, match="cannot read"):
        load_spec("/nonexistent/spec.yml")


def test_the_fake_raises_pynvml_errors_and_counts_calls() -> None:
    fake = fake_from_gpus([FULL])
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        fake.nvmlDeviceGetCount()
    fake.nvmlInit()
    handle = fake.nvmlDeviceGetHandleByIndex(0)
    assert isinstance(handle, pynvml.c_nvmlDevice_t)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        fake.nvmlDeviceGetHandleByIndex(1)
    values = fake.nvmlDeviceGetFieldValues(
        handle, [pynvml.NVML_FI_DEV_MEMORY_TEMP, (pynvml.NVML_FI_DEV_NVLINK_GET_STATE, 7)]
    )
    assert isinstance(values[0], pynvml.c_nvmlFieldValue_t)
    assert (values[0].nvmlReturn, values[0].valueType, values[0].value.uiVal) == (
        0,
        pynvml.NVML_VALUE_TYPE_UNSIGNED_INT,
        71,
    )
    assert values[1].nvmlReturn == pynvml.NVML_ERROR_INVALID_ARGUMENT  # no link 7
    event_set = fake.nvmlEventSetCreate()
    fake.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError, event_set)
    with pytest.raises(pynvml.NVMLError_Timeout):
        fake.nvmlEventSetWait_v2(event_set, 0)
    fake.lose_gpu(0)
    assert fake.nvmlEventSetWait_v2(event_set, 0).eventData == 79
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        fake.nvmlEventSetWait_v2(event_set, 0)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        fake.nvmlDeviceGetHandleByIndex(0)
    assert fake.nvmlDeviceGetCount() == 1  # a lost GPU is still counted
    assert fake.calls_for(gpu=0) == 4 and fake.calls_for(function="nvmlEventSetWait_v2") == 3


# --- the simulated node ---


def test_simulated_straggler_gpu_is_throttled(collectors: list[GpuCollector]) -> None:
    fake = FakeNvml(sim_gpu.node_spec("straggler"))
    s = collect(started(collectors, fake))
    uuids = sim_gpu.GPU_UUIDS

    def value(name: str, i: int, **labels: str) -> float:
        return s[key(name, gpu=str(i), uuid=uuids[i], **labels)]

    assert value("lockstep_gpu_clock_event_active", 3, reason="hw_slowdown") == 1
    assert [value("lockstep_gpu_clock_event_active", i, reason="hw_slowdown") for i in (0, 1, 2, 4, 5, 6, 7)] == [0] * 7
    assert value("lockstep_gpu_sm_clock_hertz", 0) / value("lockstep_gpu_sm_clock_hertz", 3) == pytest.approx(
        1.4, abs=0.01
    )
    assert value("lockstep_gpu_power_watts", 3) < min(
        value("lockstep_gpu_power_watts", i) for i in (0, 1, 2, 4, 5, 6, 7)
    )


def test_simulated_node_gpus_run_the_training_process(collectors: list[GpuCollector]) -> None:
    collector = started(collectors, FakeNvml(sim_gpu.node_spec("healthy")))
    collect(collector)
    gpus = collector.context.gpu_inventory.published()
    assert [(g.index, g.minor_number, g.uuid, g.pci_bus_id) for g in gpus] == [
        (i, i, sim_gpu.GPU_UUIDS[i], sim_gpu.PCI_BUS_IDS[i]) for i in range(8)
    ]
    assert {p.pid for g in gpus for p in g.processes} == {sim_gpu.TRAINING_PID}


def test_nvml_calls_per_gpu_per_round_on_8_gpus_with_18_links(collectors: list[GpuCollector]) -> None:
    fake = FakeNvml(sim_gpu.node_spec("healthy"))
    collector = started(collectors, fake)
    collect(collector)  # enumeration and probing
    fake.reset_calls()
    rounds = 5
    for _ in range(rounds):
        collect(collector)
    per_gpu = [fake.calls_for(gpu=i) / rounds for i in range(8)]
    # + the current PCIe link generation and width (collectors/gpu/pcie.py); + GPM (a sample, the
    # metrics between it and the last round's) and the fabric info (collectors/gpu/gpm.py, issue 13);
    # + the training process's per-process utilisation (collectors/gpu/processes.py, issue 14).
    assert per_gpu == [11 + 2 + 3 + 1] * 8
    assert fake.calls_for(gpu=0, function="nvmlGpmSampleGet") == rounds
    assert fake.calls_for(gpu=0, function="nvmlGpmMetricsGet") == rounds
    assert fake.calls_for(gpu=0, function="nvmlDeviceGetGpuFabricInfoV") == rounds
    assert fake.calls_for(gpu=0, function="nvmlDeviceGetFieldValues") == rounds


def test_a_gpu_falling_off_the_bus_is_reported_at_once_not_at_the_next_interval() -> None:
    """The XID thread sees XID 79 and asks for a round; the agent runs it without waiting 1 h."""
    fake = FakeNvml(FakeSpec(gpus=(with_defaults(FULL, 0), with_defaults(FULL, 1)), xid_events=()))
    available = {"gpu": FastGpuCollector}
    overrides = Overrides(disable_defaults=True, enable=frozenset({"gpu"}))
    setup = Setup(
        None, available, overrides, Seams(NVML.replaced_by(fake), WALL_CLOCK_SEAM.replaced_by(lambda: WALL_CLOCK))
    )
    config = load_config(None, available, overrides)
    hour = dataclasses.replace(config.collectors["gpu"], interval=3600.0, deadline=30.0)
    config = dataclasses.replace(config, collectors={"gpu": hour})
    agent = Agent(setup, config, WebConfig())
    try:
        worker = agent.workers["gpu"]
        worker.first_run_done.wait(10)
        assert worker.view().runs_total == 1
        fake.lose_gpu(1)
        wait_until(lambda: worker.view().runs_total >= 2, timeout=10, what="a round triggered by XID 79")
        body, _ = agent.exporter.render()
        s = samples(body.decode())
        assert s[key("lockstep_gpu_up", gpu="1", uuid=default_uuid(1))] == 0
        assert s[key("lockstep_gpu_up", gpu="0", uuid=default_uuid(0))] == 1
        assert s[key("lockstep_gpu_xid_errors_total", gpu="1", uuid=default_uuid(1), xid="79")] == 1
    finally:
        agent.stop()
