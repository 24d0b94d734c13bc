"""A simulated fleet in a real Prometheus: rule-group evaluation time, fleet dashboard query
latency and TSDB memory at N nodes.

    .venv/bin/python bench/fleet.py [--nodes 256 1024] [--hours 1] [--step 60] [--all-series]

For each N it:
1. builds the fleet's history from the simulated node's expositions (lockstep.simulation.snapshot,
   scenarios of SCENARIOS: healthy, straggler, kv-pressure, nfs-server-down and four nodes' own
   faults, each at simulated times 0 and 600 s), relabelled per node, not a second model of the
   metrics:
   - nodes gpu0001.. in two clusters (east, west), scrape labels job="lockstep", instance, cluster;
   - per cluster, the last sixteenth of the nodes serve inference (the kv-pressure node without its
     training job), the rest run up to four multi-node training jobs of contiguous nodes, 8 ranks a
     node (ranks renumbered across the job, GPU UUIDs and HCA GUIDs made distinct per node);
   - east's first job has one straggler node (scenario straggler: rank 3 on GPU 3 computes slower);
     west's first job stalls a quarter into the history (its training counters stop);
   - one west node has a hung NFS mount (scenario nfs-server-down);
   - four nodes have faults of their own (FAULTY: gpu-faults' XIDs, ECC errors and remapped rows,
     link-flap, gpu-throttle, gpu-lost), in jobs of their own where a fleet has three or more;
   - every eighth training node, and the straggler's, named by its job's straggler alert all
     through the history (ALERTS series: the node record's inputs, alerts/nodes.py);
   - values: counters (and histogram samples) go on at the rate the two moments show, gauges
     alternate between the two moments' values, `*_timestamp_seconds` keep the age they had;
   - by default only the families the shipped rules and the fleet dashboard read (about half of a
     node's series; --all-series writes every series);
2. writes it as OpenMetrics with one sample every --step seconds over the last --hours and on
   past now by --ahead seconds (building and backfilling take minutes, and the rules run at the
   wall clock on data no older than their windows), and backfills it with `promtool tsdb
   create-blocks-from openmetrics`;
3. starts Prometheus (Debian `prometheus`) on those blocks with the shipped rule files
   (alerts/*.rules.yml, unchanged) and an out-of-order window (the rules write their results at
   now, inside the blocks' time range), waits until every rule group has been evaluated twice
   (every 15 s), and prints:
   - every rule group's `prometheus_rule_group_last_duration_seconds` (the largest of its
     evaluations seen);
   - every fleet dashboard query's latency as Grafana runs it: a range query over the dashboard's
     default range (3 h) with a step of range/1000 (Grafana's default max data points for a
     panel ~1000 px wide) but no less than the sample step, first run and best of three; and the
     raw queries the lockstep-fleet.recording rules replaced.  The recorded series exist only
     since Prometheus started, so their figures are the cost of few series, not of 3 h of them;
   - the Prometheus process's resident memory, heap in use, and series loaded.
Prints figures; no pass/fail.  tests/simulation/test_fleet.py runs a 16-node, 10-minute version.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # alerts/ and dashboards/ are repository packages, not installed

from alerts import render  # noqa: E402
from lockstep import thresholds as T  # noqa: E402
from lockstep.simulation.snapshot import expositions  # noqa: E402
from lockstep.simulation.storage import EPOCH  # noqa: E402

PROMETHEUS = "/usr/bin/prometheus"
SCENARIOS = (
    "healthy",
    "straggler",
    "kv-pressure",
    "nfs-server-down",
    "gpu-faults",
    "link-flap",
    "gpu-throttle",
    "gpu-lost",
)
# Nodes with faults of their own (the node record's inputs, lockstep/node_faults.py): (cluster,
# job, position in it) -> scenario, in jobs other than the straggler's, the stalled one and the
# hung mount's.
FAULTY = {
    ("east", 2, 0): "gpu-faults",
    ("east", 2, 1): "link-flap",
    ("east", 1, 0): "gpu-throttle",
    ("west", 2, 0): "gpu-lost",
}
MOMENTS = (0.0, 600.0)  # simulated seconds: a checkpoint interval apart, so every counter moves
SIM_JOB = "4242"  # the simulated node's Slurm job
RANKS_PER_NODE = 8
FLEET_DASHBOARD = REPO / "dashboards" / "lockstep-fleet.json"
RULE_FILES = [REPO / path for path in render.RULE_FILES.values()]
DASHBOARD_RANGE = 3 * 3600  # the fleet dashboard's default time range (now-3h)
GRAFANA_MAX_POINTS = 1000
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


# --- The simulated node's series -----------------------------------------------------------------


@dataclass(frozen=True)
class BaseSeries:
    """One series of the simulated node, at the two moments."""

    name: str
    labels: tuple[tuple[str, str], ...]
    first: float
    second: float

    @property
    def kind(self) -> str:
        if self.name.endswith("_timestamp_seconds"):
            return "timestamp"
        if self.name.endswith(("_total", "_bucket", "_sum", "_count")):
            return "counter"
        return "gauge"


def parse_exposition(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        name, _, labels = head.partition("{")
        out[(name, tuple(sorted(_LABEL.findall(labels))))] = float(value)
    return out


def node_series(scenario: str) -> list[BaseSeries]:
    first, second = (parse_exposition(text) for text in expositions(scenario, MOMENTS))
    return [
        BaseSeries(name, labels, first.get((name, labels), value), value) for (name, labels), value in second.items()
    ]


def referenced_families() -> set[str]:
    """Metric names the shipped rules and the fleet dashboard read."""
    text = "".join(path.read_text() for path in RULE_FILES) + FLEET_DASHBOARD.read_text()
    return set(re.findall(r"\blockstep_[a-z0-9_]+", text))


def family(name: str) -> str:
    return re.sub(r"_(bucket|sum|count)$", "", name)


# --- The fleet -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Node:
    index: int
    name: str
    cluster: str
    scenario: str
    job_id: str | None  # None: an inference node
    position: int  # the node's place in its job (ranks 8*position ... 8*position+7)
    stalls: bool


@dataclass
class FleetPlan:
    nodes: list[Node] = field(default_factory=list)
    straggler: tuple[str, str] = ("", "")  # (job_id, instance)
    stalled_job: str = ""
    hung_mount: str = ""  # instance

    def jobs(self) -> set[tuple[str, str]]:
        return {(n.cluster, n.job_id) for n in self.nodes if n.job_id}


def plan(count: int) -> FleetPlan:
    result = FleetPlan()
    halves = {"east": range(0, count // 2), "west": range(count // 2, count)}
    for number, (cluster, indices) in enumerate(halves.items(), start=1):
        indices = list(indices)
        inference = max(1, len(indices) // 16)
        training = indices[: len(indices) - inference]
        jobs = max(1, min(4, len(training) // 2))
        size = len(training) // jobs
        for position_in_cluster, index in enumerate(indices):
            name = f"gpu{index + 1:04d}"
            if position_in_cluster >= len(training):
                result.nodes.append(Node(index, name, cluster, "kv-pressure", None, 0, False))
                continue
            job = min(position_in_cluster // size, jobs - 1)
            job_id = str(number * 10000 + job + 1)
            position = position_in_cluster - job * size
            scenario = FAULTY.get((cluster, job, position), "healthy")
            if cluster == "east" and job == 0 and position == 1:
                scenario = "straggler"
                result.straggler = (job_id, f"{name}:12400")
            if cluster == "west" and job == min(1, jobs - 1) and position == 1:
                scenario = "nfs-server-down"
                result.hung_mount = f"{name}:12400"
            stalls = cluster == "west" and job == 0
            if stalls:
                result.stalled_job = job_id
            result.nodes.append(Node(index, name, cluster, scenario, job_id, position, stalls))
    return result


def relabel(series: BaseSeries, node: Node) -> dict[str, str] | None:
    """The series' labels as this node exports them, or None when the node has no such series."""
    labels = dict(series.labels)
    if node.job_id is None and series.name.startswith(
        ("lockstep_training_", "lockstep_slurm_job_", "lockstep_checkpoint_")
    ):
        return None  # an inference node runs no training job
    if series.name.startswith("lockstep_training_"):
        if labels.get("host") != "node001":
            return None  # the simulated node reads its job's other node's logs too; each node keeps its own
        labels["host"] = node.name
        labels["rank"] = str(int(labels["rank"]) + RANKS_PER_NODE * node.position)
    for key, value in labels.items():
        if SIM_JOB in value and node.job_id:
            labels[key] = value.replace(SIM_JOB, node.job_id)
        elif key in ("uuid", "mig_uuid") and value.startswith(("GPU-", "MIG-")):
            labels[key] = f"{value[:4]}{node.index:08x}{value[12:]}"
        elif key == "node_guid":
            labels[key] = f"{node.index:04x}{value[4:]}"
        elif key == "slurm_node":
            labels[key] = node.name
    labels.update({"job": T.AGENT_JOB, "instance": f"{node.name}:12400", "cluster": node.cluster})
    return labels


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


