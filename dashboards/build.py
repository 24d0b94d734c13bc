"""Lockstep's Grafana dashboards, written with grafanalib.

`python -m dashboards --write` renders them to dashboards/*.json and to the Grafana sidecar
ConfigMaps in deploy/dashboards-configmap.yaml; tests/test_dashboards.py fails when those files
differ from what this module renders.  Threshold lines and colours come from
alerts/thresholds.py, the numbers the alert rules use.

Conventions: every dashboard has the variables datasource, cluster and node (the instance
label: the agent's address) and the Slurm job dashboard a job variable; every query selects
on them through SEL / JOB below.  Panels are the current Grafana types (timeseries, stat,
table, heatmap) with a unit each.  grafanalib's Heatmap class writes the legacy (pre-Grafana 9)
heatmap, so the heatmap here is a small Panel subclass that writes the current one.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import attr
from grafanalib._gen import DashboardEncoder
from grafanalib.core import (
    Dashboard,
    GridPos,
    Panel,
    Stat,
    Table,
    Target,
    Template,
    Templating,
    Time,
    TimeSeries,
)

from alerts import thresholds as T
from alerts.promql import num
from alerts.recording import SM_ACTIVE, TENSOR_ACTIVE

# The data source every panel and variable queries: the dashboard's datasource variable.
DS = {"type": "prometheus", "uid": "${datasource}"}
SCHEMA_VERSION = 39  # Grafana 10.4's: Grafana runs no migration on what is written here
SEL = 'cluster=~"$cluster", instance=~"$node"'
JOB = 'cluster=~"$cluster", job_id="$job_id"'
RATE = "$__rate_interval"
TAG = "lockstep"

GREEN, ORANGE, RED = "green", "orange", "red"


# --- Thresholds, drawn from the alert rules' numbers ---------------------------------------------


def above(*steps: tuple[float, str], base: str = GREEN) -> list[dict[str, Any]]:
    """Threshold steps for 'higher is worse': base colour, then (value, colour) from low to high."""
    return [{"color": base, "value": None}] + [{"color": color, "value": value} for value, color in steps]


def below(value: float, *, bad: str = RED, good: str = GREEN) -> list[dict[str, Any]]:
    """Threshold steps for 'lower is worse': bad below value, good from it."""
    return [{"color": bad, "value": None}, {"color": good, "value": value}]


NONE_BAD = above((1, RED))  # a count where anything above zero is a problem


# --- Panels ----------------------------------------------------------------------------------------


def targets(queries: Sequence[tuple[str, str]], *, instant: bool = False, table: bool = False) -> list[Target]:
    letters = "ABCDEFGH"
    return [
        Target(
            expr=expr,
            legendFormat=legend,
            refId=letters[i],
            instant=instant,
            format="table" if table else "time_series",
            datasource=DS,
            intervalFactor=1,  # full resolution (grafanalib's default, 2, halves it)
        )
        for i, (expr, legend) in enumerate(queries)
    ]


@dataclass
class Cell:
    """A panel with its size; the layout places cells left to right, 24 columns a row."""

    panel: Any
    width: int
    height: int = 8


def timeseries(
    title: str,
    queries: Sequence[tuple[str, str]],
    unit: str,
    description: str = "",
    thresholds: list[dict[str, Any]] | None = None,
    width: int = 12,
    height: int = 8,
    **options: Any,
) -> Cell:
    panel = TimeSeries(
        title=title,
        maxDataPoints=None,  # as many points as the panel is wide (grafanalib's default is 100)
        description=description,
        dataSource=DS,
        targets=targets(queries),
        unit=unit,
        thresholds=thresholds or above(),
        # Draw the alert threshold as a line where there is one.
        thresholdsStyleMode="line" if thresholds else "off",
        legendDisplayMode="table",
        legendPlacement="right" if width >= 16 else "bottom",
        legendCalcs=["lastNotNull", "max"],
        tooltipMode="multi",
        tooltipSort="desc",
        **options,
    )
    return Cell(panel, width, height)


def stat(
    title: str,
    expr: str,
    unit: str,
    description: str = "",
    thresholds: list[dict[str, Any]] | None = None,
    width: int = 4,
    height: int = 4,
) -> Cell:
    panel = Stat(
        title=title,
        maxDataPoints=None,  # as many points as the panel is wide (grafanalib's default is 100)
        description=description,
        dataSource=DS,
        targets=targets([(expr, "")], instant=True),
        format=unit,
        thresholds=thresholds or above(),
        reduceCalc="lastNotNull",
        graphMode="none",
        colorMode="background" if thresholds else "value",
        noValue="0",
    )
    return Cell(panel, width, height)


def table(
    title: str,
    queries: Sequence[tuple[str, str]],
    unit: str,
    description: str = "",
    thresholds: list[dict[str, Any]] | None = None,
    hide: Sequence[str] = ("Time", "__name__", "job"),
    width: int = 12,
    height: int = 8,
    rename: Mapping[str, str] | None = None,
) -> Cell:
    panel = Table(
        title=title,
        maxDataPoints=None,  # as many points as the panel is wide (grafanalib's default is 100)
        description=description,
        dataSource=DS,
        targets=targets(queries, instant=True, table=True),
        unit=unit,
        thresholds=thresholds or above(),
        displayMode="color-text" if thresholds else "auto",
        filterable=True,
        # One row per series, its labels as columns; the housekeeping columns hidden.
        transformations=[
            {"id": "merge", "options": {}},
            {
                "id": "organize",
                "options": {
                    "excludeByName": {name: True for name in hide},
                    **({"renameByName": dict(rename)} if rename else {}),
                },
            },
        ],
    )
    return Cell(panel, width, height)


@attr.s
class CurrentHeatmap(Panel):
    """The heatmap panel as Grafana 9+ writes it (grafanalib 0.7.1 only knows the legacy one):
    buckets calculated from the series' values, so any gauge can be drawn as a distribution."""

    unit = attr.ib(default="", validator=attr.validators.instance_of(str))

    def to_json_data(self) -> dict[str, Any]:
        return self.panel_json(
            {
                "type": "heatmap",
                "pluginVersion": "10.4.0",
                "fieldConfig": {"defaults": {"unit": self.unit}, "overrides": []},
                "options": {
                    "calculate": True,
                    "calculation": {"yBuckets": {"mode": "count", "value": "20"}},
                    "cellGap": 1,
                    "color": {
                        "mode": "scheme",
                        "scheme": "Oranges",
                        "steps": 64,
                        "exponent": 0.5,
                        "fill": "dark-orange",
                    },
                    "yAxis": {"axisPlacement": "left", "unit": self.unit},
                    "legend": {"show": True},
                    "tooltip": {"mode": "single", "yHistogram": True, "showColorScale": True},
                    "rowsFrame": {"layout": "auto"},
                    "showValue": "never",
                    "filterValues": {"le": 1e-9},
                },
            }
        )


