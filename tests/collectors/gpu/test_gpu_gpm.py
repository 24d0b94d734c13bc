"""GPU activity from GPM (Hopper and newer), health verdicts (recovery action, NVSwitch fabric)
and lifetime ECC counts, against the fake NVML, which implements GPM with pynvml's own
structures (c_nvmlGpmMetricsGet_t, c_nvmlGpmSample_t) and per-metric return codes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pynvml
import pytest

from lockstep.collectors.gpu import GpuCollector
from lockstep.simulation import gpu as sim_gpu
from lockstep.simulation.fake_nvml import FakeNvml, GpuSpec, MigDeviceSpec, fake_from_gpus
from tests.support import lockstep
from tests.support.gpu import collect, key, make

PIPES = ("tensor", "tensor_hmma", "tensor_imma", "tensor_dmma", "tensor_dfma", "fp64", "fp32", "fp16", "integer")


@pytest.fixture
def made() -> Iterator[list[GpuCollector]]:
    collectors: list[GpuCollector] = []
    yield collectors
    for collector in collectors:
        collector.close()


def rounds_at(fake: FakeNvml, collector: GpuCollector, times: list[float]) -> list[dict]:
    out = []
    for t in times:
        fake.set_time(t)
        out.append(collect(collector))
    return out


def rate(first: dict, second: dict, seconds: float, name: str, **labels: str) -> float:
    """What Prometheus' rate() gives over the window (no counter reset in between)."""
    return (second[key(name, **labels)] - first[key(name, **labels)]) / seconds


def test_simulated_hopper_node_rate_of_the_counters_is_the_activity_the_spec_gives(made: list) -> None:
    fake = FakeNvml(sim_gpu.node_spec("healthy"))
    collector = make(fake)
    made.append(collector)
    first, second, third = rounds_at(fake, collector, [0.0, 10.0, 70.0])
    for gpu in range(8):
        g = {"gpu": str(gpu), "uuid": sim_gpu.GPU_UUIDS[gpu], "gpu_instance_id": ""}
        for a, b, seconds in ((first, second, 10.0), (second, third, 60.0), (first, third, 70.0)):
            cycles = rate(a, b, seconds, "lockstep_gpu_sm_cycles_total", **g)
            assert cycles == 132 * 1980e6  # 132 SMs at 1980 MHz
            assert rate(a, b, seconds, "lockstep_gpu_sm_active_cycles_total", **g) / cycles == 0.875
            for pipe in PIPES:
                active = rate(a, b, seconds, "lockstep_gpu_pipe_active_cycles_total", **g, pipe=pipe) / cycles
                assert active == sim_gpu.PIPE_ACTIVE_PERCENT.get(pipe, 0) / 100, pipe
        # Windowed metrics are averages between two rounds' samples: from the second round on.
        assert key("lockstep_gpu_sm_occupancy_ratio", **g) not in first
        assert third[key("lockstep_gpu_sm_occupancy_ratio", **g)] == 0.4375
        assert third[key("lockstep_gpu_dram_bandwidth_used_ratio", **g)] == 0.625
        # The driver has the counters: the same activity is not also exported as a ratio gauge.
        assert {k[0] for k in third} & {"lockstep_gpu_sm_active_ratio", "lockstep_gpu_pipe_active_ratio"} == set()
        assert not [k for k in third if k[0] == "lockstep_gpu_nvml_errors_total"]


def test_a_driver_without_cumulative_metrics_gives_ratio_gauges_averaged_over_the_interval(made: list) -> None:
    spec = GpuSpec(
        gpm_cumulative=False, sm_active_percent=50, sm_occupancy_percent=25, pipe_active_percent={"tensor": 37.5}
    )
    fake = fake_from_gpus([spec])
    collector = make(fake)
    made.append(collector)
    first, second, third = rounds_at(fake, collector, [0.0, 10.0, 20.0])
    g = {"gpu": "0", "uuid": fake.spec.gpus[0].uuid, "gpu_instance_id": ""}
    names = {k[0] for k in first}
    assert not names & {"lockstep_gpu_sm_cycles_total", "lockstep_gpu_sm_active_ratio"}
    for s in (second, third):
        assert s[key("lockstep_gpu_sm_active_ratio", **g)] == 0.5
        assert s[key("lockstep_gpu_pipe_active_ratio", **g, pipe="tensor")] == 0.375
        assert s[key("lockstep_gpu_pipe_active_ratio", **g, pipe="fp64")] == 0
        assert s[key("lockstep_gpu_sm_occupancy_ratio", **g)] == 0.25
        assert "lockstep_gpu_sm_cycles_total" not in {k[0] for k in s}
        assert not [k for k in s if k[0] == "lockstep_gpu_nvml_errors_total"]  # NOT_SUPPORTED is no error
    assert "activity" not in collector.check()  # GPM is there, only without counters: nothing to explain


