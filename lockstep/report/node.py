"""A node's story (`lockstep report --node NAME [--since 7d]`, issue 45): the jobs it hurt and
its own faults over a window, in text, JSON and HTML like the job report.

The jobs are what the node record counts (alerts/nodes.py): every firing alert of
NODE_RECORD_ALERTS that named one of the node's agents with a job_id, and every job whose
checkpoint save stalled with the node its slow writer (NODE_CHECKPOINT_WRITER_RECORD, listed as
LockstepCheckpointStalled), each job once, with the alerts that named the node and when.  The
faults are the node's own counters over the window, read for its agents only (a node's 8 GPUs,
never the fleet's): XIDs by code, uncorrectable ECC errors, memory rows remapped and remappings
failed or pending, GPUs that fell off the bus, links that went down, and the time its GPUs'
clocks were held down for the causes that slow a job (SUSPECT_GPU_THROTTLE_REASONS).

NAME is the node as the operator knows it: its Slurm node name, its host name, or an agent's
instance label (`host:port`).  Every query names the node's agents (`instance=~...`).
"""

from __future__ import annotations

import dataclasses
import json
import re
import textwrap
import urllib.parse
from dataclasses import dataclass, field
from html import escape

from lockstep import thresholds as T
from lockstep.node_faults import NODE_FAULTS
from lockstep.report.prometheus import Prometheus, ReportError, Sample
from lockstep.report.scope import natural, quote
from lockstep.report.text import WIDTH, stamp, visible

NODE_SCHEMA = "lockstep.node-report/v1"
# The series that say which agents a node has (the series API reads no sample).
NODE_SERIES = (
    "lockstep_collector_up",
    "lockstep_gpu_up",
    "lockstep_slurm_node_info",
    "ALERTS",
    T.NODE_CHECKPOINT_WRITER_RECORD,
)
# A subquery's step when asking for the first and last time an alert fired: the alerts are
# evaluated every 15-60 s; a step of a minute sees each firing sample's own timestamp.
FIRING_STEP = "1m"
UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


@dataclass
class HurtJob:
    job_id: str
    alerts: list[str]  # the alerts that named the node in this job
    first: float  # unix seconds: the first firing sample of them in the window
    last: float  # the last
    report: str  # the command that prints the job's report
    grafana_url: str  # the Slurm job dashboard over the time the alerts fired


@dataclass
class Fault:
    # a NodeFault's name (lockstep/node_faults.py), or row_remapping_failed, row_remapping_pending,
    # gpu_lost
    kind: str
    where: str  # "GPU 3", "mlx5_0 port 1"
    what: str  # the fault in words, with its labels: "XID errors (xid 79)"
    count: float  # events, or seconds where unit is "s"
    unit: str = ""  # "" for events, "s" for seconds


@dataclass
class NodeReport:
    node: str
    cluster: str
    instances: list[str]  # the node's agents (instance labels)
    since_seconds: float
    start: float
    end: float
    generated_at: float
    verdict: str = ""
    jobs: list[HurtJob] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    prometheus: str = ""
    schema: str = NODE_SCHEMA


def since_seconds(text: str) -> float:
    """A window as Prometheus writes one (`7d`, `36h`, `1w`, `90m`): its seconds; ValueError otherwise."""
    match = re.fullmatch(r"(\d+)([smhdw])", text.strip())
    if not match or int(match[1]) == 0:
        raise ValueError(f"{text!r} is not a duration such as 7d, 36h or 90m")
    return int(match[1]) * UNITS[match[2]]


def window(seconds: float) -> str:
    """Seconds as PromQL writes a range, in the largest unit that divides them (604800: 7d)."""
    for unit in "dhm":
        if seconds >= UNITS[unit] and seconds % UNITS[unit] == 0:
            return f"{int(seconds // UNITS[unit])}{unit}"
    return f"{int(seconds)}s"


def build_node_report(
    prom: Prometheus,
    name: str,
    cluster: str | None,
    *,
    now: float,
    since: float,
    grafana_url: str = T.GRAFANA_URL,
) -> NodeReport:
    instances, cluster_found, host = find_node(prom, name, cluster, now, since)
    report = NodeReport(
        node=host,
        cluster=cluster_found,
        instances=instances,
        since_seconds=since,
        start=now - since,
        end=now,
        generated_at=now,
        prometheus=prom.url,
    )
    on_node = ",".join(
        [
            f"instance=~{quote('|'.join(re.escape(i) for i in instances))}",
            *([f"cluster={quote(cluster_found)}"] if cluster_found else []),
        ]
    )
    report.jobs = jobs_hurt(prom, on_node, now, since, grafana_url, cluster_found)
    report.faults = faults(prom, on_node, now, since)
    report.verdict = verdict_of(report)
    return report


