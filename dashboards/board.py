"""A dashboard: its identity, its cells laid out in rows of 24 columns, its variables, and its JSON."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from grafanalib._gen import DashboardEncoder
from grafanalib.core import Dashboard, GridPos, Template, Templating, Time

from dashboards.panels import Cell
from dashboards.variables import CLUSTER, NODE, datasource_variable

SCHEMA_VERSION = 39  # Grafana 10.4's: Grafana runs no migration on what is written here
TAG = "lockstep"


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


@dataclass
class Board:
    """One Grafana dashboard: its uid (also its file name), title, description, cells and variables."""

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
