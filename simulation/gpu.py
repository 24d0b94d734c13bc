"""The simulated node's GPUs: a fake NVML with 8 H100 SXM GPUs, 18 NVLinks each.

A training job (Slurm job 4242, training process pid 2200, one rank per GPU) keeps every
GPU busy.  Values are a pure function of (scenario, t): counters (energy, PCIe and NVLink
bytes) grow with t from what a day since the driver was loaded accumulated.

Scenarios:
- ``gpu-lost``: GPU 5 falls off the bus at t=0 (XID 79); NVML answers GPU_IS_LOST for it.
- ``gpu-mig``: GPUs 6 and 7 are partitioned with MIG and serve inference (the training job
  runs on GPUs 0-5).
- ``pcie-degraded`` (defined by the pcie area): GPU 2's PCIe link trained at x8 of x16.
- ``training-finished`` (defined by the workloads area): the job ended, every GPU idles, and its
  PCIe link is down at Gen1 as NVML documents for an idle GPU (which is no degraded link).
- ``gpu-volta``: an older node's GPUs: 8 V100s with NVLink 2 (6 links), page retirement
  instead of row remapping, and the fields Volta lacks probed once and left out.
- ``straggler-thermal`` (defined by the workloads area): from its onset GPU 3 is held ~10 %
  down by sw_thermal_slowdown, hot (89 C).
- ``straggler`` (defined by another area): GPU 3 is throttled: hw_slowdown active, its SM
  clock ~1.4x below its peers' and its power lower.

- ``idle-gpu``: job 4242 holds GPUs 6 and 7 but runs nothing on them (its process has a CUDA
  context there, SM activity is 0);
  ``idle-gpu-free`` (near miss): the same two GPUs idle, and free (the job holds GPUs 0-5, slurm.py).
- ``gpu-recovery``: after an error, the driver asks for GPU 4 to be drained and reset.
- ``gpu-fabric-degraded``: GPU 2's NVSwitch fabric runs at degraded bandwidth; GPU 5 has a route
  recovery in progress (the driver repairing itself: no alert).
- the hang scenarios (timeline.py, issue 35) and ``nccl-hang`` (nccl.py): the ranks that wait in
  a collective leave their GPUs spinning (a kernel at every sample at near-idle power), the rank
  that stopped leaves its GPU idle (its context still open); a save's coordinator (GPU 0) writes
  at low power while the others spin; an evaluation keeps every GPU at work; an ended job idles
  them all.

Other areas can name the GPUs with ``GPU_UUIDS`` and ``PCI_BUS_IDS`` (index i is
/dev/nvidia<i>, minor number i).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from lockstep.agent.seams import MONOTONIC_CLOCK, WALL_CLOCK
from lockstep.collectors.gpu.provider import NVML
from lockstep.simulation import Scenario
from lockstep.simulation.fake_nvml import (
    MIB,
    FakeNvml,
    FakeSpec,
    GpuSpec,
    MigDeviceSpec,
    ProcessSpec,
    XidEventSpec,
    default_uuid,
    with_defaults,
)
from lockstep.simulation.timeline import HANG_RANK, HANG_SCENARIOS, INFERENCE_SCENARIOS, hang_phase, slow

if TYPE_CHECKING:
    from lockstep.simulation import SimulatedNode

SCENARIOS = (
    Scenario("gpu-lost", "GPU 5 fell off the bus (XID 79): it reports lockstep_gpu_up 0, the other GPUs go on."),
    Scenario("gpu-mig", "GPUs 6 and 7 are partitioned with MIG and serve inference; training runs on GPUs 0-5."),
    Scenario(
        "gpu-faults",
        "GPU 1 reports XID 48, GPU 2 uncorrectable ECC errors, GPU 4 a failed row remapping, GPU 6 an NVLink "
        "down, GPU 7 NVLink replays; GPU 3's XID 13 (an application fault) and GPU 0's corrected ECC errors "
        "are no alerts.",
    ),
    Scenario(
        "gpu-nvml-hang",
        "GPU 5 falls off the bus 10 s in and NVML hangs: every call blocks, the GPU collector is stuck, "
        "every GPU series ages out.",
    ),
    Scenario(
        "gpu-throttle",
        "From 10 s in, GPU 2 hovers at its thermal limit (slowed down half of every 20 s) and GPU 5's power "
        "brake holds; GPU 0 has a 3-s thermal blip, GPU 1 touches its limit 10 % of the time, and one NVML call "
        "takes 1.5 s (slow, not hung).",
    ),
    Scenario(
        "idle-gpu",
        "Job 4242 holds GPUs 6 and 7 but runs nothing on them: SM activity 0 for as long as it runs.",
    ),
    Scenario(
        "idle-gpu-free",
        "GPUs 6 and 7 idle and free: job 4242 holds GPUs 0-5 only (a near miss of idle-gpu: no alert).",
    ),
    Scenario(
        "gpu-recovery",
        "After an error the driver asks for GPU 4 to be drained and reset (recovery action drain_and_reset).",
    ),
    Scenario(
        "gpu-fabric-degraded",
        "GPU 2's NVSwitch fabric runs at degraded bandwidth; GPU 5's fabric has a route recovery in progress "
        "(the driver repairing itself: no alert).",
    ),
    Scenario(
        "gpu-volta",
        "An older node: 8 V100s with NVLink 2, page retirement instead of row remapping; "
        "what Volta lacks is probed once and left out.",
    ),
)

GPUS = 8
TRAINING_PID = 2200
DRIVER_UPTIME = 86_400.0  # the driver was loaded a day before the demo starts
# Unix time at t=0: the host area's boot time plus that day.  XID timestamps use it, so
# an exposition of the simulated node is reproducible.
WALL_CLOCK_AT_START = 1_767_225_600 + DRIVER_UPTIME
PCI_BUS_IDS = tuple(f"00000000:{bus}:00.0" for bus in ("18", "2A", "3A", "5D", "9A", "AB", "BA", "DB"))
GPU_UUIDS = tuple(default_uuid(i) for i in range(GPUS))
STRAGGLER_GPU = 3
LOST_GPU = 5
FAULT_AT = 10.0  # gpu-nvml-hang, gpu-throttle: the fault begins 10 s into the demo
XID_AT = 20.0  # gpu-faults: XIDs and uncorrectable ECC errors 20 s into the demo (after the first scrapes)
PCIE_NARROW_GPU = 2  # pcie-degraded: this GPU's link trained at x8
# The training job's GPM activity on every GPU of the healthy node.
SM_ACTIVE_PERCENT = 87.5
PIPE_ACTIVE_PERCENT = {"tensor": 56.25, "tensor_hmma": 56.25, "fp32": 12.5, "fp16": 6.25, "integer": 9.375}


def h100(i: int) -> GpuSpec:
    """GPU i of the healthy training node."""
    used = (71_200 + 37 * i) * MIB
    return GpuSpec(
        uuid=GPU_UUIDS[i],
        pci_bus_id=PCI_BUS_IDS[i],
        minor_number=i,
        model="NVIDIA H100 80GB HBM3",
        architecture="hopper",
        memory_total_bytes=81_559 * MIB,
        memory_used_bytes=used,
        utilization_gpu_percent=96 + i % 3,
        utilization_memory_percent=58 + i,
        sm_clock_mhz=1980,
        sm_clock_max_mhz=1980,
        memory_clock_mhz=2619,
        power_watts=612.0 + 7 * i,
        power_limit_watts=700.0,
        driver_uptime_seconds=DRIVER_UPTIME,
        temperature_celsius=60 + i % 4,
        memory_temperature_celsius=68 + i % 3,
        clock_event_seconds={"sw_power_cap": 1520.5 + 13 * i},
        pcie_transmitted_bytes_per_second=400e6,
        pcie_received_bytes_per_second=1.6e9,
        nvlink_links=18,
        nvlink_transmitted_bytes_per_second=14_648_437 * 1024,  # ~15 GB/s per link and direction
        nvlink_received_bytes_per_second=14_648_437 * 1024,
        processes=(training_process(used - 512 * MIB, 96 + i % 3, 58 + i),),
        # GPM: a BF16 training step, tensor-bound (exact binary fractions, so rates are exact in tests).
        sm_active_percent=SM_ACTIVE_PERCENT,
        sm_occupancy_percent=43.75,
        dram_bandwidth_used_percent=62.5,
        pipe_active_percent=dict(PIPE_ACTIVE_PERCENT),
    )


def training_process(used_memory_bytes: int, sm_percent: int, memory_percent: int) -> ProcessSpec:
    """The training job's rank on a GPU: the only process there, so its per-process
    utilisation is the GPU's."""
    return ProcessSpec(
        pid=TRAINING_PID,
        used_memory_bytes=used_memory_bytes,
        sm_util_percent=sm_percent,
        memory_util_percent=memory_percent,
    )