def heatmap(title: str, expr: str, unit: str, description: str = "", width: int = 12, height: int = 8) -> Cell:
    # grafanalib's Panel is untyped, so mypy knows only the attribute declared here.
    panel = CurrentHeatmap(  # type: ignore[call-arg]
        title=title,
        description=description,
        dataSource=DS,
        targets=targets([(expr, "")]),
        unit=unit,
        maxDataPoints=None,
    )
    return Cell(panel, width, height)


def with_id(panel_id: int, cell: Cell) -> Cell:
    """A panel with a fixed id, for links that open it (the straggler alerts' dashboard_url)."""
    cell.panel = attr.evolve(cell.panel, id=panel_id)
    return cell


def layout(cells: Sequence[Cell]) -> list[Any]:
    """Place the cells in rows of 24 columns, in order; a cell that does not fit starts a row."""
    x = y = row_height = 0
    panels = []
    for cell in cells:
        if x + cell.width > 24:
            x, y, row_height = 0, y + row_height, 0
        cell.panel.gridPos = GridPos(h=cell.height, w=cell.width, x=x, y=y)
        panels.append(cell.panel)
        x += cell.width
        row_height = max(row_height, cell.height)
    return panels


# --- Variables --------------------------------------------------------------------------------------


def datasource_variable() -> Template:
    return Template(name="datasource", label="Data source", type="datasource", query="prometheus", default="default")


def query_variable(name: str, label: str, query: str, *, include_all: bool = True, multi: bool = True) -> Template:
    variable = Template(
        name=name,
        label=label,
        query=query,
        dataSource=DS,
        includeAll=include_all,
        multi=multi,
        allValue=".*" if include_all else None,
        default="$__all" if include_all else None,
        refresh=2,  # on time range change: nodes and jobs come and go
        sort=1,
    )
    if include_all:  # selected: All, as Grafana writes it (grafanalib would write the raw "$__all")
        variable._current = {"selected": True, "text": ["All"], "value": ["$__all"]}
    return variable


CLUSTER = query_variable("cluster", "Cluster", "label_values(lockstep_build_info, cluster)")
NODE = query_variable("node", "Node", 'label_values(lockstep_build_info{cluster=~"$cluster"}, instance)')
JOB_ID = query_variable(
    "job_id",
    "Slurm job",
    'label_values(lockstep_slurm_job_info{cluster=~"$cluster"}, job_id)',
    include_all=False,
    multi=False,
)


@dataclass
class Board:
    uid: str
    title: str
    description: str
    cells: list[Cell]
    variables: list[Template] = field(default_factory=lambda: [CLUSTER, NODE])

    @property
    def file_name(self) -> str:
        return f"{self.uid}.json"

    def dashboard(self) -> Dashboard:
        return Dashboard(
            title=self.title,
            uid=self.uid,
            description=self.description,
            tags=[TAG],
            timezone="browser",
            refresh="1m",
            time=Time("now-3h", "now"),
            schemaVersion=SCHEMA_VERSION,
            graphTooltip=1,  # shared crosshair: line up a straggler's GPU with its rank
            links=[
                {
                    "title": "Lockstep",
                    "type": "dashboards",
                    "tags": [TAG],
                    "asDropdown": True,
                    "includeVars": True,
                    "keepTime": True,
                }
            ],
            templating=Templating(list=[datasource_variable(), *self.variables]),
            panels=layout(self.cells),
        ).auto_panel_ids()

    def json(self) -> str:
        return json.dumps(self.dashboard().to_json_data(), cls=DashboardEncoder, indent=2, sort_keys=True) + "\n"


# --- The dashboards ----------------------------------------------------------------------------------


def fleet() -> Board:
    cl = 'cluster=~"$cluster"'
    firing = f'ALERTS{{alertstate="firing", alertname=~"Lockstep.*", {cl}}}'
    return Board(
        "lockstep-fleet",
        "Lockstep / Fleet overview",
        "Every node and GPU of the selected clusters: what is down, what fires, which jobs run and their worst "
        "stragglers.",
        [
            stat("Agents up", f'sum(up{{job="{T.AGENT_JOB}", {cl}}})', "none"),
            stat(
                "Agents down",
                f'count(up{{job="{T.AGENT_JOB}", {cl}}} == 0) or vector(0)',
                "none",
                "Agents Prometheus cannot scrape (LockstepAgentDown).",
                NONE_BAD,
            ),
            stat("GPUs up", f"sum(cluster:lockstep_gpu_up:sum{{{cl}}})", "none"),
            stat(
                "GPUs lost",
                f"count(lockstep_gpu_up{{{cl}}} == 0) or vector(0)",
                "none",
                "GPUs that stopped answering NVML (LockstepGPUFellOffBus).",
                NONE_BAD,
            ),
            stat(
                "Firing alerts",
                f"count({firing}) or vector(0)",
                "none",
                "Lockstep alerts firing now.",
                NONE_BAD,
            ),
            stat(
                "Running Slurm jobs",
                f"count(count by (cluster, job_id) (lockstep_slurm_job_info{{{cl}}})) or vector(0)",
                "none",
            ),
            table(
                "Stalled or straggling training jobs",
                [
                    (
                        'ALERTS{alertstate="firing", '
                        'alertname=~"LockstepTrainingStalled|LockstepTrainingStraggler|LockstepGPUStraggler", '
                        f"{cl}}}",
                        "",
                    )
                ],
                "none",
                "Which jobs are stalled or straggling now, and where: the job (cluster, job_id), and for a "
                "straggler the node (instance), rank or GPU. From the alerts' own series, so it costs the same at "
                "any fleet size.",
                hide=("Time", "__name__", "alertstate", "Value", "job", "severity"),
                width=24,
                height=6,
            ),
            table(
                "Firing alerts",
                [(firing, "")],
                "none",
                "Every Lockstep alert firing now, with the labels that say where; the runbook link is in the "
                "alert's annotations (docs/runbooks.md).",
                hide=("Time", "__name__", "alertstate", "Value", "job"),
                width=24,
            ),
            table(
                "Worst training stragglers",
                [(f"topk(10, job_rank:lockstep_training_compute_seconds:ratio_to_median5m{{{cl}}})", "")],
                "suffix:x",
                "Ranks by their compute time per step against their job's median rank (5 min). "
                f"LockstepTrainingStraggler fires above {T.TRAINING_STRAGGLER_COMPUTE_RATIO}x for 10 minutes.",
                above((T.TRAINING_STRAGGLER_COMPUTE_RATIO, RED)),
            ),
            table(
                "Slowest GPUs against their job",
                [(f"bottomk(10, job_gpu:lockstep_gpu_sm_clock_hertz:ratio_to_median5m{{{cl}}})", "")],
                "percentunit",
                "Busy GPUs by their SM clock against the median of their Slurm job's GPUs (5 min). "
                f"LockstepGPUStraggler fires below {T.GPU_STRAGGLER_SM_CLOCK_RATIO:.0%} for 10 minutes.",
                below(T.GPU_STRAGGLER_SM_CLOCK_RATIO),
            ),
            timeseries(
                "GPU utilization by cluster",
                [(f"cluster:lockstep_gpu_utilization_ratio:avg{{{cl}}}", "{{cluster}}")],
                "percentunit",
                "Mean utilization of the GPUs that report it (GPUs in MIG mode do not).",
            ),
            heatmap(
                "GPU utilization across nodes",
                f"instance:lockstep_gpu_utilization_ratio:avg{{{cl}}}",
                "percentunit",
                "How many nodes run their GPUs at which mean utilization: a band at the bottom is idle or stalled "
                "nodes. Per node, not per GPU: one series a node keeps the panel fast at a thousand nodes "
                "(docs/performance.md); the GPU dashboard shows each GPU.",
            ),
        ],
        variables=[CLUSTER],
    )


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