@dataclass(frozen=True)
class Track:
    """One series of the fleet: its exposition prefix and how its value moves."""

    prefix: str
    kind: str
    first: float
    second: float
    stall_at: float | None  # Unix time its training counters stop, for a stalled job


def tracks(
    plan_: FleetPlan, base: dict[str, list[BaseSeries]], families: set[str] | None, start: float, stall_at: float
) -> Iterator[Track]:
    for node in plan_.nodes:
        yield Track(
            f'up{{cluster="{node.cluster}",instance="{node.name}:12400",job="{T.AGENT_JOB}"}}', "gauge", 1.0, 1.0, None
        )
        for series in base[node.scenario]:
            if families is not None and family(series.name) not in families:
                continue
            labels = relabel(series, node)
            if labels is None:
                continue
            text = ",".join(f'{key}="{_escape(value)}"' for key, value in sorted(labels.items()))
            stalls = node.stalls and series.name.startswith("lockstep_training_")
            yield Track(
                f"{series.name}{{{text}}}", series.kind, series.first, series.second, stall_at if stalls else None
            )


# Every NAMED_EVERY-th training node was named by its job's straggler alert all through the
# history (ALERTS, as Prometheus writes it while an alert fires), and so was the straggler node:
# the node record's inputs (alerts/nodes.py).  A fleet whose alerts named one node in eight in a
# week, the history's hour standing for the week the record reads.
NAMED_EVERY = 8