def kubernetes(gpus: list[GpuSpec]) -> None:
    """The kubernetes scenario's pods (simulation/kubernetes.py) on the GPUs: the trainer keeps
    GPUs 0-3; vLLM's engine core serves on 4 and 5; GPU 6 is idle (an embeddings pod holds it
    through DRA); two notebooks share GPU 7 by time-slicing, alice's busier than bob's."""
    for i in (4, 5):
        engine = ProcessSpec(pid=3101, used_memory_bytes=70_000 * MIB, sm_util_percent=38, memory_util_percent=21)
        gpus[i] = dataclasses.replace(
            gpus[i], processes=(engine,), utilization_gpu_percent=38, utilization_memory_percent=21
        )
    gpus[6] = dataclasses.replace(  # held through a DRA claim by a pod that runs nothing on it yet
        gpus[6],
        processes=(),
        utilization_gpu_percent=0,
        utilization_memory_percent=0,
        memory_used_bytes=0,
        sm_active_percent=0.0,
        sm_occupancy_percent=0.0,
        dram_bandwidth_used_percent=0.0,
        pipe_active_percent={},
    )
    alice = ProcessSpec(pid=4100, used_memory_bytes=30_000 * MIB, sm_util_percent=55, memory_util_percent=30)
    bob = ProcessSpec(pid=4200, used_memory_bytes=12_000 * MIB, sm_util_percent=20, memory_util_percent=12)
    gpus[7] = dataclasses.replace(
        gpus[7],
        processes=(alice, bob),
        utilization_gpu_percent=75,
        utilization_memory_percent=42,
        memory_used_bytes=42_000 * MIB + 512 * MIB,
    )