def node() -> Board:
    return Board(
        "lockstep-node",
        "Lockstep / Node",
        "One node's host resources, pressure, filesystems and GPUs.",
        [
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
            table("GPUs", [(f"lockstep_gpu_info{{{SEL}}}", "")], "none", hide=("Time", "__name__", "job", "Value")),
            timeseries(
                "GPU utilization",
                [(f"lockstep_gpu_utilization_ratio{{{SEL}}}", "{{instance}} GPU {{gpu}}")],
                "percentunit",
            ),
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
            stat(
                "Collectors failing",
                f"count(lockstep_collector_up{{{SEL}}} == 0) or vector(0)",
                "none",
                "Collectors whose last run failed or is stuck (LockstepCollectorFailing after 10 minutes).",
                NONE_BAD,
            ),
        ],
    )


HW_REASONS = "hw_slowdown|hw_thermal_slowdown|sw_thermal_slowdown|hw_power_brake"


def gpu() -> Board:
    return Board(
        "lockstep-gpu",
        "Lockstep / GPU & NVLink",
        "Per GPU: load, clocks against the GPU's job peers, throttling, power, temperature, memory errors; "
        "NVLink traffic and errors.",
        [
            timeseries(
                "GPU utilization",
                [(f"lockstep_gpu_utilization_ratio{{{SEL}}}", "{{instance}} GPU {{gpu}}")],
                "percentunit",
            ),
            timeseries(
                "SM activity",
                [(f"{SM_ACTIVE}{{{SEL}}}", "{{instance}} GPU {{gpu}} {{gpu_instance_id}}")],
                "percentunit",
                "Share of SM cycles with a warp on the SM (GPM, Hopper and newer; 5 min; per MIG GPU instance "
                "where partitioned). GPU utilization reads 100 % while any kernel runs; this says how much of the "
                f"GPU works. LockstepGPUIdleWhileAllocated fires below {T.GPU_IDLE_ACTIVITY_RATIO:.0%} for "
                f"{T.GPU_IDLE_FOR} on a GPU a job or pod holds.",
                below(T.GPU_IDLE_ACTIVITY_RATIO, bad=ORANGE),
            ),
            timeseries(
                "Tensor activity",
                [(f"{TENSOR_ACTIVE}{{{SEL}}}", "{{instance}} GPU {{gpu}} {{gpu_instance_id}}")],
                "percentunit",
                "Share of SM cycles in which the tensor cores (any MMA) were busy (GPM; 5 min).",
            ),
            timeseries(
                "DRAM bandwidth used",
                [(f"lockstep_gpu_dram_bandwidth_used_ratio{{{SEL}}}", "{{instance}} GPU {{gpu}} {{gpu_instance_id}}")],
                "percentunit",
                "Device memory bandwidth used against its maximum, averaged over the collector's interval (GPM).",
            ),
            timeseries(
                "SM clock",
                [(f"lockstep_gpu_sm_clock_hertz{{{SEL}}}", "{{instance}} GPU {{gpu}}")],
                "hertz",
                "A GPU held below its peers' clock makes its whole job wait.",
            ),
            timeseries(
                "SM clock against the job's median",
                [
                    (
                        f"job_gpu:lockstep_gpu_sm_clock_hertz:ratio_to_median5m{{{SEL}}}",
                        "{{instance}} GPU {{gpu}} job {{job_id}}",
                    )
                ],
                "percentunit",
                "Each busy GPU's SM clock over the median of its Slurm job's GPUs (5 min). "
                f"LockstepGPUStraggler fires below {T.GPU_STRAGGLER_SM_CLOCK_RATIO:.0%} for 10 minutes.",
                below(T.GPU_STRAGGLER_SM_CLOCK_RATIO),
            ),
            heatmap(
                "SM clock across GPUs",
                f"lockstep_gpu_sm_clock_hertz{{{SEL}}}",
                "hertz",
                "Where the GPUs' clocks sit: a straggler is a lone cell below the band.",
            ),
            table(
                "Hardware and thermal throttling now",
                [(f'lockstep_gpu_clock_event_active{{reason=~"{HW_REASONS}", {SEL}}}', "")],
                "none",
                "1 where the reason holds the GPU's clocks down now: LockstepGPUThermalSlowdown (thermal reasons, "
                "5 minutes), LockstepGPUPowerBrake (hw_power_brake, 1 minute).",
                NONE_BAD,
            ),
            timeseries(
                "Time throttled, by reason",
                [
                    (
                        f'rate(lockstep_gpu_clock_event_seconds_total{{reason!="idle", {SEL}}}[{RATE}])',
                        "{{instance}} GPU {{gpu}} {{reason}}",
                    )
                ],
                "percentunit",
                "Share of time each reason held the clocks down (sw_power_cap at full load is normal).",
            ),
            timeseries(
                "Power",
                [(f"lockstep_gpu_power_watts{{{SEL}}}", "{{instance}} GPU {{gpu}}")],
                "watt",
                "A GPU drawing well below its peers at equal utilization is throttled.",
            ),
            timeseries(
                "Temperature",
                [
                    (f"lockstep_gpu_temperature_celsius{{{SEL}}}", "{{instance}} GPU {{gpu}}"),
                    (f"lockstep_gpu_memory_temperature_celsius{{{SEL}}}", "{{instance}} GPU {{gpu}} HBM"),
                ],
                "celsius",
                f"The line at {T.GPU_TEMPERATURE_WARNING_CELSIUS} °C is a guide; the alert is on the driver's own "
                "thermal slowdown reasons.",
                above((T.GPU_TEMPERATURE_WARNING_CELSIUS, ORANGE)),
            ),
            timeseries(
                "Memory used",
                [
                    (
                        f"lockstep_gpu_memory_used_bytes{{{SEL}}} / lockstep_gpu_memory_total_bytes{{{SEL}}}",
                        "{{instance}} GPU {{gpu}}",
                    )
                ],
                "percentunit",
            ),
            table(
                "XID errors since the agent started",
                [(f"lockstep_gpu_xid_errors_total{{{SEL}}}", "")],
                "none",
                "By GPU and XID code. LockstepGPUXidCritical fires for 10 minutes after a critical one "
                f"({', '.join(str(x) for x in T.CRITICAL_XIDS)}).",
                NONE_BAD,
            ),
            table(
                "Memory errors and row remapping",
                [
                    (f'lockstep_gpu_ecc_errors_total{{type="uncorrected", {SEL}}}', ""),
                    (f"lockstep_gpu_row_remapping_pending{{{SEL}}}", ""),
                    (f"lockstep_gpu_row_remapping_failed{{{SEL}}}", ""),
                ],
                "none",
                "Uncorrectable ECC errors since the driver loaded (LockstepGPUUncorrectableECC on any increase), "
                "a pending remapping (the GPU needs a reset) and a failed one (LockstepGPURowRemapFailure: "
                "replace it).",
                NONE_BAD,
                hide=("Time", "job"),
            ),
            table(
                "Driver recovery action and fabric state",
                [
                    (f"lockstep_gpu_recovery_action{{{SEL}}} == 1", ""),
                    (f"lockstep_gpu_fabric_state{{{SEL}}} == 1", ""),
                ],
                "none",
                "Per GPU: the action the driver asks for (none when healthy; LockstepGPURecoveryActionRequired "
                f"after {T.GPU_RECOVERY_ACTION_FOR}) and its NVSwitch fabric registration state (completed when "
                f"healthy; LockstepGPUFabricDegraded after {T.GPU_FABRIC_FOR} otherwise).",
                hide=("Time", "__name__", "job", "Value #A", "Value #B"),
            ),
            timeseries(
                "NVSwitch fabric health",
                [(f"lockstep_gpu_fabric_health{{{SEL}}}", "{{instance}} GPU {{gpu}} {{condition}}")],
                "none",
                "1 while the condition holds. LockstepGPUFabricDegraded fires after "
                f"{T.GPU_FABRIC_FOR} of {', '.join(T.GPU_FABRIC_DEGRADED_CONDITIONS)}; route_recovery and "
                "access_timeout_recovery are the driver repairing itself.",
                NONE_BAD,
            ),
            stat(
                "NVLink links down",
                f"sum(1 - lockstep_nvlink_up{{{SEL}}})",
                "none",
                "Inactive NVLink links (LockstepNVLinkDown after 5 minutes).",
                NONE_BAD,
            ),
            timeseries(
                "NVLink transmit",
                [
                    (
                        f"sum by (instance, gpu) (rate(lockstep_nvlink_transmitted_bytes_total{{{SEL}}}[{RATE}]))",
                        "{{instance}} GPU {{gpu}}",
                    )
                ],
                "Bps",
                width=8,
            ),
            timeseries(
                "NVLink errors per minute",
                [
                    (
                        f"sum by (instance, gpu, link) (rate(lockstep_nvlink_errors_total"
                        f'{{type!~"{"|".join(T.NVLINK_IGNORED_ERROR_TYPES)}", {SEL}}}[{RATE}])) * 60',
                        "{{instance}} GPU {{gpu}} link {{link}}",
                    )
                ],
                "cpm",
                f"LockstepNVLinkErrors fires above {T.NVLINK_ERRORS_PER_MINUTE:g} a minute (10 min) for 5 minutes.",
                above((T.NVLINK_ERRORS_PER_MINUTE, RED)),
                width=8,
            ),
        ],
    )