def test_ampere_has_no_gpm_metrics_no_errors_and_doctor_says_why(made: list) -> None:
    fake = fake_from_gpus([GpuSpec(architecture="ampere", model="NVIDIA A100-SXM4-80GB", sm_active_percent=90)] * 2)
    collector = make(fake)
    made.append(collector)
    for s in rounds_at(fake, collector, [0.0, 10.0, 20.0]):
        names = {k[0] for k in s}
        assert not [n for n in names if "cycles" in n or n.endswith(("occupancy_ratio", "bandwidth_used_ratio"))]
        assert "lockstep_gpu_sm_active_ratio" not in names and "lockstep_gpu_nvml_errors_total" not in names
    # Asked once per NVML session, never sampled.
    assert fake.calls[("nvmlGpmQueryDeviceSupport", 0)] == 1
    assert fake.calls_for(gpu=0, function="nvmlGpmSampleGet") == 0
    assert fake.calls_for(function="nvmlGpmSampleAlloc") == 0
    note = collector.check()
    assert "GPU 0, 1: no SM, tensor or DRAM activity metrics: the GPU has no GPM (Hopper and newer have it)" in note
    assert len([line for line in note.split("; ") if "GPM" in line]) == 1


def test_a_driver_without_gpm_is_said_once(made: list) -> None:
    fake = fake_from_gpus([GpuSpec(unsupported=frozenset({"nvmlGpmQueryDeviceSupport"}))])
    collector = make(fake)
    made.append(collector)
    rounds_at(fake, collector, [0.0, 10.0])
    assert fake.calls[("nvmlGpmQueryDeviceSupport", 0)] == 1
    assert "no SM, tensor or DRAM activity metrics: the driver has no GPM (R520 and newer have it)" in collector.check()


def test_mig_instances_have_the_same_metrics_per_gpu_instance(made: list) -> None:
    devices = (
        MigDeviceSpec(
            gpu_instance_id=1, profile="3g.40gb", sm_count=60, sm_active_percent=75, tensor_active_percent=50
        ),
        MigDeviceSpec(gpu_instance_id=2, profile="3g.40gb", sm_count=60, sm_active_percent=25),
    )
    fake = fake_from_gpus([GpuSpec(mig_devices=devices, sm_active_percent=99)])
    collector = make(fake)
    made.append(collector)
    first, second, third = rounds_at(fake, collector, [0.0, 10.0, 30.0])
    uuid = fake.spec.gpus[0].uuid
    for gi, active, tensor in (("1", 0.75, 0.5), ("2", 0.25, 0.0)):
        g = {"gpu": "0", "uuid": uuid, "gpu_instance_id": gi}
        cycles = rate(second, third, 20.0, "lockstep_gpu_sm_cycles_total", **g)
        assert cycles == 60 * 1980e6
        assert rate(second, third, 20.0, "lockstep_gpu_sm_active_cycles_total", **g) / cycles == active
        assert rate(second, third, 20.0, "lockstep_gpu_pipe_active_cycles_total", **g, pipe="tensor") / cycles == tensor
        assert key("lockstep_gpu_sm_occupancy_ratio", **g) in third
    # In MIG mode the whole GPU is not sampled: its instances are, two calls each a round.
    assert key("lockstep_gpu_sm_cycles_total", gpu="0", uuid=uuid, gpu_instance_id="") not in third
    # The whole GPU was refused once, at enumeration (MIG mode not known yet): GPM stays on, no error.
    assert fake.calls_for(gpu=0, function="nvmlGpmSampleGet") == 1
    assert fake.calls_for(function="nvmlGpmSampleAlloc") == 2 + 2 * 2  # the whole GPU's pair, each instance's
    assert not [k for k in third if k[0] == "lockstep_gpu_nvml_errors_total"]
    fake.reset_calls()
    fake.set_time(40.0)
    collect(collector)
    assert fake.calls_for(gpu=0, function="nvmlGpmMigSampleGet") == 2
    assert fake.calls_for(gpu=0, function="nvmlGpmMetricsGet") == 2
    assert fake.calls_for(gpu=0, function="nvmlGpmSampleGet") == 0


