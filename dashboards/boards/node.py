"""One node's host resources, pressure, filesystems, GPUs and PCIe links."""

from __future__ import annotations

from dashboards.board import Board
from dashboards.panels import GREEN, NONE_BAD, ORANGE, RATE, RED, SEL, Cell, above, stat, table, timeseries
from lockstep import thresholds as T

# The PCIe links table's columns: (GPU metric, HCA/NVMe metric), one query each.
PCIE_LINK_COLUMNS = (
    ("lockstep_gpu_pcie_link_generation", "lockstep_pcie_link_generation"),
    ("lockstep_gpu_pcie_link_max_generation", "lockstep_pcie_link_max_generation"),
    ("lockstep_gpu_pcie_link_width_lanes", "lockstep_pcie_link_width_lanes"),
    ("lockstep_gpu_pcie_link_max_width_lanes", "lockstep_pcie_link_max_width_lanes"),
)


def pcie_links(gpu_metric: str, device_metric: str) -> str:
    """One value per link, named 'GPU <n>' or by its device, so the four columns merge into rows."""
    return (
        f"max by (instance, link) (\n"
        f'  label_replace({gpu_metric}{{{SEL}}}, "link", "GPU $1", "gpu", "(.*)")\n'
        f'  or label_replace({device_metric}{{{SEL}}}, "link", "$1", "device", "(.*)")\n'
        f")"
    )


def host_resources() -> list[Cell]:
    """CPU, memory, load, pressure stall and blocked tasks."""
    return [
        timeseries(
            "CPU busy",
            [
                (
                    f'1 - sum by (instance) (rate(lockstep_host_cpu_seconds_total{{mode="idle", {SEL}}}[{RATE}]))'
                    f" / sum by (instance) (rate(lockstep_host_cpu_seconds_total{{{SEL}}}[{RATE}]))",
                    "{{instance}}",
                )
            ],
            "percentunit",
            width=8,
        ),
        timeseries(
            "Memory available",
            [
                (f"lockstep_host_memory_available_bytes{{{SEL}}}", "{{instance}} available"),
                (f"lockstep_host_memory_total_bytes{{{SEL}}}", "{{instance}} total"),
            ],
            "bytes",
            width=8,
        ),
        timeseries(
            "Load",
            [
                (f"lockstep_host_load1{{{SEL}}}", "{{instance}} 1m"),
                (f"lockstep_host_load15{{{SEL}}}", "{{instance}} 15m"),
            ],
            "short",
            width=8,
        ),
        timeseries(
            "Pressure stall (share of time)",
            [
                (
                    f"rate(lockstep_host_pressure_stalled_seconds_total{{{SEL}}}[{RATE}])",
                    "{{instance}} {{resource}} {{kind}}",
                )
            ],
            "percentunit",
            "Share of time some (or all: full) tasks waited for CPU, memory or I/O. "
            f"LockstepIOStall fires when io full stays above {T.IO_FULL_PRESSURE_RATIO:.0%} (5 min) "
            "for 10 minutes.",
            above((T.IO_FULL_PRESSURE_RATIO, RED)),
        ),
        timeseries(
            "Blocked tasks and dirty memory",
            [
                (f"lockstep_host_processes_blocked{{{SEL}}}", "{{instance}} tasks in D state"),
                (f"lockstep_host_memory_dirty_bytes{{{SEL}}} / 2^20", "{{instance}} dirty MiB"),
            ],
            "short",
            "Tasks stuck in the kernel (D state, typically on storage) and page cache waiting to be written.",
        ),
    ]


def filesystems() -> list[Cell]:
    """Space left on each filesystem."""
    return [
        table(
            "Filesystems: space left",
            [(f"mountpoint:lockstep_filesystem_available_bytes:ratio{{{SEL}}}", "")],
            "percentunit",
            f"LockstepFilesystemAlmostFull fires below {T.FILESYSTEM_AVAILABLE_CRITICAL_RATIO:.0%}, or below "
            f"{T.FILESYSTEM_AVAILABLE_PREDICT_RATIO:.0%} when filling up within a day.",
            [
                {"color": RED, "value": None},
                {"color": ORANGE, "value": T.FILESYSTEM_AVAILABLE_CRITICAL_RATIO},
                {"color": GREEN, "value": T.FILESYSTEM_AVAILABLE_PREDICT_RATIO},
            ],
        ),
    ]


def gpus() -> list[Cell]:
    """The node's GPUs and their utilization."""
    return [
        table("GPUs", [(f"lockstep_gpu_info{{{SEL}}}", "")], "none", hide=("Time", "__name__", "job", "Value")),
        timeseries(
            "GPU utilization",
            [(f"lockstep_gpu_utilization_ratio{{{SEL}}}", "{{instance}} GPU {{gpu}}")],
            "percentunit",
        ),
    ]


def pcie() -> list[Cell]:
    """PCIe links against their maximum, and AER errors and replays."""
    return [
        table(
            "PCIe links",
            [(pcie_links(gpu_metric, device_metric), "") for gpu_metric, device_metric in PCIE_LINK_COLUMNS],
            "none",
            "Every GPU's (NVML) and every HCA's and NVMe drive's (sysfs) PCIe link: the generation and width "
            "it runs at, and the most it and its slot can do. LockstepPCIeLinkDegraded fires when an HCA, or "
            f"a GPU at least {T.PCIE_GPU_BUSY_UTILIZATION:.0%} busy, stays below its maximum for "
            f"{T.PCIE_DEGRADED_FOR}. An idle GPU runs its link at a lower generation to save power: that is "
            "normal.",
            hide=("Time",),
            rename={
                "Value #A": "generation",
                "Value #B": "max generation",
                "Value #C": "width",
                "Value #D": "max width",
            },
            width=14,
        ),
        timeseries(
            "PCIe AER errors",
            [
                (
                    f"sum by (instance, device, severity) (rate(lockstep_pcie_aer_errors_total{{{SEL}}}[{RATE}]))",
                    "{{instance}} {{device}} {{severity}}",
                ),
                (
                    f"rate(lockstep_gpu_pcie_replays_total{{{SEL}}}[{RATE}])",
                    "{{instance}} GPU {{gpu}} replays",
                ),
            ],
            "short",
            "PCIe errors per second the HCAs and NVMe drives report through AER, by severity, and the GPUs' "
            "PCIe replays. Correctable errors rising on a link that trained down point at the slot, riser or "
            "cable.",
            width=10,
        ),
    ]


def collectors() -> list[Cell]:
    """The agent's collectors that fail."""
    return [
        stat(
            "Collectors failing",
            f"count(lockstep_collector_up{{{SEL}}} == 0) or vector(0)",
            "none",
            "Collectors whose last run failed or is stuck (LockstepCollectorFailing after 10 minutes).",
            NONE_BAD,
        ),
    ]


def board() -> Board:
    return Board(
        "lockstep-node",
        "Lockstep / Node",
        "One node's host resources, pressure, filesystems and GPUs.",
        [*host_resources(), *filesystems(), *gpus(), *pcie(), *collectors()],
    )
