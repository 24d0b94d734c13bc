"""The panel library every dashboard is made of: the selectors of the dashboards' variables,
threshold steps drawn from the alert rules' numbers, and the current Grafana panel types
(timeseries, stat, table, heatmap) with a unit each, as cells the layout places.

Conventions: every dashboard has the variables datasource, cluster and node (the instance
label: the agent's address) and the Slurm job dashboard a job variable; every query selects
on them through SEL / JOB below.  grafanalib's Heatmap class writes the legacy (pre-Grafana 9)
heatmap, so the heatmap here is a small Panel subclass that writes the current one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import attr
from grafanalib.core import Panel, Stat, Table, Target, TimeSeries

# The data source every panel and variable queries: the dashboard's datasource variable.
DS = {"type": "prometheus", "uid": "${datasource}"}
SEL = 'cluster=~"$cluster", instance=~"$node"'
JOB = 'cluster=~"$cluster", job_id="$job_id"'
RATE = "$__rate_interval"
# The clock event reasons that are the hardware's (or the driver's thermal) doing, not the workload's.
HW_REASONS = "hw_slowdown|hw_thermal_slowdown|sw_thermal_slowdown|hw_power_brake"

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