def test_gpm_buffers_are_freed_when_the_session_ends(made: list) -> None:
    fake = fake_from_gpus([GpuSpec(), GpuSpec()])
    collector = make(fake)
    rounds_at(fake, collector, [0.0, 10.0])
    assert len(fake.gpm.samples) == 4
    collector.close()
    assert fake.gpm.samples == {}


def test_recovery_action_fabric_health_and_lifetime_ecc(made: list) -> None:
    fake = fake_from_gpus(
        [
            GpuSpec(recovery_action="drain_and_reset", ecc_aggregate_uncorrected=4, ecc_uncorrected=1),
            GpuSpec(fabric_health=("degraded_bandwidth", "route_recovery")),
            GpuSpec(fabric_state="in_progress"),
            GpuSpec(fabric_registration_failed=True),
            GpuSpec(fabric_state="not_supported"),  # no NVSwitch: a PCIe card
        ]
    )
    collector = make(fake)
    made.append(collector)
    _, s = rounds_at(fake, collector, [0.0, 10.0])
    uuids = [g.uuid for g in fake.spec.gpus]

    def g(i: int) -> dict[str, str]:
        return {"gpu": str(i), "uuid": uuids[i]}

    actions = {
        dict(k[1])["action"]: v
        for k, v in s.items()
        if k[0] == "lockstep_gpu_recovery_action" and g(0).items() <= dict(k[1]).items()
    }
    assert actions == {
        "none": 0,
        "gpu_reset": 0,
        "node_reboot": 0,
        "drain_p2p": 0,
        "drain_and_reset": 1,
        "recover_imex_domain": 0,
        "bus_reset": 0,
        "system_reboot": 0,
    }
    assert s[key("lockstep_gpu_ecc_aggregate_errors_total", **g(0), type="uncorrected")] == 5
    assert s[key("lockstep_gpu_ecc_errors_total", **g(0), type="uncorrected")] == 1

    def health(i: int) -> dict[str, float]:
        return {
            dict(k[1])["condition"]: v
            for k, v in s.items()
            if k[0] == "lockstep_gpu_fabric_health" and dict(k[1])["gpu"] == str(i)
        }

    def state(i: int) -> dict[str, float]:
        return {
            dict(k[1])["state"]: v
            for k, v in s.items()
            if k[0] == "lockstep_gpu_fabric_state" and dict(k[1])["gpu"] == str(i)
        }

    assert health(1) == {
        "registration_failed": 0,
        "degraded_bandwidth": 1,
        "route_recovery": 1,
        "route_unhealthy": 0,
        "access_timeout_recovery": 0,
    }
    assert state(2) == {"not_started": 0, "in_progress": 1, "completed": 0}
    assert "registration_failed" not in health(2)  # only known once registration completed
    assert health(3)["registration_failed"] == 1
    assert state(4) == {} and health(4) == {}
    # A GPU without a fabric is asked once, then no more.
    assert fake.calls[("nvmlDeviceGetGpuFabricInfoV", 4)] == 1
    assert fake.calls[("nvmlDeviceGetGpuFabricInfoV", 1)] == 2


def test_gpm_buffers_are_freed_when_a_session_fails_to_open(made: list) -> None:
    """NVML breaks while the second GPU is enumerated: the first one's buffers are freed with the session."""
    fake = fake_from_gpus([GpuSpec(), GpuSpec()])
    fake.fail("nvmlDeviceGetUUID", pynvml.NVMLError_Uninitialized, gpu=1)
    collector = make(fake)
    made.append(collector)
    with pytest.raises(RuntimeError, match="NVML initialisation failed"):
        collect(collector)
    assert fake.calls[("nvmlGpmSampleAlloc", None)] == 2  # GPU 0's pair
    assert fake.gpm.samples == {}


