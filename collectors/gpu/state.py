"""What the GPU collector knows about each GPU in an NVML session, and the types the readers
share: ``GpuState`` (one GPU), the field uses it still asks for (``FieldUse``), its GPM state
(``GpmUse``, ``GpmTarget``, ``GpmState``), and ``Sample``, one value of a round.

It imports none of the readers (fields, gpm, mig, pcie, processes, reading, xid): they all
import it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lockstep.agent.collector import MetricSpec
from lockstep.agent.gpus import MigDevice
from lockstep.collectors.gpu.provider import DeviceHandle

# One value of a round: (metric, label values, value).
Sample = tuple[MetricSpec, tuple[str, ...], float]


@dataclass(frozen=True)
class FieldUse:
    """One NVML field and where its value goes: metric, extra label values, scale to base units."""

    field: str  # pynvml constant name, e.g. NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION
    spec: MetricSpec | None  # None: handled specially (link state, recovery action)
    labels: tuple[str, ...] = ()
    scale: float = 1.0


@dataclass(frozen=True)
class GpmUse:
    """One GPM metric and where its value goes."""

    metric: str  # pynvml constant name, e.g. NVML_GPM_METRIC_SM_CYCLES_ACTIVE
    spec: MetricSpec
    labels: tuple[str, ...] = ()
    cumulative: bool = False  # a count since boot at sample2; else an average between the samples
    # A windowed metric that says the same as a cumulative one: not needed once that one answers.
    covered_by: str = ""

    def value(self, number: float) -> float:
        return number if self.cumulative else number / 100  # windowed metrics are percentages


@dataclass
class GpmTarget:
    """The whole GPU (gpu_instance_id None) or one MIG GPU instance: its two sample buffers."""

    gpu_instance_id: int | None
    previous: Any  # c_nvmlGpmSample_t holding the last round's sample (or the enumeration's)
    current: Any
    sampled: bool = False  # previous holds a sample
    sampled_at: float = 0.0  # monotonic time of the sample in previous
    rounds: int = 0  # metrics computed so far: windowed ones only from the second on


@dataclass
class GpmState:
    """One GPU's GPM: the metrics still asked for, and its sample buffers."""

    uses: list[tuple[GpmUse, int]]  # (use, metric id) still asked for
    targets: dict[int | None, GpmTarget] = field(default_factory=dict)

    def buffers(self) -> list[Any]:
        return [b for t in self.targets.values() for b in (t.previous, t.current)]


@dataclass
class GpuState:
    """What the collector knows about one GPU in the current NVML session."""

    index: int
    handle: DeviceHandle
    uuid: str = ""
    pci_bus_id: str = ""
    minor_number: int | None = None
    model: str = ""
    vbios_version: str = ""
    sm_clock_max_hz: float | None = None
    links: int = 0
    lost: bool = False
    # Per-process utilisation (processes.py), NVML µs: asked since the newest sample of the round
    # before the last one, so that a round right after another (an XID) sees the same samples.
    process_samples_since: int = 0
    process_samples_newest: int = 0
    field_uses: list[tuple[FieldUse, int, int]] = field(default_factory=list)  # (use, id, scopeId) still asked for
    unsupported: set[str] = field(default_factory=set)  # calls and fields found unsupported
    link_state_by_call: bool = False  # the link state field is unsupported: ask per link
    mig_cache: dict[str, MigDevice] = field(default_factory=dict)
    gpm: GpmState | None = None  # None: no GPM (gpm_absent says why)
    gpm_absent: str = ""
    pcie_max_generation: int | None = None  # asked once per session (collectors/gpu/pcie.py)
    pcie_max_width: int | None = None

    @property
    def labels(self) -> tuple[str, str]:
        return (str(self.index), self.uuid)
