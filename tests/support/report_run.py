"""The demo scenarios at their own timing on a real Prometheus, watched once for
tests/report/test_report_e2e.py (`lockstep report` of each scenario's job), the report-section
recipe (tests/project/test_new_report_section_recipe.py, from the run's recorded data) and the
hangs at their own timing (tests/alerts/test_hangs_e2e.py: the alerts seen firing, and when).

One Prometheus (Debian `prometheus`, tests/support/prometheus.py Stack) scrapes one
`lockstep demo --speed 10` per scenario (10 simulated seconds per real second), each target
labelled cluster=<scenario> and registered before its demo serves, every 1.5 s (15 simulated
seconds, a production scrape interval), and evaluates every 1.5 s.  Every `for:`, range window
and offset of the rules is divided by exactly the same 10 (alerts/compression.py, no minimum that
would stretch a window): every window holds what it holds in production, at the scenario's own
timing (simulation/timeline.py: the hangs' event at HANG_AT, a minute in), and a 6-minute save
lasts 6 minutes of the rules' time.  The rules that read time() are left out (the simulated clock
runs ten times as fast as Prometheus'), and the agent's own health (on a loaded 2-core machine a
scrape can time out, which is no part of the jobs' story; tests/alerts/test_alerts_e2e.py proves
those alerts).  The collectors are those of a job's evidence, every second (10 simulated).

The hangs' twins (hang-save, hang-eval, hang-end) are watched too, for their alerts alone.  While
the demos run, the alerts API is read every real second (10 simulated): each alert's first firing,
in simulated seconds from its demo's start (Run.fired).  At OBSERVE every report is made as
Prometheus saw its job at that moment, the demos stopped from then on (the reports are made on a
quiet machine, in any order, each from the same data): the collective straggler's twice (the
recorded series deleted for the second), and the Slurm epilog stores the report of the job killed
while hung, then read back with Prometheus gone.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from alerts import render
from alerts.compression import Compression
from lockstep.report import text
from lockstep.report.model import Report, from_json
from lockstep.report.prometheus import Prometheus
from lockstep.report.stragglers import NCCL_PER_OP_RECORDED
from lockstep.suspects import GPU_THROTTLE, NCCL_RANK_SUSPECT, NODE_SUSPECT, RANK_SUSPECT
from tests.support import LOCKSTEP, REPO
from tests.support.hang_cases import HANG_CASES
from tests.support.prometheus import Stack, query_alerts
from tests.support.reports import report_cli

SPEED = 10
# The collectors of a job's evidence, and those a scenario's fault needs besides (fewer agents'
# threads on a shared 2-core machine: a demo starved of CPU reads its step logs late).
COLLECTORS = ("gpu", "slurm", "training", "nccl_inspector", "nccl_ras", "checkpoint")
EXTRA_COLLECTORS = {
    "straggler-nfs": ("filesystem",),
    "straggler-pfc": ("ethtool",),
    "checkpoint-stall": ("host", "filesystem"),
}
# The scenarios reported (tests/report/test_report_e2e.py), and the hangs' (hang_cases.py).
REPORTED = (
    "healthy",
    "straggler",
    "straggler-thermal",
    "straggler-data",
    "straggler-nfs",
    "straggler-pfc",
    "nccl-straggler",
    "hang-steps",
    "hang-nccl",
    "hang-killed",
    "checkpoint-stall",
)
# Watched besides, for their alerts alone (tests/alerts/test_hangs_e2e.py): the hangs' twins.
WATCHED = (*REPORTED, *(scenario for scenario in HANG_CASES if scenario not in REPORTED))
OBSERVE = 210  # real seconds: the straggler-* scenarios turn slow 25 simulated minutes (150 s) in
AGENT_HEALTH = ("LockstepAgentDown", "LockstepCollectorFailing")
EPILOG = REPO / "deploy" / "slurm" / "lockstep-report-epilog.sh"
# The environment variable naming another run's recorded data (its recorded.json) to make the
# reports from, in place of a run of the demos (reports_from_recorded).
RECORDED = "LOCKSTEP_TEST_REPORTS_FROM"


@dataclass
class Run:
    logs: dict[str, Path] = field(default_factory=dict)
    # Every alert seen firing while the demos ran: scenario -> alertname -> (simulated seconds
    # from the demo's start when first seen, its labels); and every alert (firing or pending) at OBSERVE.
    fired: dict[str, dict[str, tuple[float, dict[str, str]]]] = field(default_factory=dict)
    at_end: list[dict[str, Any]] = field(default_factory=list)
    # The reports, at OBSERVE.
    reports: dict[str, Report] = field(default_factory=dict)
    texts: dict[str, str] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    store: Path = Path()
    epilog: subprocess.CompletedProcess[str] | None = None
    # The NCCL time per collective the rules recorded, a series a rank and communicator, by scenario.
    recorded_per_op: dict[str, int] = field(default_factory=dict)
    # ... and once deleted (at the same moment), with nccl-straggler's report then (the counters').
    recorded_after_delete: dict[str, int] = field(default_factory=dict)
    counted_nccl: subprocess.CompletedProcess[str] | None = None
    # The suspects the rules recorded for each straggler of each report, over the same span as
    # the report reads (what the straggler alert's annotation names), by scenario and rank.
    recorded_suspects: dict[str, dict[str, set[str]]] = field(default_factory=dict)
    stored_text: subprocess.CompletedProcess[str] | None = None
    # The data the reports were made from and when (record()): recorded.json.
    recorded: Path = Path()


def watch(url: str, served: dict[str, float], result: Run) -> None:
    """The alerts firing now, each kept in result.fired with the simulated time it was first seen
    (served: when each scenario's demo served, by time.monotonic(); its clock started then)."""
    now = time.monotonic()
    for alert in query_alerts(url):
        scenario = alert["labels"].get("cluster", "")
        if alert["state"] == "firing" and scenario in served:
            seen = result.fired.setdefault(scenario, {})
            seen.setdefault(alert["labels"]["alertname"], ((now - served[scenario]) * SPEED, alert["labels"]))


def suspects_recorded_for(url: str, report: Report) -> dict[str, set[str]]:
    """For each straggler of the report, the suspects the rules recorded over its span and the
    timeline's window before (asked here, apart from the report's own queries): its rank's (what
    the straggler alerts name), its node's, and a throttled GPU of its job there."""
    prom = Prometheus(url)
    out = {}
    for s in report.stragglers:
        record = NCCL_RANK_SUSPECT if s.kind == "nccl" else RANK_SUSPECT
        comm = f', comm="{s.comm}"' if s.kind == "nccl" else ""
        window = f"[{int((s.end - s.start + 4 * 1.5) * 1000)}ms]"  # the report's window: 4 scrapes
        node = f'{{cluster="{report.job.cluster}", instance="{s.node}"}}'
        rank = f'{{cluster="{report.job.cluster}", job_id="4242", rank="{s.rank}"{comm}}}'
        names = set()
        for selector in (record + rank, NODE_SUSPECT + node):
            found = prom.query(f"max by (suspect) (max_over_time({selector}{window}))", s.end)
            names |= {x.labels["suspect"] for x in found}
        gpus = f'lockstep_slurm_job_gpu_info{{cluster="{report.job.cluster}", job_id="4242"}}'
        if prom.query(f"max by (uuid) (max_over_time({GPU_THROTTLE}{node}{window})) and on (uuid) {gpus}", s.end):
            names.add("gpu_throttle")
        out[s.rank] = names
    return out


def recorded_per_cluster(url: str, at: float) -> dict[str, int]:
    """The NCCL time per collective the rules recorded, its series by scenario, at `at`."""
    recorded = Prometheus(url).query(f"count by (cluster) ({NCCL_PER_OP_RECORDED})", at)
    return {s.labels.get("cluster", ""): int(s.value) for s in recorded}


def _rule_files() -> dict[str, str]:
    compression = Compression(for_scale=1 / SPEED, range_scale=1 / SPEED, min_range=1)
    files = {}
    for name, rendered in render.render_rule_files(compression).items():
        # Not the node record's groups (alerts/nodes.py): no report reads them, and since they
        # joined, straggler-thermal's report (a straggler seen at one point) lost its GPU in two
        # full runs of two (e2881a8, 2ec7d4f), though it matched alone.
        groups = [g for g in yaml.safe_load(rendered)["groups"] if not g["name"].startswith("lockstep-nodes.")]
        for group in groups:
            group["rules"] = [
                r
                for r in group["rules"]
                if "record" in r or ("time()" not in r["expr"] and r["alert"] not in AGENT_HEALTH)
            ]
        files[Path(name).name] = yaml.safe_dump({"groups": groups}, sort_keys=False)
    return files


def make_reports(url: str, at: float, result: Run) -> None:
    """Each reported scenario's report (JSON, and its text) as Prometheus at url saw its job at
    `at`, stored in result.store; a failed one's stderr in result.errors."""
    for scenario in REPORTED:
        got = report_cli(
            "4242",
            *("--prometheus", url, "--cluster", scenario, "--time-scale", str(SPEED), "--refresh"),
            *("--at", f"{at:.3f}"),
            *("--format", "json", "--store", str(result.store)),
        )
        if got.returncode != 0:
            result.errors[scenario] = got.stderr
            continue
        result.reports[scenario] = from_json(got.stdout)
        result.texts[scenario] = text.render(result.reports[scenario])


def record(url: str, at: float, tmp: Path) -> Path:
    """A snapshot of Prometheus' data (its admin API: hard links, the head block included) and
    the moment the reports were made, in tmp/recorded.json."""
    request = urllib.request.Request(f"{url}/api/v1/admin/tsdb/snapshot", method="POST")
    with urllib.request.urlopen(request, timeout=60) as response:
        name = json.loads(response.read())["data"]["name"]
    recorded = tmp / "recorded.json"
    recorded.write_text(json.dumps({"snapshot": str(tmp / "tsdb" / "snapshots" / name), "at": at}))
    return recorded


@contextmanager
def reports_from_recorded(tmp: Path, recorded: Path) -> Iterator[Run]:
    """The reports alone, made by this checkout's code from another run's recorded data (its
    record()): a Prometheus on a copy of the snapshot, no demo, no rule.  The report-section
    recipe's copy of the repository regenerates the report goldens this way (RECORDED in its
    environment): the demos' data does not change with a report section, and watching them
    again took 3.5 minutes.  Nothing but the reports is in the Run."""
    facts = json.loads(recorded.read_text())
    shutil.copytree(facts["snapshot"], tmp / "tsdb")
    stack = Stack(tmp, {}, scrape_interval="1500ms", evaluation_interval="1500ms")
    try:
        result = Run(store=tmp / "store", logs=stack.logs)
        make_reports(stack.url, facts["at"], result)
        yield result
    finally:
        stack.stop()
        shutil.rmtree(tmp, ignore_errors=True)


@contextmanager
def report_run(tmp: Path) -> Iterator[Run]:
    """Watch every scenario (see the module's docstring) and yield what was seen and reported;
    everything started is stopped, and tmp removed, on the way out.  With RECORDED in the
    environment, the reports alone from that recorded run (reports_from_recorded)."""
    if RECORDED in os.environ:
        with reports_from_recorded(tmp, Path(os.environ[RECORDED])) as recorded:
            yield recorded
        return
    stack: Stack | None = None
    try:
        config = tmp / "lockstep.yml"
        every = {*COLLECTORS, *(c for extra in EXTRA_COLLECTORS.values() for c in extra)}
        config.write_text(yaml.safe_dump({"collectors": {c: {"interval": "1s", "deadline": "10s"} for c in every}}))
        # The admin API: the recorded NCCL series deleted for the counters' report (below).
        stack = Stack(
            tmp,
            _rule_files(),
            scrape_interval="1500ms",
            evaluation_interval="1500ms",
            prometheus_args=("--web.enable-admin-api",),
        )
        demos = {}
        for scenario in WATCHED:
            enabled = (*COLLECTORS, *EXTRA_COLLECTORS.get(scenario, ()))
            args = ["--scenario", scenario, "--speed", str(SPEED), "--config", str(config)]
            demos[scenario] = (
                scenario,
                [*args, "--collector.disable-defaults", *(f"--collector.{c}" for c in enabled)],
            )
        ready = stack.start_demos(demos, register="before", give_up=120)
        result = Run(store=tmp / "store", logs=stack.logs)
        until = max(ready.values()) + OBSERVE
        while time.monotonic() < until:
            watch(stack.url, ready, result)
            time.sleep(max(0.0, min(1.0, until - time.monotonic())))
        result.at_end = query_alerts(stack.url)
        # Every report as Prometheus saw its job at one moment, the demos stopped from then on.
        at = time.time()
        stack.stop_demos()
        url = stack.url
        result.recorded_per_op = recorded_per_cluster(url, at)
        make_reports(url, at, result)
        for scenario, report in result.reports.items():
            result.recorded_suspects[scenario] = suspects_recorded_for(url, report)
        # What the reports were made from, kept for the session: the report-section recipe's
        # copy of the repository makes its reports from it (RECORDED, reports_from_recorded).
        result.recorded = record(url, at, tmp)
        # The collective straggler as a Prometheus without the shipped rules shows it: the
        # recorded time per collective deleted (the rules record again from now on, after `at`),
        # so the report reads the counters (lockstep/report/stragglers.py counted_per_op).
        deleted = urllib.request.Request(
            f"{url}/api/v1/admin/tsdb/delete_series?" + urllib.parse.urlencode({"match[]": NCCL_PER_OP_RECORDED}),
            method="POST",
        )
        with urllib.request.urlopen(deleted, timeout=30) as response:
            assert response.status == 204, response.read()
        result.recorded_after_delete = recorded_per_cluster(url, at)
        result.counted_nccl = report_cli(
            "4242",
            *("--prometheus", url, "--cluster", "nccl-straggler", "--time-scale", str(SPEED), "--refresh"),
            *("--at", f"{at:.3f}"),
            *("--format", "json", "--store", str(tmp / "counted-store")),
        )
        # The job killed while hung: the Slurm epilog stores its report ...
        env = {
            **os.environ,
            "SLURM_JOB_ID": "4242",
            "LOCKSTEP": " ".join(LOCKSTEP),
            "LOCKSTEP_PROMETHEUS_URL": url,
            "LOCKSTEP_REPORT_STORE": str(result.store),
            "LOCKSTEP_CLUSTER": "hang-killed",
            "LOCKSTEP_REPORT_DELAY": "0",
            "LOCKSTEP_REPORT_OPTIONS": f"--time-scale {SPEED}",
            "LOCKSTEP_REPORT_DEFAULTS": str(tmp / "no-defaults"),
        }
        result.epilog = subprocess.run(["sh", str(EPILOG)], capture_output=True, text=True, timeout=120, env=env)
        # ... which `lockstep report` reads with Prometheus gone.
        stack.stop()
        result.stored_text = report_cli(
            "4242", "--cluster", "hang-killed", "--prometheus", url, "--store", str(result.store)
        )
        yield result
    finally:
        if stack is not None:
            stack.stop()
        # Prometheus' data and the agents' nodes: 22 MB that would stay until the session ends
        # (the suite's machine check allows 50 MB in all).
        shutil.rmtree(tmp, ignore_errors=True)