@pytest.mark.real
def test_lockstep_doctor_says_in_one_line_why_an_ampere_node_has_no_activity(tmp_path: Path) -> None:
    spec = tmp_path / "gpus.yml"
    spec.write_text("defaults:\n  architecture: ampere\n  model: NVIDIA A100-SXM4-80GB\ngpus: 2\n")
    result = lockstep("doctor", "--gpu.fake-nvml", str(spec))
    gpu_lines = [line for line in result.stdout.splitlines() if line.startswith("gpu ")]
    assert len(gpu_lines) == 1, result.stdout + result.stderr
    assert (
        "GPU 0, 1: no SM, tensor or DRAM activity metrics: the GPU has no GPM (Hopper and newer have it)"
        in (gpu_lines[0])
    )


def test_each_gpm_metric_is_checked_by_its_own_return_code(made: list) -> None:
    """nvmlGpmMetricsGet succeeds as a whole; one metric failing is counted and asked again, the
    others are exported; an unsupported one is dropped for good."""
    fake = fake_from_gpus([GpuSpec(sm_active_percent=50, sm_occupancy_percent=25)])
    fake.fail_gpm_metric(0, "NVML_GPM_METRIC_SM_CYCLES_ACTIVE", pynvml.NVML_ERROR_UNKNOWN)
    fake.fail_gpm_metric(0, "NVML_GPM_METRIC_DRAM_BW_UTIL", pynvml.NVML_ERROR_NOT_SUPPORTED)
    collector = make(fake)
    made.append(collector)
    rounds = rounds_at(fake, collector, [0.0, 10.0, 20.0])
    g = {"gpu": "0", "uuid": fake.spec.gpus[0].uuid}
    last = rounds[-1]
    assert key("lockstep_gpu_sm_active_cycles_total", **g, gpu_instance_id="") not in last
    assert last[key("lockstep_gpu_sm_cycles_total", **g, gpu_instance_id="")] == 132 * 1980e6 * 20
    assert last[key("lockstep_gpu_sm_occupancy_ratio", **g, gpu_instance_id="")] == 0.25
    # Without its counter, SM activity comes from the windowed metric (from the second round on).
    assert last[key("lockstep_gpu_sm_active_ratio", **g, gpu_instance_id="")] == 0.5
    assert key("lockstep_gpu_dram_bandwidth_used_ratio", **g, gpu_instance_id="") not in last
    # Asked every round, failing every round: counted 3 times, never dropped.
    assert last[key("lockstep_gpu_nvml_errors_total", **g, error="unknown")] == 3


def test_a_round_too_soon_after_the_last_reads_the_counters_and_keeps_its_window(made: list) -> None:
    """NVML wants GPM samples at least 100 ms apart: a round sooner than that (one run at once
    after an XID) exports the counters but no windowed average, and the next average spans both."""
    fake = fake_from_gpus([GpuSpec(sm_active_percent=50, sm_occupancy_percent=25)])
    collector = make(fake)
    made.append(collector)
    collector.reader.gpm_min_interval = 3600.0  # every round is "too soon"
    g = {"gpu": "0", "uuid": fake.spec.gpus[0].uuid, "gpu_instance_id": ""}
    rounds = rounds_at(fake, collector, [0.0, 10.0, 20.0])
    for s in rounds:
        assert key("lockstep_gpu_sm_occupancy_ratio", **g) not in s
        assert not [k for k in s if k[0] == "lockstep_gpu_nvml_errors_total"]
    assert [s[key("lockstep_gpu_sm_cycles_total", **g)] for s in rounds] == [132 * 1980e6 * t for t in (0, 10, 20)]
    session = collector.sessions.session
    assert session is not None and session.gpus[0].gpm is not None
    window_start = session.gpus[0].gpm.targets[None].previous
    assert fake.gpm.sample(window_start).t == 0.0  # the window still starts at the first round
    collector.reader.gpm_min_interval = 0.0
    fake.set_time(30.0)
    assert collect(collector)[key("lockstep_gpu_sm_occupancy_ratio", **g)] == 0.25