def fabric() -> Board:
    flaps = (
        f"increase(lockstep_ib_port_link_downed_total{{{SEL}}}[{T.IB_LINK_FLAP_WINDOW}])"
        f" + increase(lockstep_ib_port_link_error_recovery_total{{{SEL}}}[{T.IB_LINK_FLAP_WINDOW}])"
    )
    return Board(
        "lockstep-fabric",
        "Lockstep / Fabric (InfiniBand, RoCE, PFC)",
        "InfiniBand and RoCE ports: state, traffic, link errors and flaps, congestion; PFC pause and storms, "
        "ECN and congestion notifications, DCQCN.",
        [
            table(
                "Port state",
                [(f"lockstep_ib_port_state{{{SEL}}}", "")],
                "none",
                "Logical state: 4 ACTIVE (5 ACTIVE_DEFER); 1 DOWN, 2 INIT, 3 ARMED. LockstepIBPortDown fires for a "
                "port not active for 5 minutes that is not administratively disabled.",
                below(4),
            ),
            timeseries(
                "Port throughput",
                [
                    (f"rate(lockstep_ib_port_transmitted_bytes_total{{{SEL}}}[{RATE}])", "{{instance}} {{device}} tx"),
                    (f"rate(lockstep_ib_port_received_bytes_total{{{SEL}}}[{RATE}])", "{{instance}} {{device}} rx"),
                ],
                "Bps",
            ),
            timeseries(
                "Port utilization (transmit)",
                [
                    (
                        f"rate(lockstep_ib_port_transmitted_bytes_total{{{SEL}}}[{RATE}])"
                        f" / lockstep_ib_port_rate_bytes_per_second{{{SEL}}}",
                        "{{instance}} {{device}}",
                    )
                ],
                "percentunit",
            ),
            timeseries(
                "Transmit wait (congestion)",
                [(f"port:lockstep_ib_port_transmit_wait:ratio5m{{{SEL}}}", "{{instance}} {{device}}")],
                "percentunit",
                "Share of transmit time spent waiting for flow-control credits (port_xmit_wait, 5 min). "
                f"LockstepIBCongestion fires above {T.IB_TRANSMIT_WAIT_RATIO:.0%} for 15 minutes.",
                above((T.IB_TRANSMIT_WAIT_RATIO, RED)),
            ),
            timeseries(
                f"Link downs and retrains ({T.IB_LINK_FLAP_WINDOW})",
                [(flaps, "{{instance}} {{device}}")],
                "short",
                f"LockstepIBLinkFlapping fires at {T.IB_LINK_FLAP_EVENTS} in {T.IB_LINK_FLAP_WINDOW}.",
                above((T.IB_LINK_FLAP_EVENTS, RED)),
            ),
            timeseries(
                "Symbol errors per hour",
                [(f"increase(lockstep_ib_port_symbol_errors_total{{{SEL}}}[1h])", "{{instance}} {{device}}")],
                "short",
                f"LockstepIBSymbolErrors fires above {T.IB_SYMBOL_ERRORS_PER_HOUR} an hour, or when the counter is "
                "saturated (see the table).",
                above((T.IB_SYMBOL_ERRORS_PER_HOUR, RED)),
            ),
            table(
                "Saturated counters",
                [(f"lockstep_ib_port_saturated{{{SEL}}}", "")],
                "none",
                "PMA counters stuck at their maximum: their rate reads 0 whatever happens. Reset them with "
                "perfquery -R.",
                NONE_BAD,
            ),
            timeseries(
                "Receive errors and transmit discards",
                [
                    (
                        f"rate(lockstep_ib_port_receive_errors_total{{{SEL}}}[{RATE}])",
                        "{{instance}} {{device}} rx errors",
                    ),
                    (
                        f"rate(lockstep_ib_port_transmit_discards_total{{{SEL}}}[{RATE}])",
                        "{{instance}} {{device}} tx discards",
                    ),
                ],
                "cps",
            ),
            timeseries(
                "PFC pause (share of time)",
                [
                    (
                        f"interface:lockstep_pfc_pause_seconds:ratio5m{{{SEL}}}",
                        "{{instance}} {{interface}} prio {{priority}} {{direction}}",
                    )
                ],
                "percentunit",
                "tx: this host paused its switch port (its receive path is filling); rx: it was paused. "
                f"LockstepPFCStorm fires above {T.PFC_TX_PAUSE_RATIO:.0%} tx for 2 minutes.",
                above((T.PFC_TX_PAUSE_RATIO, RED)),
            ),
            timeseries(
                "Pause storm events (10m)",
                [
                    (
                        f"increase(lockstep_pfc_pause_storm_events_total{{{SEL}}}[10m])",
                        "{{instance}} {{interface}} {{level}}",
                    )
                ],
                "short",
                "The NIC's own storm detector (mlx5): any event fires LockstepPFCStorm.",
                NONE_BAD,
            ),
            timeseries(
                "ECN marks and congestion notifications",
                [
                    (
                        f"rate(lockstep_roce_ecn_marked_packets_total{{{SEL}}}[{RATE}])",
                        "{{instance}} {{device}} ECN marked",
                    ),
                    (f"rate(lockstep_roce_cnp_sent_total{{{SEL}}}[{RATE}])", "{{instance}} {{device}} CNP sent"),
                    (f"rate(lockstep_roce_cnp_handled_total{{{SEL}}}[{RATE}])", "{{instance}} {{device}} CNP handled"),
                    (f"rate(lockstep_roce_cnp_ignored_total{{{SEL}}}[{RATE}])", "{{instance}} {{device}} CNP ignored"),
                ],
                "pps",
                f"CNPs ignored above {T.ROCE_CNP_IGNORED_PER_SECOND:g}/s fire LockstepRoCECongestionControlOff.",
            ),
            table(
                "DCQCN enabled",
                [(f"max by (cluster, instance, interface, role) (lockstep_roce_dcqcn_enabled{{{SEL}}})", "")],
                "none",
                "1 when DCQCN is enabled on some priority; 0 on every priority fires LockstepRoCECongestionControlOff.",
                below(1),
            ),
            timeseries(
                "NIC discards",
                [(f"rate(lockstep_nic_discards_total{{{SEL}}}[{RATE}])", "{{instance}} {{interface}} {{direction}}")],
                "pps",
                "rx: no receive buffer (a congested adapter, often with PFC pause); tx: link down or paused.",
            ),
        ],
    )