def find_node(prom: Prometheus, name: str, cluster: str | None, now: float, since: float) -> tuple[list[str], str, str]:
    """The node's agents, its cluster and its name: the instances named `name` or `name:port`,
    or whose Slurm node is `name`; ReportError when none, or when several clusters have one."""
    in_cluster = f",cluster={quote(cluster)}" if cluster is not None else ""
    named = f"instance=~{quote(re.escape(name) + '(:[0-9]+)?')}"
    found = prom.series(f'{{__name__=~"{"|".join(NODE_SERIES)}",{named}{in_cluster}}}', now - since, now)
    found += prom.series(f"lockstep_slurm_node_info{{slurm_node={quote(name)}{in_cluster}}}", now - since, now)
    clusters = sorted({labels.get("cluster", "") for labels in found})
    where = f" in cluster {cluster}" if cluster is not None else ""
    if not found:
        raise ReportError(
            f"node {name}{where} is unknown to Prometheus at {prom.url} (no agent or alert named it "
            f"in the last {window(since)})"
        )
    if len(clusters) > 1:
        raise ReportError(f"node {name} is in clusters {', '.join(clusters)}: choose one with --cluster")
    instances = sorted({labels["instance"] for labels in found if labels.get("instance")}, key=natural)
    hosts = {labels["slurm_node"] for labels in found if labels.get("slurm_node")}
    host = hosts.pop() if len(hosts) == 1 else name
    return instances, clusters[0], host


def jobs_hurt(
    prom: Prometheus, on_node: str, now: float, since: float, grafana_url: str, cluster: str
) -> list[HurtJob]:
    """The distinct jobs whose straggler or hang alerts named the node, or whose checkpoint saves
    it stalled (the record of the stall's slow writer, alerts/nodes.py), with the time they did."""
    named = f'ALERTS{{alertstate="firing",alertname=~{quote("|".join(T.NODE_RECORD_ALERTS))},job_id!="",{on_node}}}'
    wrote = f"{T.NODE_CHECKPOINT_WRITER_RECORD}{{{on_node}}}"
    span = f"{window(since)}:{FIRING_STEP}"
    seen = []
    for selector, named_by in ((named, ""), (wrote, "LockstepCheckpointStalled")):
        seen += [(s, False, named_by) for s in prom.query(f"min_over_time(timestamp({selector})[{span}])", now)]
        seen += [(s, True, named_by) for s in prom.query(f"max_over_time(timestamp({selector})[{span}])", now)]
    jobs: dict[str, HurtJob] = {}
    for sample, end, named_by in seen:
        job_id = sample.labels.get("job_id", "")
        job = jobs.setdefault(job_id, HurtJob(job_id, [], sample.value, sample.value, f"lockstep report {job_id}", ""))
        alertname = named_by or sample.labels.get("alertname", "?")
        if alertname not in job.alerts:
            job.alerts.append(alertname)
        if end:
            job.last = max(job.last, sample.value)
        else:
            job.first = min(job.first, sample.value)
    out = sorted(jobs.values(), key=lambda j: (j.first, natural(j.job_id)))
    for job in out:
        job.alerts.sort()
        job.grafana_url = job_link(grafana_url, job, cluster)
    return out


def job_link(base: str, job: HurtJob, cluster: str) -> str:
    """The Slurm job dashboard from an hour before the first alert to an hour after the last."""
    query = {
        "var-job_id": job.job_id,
        "from": str(int((job.first - 3600) * 1000)),
        "to": str(int((job.last + 3600) * 1000)),
    }
    if cluster:
        query = {"var-cluster": cluster, **query}
    return f"{base.rstrip('/')}/d/{T.SLURM_JOB_DASHBOARD_UID}?{urllib.parse.urlencode(query)}"


def faults(prom: Prometheus, on_node: str, now: float, since: float) -> list[Fault]:
    """The node's own faults over the window, each where it happened (a GPU, a port)."""
    w = window(since)

    def ask(expr: str) -> list[Sample]:
        return prom.query(expr, now)

    def gpu(s: Sample) -> str:
        return f"GPU {s.labels.get('gpu', '?')}"

    def port(s: Sample) -> str:
        return f"{s.labels.get('device', '?')} port {s.labels.get('port', '?')}"

    out: list[Fault] = []
    for fault in NODE_FAULTS:  # (the node record's faults, as its rules count them)
        for s in ask(f"{fault.per_series(on_node, w)} > 0"):
            detail = ", ".join(f"{label} {s.labels.get(label, '?')}" for label in fault.by)
            what = f"{fault.says} ({detail})" if detail else fault.says
            if round(s.value):
                out.append(
                    Fault(fault.name, port(s) if fault.place == "port" else gpu(s), what, round(s.value), fault.unit)
                )
    for state in ("failed", "pending"):
        for s in ask(f"max_over_time(lockstep_gpu_row_remapping_{state}{{{on_node}}}[{w}]) > 0"):
            out.append(Fault(f"row_remapping_{state}", gpu(s), f"a row remapping {state}", 1))
    # The minutes a GPU answered NVML no more (fell off the bus, or lost): counted a minute at a time.
    for s in ask(f"sum_over_time((lockstep_gpu_up{{{on_node}}} == bool 0)[{w}:1m]) > 0"):
        out.append(Fault("gpu_lost", gpu(s), "lost (fell off the bus or unreachable)", s.value * 60, "s"))
    return sorted(out, key=lambda f: (f.kind, natural(f.where), natural(f.what)))


