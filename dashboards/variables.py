"""The dashboards' variables: the data source, and the cluster, node and Slurm job to show."""

from __future__ import annotations

from grafanalib.core import Template

from dashboards.panels import DS


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