EXPECTED_INTERVAL = "root:lockstep_checkpoint_expected_interval_seconds:or_default"


def storage() -> Board:
    return Board(
        "lockstep-storage",
        "Lockstep / Storage & checkpoints",
        "Filesystems (space, responsiveness, NFS and Lustre client) and checkpoint saves per root.",
        [
            table(
                "Space left",
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
            table(
                "Responsive",
                [(f"lockstep_filesystem_responsive{{{SEL}}}", "")],
                "none",
                "0: statfs on the mount did not return within the agent's deadline (LockstepFilesystemHung).",
                below(1),
            ),
            timeseries(
                "Available space",
                [(f"lockstep_filesystem_available_bytes{{{SEL}}}", "{{instance}} {{mountpoint}}")],
                "bytes",
            ),
            timeseries(
                "statfs latency",
                [(f"lockstep_filesystem_stat_duration_seconds{{{SEL}}}", "{{instance}} {{mountpoint}}")],
                "s",
            ),
            timeseries(
                "NFS round-trip time",
                [
                    (
                        "sum by (instance, mountpoint, operation)"
                        f" (rate(lockstep_nfs_rtt_seconds_total{{{SEL}}}[{RATE}]))"
                        " / sum by (instance, mountpoint, operation)"
                        f" (rate(lockstep_nfs_operations_total{{{SEL}}}[{RATE}]))",
                        "{{instance}} {{mountpoint}} {{operation}}",
                    )
                ],
                "s",
            ),
            timeseries(
                "NFS retransmissions and major timeouts",
                [
                    (
                        f"sum by (instance, mountpoint) (rate(lockstep_nfs_retransmissions_total{{{SEL}}}[{RATE}]))",
                        "{{instance}} {{mountpoint}} retransmissions",
                    ),
                    (
                        f"sum by (instance, mountpoint) (rate(lockstep_nfs_major_timeouts_total{{{SEL}}}[{RATE}]))",
                        "{{instance}} {{mountpoint}} major timeouts",
                    ),
                ],
                "cps",
                "Major timeouts ('server not responding') fire LockstepFilesystemHung.",
            ),
            timeseries(
                "Lustre client throughput",
                [
                    (f"rate(lockstep_lustre_read_bytes_total{{{SEL}}}[{RATE}])", "{{instance}} {{filesystem}} read"),
                    (f"rate(lockstep_lustre_write_bytes_total{{{SEL}}}[{RATE}])", "{{instance}} {{filesystem}} write"),
                ],
                "Bps",
            ),
            timeseries(
                "I/O pressure (all tasks stalled)",
                [(f"instance:lockstep_host_io_full_pressure:ratio5m{{{SEL}}}", "{{instance}}")],
                "percentunit",
                f"LockstepIOStall fires above {T.IO_FULL_PRESSURE_RATIO:.0%} for 10 minutes.",
                above((T.IO_FULL_PRESSURE_RATIO, RED)),
            ),
            timeseries(
                "Time since the last completed save",
                [
                    (f"root:lockstep_checkpoint_last_success_timestamp_seconds:age{{{SEL}}}", "{{instance}} {{root}}"),
                    (
                        f"{T.CHECKPOINT_OVERDUE_INTERVALS:g} * {EXPECTED_INTERVAL}{{{SEL}}}",
                        "{{instance}} {{root}} overdue after",
                    ),
                ],
                "s",
                f"LockstepCheckpointOverdue fires when the age passes {T.CHECKPOINT_OVERDUE_INTERVALS:g} save "
                f"intervals (the 'overdue after' series) for 5 minutes; roots without an interval use "
                f"{T.CHECKPOINT_DEFAULT_INTERVAL_SECONDS} s.",
            ),
            timeseries(
                "Save in progress for",
                [
                    (f"lockstep_checkpoint_in_progress_seconds{{{SEL}}}", "{{instance}} {{root}}"),
                    (
                        f"{T.CHECKPOINT_STALL_INTERVALS:g} * {EXPECTED_INTERVAL}{{{SEL}}}",
                        "{{instance}} {{root}} stalled after",
                    ),
                ],
                "s",
                "LockstepCheckpointStalled fires when a save stays in progress past the root's save interval for "
                "5 minutes.",
            ),
            timeseries(
                "Last save: duration",
                [(f"lockstep_checkpoint_last_duration_seconds{{{SEL}}}", "{{instance}} {{root}}")],
                "s",
                width=8,
            ),
            timeseries(
                "Last save: size",
                [(f"lockstep_checkpoint_last_size_bytes{{{SEL}}}", "{{instance}} {{root}}")],
                "bytes",
                width=8,
            ),
            timeseries(
                "Last save: write throughput",
                [(f"lockstep_checkpoint_last_write_throughput_bytes_per_second{{{SEL}}}", "{{instance}} {{root}}")],
                "Bps",
                width=8,
            ),
            table(
                "Checkpoint roots",
                [(f"lockstep_checkpoint_info{{{SEL}}}", "")],
                "none",
                hide=("Time", "__name__", "job", "Value"),
                width=24,
                height=6,
            ),
        ],
    )


def slurm_job() -> Board:
    on_job_gpus = f"* on (cluster, instance, uuid) group_left (job_id) lockstep_slurm_job_gpu_info{{{JOB}}}"
    on_job_nodes = (
        f"* on (cluster, instance) group_left () group by (cluster, instance) (lockstep_slurm_job_info{{{JOB}}})"
    )
    return Board(
        "lockstep-slurm-job",
        "Lockstep / Slurm job",
        "One Slurm job: its nodes and GPUs, its ranks' step times against each other, its checkpoints and the "
        "fabric ports of its nodes.",
        [
            table(
                "Job",
                [(f"lockstep_slurm_job_info{{{JOB}}}", "")],
                "none",
                hide=("Time", "__name__", "job", "Value"),
                width=24,
                height=5,
            ),
            stat("Nodes", f"count(lockstep_slurm_job_info{{{JOB}}})", "none"),
            stat("GPUs", f"count(lockstep_slurm_job_gpu_info{{{JOB}}})", "none"),
            stat("Ranks", f"sum(job:lockstep_training_ranks:count{{{JOB}}})", "none"),
            stat("Steps per second", f"sum(job:lockstep_training_steps:rate5m{{{JOB}}})", "short"),
            stat(
                "GPUs throttled in hardware",
                f'sum(lockstep_gpu_clock_event_active{{reason=~"{HW_REASONS}"}} {on_job_gpus})',
                "none",
                thresholds=NONE_BAD,
            ),
            stat(
                "Slowest GPU against the job",
                f"min(job_gpu:lockstep_gpu_sm_clock_hertz:ratio_to_median5m{{{JOB}}})",
                "percentunit",
                f"LockstepGPUStraggler fires below {T.GPU_STRAGGLER_SM_CLOCK_RATIO:.0%}.",
                below(T.GPU_STRAGGLER_SM_CLOCK_RATIO),
            ),
            timeseries(
                "Compute time per step against the job's median",
                [(f"job_rank:lockstep_training_compute_seconds:ratio_to_median5m{{{JOB}}}", "rank {{rank}}")],
                "suffix:x",
                "Each rank's compute time per step over the job's median rank's (5 min). Wall step time is the same "
                "for every rank of a synchronous job; compute time singles out the straggler. "
                f"LockstepTrainingStraggler fires above {T.TRAINING_STRAGGLER_COMPUTE_RATIO}x for 10 minutes.",
                above((T.TRAINING_STRAGGLER_COMPUTE_RATIO, RED)),
            ),
            with_id(
                T.RANK_DEVIATION_PANEL_ID,
                timeseries(
                    "Each rank against the job's median (30 min)",
                    [
                        (
                            f"job_rank:lockstep_training_work_seconds:ratio_to_median30m{{{JOB}}} - 1",
                            "rank {{rank}} ({{host}})",
                        )
                    ],
                    "percentunit",
                    "How much longer (or shorter) than the job's median rank each rank takes per step of its own work "
                    "(compute and data wait, not waiting for peers), averaged over 30 minutes. Healthy ranks stay "
                    "within a few percent. LockstepTrainingStragglerSustained fires for a rank above "
                    f"{T.TRAINING_STRAGGLER_SUSTAINED_RATIO - 1:.0%} that is also {num(T.STRAGGLER_SUSTAINED_MADS)} "
                    "times the job's spread (MAD) above the median, for 10 minutes; its suspects are in the table "
                    "beside this panel.",
                    above((T.TRAINING_STRAGGLER_SUSTAINED_RATIO - 1, RED)),
                    width=16,
                ),
            ),
            with_id(
                T.RANK_SUSPECTS_PANEL_ID,
                table(
                    "Slow ranks and their suspects",
                    [
                        (
                            f"job_rank:lockstep_training_suspect:active30m{{{JOB}}}\nor\nlabel_replace(\n"
                            f"  job_rank:lockstep_training_work_seconds:ratio_to_median30m{{{JOB}}}"
                            f" > {num(T.TRAINING_STRAGGLER_SUSTAINED_RATIO)}\n"
                            "  unless on (cluster, job_id, rank) job_rank:lockstep_training_suspect:active30m,\n"
                            '  "suspect", "none found", "", ""\n)',
                            "",
                        )
                    ],
                    "none",
                    "Ranks more than "
                    f"{T.TRAINING_STRAGGLER_SUSTAINED_RATIO - 1:.0%} slower than the job's median (30 min), each with "
                    "what its node (host) showed in the same 30 minutes: gpu_throttle (a GPU of this job on it held "
                    "down by a thermal, hardware slowdown or power brake clock event), ib_errors, ib_congestion, "
                    "pfc_pause, hung_mount, cpu_pressure, io_pressure; data_wait: the rank's own data wait explains "
                    "most of its excess. docs/alerting.md says how each is decided.",
                    hide=("Time", "__name__", "job", "Value", "instance", "cluster", "job_id"),
                    width=8,
                ),
            ),
            with_id(
                T.GPU_DEVIATION_PANEL_ID,
                timeseries(
                    "Each GPU's SM clock against the job's median (30 min)",
                    [
                        (
                            f"job_gpu:lockstep_gpu_sm_clock_hertz:ratio_to_median30m{{{JOB}}} - 1",
                            "{{instance}} GPU {{gpu}}",
                        ),
                        (
                            f"gpu:lockstep_gpu_clock_event_active:avg30m {on_job_gpus}",
                            "{{instance}} GPU {{gpu}} {{reason}} (share of the time)",
                        ),
                    ],
                    "percentunit",
                    "Each busy GPU's SM clock over the median of the job's busy GPUs, minus 1 (30 min), and beside "
                    "it the share of the time a slowdown clock event reason held the GPU down. "
                    "LockstepGPUStragglerSustained fires below "
                    f"-{1 - T.GPU_STRAGGLER_SUSTAINED_RATIO:.0%} (and {num(T.STRAGGLER_SUSTAINED_MADS)} MADs) for "
                    "10 minutes.",
                    below(T.GPU_STRAGGLER_SUSTAINED_RATIO - 1),
                    width=24,
                ),
            ),
            timeseries(
                "Step time per rank",
                [
                    (f"job_rank:lockstep_training_step_seconds:mean5m{{{JOB}}}", "rank {{rank}} wall"),
                    (f"job_rank:lockstep_training_compute_seconds:mean5m{{{JOB}}}", "rank {{rank}} compute"),
                ],
                "s",
            ),
            timeseries(
                "Waiting per step: communication and data",
                [
                    (f"job_rank:lockstep_training_comm_wait_seconds:mean5m{{{JOB}}}", "rank {{rank}} communication"),
                    (f"job_rank:lockstep_training_data_wait_seconds:mean5m{{{JOB}}}", "rank {{rank}} data"),
                ],
                "s",
                "A straggler's peers wait for it in communication; a rank waiting on data points at the loader or "
                "storage.",
            ),
            timeseries(
                "SM clock against the job's median",
                [(f"job_gpu:lockstep_gpu_sm_clock_hertz:ratio_to_median5m{{{JOB}}}", "{{instance}} GPU {{gpu}}")],
                "percentunit",
                f"LockstepGPUStraggler fires below {T.GPU_STRAGGLER_SM_CLOCK_RATIO:.0%} for 10 minutes.",
                below(T.GPU_STRAGGLER_SM_CLOCK_RATIO),
            ),
            timeseries(
                "GPU utilization",
                [(f"lockstep_gpu_utilization_ratio {on_job_gpus}", "{{instance}} GPU {{gpu}}")],
                "percentunit",
            ),
            timeseries(
                "SM activity of the job's GPUs",
                [
                    (f'{SM_ACTIVE}{{gpu_instance_id=""}} {on_job_gpus}', "{{instance}} GPU {{gpu}}"),
                    (f'avg({SM_ACTIVE}{{gpu_instance_id=""}} {on_job_gpus})', "job average"),
                ],
                "percentunit",
                "Share of SM cycles with a warp on the SM (GPM, Hopper and newer; 5 min). Unlike utilization, it "
                "shows how much of each GPU the job uses. LockstepGPUIdleWhileAllocated fires below "
                f"{T.GPU_IDLE_ACTIVITY_RATIO:.0%} for {T.GPU_IDLE_FOR}.",
                below(T.GPU_IDLE_ACTIVITY_RATIO, bad=ORANGE),
            ),
            timeseries(
                "Tensor activity of the job's GPUs",
                [
                    (f'{TENSOR_ACTIVE}{{gpu_instance_id=""}} {on_job_gpus}', "{{instance}} GPU {{gpu}}"),
                    (f'avg({TENSOR_ACTIVE}{{gpu_instance_id=""}} {on_job_gpus})', "job average"),
                ],
                "percentunit",
                "Share of SM cycles in which the tensor cores were busy (GPM; 5 min): a model's efficiency, "
                "watched for slow regressions.",
            ),
            timeseries(
                "DRAM bandwidth of the job's GPUs",
                [
                    (
                        f'lockstep_gpu_dram_bandwidth_used_ratio{{gpu_instance_id=""}} {on_job_gpus}',
                        "{{instance}} GPU {{gpu}}",
                    )
                ],
                "percentunit",
                "Device memory bandwidth used against its maximum, averaged over the collector's interval (GPM): "
                "high with low tensor activity means memory-bound.",
            ),
            timeseries(
                "GPU power",
                [(f"lockstep_gpu_power_watts {on_job_gpus}", "{{instance}} GPU {{gpu}}")],
                "watt",
            ),
            timeseries(
                "Checkpoint: time since the last completed save",
                [
                    (
                        "root:lockstep_checkpoint_last_success_timestamp_seconds:age"
                        f" * on (cluster, instance, root) group_left (job_id) lockstep_checkpoint_info{{{JOB}}}",
                        "{{instance}} {{root}}",
                    ),
                    (
                        "lockstep_checkpoint_in_progress_seconds"
                        f" * on (cluster, instance, root) group_left (job_id) lockstep_checkpoint_info{{{JOB}}}",
                        "{{instance}} {{root}} save in progress",
                    ),
                ],
                "s",
                "Checkpoint roots whose path names the job (job=<id>).",
            ),
            timeseries(
                "Fabric ports of the job's nodes: transmit",
                [(f"rate(lockstep_ib_port_transmitted_bytes_total[{RATE}]) {on_job_nodes}", "{{instance}} {{device}}")],
                "Bps",
            ),
            timeseries(
                f"Fabric ports of the job's nodes: link downs and retrains ({T.IB_LINK_FLAP_WINDOW})",
                [
                    (
                        f"(increase(lockstep_ib_port_link_downed_total[{T.IB_LINK_FLAP_WINDOW}])"
                        f" + increase(lockstep_ib_port_link_error_recovery_total[{T.IB_LINK_FLAP_WINDOW}]))"
                        f" {on_job_nodes}",
                        "{{instance}} {{device}}",
                    )
                ],
                "short",
                thresholds=above((T.IB_LINK_FLAP_EVENTS, RED)),
            ),
            timeseries(
                "PFC pause on the job's nodes (share of time)",
                [
                    (
                        f"interface:lockstep_pfc_pause_seconds:ratio5m {on_job_nodes}",
                        "{{instance}} {{interface}} {{direction}}",
                    )
                ],
                "percentunit",
                thresholds=above((T.PFC_TX_PAUSE_RATIO, RED)),
            ),
        ],
        variables=[CLUSTER, JOB_ID],
    )


# An inference endpoint's level of generation throughput, as LockstepInferenceThroughputDrop sees it.
TOKENS_LEVEL = (
    f"quantile_over_time({num(T.INFERENCE_THROUGHPUT_BASELINE_QUANTILE)}, "
    f"server:lockstep_inference_generation_tokens:rate5m{{{SEL}}}[{T.INFERENCE_THROUGHPUT_BASELINE_WINDOW}])"
)


def _p95(histogram: str) -> str:
    return (
        f"histogram_quantile(0.95, sum by (le, cluster, instance, server, model) "
        f"(rate({histogram}_bucket{{{SEL}}}[{RATE}])))"
    )


def inference() -> Board:
    return Board(
        "lockstep-inference",
        "Lockstep / Inference",
        "Inference endpoints' KV cache against their queue and preemptions: latency climbs once the cache is "
        "full and requests wait or get preempted.",
        [
            table(
                "Endpoints up",
                [(f"lockstep_inference_up{{{SEL}}}", "")],
                "none",
                "0: the agent could not scrape the engine's own metrics endpoint.",
                below(1),
                width=24,
                height=5,
            ),
            timeseries(
                "KV cache usage",
                [(f"lockstep_inference_kv_cache_usage_ratio{{{SEL}}}", "{{instance}} {{server}} {{model}}")],
                "percentunit",
                f"LockstepKVCachePressure fires above {T.KV_CACHE_USAGE_RATIO:.0%} while requests wait, for 5 minutes.",
                above((T.KV_CACHE_USAGE_RATIO, RED)),
            ),
            timeseries(
                "Requests waiting and running",
                [
                    (f"lockstep_inference_requests_waiting{{{SEL}}}", "{{instance}} {{server}} waiting"),
                    (f"lockstep_inference_requests_running{{{SEL}}}", "{{instance}} {{server}} running"),
                ],
                "short",
                "Waiting requests add their whole wait to time to first token.",
            ),
            timeseries(
                "Preemptions per minute",
                [(f"rate(lockstep_inference_preemptions_total{{{SEL}}}[{RATE}]) * 60", "{{instance}} {{server}}")],
                "cpm",
                f"LockstepKVCachePreemptions fires above {T.KV_PREEMPTIONS_PER_MINUTE:g} a minute (5 min) "
                "for 5 minutes.",
                above((T.KV_PREEMPTIONS_PER_MINUTE, RED)),
            ),
            timeseries(
                "Generation tokens per second",
                [
                    (
                        f"server:lockstep_inference_generation_tokens:rate5m{{{SEL}}}",
                        "{{instance}} {{server}} {{model}}",
                    ),
                    (TOKENS_LEVEL, "{{instance}} {{server}} level of the last hour"),
                ],
                "short",
                "Output tokens per second (5 min rate), and each endpoint's level of the last "
                f"{T.INFERENCE_THROUGHPUT_BASELINE_WINDOW}: the "
                f"{num(T.INFERENCE_THROUGHPUT_BASELINE_QUANTILE * 100)}th percentile of its rate, which "
                "LockstepInferenceThroughputDrop compares with.",
            ),
            timeseries(
                "Generation throughput against its last hour",
                [
                    (
                        f"server:lockstep_inference_generation_tokens:rate5m{{{SEL}}}\n/ {TOKENS_LEVEL}",
                        "{{instance}} {{server}}",
                    )
                ],
                "percentunit",
                f"LockstepInferenceThroughputDrop fires below {T.INFERENCE_THROUGHPUT_DROP_RATIO:.0%} while requests "
                "wait, for 10 minutes (below it with an empty queue: demand fell, not capacity).",
                below(T.INFERENCE_THROUGHPUT_DROP_RATIO),
            ),
            timeseries(
                "Time to first token (p95)",
                [
                    (
                        f"server:lockstep_inference_time_to_first_token_seconds:p95_5m{{{SEL}}}",
                        "{{instance}} {{server}} {{model}}",
                    )
                ],
                "s",
                "p95 over 5 minutes. LockstepInferenceTTFTHigh fires above the SLO "
                f"({num(T.INFERENCE_TTFT_SLO_SECONDS)} s, the line; models listed in "
                "INFERENCE_TTFT_SLO_SECONDS_BY_MODEL have their own) for 10 minutes.",
                above((T.INFERENCE_TTFT_SLO_SECONDS, RED)),
            ),
            timeseries(
                "Aborted or failed requests (share)",
                [(f"server:lockstep_inference_requests_failed:ratio5m{{{SEL}}}", "{{instance}} {{server}} {{model}}")],
                "percentunit",
                f"Share of finished requests with reason abort or error (5 min). LockstepInferenceErrors fires above "
                f"{T.INFERENCE_FAILED_REQUESTS_RATIO:.0%} for 10 minutes on endpoints finishing at least "
                f"{num(T.INFERENCE_MIN_REQUESTS_PER_MINUTE)} requests a minute. Only engines that count their "
                "successes by reason (vLLM) have a share.",
                above((T.INFERENCE_FAILED_REQUESTS_RATIO, RED)),
            ),
            timeseries(
                "Requests finished per minute by reason",
                [
                    (
                        f"sum by (cluster, instance, server, model, reason) "
                        f"(rate(lockstep_inference_requests_finished_total{{{SEL}}}[{RATE}])) * 60",
                        "{{instance}} {{server}} {{reason}}",
                    )
                ],
                "cpm",
                "stop, length, abort, error: only the reasons the engine tells apart (docs/workloads.md).",
            ),
            timeseries(
                "End-to-end latency and queue time (p95)",
                [
                    (_p95("lockstep_inference_e2e_request_latency_seconds"), "{{instance}} {{server}} end to end"),
                    (_p95("lockstep_inference_request_queue_time_seconds"), "{{instance}} {{server}} queued"),
                ],
                "s",
                "Arrival to last token, and the part spent waiting in the engine's queue.",
            ),
            timeseries(
                "KV cache usage (5 min average) against queue",
                [
                    (
                        f"server:lockstep_inference_kv_cache_usage_ratio:avg5m{{{SEL}}}",
                        "{{instance}} {{server}} KV",
                    ),
                    (
                        f"server:lockstep_inference_requests_waiting:avg5m{{{SEL}}}",
                        "{{instance}} {{server}} waiting",
                    ),
                ],
                "short",
                "Both on one axis: KV usage 0-1, waiting requests as counted.",
            ),
            heatmap(
                "KV cache usage across endpoints",
                f"lockstep_inference_kv_cache_usage_ratio{{{SEL}}}",
                "percentunit",
                width=24,
            ),
        ],
    )


def agent() -> Board:
    scrape = f'job="{T.AGENT_JOB}", {SEL}'
    return Board(
        "lockstep-agent",
        "Lockstep / Agent health",
        "The agents themselves: versions, collectors' state, run time, errors and cost, and the scrape.",
        [
            stat(
                "Agents down",
                f"count(up{{{scrape}}} == 0) or vector(0)",
                "none",
                "LockstepAgentDown after 5 minutes.",
                NONE_BAD,
            ),
            stat(
                "Collectors failing",
                f"count(lockstep_collector_up{{{SEL}}} == 0) or vector(0)",
                "none",
                "LockstepCollectorFailing after 10 minutes.",
                NONE_BAD,
            ),
            table(
                "Agent versions",
                [(f"lockstep_build_info{{{SEL}}}", "")],
                "none",
                hide=("Time", "__name__", "job", "Value"),
                width=16,
                height=4,
            ),
            table(
                "Collector state",
                [(f"lockstep_collector_state{{{SEL}}} == 1", "")],
                "none",
                "One row per collector and node: ok, nothing_here (nothing to collect on this machine), failed, "
                "stuck (past its deadline), never_ran.",
                hide=("Time", "__name__", "job", "Value"),
                width=24,
            ),
            timeseries(
                "Collector run time",
                [(f"lockstep_collector_duration_seconds{{{SEL}}}", "{{instance}} {{collector}}")],
                "s",
            ),
            timeseries(
                "Time since the last successful run",
                [
                    (
                        f"time() - lockstep_collector_last_success_timestamp_seconds{{{SEL}}}",
                        "{{instance}} {{collector}}",
                    )
                ],
                "s",
            ),
            timeseries(
                "Collector errors per minute",
                [(f"rate(lockstep_collector_errors_total{{{SEL}}}[{RATE}]) * 60", "{{instance}} {{collector}}")],
                "cpm",
            ),
            timeseries(
                "Collector CPU (cores)",
                [(f"rate(lockstep_collector_cpu_seconds_total{{{SEL}}}[{RATE}])", "{{instance}} {{collector}}")],
                "short",
            ),
            timeseries(
                "Scrape duration",
                [(f"scrape_duration_seconds{{{scrape}}}", "{{instance}}")],
                "s",
            ),
            timeseries(
                "Samples per scrape",
                [(f"scrape_samples_scraped{{{scrape}}}", "{{instance}}")],
                "short",
            ),
        ],
    )


BOARDS = (fleet, node, gpu, fabric, storage, slurm_job, inference, agent)


def boards() -> list[Board]:
    return [make() for make in BOARDS]