def alert_history(plan_: FleetPlan) -> Iterator[Track]:
    named = [n for n in plan_.nodes if n.job_id and n.index % NAMED_EVERY == 0]
    named += [n for n in plan_.nodes if f"{n.name}:12400" == plan_.straggler[1] and n not in named]
    for node in named:
        labels = {
            "alertname": "LockstepTrainingStragglerSustained",
            "alertstate": "firing",
            "cluster": node.cluster,
            "instance": f"{node.name}:12400",
            "job": T.AGENT_JOB,
            "job_id": node.job_id or "",
            "rank": str(8 * node.position + 3),
            "severity": "warning",
        }
        yield Track(
            "ALERTS{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}", "gauge", 1.0, 1.0, None
        )


def value_at(track: Track, t: float, start: float, k: int) -> float:
    """The series' value at Unix time t, the k-th sample of the history starting at start."""
    if track.stall_at is not None and t > track.stall_at:
        t = track.stall_at
    elapsed = t - start
    span = MOMENTS[1] - MOMENTS[0]
    if track.kind == "counter":
        return track.first + (track.second - track.first) / span * elapsed
    if track.kind == "timestamp":
        if track.second < 1e9:
            return track.second  # 0: never happened
        age = (EPOCH + MOMENTS[1]) - track.second  # as old as on the simulated node
        return t - age
    return track.first if k % 2 == 0 else track.second


def write_openmetrics(path: Path, fleet_tracks: list[Track], start: float, end: float, step: int) -> int:
    """The whole history as OpenMetrics text (time-major: promtool needs each series in time
    order, not families together).  Returns the number of samples."""
    samples = 0
    with open(path, "w") as out:
        k = 0
        t = start
        while t <= end:
            stamp = f"{t:.3f}"
            out.write("".join(f"{tr.prefix} {value_at(tr, t, start, k)!r} {stamp}\n" for tr in fleet_tracks))
            samples += len(fleet_tracks)
            k += 1
            t += step
        out.write("# EOF\n")
    return samples