def throttled(gpu: GpuSpec) -> GpuSpec:
    """The straggler: hardware slowdown engaged, SM clock ~1.4x lower, less power drawn."""
    return dataclasses.replace(
        gpu,
        clock_event_reasons=("hw_slowdown",),
        sm_clock_mhz=round(gpu.sm_clock_max_mhz / 1.4),
        power_watts=430.0,
        temperature_celsius=71,
        utilization_gpu_percent=99,
        processes=tuple(dataclasses.replace(p, sm_util_percent=99) for p in gpu.processes),
    )


def thermally_throttled(gpu: GpuSpec) -> GpuSpec:
    """GPU 3 in ``straggler-thermal``: the driver holds its clock ~10 % down for heat."""
    return dataclasses.replace(
        gpu,
        clock_event_reasons=("sw_thermal_slowdown",),
        sm_clock_mhz=round(gpu.sm_clock_max_mhz / 1.1),
        temperature_celsius=89,
        power_watts=560.0,
    )


def mig(gpu: GpuSpec, devices: tuple[tuple[int, str, int, int], ...]) -> GpuSpec:
    """The GPU in MIG mode with (gpu instance, profile, memory MiB, inference pid) devices."""
    return dataclasses.replace(
        gpu,
        mig_devices=tuple(
            MigDeviceSpec(
                gpu_instance_id=gi,
                profile=profile,
                memory_total_bytes=mib * MIB,
                memory_used_bytes=mib * MIB * 9 // 10,
                # GPM per GPU instance: an H100 slice has 16 SMs; serving keeps them 62 % active.
                sm_count=16 * int(profile.split("g", 1)[0]),
                sm_active_percent=62,
                tensor_active_percent=31,
            )
            for gi, profile, mib, _ in devices
        ),
        processes=tuple(
            ProcessSpec(
                pid=pid, used_memory_bytes=mib * MIB * 9 // 10 - 256 * MIB, gpu_instance_id=gi, compute_instance_id=0
            )
            for gi, _, mib, pid in devices
        ),
        memory_used_bytes=sum(mib * MIB * 9 // 10 for _, _, mib, _ in devices),
        utilization_gpu_percent=0,
        utilization_memory_percent=0,
        power_watts=455.0,
    )


def idle(gpu: GpuSpec) -> GpuSpec:
    """A GPU with no work: no process, idle clocks and power, and its PCIe link down at Gen1, as
    NVML documents for a GPU not in use (nvidia-smi: "may be reduced when the GPU is not in use")."""
    return dataclasses.replace(
        gpu,
        memory_used_bytes=0,
        utilization_gpu_percent=0,
        utilization_memory_percent=0,
        sm_clock_mhz=345,
        power_watts=72.0,
        temperature_celsius=33,
        memory_temperature_celsius=38,
        clock_event_reasons=("idle",),
        processes=(),
        pcie_link_generation=1,
        pcie_transmitted_bytes_per_second=0.0,
        pcie_received_bytes_per_second=0.0,
        nvlink_transmitted_bytes_per_second=0.0,
        nvlink_received_bytes_per_second=0.0,
        sm_active_percent=0.0,  # GPM: nothing runs
        sm_occupancy_percent=0.0,
        dram_bandwidth_used_percent=0.0,
        pipe_active_percent={},
    )


def spinning(gpu: GpuSpec) -> GpuSpec:
    """A rank waiting in a collective: NCCL's kernel polls for its peers on a few SMs, so a
    kernel runs at every sample (utilization 100 %) at near-idle power."""
    return dataclasses.replace(
        gpu,
        utilization_gpu_percent=100,
        utilization_memory_percent=1,
        power_watts=128.0 + (gpu.minor_number or 0),
        processes=tuple(dataclasses.replace(p, sm_util_percent=100, memory_util_percent=1) for p in gpu.processes),
        sm_active_percent=12.5,
        sm_occupancy_percent=1.5625,
        dram_bandwidth_used_percent=0.0,
        pipe_active_percent={"integer": 1.5625},
        nvlink_transmitted_bytes_per_second=0.0,
        nvlink_received_bytes_per_second=0.0,
    )


def stopped(gpu: GpuSpec) -> GpuSpec:
    """A rank that stopped (hung on its CPU, in a data loader, a deadlock): its process keeps its
    context and memory, and its GPU idles."""
    return dataclasses.replace(idle(gpu), processes=gpu.processes, memory_used_bytes=gpu.memory_used_bytes)


def evaluating(gpu: GpuSpec) -> GpuSpec:
    """An evaluation pass: forward only, real work at high power."""
    return dataclasses.replace(gpu, utilization_gpu_percent=92, power_watts=540.0 + (gpu.minor_number or 0))


def hang_gpus(gpus: list[GpuSpec], phase: str) -> list[GpuSpec]:
    """The GPUs of job 4242 in a hang scenario's phase (timeline.hang_phase)."""
    if phase == "hang":
        return [stopped(g) if i == HANG_RANK else spinning(g) for i, g in enumerate(gpus)]
    if phase == "save":  # rank 0, the coordinator, writes; the others wait in a collective
        writing = dataclasses.replace(
            stopped(gpus[0]), utilization_gpu_percent=8, power_watts=110.0, sm_active_percent=6.25
        )
        return [writing, *(spinning(g) for g in gpus[1:])]
    if phase == "evaluate":
        return [evaluating(g) for g in gpus]
    if phase == "ended":
        return [idle(g) for g in gpus]
    return gpus


IDLE_GPUS = (6, 7)  # idle-gpu, idle-gpu-free
RECOVERY_GPU = 4  # gpu-recovery
FABRIC_DEGRADED_GPU = 2  # gpu-fabric-degraded
FABRIC_RECOVERING_GPU = 5


def v100(i: int) -> GpuSpec:
    used = 29_000 * MIB
    return GpuSpec(
        uuid=GPU_UUIDS[i],
        pci_bus_id=PCI_BUS_IDS[i],
        minor_number=i,
        model="Tesla V100-SXM2-32GB",
        architecture="volta",
        vbios_version="88.00.80.00.01",
        memory_total_bytes=32_768 * MIB,
        memory_used_bytes=used,
        utilization_gpu_percent=94,
        utilization_memory_percent=51,
        sm_clock_mhz=1530,
        sm_clock_max_mhz=1530,
        memory_clock_mhz=877,
        power_watts=268.0,
        power_limit_watts=300.0,
        driver_uptime_seconds=DRIVER_UPTIME,
        temperature_celsius=58,
        memory_temperature_celsius=61,
        clock_event_seconds={"sw_power_cap": 310.0},
        retired_pages_single_bit=2 if i == 2 else 0,
        pcie_link_generation=3,  # PCIe Gen3 x16
        pcie_max_link_generation=3,
        nvlink_links=6,
        processes=(training_process(used - 512 * MIB, 94, 51),),
    )


def node_spec(scenario: str, t: float = 0.0) -> FakeSpec:
    """The node's NVML at time t (only gpu-faults changes with t)."""
    if scenario == "gpu-volta":
        return FakeSpec(gpus=tuple(v100(i) for i in range(GPUS)), driver_version="535.183.06")
    gpus = [h100(i) for i in range(GPUS)]
    if scenario == "straggler":
        gpus[STRAGGLER_GPU] = throttled(gpus[STRAGGLER_GPU])
    elif scenario == "gpu-lost":
        gpus[LOST_GPU] = dataclasses.replace(gpus[LOST_GPU], lost_at=0.0)
    elif scenario in ("idle-gpu", "idle-gpu-free"):
        for i in IDLE_GPUS:
            gpus[i] = idle(gpus[i])
            if scenario == "idle-gpu":
                # The job's process opened a CUDA context on the GPU (its memory is taken) and runs
                # nothing there: the job holds the GPU.  (The simulated node has no gres.conf, so
                # the Slurm collector attributes GPUs to jobs by their processes.)
                context = ProcessSpec(pid=TRAINING_PID, used_memory_bytes=512 * MIB)
                gpus[i] = dataclasses.replace(gpus[i], processes=(context,), memory_used_bytes=1024 * MIB)
    elif scenario == "gpu-recovery":
        gpus[RECOVERY_GPU] = dataclasses.replace(gpus[RECOVERY_GPU], recovery_action="drain_and_reset")
    elif scenario == "gpu-fabric-degraded":
        gpus[FABRIC_DEGRADED_GPU] = dataclasses.replace(
            gpus[FABRIC_DEGRADED_GPU], fabric_health=("degraded_bandwidth",)
        )
        gpus[FABRIC_RECOVERING_GPU] = dataclasses.replace(
            gpus[FABRIC_RECOVERING_GPU], fabric_health=("route_recovery",)
        )
    elif scenario == "pcie-degraded":
        gpus[PCIE_NARROW_GPU] = dataclasses.replace(gpus[PCIE_NARROW_GPU], pcie_link_width=8)
    elif scenario in HANG_SCENARIOS:
        gpus = hang_gpus(gpus, hang_phase(scenario, t))
    elif scenario == "nccl-hang":
        gpus = [spinning(g) for g in gpus]  # this node's 8 ranks wait for rank 13 (node002), dead
    elif scenario == "training-finished":
        gpus = [idle(g) for g in gpus]  # the job ended: every GPU idles, its link at Gen1
    elif scenario in ("kv-pressure", *INFERENCE_SCENARIOS):
        # The workloads area's vLLM server (pid 3100) runs its engine core, pid 3101, on GPU 7.
        serving = ProcessSpec(pid=3101, used_memory_bytes=70_000 * MIB)
        gpus[7] = dataclasses.replace(gpus[7], processes=(*gpus[7].processes, serving))
    elif scenario == "kubernetes":
        kubernetes(gpus)
    elif scenario == "gpu-nvml-hang":
        gpus[LOST_GPU] = dataclasses.replace(gpus[LOST_GPU], lost_at=FAULT_AT)
        return FakeSpec(gpus=tuple(with_defaults(g, i) for i, g in enumerate(gpus)), hang_from=FAULT_AT)
    elif scenario == "gpu-throttle":
        duty = {
            0: ("hw_thermal_slowdown", (FAULT_AT, 1e9, 3.0)),  # one 3-s blip
            1: ("sw_thermal_slowdown", (0.0, 20.0, 2.0)),  # 10 % of the time
            2: ("hw_thermal_slowdown", (FAULT_AT, 20.0, 10.0)),  # 50 %: hovering at its limit
            5: ("hw_power_brake", (FAULT_AT, 1e9, 1e9)),  # from FAULT_AT on
        }
        for i, (reason, cycle) in duty.items():
            gpus[i] = dataclasses.replace(gpus[i], clock_event_duty={reason: cycle})
        # ... and one NVML call takes 1.5 s, within the GPU collector's deadline.
        return FakeSpec(
            gpus=tuple(with_defaults(g, i) for i, g in enumerate(gpus)), slow_call_at=FAULT_AT, slow_call_seconds=1.5
        )
    elif scenario == "gpu-faults":
        faulty = t >= XID_AT
        gpus[0] = dataclasses.replace(gpus[0], ecc_corrected=40 + int(max(0.0, t)))  # corrected: no alert
        gpus[2] = dataclasses.replace(gpus[2], ecc_uncorrected=2 if faulty else 0)
        gpus[4] = dataclasses.replace(gpus[4], remapped_rows_uncorrectable=8, remapped_rows_failed=True)
        gpus[6] = dataclasses.replace(gpus[6], nvlink_down=(3,))
        gpus[7] = dataclasses.replace(gpus[7], nvlink_errors={"replay": 100 + int(max(0.0, t))})  # 60 a minute
        xids = (XidEventSpec(gpu=1, xid=48, at=XID_AT), XidEventSpec(gpu=3, xid=13, at=XID_AT))
        return FakeSpec(gpus=tuple(with_defaults(g, i) for i, g in enumerate(gpus)), xid_events=xids)
    elif scenario == "gpu-mig":
        gpus[6] = mig(gpus[6], ((1, "3g.40gb", 40_192, 3101), (2, "3g.40gb", 40_192, 3102)))
        gpus[7] = mig(
            gpus[7], ((1, "4g.40gb", 40_192, 3201), (5, "2g.20gb", 20_096, 3202), (13, "1g.10gb", 9_856, 3203))
        )
    return FakeSpec(gpus=tuple(with_defaults(g, i) for i, g in enumerate(gpus)))


def build(node: SimulatedNode, t: float) -> None:
    # This area puts its fake NVML in the seams at the first build; later builds change it.
    fake = node.seams.get(NVML)
    fake = fake if isinstance(fake, FakeNvml) else None
    if node.scenario == "straggler-thermal" and fake is not None and slow(node.scenario, t):
        # The throttle begins at the workloads area's onset: the fake serves the new spec from now on.
        if fake.spec.gpus[STRAGGLER_GPU].clock_event_reasons != ("sw_thermal_slowdown",):
            gpus = list(fake.spec.gpus)
            gpus[STRAGGLER_GPU] = thermally_throttled(gpus[STRAGGLER_GPU])
            fake.spec = dataclasses.replace(fake.spec, gpus=tuple(gpus))
    if fake is None:
        fake = FakeNvml(node_spec(node.scenario))
        node.seams.replace(NVML.replaced_by(fake))
        if node.seams.get(WALL_CLOCK) is None:
            node.seams.replace(WALL_CLOCK.replaced_by(lambda: WALL_CLOCK_AT_START + node.t))
        # The collectors' intervals in simulated time too (agent/seams.py): GPM's sample spacing
        # (a round asked for at once after an XID is then never 100 ms after the last one, however
        # slow the machine running the node), idle training and NCCL ranks, inference probes.
        node.seams.replace(MONOTONIC_CLOCK.replaced_by(lambda: node.t))
    if node.scenario == "gpu-faults" or node.scenario in HANG_SCENARIOS:
        fake.spec = node_spec(node.scenario, t)  # its counters (gpu-faults) or its job's phase change with t
    fake.set_time(t)
