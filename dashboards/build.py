"""Lockstep's Grafana dashboards, written with grafanalib: the index of the dashboards, in the
order Grafana's dashboard list links them.

`python -m dashboards --write` renders them (dashboards/render.py) to dashboards/*.json and to the
Grafana sidecar ConfigMaps in deploy/dashboards-configmap.yaml; tests/dashboards/test_dashboards.py fails
when those files differ from what it renders.  Threshold lines and colours come from
lockstep/thresholds.py, the numbers the alert rules use.

Where the dashboards are written:

    dashboards/panels.py        the panel library: selectors, thresholds, panel types, cells
    dashboards/variables.py     the data source, cluster, node and Slurm job variables
    dashboards/board.py         Board: a dashboard's cells laid out, its variables, its JSON
    dashboards/boards/*.py      one module per dashboard, a function per section of panels
    dashboards/render.py        the JSON files and the sidecar ConfigMaps
"""

from __future__ import annotations

from dashboards.board import Board
from dashboards.boards import agent, fabric, fleet, gpu, inference, node, slurm_job, storage

BOARDS = (
    fleet.board,
    node.board,
    gpu.board,
    fabric.board,
    storage.board,
    slurm_job.board,
    inference.board,
    agent.board,
)


def boards() -> list[Board]:
    return [make() for make in BOARDS]