# --- Prometheus ----------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def backfill(openmetrics: Path, tsdb: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        raise SystemExit("promtool not found: apt-get install prometheus")
    result = subprocess.run(
        [promtool, "tsdb", "create-blocks-from", "openmetrics", str(openmetrics), str(tsdb)],
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        raise RuntimeError(f"promtool failed: {result.stderr[-2000:]}")


class Prometheus:
    """A Prometheus on a backfilled TSDB with the shipped rule files."""

    def __init__(self, directory: Path, tsdb: Path, evaluation_interval: str, flags: tuple[str, ...] = ()) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = directory / "prometheus.yml"
        # JSON is YAML.  The fleet's history is backfilled; the rule files are the shipped ones.
        config.write_text(
            json.dumps(
                {
                    "global": {"evaluation_interval": evaluation_interval, "scrape_interval": "5s"},
                    # The backfilled blocks reach past now (see run): the rules' results and the
                    # self-scrape are written at now, before the blocks' end, which only an
                    # out-of-order window allows ("out of bounds" otherwise).
                    "storage": {"tsdb": {"out_of_order_time_window": "1d"}},
                    "rule_files": [str(path) for path in RULE_FILES],
                    # Itself only, for its memory figures.
                    "scrape_configs": [
                        {"job_name": "prometheus", "static_configs": [{"targets": [f"127.0.0.1:{self.port}"]}]}
                    ],
                }
            )
        )
        self.log = directory / "prometheus.log"
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                [
                    PROMETHEUS,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={tsdb}",
                    "--storage.tsdb.retention.time=30d",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--log.level=warn",
                    *flags,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def get(self, path: str, timeout: float = 120) -> dict:
        with urllib.request.urlopen(self.url + path, timeout=timeout) as response:
            return json.loads(response.read())

    def query(self, expr: str) -> list[dict]:
        return self.get("/api/v1/query?" + urllib.parse.urlencode({"query": expr}))["data"]["result"]

    def wait_ready(self, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"prometheus exited {self.process.returncode}: {self.log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError("prometheus not ready in time")

    def rule_groups(self) -> list[dict]:
        return self.get("/api/v1/rules")["data"]["groups"]

    def wait_evaluated(self, rounds: int, timeout: float) -> tuple[dict[str, tuple[float, float]], dict[str, float]]:
        """Once every group ran `rounds` times: each group's (last, largest) evaluation duration
        (s), and each rule's last.  The first evaluations read the backfilled blocks from disk
        and are the largest; the last is the steady state."""
        seen: dict[str, set[str]] = {}
        durations: dict[str, tuple[float, float]] = {}
        rules: dict[str, float] = {}  # "group / alert or record name"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for group in self.rule_groups():
                stamp = group.get("lastEvaluation", "")
                if stamp and not stamp.startswith("0001-"):
                    seen.setdefault(group["name"], set()).add(stamp)
                    # evaluationTime: what Prometheus exports as prometheus_rule_group_last_duration_seconds
                    largest = max(durations.get(group["name"], (0.0, 0.0))[1], group["evaluationTime"])
                    durations[group["name"]] = (group["evaluationTime"], largest)
                    for rule in group["rules"]:
                        rules[f"{group['name']} / {rule['name']}"] = rule.get("evaluationTime", 0.0)
            groups = {g["name"] for g in self.rule_groups()}
            if groups and all(len(seen.get(name, ())) >= rounds for name in groups):
                return durations, rules
            time.sleep(0.5)
        raise RuntimeError(f"rule groups not evaluated {rounds} times in {timeout} s: {seen}")

    def memory(self) -> dict[str, float]:
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        rss = int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1)) * 1024  # type: ignore[union-attr]
        figures = {"rss_bytes": float(rss)}
        for name in ("go_memstats_heap_inuse_bytes", "prometheus_tsdb_head_series"):
            deadline = time.monotonic() + 30
            result = self.query(f'{name}{{job="prometheus"}}')
            while not result and time.monotonic() < deadline:  # its first self-scrape
                time.sleep(1)
                result = self.query(f'{name}{{job="prometheus"}}')
            figures[name] = float(result[0]["value"][1]) if result else float("nan")
        return figures

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


# --- Dashboard queries ---------------------------------------------------------------------------


def dashboard_queries(path: Path = FLEET_DASHBOARD) -> list[tuple[str, str]]:
    """(panel title, expression) for every query of a dashboard, in panel order."""
    dashboard = json.loads(path.read_text())
    out = []

    def walk(panels: Iterable[dict]) -> None:
        for panel in panels:
            for target in panel.get("targets", []):
                if target.get("expr"):
                    out.append((panel.get("title", ""), target["expr"]))
            walk(panel.get("panels", []))

    walk(dashboard["panels"])
    return out


# What the fleet dashboard's panels queried before the lockstep-fleet.recording rules, at 256 nodes
# 1-5 s each: timed too, to show what the rules save.
RAW_QUERIES = (
    ("GPUs up (raw)", 'sum(lockstep_gpu_up{cluster=~"$cluster"})'),
    ("GPU utilization by cluster (raw)", 'avg by (cluster) (lockstep_gpu_utilization_ratio{cluster=~"$cluster"})'),
    ("GPU utilization across GPUs (raw)", 'lockstep_gpu_utilization_ratio{cluster=~"$cluster"}'),
)


def grafana_expr(expr: str, step: int, sample_step: int) -> str:
    """The variables as Grafana fills them with every cluster selected."""
    rate_interval = max(4 * sample_step, step + sample_step)  # Grafana's $__rate_interval
    for variable, value in (
        ("$__rate_interval", f"{rate_interval}s"),
        ("$__interval", f"{step}s"),
        ("$cluster", ".*"),
        ("$node", ".*"),
        ("$job_id", ".*"),
    ):
        expr = expr.replace(variable, value)
    return expr


def time_query(prometheus: Prometheus, expr: str, start: float, end: float, step: int) -> tuple[float, int]:
    """Seconds for one range query, and the number of series it returned."""
    params = urllib.parse.urlencode({"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step}s"})
    began = time.perf_counter()
    answer = prometheus.get("/api/v1/query_range?" + params)
    elapsed = time.perf_counter() - began
    if answer.get("status") != "success":
        raise RuntimeError(f"{expr}: {answer}")
    return elapsed, len(answer["data"]["result"])


@dataclass
class Result:
    nodes: int
    series: int
    samples: int
    generate_seconds: float
    backfill_seconds: float
    groups: dict[str, tuple[float, float]]  # last, largest (s)
    queries: list[tuple[str, str, float, float, int]]  # panel, expr, first, best, series
    memory: dict[str, float]
    rules: dict[str, float]  # "group / rule name" -> its last evaluation (s)


def run(
    nodes: int,
    hours: float,
    step: int,
    all_series: bool,
    evaluation_interval: str = "15s",
    ahead: float = 300.0,
    work: Path | None = None,
) -> tuple[Result, Prometheus, Path]:
    """Build, backfill and measure one fleet.  Returns the result and the running Prometheus
    (the caller stops it and removes the directory)."""
    directory = work or Path(tempfile.mkdtemp(prefix=f"lockstep-fleet-{nodes}-"))
    began = time.perf_counter()
    base = {scenario: node_series(scenario) for scenario in SCENARIOS}
    fleet = plan(nodes)
    # The history runs past now by `ahead` seconds: rules and queries run at the wall clock once
    # backfilling is done, and must find the fleet still "scraped" then (a gauge older than 5
    # minutes is stale).  Samples after the moment of a query are not read by it.
    now = float(int(time.time()) // step * step)
    start = now - hours * 3600
    end = now + ahead
    # The stalled job stops a quarter into the history, or before it when the history is shorter
    # than the stall alert's window and a quarter (the test's 10 minutes): then it never moves.
    stall_at = max(start, min(start + (now - start) / 4, now - 15 * 60))
    families = None if all_series else referenced_families()
    fleet_tracks = [*tracks(fleet, base, families, start, stall_at), *alert_history(fleet)]
    openmetrics = directory / "fleet.om.txt"
    samples = write_openmetrics(openmetrics, fleet_tracks, start, end, step)
    generated = time.perf_counter()
    tsdb = directory / "tsdb"
    backfill(openmetrics, tsdb)
    openmetrics.unlink()
    backfilled = time.perf_counter()
    prometheus = Prometheus(directory, tsdb, evaluation_interval)
    try:
        prometheus.wait_ready()
        groups, rule_seconds = prometheus.wait_evaluated(rounds=3, timeout=900)
        now = time.time()
        query_step = max(step, DASHBOARD_RANGE // GRAFANA_MAX_POINTS)
        queries = []
        for panel, expr in [*dashboard_queries(), *RAW_QUERIES]:
            filled = grafana_expr(expr, query_step, step)
            timings = [time_query(prometheus, filled, now - DASHBOARD_RANGE, now, query_step) for _ in range(3)]
            queries.append((panel, filled, timings[0][0], min(t for t, _ in timings), timings[0][1]))
        memory = prometheus.memory()
    except BaseException:
        prometheus.stop()
        raise
    result = Result(
        nodes,
        len(fleet_tracks),
        samples,
        generated - began,
        backfilled - generated,
        groups,
        queries,
        memory,
        rule_seconds,
    )
    return result, prometheus, directory


def report(result: Result, fleet: FleetPlan) -> None:
    print(
        f"fleet of {result.nodes} nodes: {result.series} series, {result.samples} samples; "
        f"generated in {result.generate_seconds:.0f} s, backfilled in {result.backfill_seconds:.0f} s"
    )
    print(
        f"  straggler: job {fleet.straggler[0]} on {fleet.straggler[1]}; stalled job {fleet.stalled_job}; "
        f"hung mount on {fleet.hung_mount}"
    )
    print("  rule group evaluation (prometheus_rule_group_last_duration_seconds after 3 rounds / largest seen):")
    for name, (last, largest) in sorted(result.groups.items(), key=lambda item: -item[1][0]):
        print(f"    {name:<34} {last * 1000:9.1f} ms {largest * 1000:9.1f} ms")
    print("  slowest rules (evaluationTime of /api/v1/rules, last round):")
    for name, seconds in sorted(result.rules.items(), key=lambda item: -item[1])[:8]:
        print(f"    {name:<70} {seconds * 1000:9.1f} ms")
    print(f"  fleet dashboard queries over {DASHBOARD_RANGE // 3600} h (first run / best of 3, series returned):")
    for panel, expr, first, best, count in result.queries:
        flag = "  > 1 s" if best > 1 else ""
        print(f"    {panel[:34]:<34} {first * 1000:8.0f} ms {best * 1000:8.0f} ms {count:6d}  {expr[:70]}{flag}")
    m = result.memory
    print(
        f"  prometheus: RSS {m['rss_bytes'] / 2**20:.0f} MiB, heap in use "
        f"{m['go_memstats_heap_inuse_bytes'] / 2**20:.0f} MiB, head series {m['prometheus_tsdb_head_series']:.0f}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, nargs="+", default=[256, 1024])
    parser.add_argument("--hours", type=float, default=1.0, help="history to backfill (default 1)")
    parser.add_argument("--step", type=int, default=60, help="seconds between samples, the scrape interval (60)")
    parser.add_argument(
        "--all-series", action="store_true", help="every series, not only those rules and the fleet dashboard read"
    )
    parser.add_argument(
        "--ahead",
        type=float,
        help="seconds of history past now, to cover building and backfilling (default: 1 s a node, at least 300)",
    )
    args = parser.parse_args()
    if not os.access(PROMETHEUS, os.X_OK):
        sys.exit("prometheus not found: apt-get install prometheus")
    for nodes in args.nodes:
        ahead = args.ahead if args.ahead is not None else max(300.0, nodes * 1.0)
        result, prometheus, directory = run(nodes, args.hours, args.step, args.all_series, ahead=ahead)
        prometheus.stop()
        shutil.rmtree(directory, ignore_errors=True)
        report(result, plan(nodes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
