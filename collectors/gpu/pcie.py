"""A GPU's PCIe link from NVML: the generation and width it trained at, and the most it can do.

Two NVML calls per GPU and round (current generation and width); the maxima are asked once per
NVML session, since neither the GPU's nor its slot's capability changes while the driver runs
(a GPU reset or a hotplug starts a new session).

Traps (NVML reference, nvidia-smi's pcie.link.* fields):
- ``nvmlDeviceGetMaxPcieLinkGeneration`` / ``...Width`` are the maxima of the GPU *and the system*
  together (a Gen5 GPU in a Gen4 slot reports 4), which is what a link can train at;
  ``nvmlDeviceGetGpuMaxPcieLinkGeneration`` is the GPU's own, which would call every Gen5 GPU in a
  Gen4 server degraded forever, so it is not used;
- the current generation and width "may be reduced when the GPU is not in use": an idle GPU
  drops its link to save power.  The values are exported as they are; the alert rule
  (LockstepPCIeLinkDegraded) judges a GPU's link only while the GPU is busy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lockstep.agent.collector import MetricSpec
from lockstep.collectors.gpu.metrics import GPU
from lockstep.collectors.gpu.provider import NvmlProvider
from lockstep.collectors.gpu.state import GpuState, Sample

if TYPE_CHECKING:  # calls.py imports pynvml, which the collector's declarations must not (issue 47)
    from lockstep.collectors.gpu.calls import NvmlCalls

LINK_GENERATION = MetricSpec(
    "lockstep_gpu_pcie_link_generation",
    "gauge",
    "PCIe generation the GPU's link runs at now (NVML current link generation).  An idle GPU lowers it to save "
    "power: compare it with the maximum only while the GPU is busy.",
    GPU,
)
LINK_MAX_GENERATION = MetricSpec(
    "lockstep_gpu_pcie_link_max_generation",
    "gauge",
    "Highest PCIe generation the GPU's link can run at: the lower of the GPU's and its slot's (NVML max link "
    "generation of the device and system).",
    GPU,
)
LINK_WIDTH = MetricSpec(
    "lockstep_gpu_pcie_link_width_lanes",
    "gauge",
    "Lanes the GPU's PCIe link runs with now (NVML current link width).  NVML notes it may be reduced too while "
    "the GPU is not in use.",
    GPU,
)
LINK_MAX_WIDTH = MetricSpec(
    "lockstep_gpu_pcie_link_max_width_lanes",
    "gauge",
    "Most lanes the GPU's PCIe link can run with: the lower of the GPU's and its slot's (NVML max link width).",
    GPU,
)
PCIE_LINK_METRICS = (LINK_GENERATION, LINK_MAX_GENERATION, LINK_WIDTH, LINK_MAX_WIDTH)
# Which call feeds which metric (for doctor's note on what a GPU cannot give).
PCIE_LINK_CALLS: dict[str, tuple[MetricSpec, ...]] = {
    "nvmlDeviceGetCurrPcieLinkGeneration": (LINK_GENERATION,),
    "nvmlDeviceGetMaxPcieLinkGeneration": (LINK_MAX_GENERATION,),
    "nvmlDeviceGetCurrPcieLinkWidth": (LINK_WIDTH,),
    "nvmlDeviceGetMaxPcieLinkWidth": (LINK_MAX_WIDTH,),
}


def read_pcie_link(calls: NvmlCalls, nvml: NvmlProvider, gpu: GpuState) -> list[Sample]:
    """The GPU's link values: current every round, maxima once per session (asked again only
    after a transient failure; an unsupported call is not asked again)."""
    call = calls.optional
    h = gpu.handle
    if gpu.pcie_max_generation is None:
        gpu.pcie_max_generation = call(
            gpu, "nvmlDeviceGetMaxPcieLinkGeneration", nvml.nvmlDeviceGetMaxPcieLinkGeneration, h
        )
    if gpu.pcie_max_width is None:
        gpu.pcie_max_width = call(gpu, "nvmlDeviceGetMaxPcieLinkWidth", nvml.nvmlDeviceGetMaxPcieLinkWidth, h)
    values = (
        (
            LINK_GENERATION,
            call(gpu, "nvmlDeviceGetCurrPcieLinkGeneration", nvml.nvmlDeviceGetCurrPcieLinkGeneration, h),
        ),
        (LINK_MAX_GENERATION, gpu.pcie_max_generation),
        (LINK_WIDTH, call(gpu, "nvmlDeviceGetCurrPcieLinkWidth", nvml.nvmlDeviceGetCurrPcieLinkWidth, h)),
        (LINK_MAX_WIDTH, gpu.pcie_max_width),
    )
    return [(spec, gpu.labels, value) for spec, value in values if value is not None]