def verdict_of(report: NodeReport) -> str:
    w = window(report.since_seconds)
    hurt = len(report.jobs)
    jobs = "job" if hurt == 1 else "jobs"
    said = (
        f"{report.node} was named by the straggler or hang alerts of, or stalled the checkpoint saves of, "
        f"{hurt} {jobs} in the last {w}"
    )
    if hurt >= T.NODE_JOBS_HURT:
        said += f": a repeat offender (LockstepNodeHurtsJobs at {T.NODE_JOBS_HURT})"
    kinds = sorted({f.kind for f in report.faults})
    said += f"; its own faults: {', '.join(kinds)}" if kinds else "; no fault of its own recorded"
    return said + "."


def to_json(report: NodeReport) -> str:
    data = dataclasses.asdict(report)
    return json.dumps({"schema": data.pop("schema"), **data}, indent=2) + "\n"


def amount(fault: Fault) -> str:
    if fault.unit == "s":
        seconds = fault.count
        if seconds >= 3600:
            return f"{seconds / 3600:.1f} h"
        return f"{seconds / 60:.0f} min" if seconds >= 60 else f"{seconds:.0f} s"
    return f"{fault.count:g}x"


def render_text(report: NodeReport) -> str:
    """Every line at most WIDTH columns: what is longer (a job id, a node's agents: labels its
    users chose) continues on the next, indented, never cut."""
    r = report
    lines = [
        *wrapped(f"Node {visible(r.node)}" + (f" (cluster {visible(r.cluster)})" if r.cluster else "")),
        *wrapped(f"  {stamp(r.start)} to {stamp(r.end)} UTC; agents: {visible(', '.join(r.instances))}", 4),
        "",
        *wrapped(visible(r.verdict)),
        "",
        f"Jobs it hurt ({len(r.jobs)})",
    ]
    for job in r.jobs:
        lines += wrapped(f"  {visible(job.job_id):<12} {stamp(job.first)} to {stamp(job.last)} UTC", 15)
        lines += wrapped(f"{'':<14} {visible(job.report)}: {visible(', '.join(job.alerts))}", 15)
    if not r.jobs:
        lines.append("  none")
    lines += ["", f"Its own faults ({len(r.faults)})"]
    for f in r.faults:
        lines += wrapped(f"  {visible(f.where):<16} {visible(f.what):<48} {amount(f)}", 19)
    if not r.faults:
        lines.append("  none")
    return "\n".join(lines) + "\n"


def wrapped(text: str, indent: int = 0) -> list[str]:
    """The text in lines of at most WIDTH columns, those after the first indented."""
    return textwrap.wrap(text, WIDTH, subsequent_indent=" " * indent) or [""]


def render_html(report: NodeReport) -> str:
    from lockstep.report.html import STYLE, table

    r = report
    jobs = "".join(
        f'<tr><td><a href="{escape(j.grafana_url)}">{escape(j.job_id)}</a></td><td>{escape(stamp(j.first))}</td>'
        f"<td>{escape(stamp(j.last))}</td><td>{escape(', '.join(j.alerts))}</td>"
        f"<td><code>{escape(j.report)}</code></td></tr>"
        for j in r.jobs
    )
    fault_rows = [[f.where, f.what, amount(f)] for f in r.faults]
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>Node {escape(r.node)}</title>'
        f"<style>{STYLE}</style></head><body>"
        f"<h1>Node {escape(r.node)}</h1><p>{escape(stamp(r.start))} to {escape(stamp(r.end))} UTC; "
        f"agents: {escape(', '.join(r.instances))}</p>"
        f'<p class="verdict">{escape(r.verdict)}</p>'
        f"<h2>Jobs it hurt ({len(r.jobs)})</h2>"
        + (
            f"<table><tr><th>job</th><th>first</th><th>last</th><th>alerts</th><th>report</th></tr>{jobs}</table>"
            if r.jobs
            else "<p>none</p>"
        )
        + f"<h2>Its own faults ({len(r.faults)})</h2>"
        + (table(["where", "what", "how much"], fault_rows) if r.faults else "<p>none</p>")
        + "</body></html>\n"
    )


def render(report: NodeReport, fmt: str) -> str:
    if fmt == "json":
        return to_json(report)
    if fmt == "html":
        return render_html(report)
    return render_text(report)
