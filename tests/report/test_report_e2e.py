"""`lockstep report` end to end: a real Prometheus scrapes the real agent on the demo scenarios,
with the alert rules loaded, and the report of each scenario's job is read back through the CLI.

One Prometheus (Debian `prometheus`) scrapes one `lockstep demo --speed 10` per scenario, each
target labelled cluster=<scenario>, every 1.5 s (15 simulated seconds), as
tests/alerts/test_hangs_e2e.py does; the rules are rendered with every `for:` and range window
divided by the same 10 (alerts/compression.py), leaving out the alerts that read time() (the
simulated clock runs ten times as fast as Prometheus').  The report is made with
`--time-scale 10`, so its durations are the simulated job's.

Each scenario's report is compared with its golden files, tests/golden/report-<scenario>.txt
and .json: the report with what depends on scrape timing taken out (tests/support/reports.py
`canonical`); `pytest --update-golden` (./dev/regenerate) rewrites them.  Exact assertions
name, per scenario, the rank held responsible, its evidence and the rank that stopped first.
The Slurm epilog script stores the report of the job killed while hung, which is then read back
with Prometheus gone.
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
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from alerts import render
from alerts.compression import Compression
from lockstep import thresholds as T
from lockstep.report import text
from lockstep.report.model import Report, from_json
from lockstep.report.prometheus import Prometheus
from lockstep.report.stragglers import NCCL_PER_OP_RECORDED
from lockstep.suspects import GPU_THROTTLE, NCCL_RANK_SUSPECT, NODE_SUSPECT, RANK_SUSPECT
from tests.support import LOCKSTEP, REPO, free_port, require_real
from tests.support.prometheus import PROMETHEUS, is_ready, start_logged, start_prometheus, stop_all
from tests.support.reports import canonical, report_cli, report_goldens

# Tier: a real Prometheus scrapes the real agent (tests/conftest.py).
pytestmark = pytest.mark.e2e

SPEED = 10
# The collectors of a job's evidence, and those a scenario's fault needs besides (fewer agents'
# threads on a shared 2-core machine: a demo starved of CPU reads its step logs late).
COLLECTORS = ("gpu", "slurm", "training", "nccl_inspector", "nccl_ras", "checkpoint")
EXTRA_COLLECTORS = {
    "straggler-nfs": ("filesystem",),
    "straggler-pfc": ("ethtool",),
    "checkpoint-stall": ("host", "filesystem"),
}
SCENARIOS = (
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
OBSERVE = 210  # real seconds: the straggler-* scenarios turn slow 25 simulated minutes (150 s) in
# The agent's own health: on a loaded 2-core machine a scrape can time out, which is no part of
# the jobs' story (tests/alerts/test_alerts_e2e.py proves these alerts).
AGENT_HEALTH = ("LockstepAgentDown", "LockstepCollectorFailing")
EPILOG = REPO / "deploy" / "slurm" / "lockstep-report-epilog.sh"


@dataclass
class Run:
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


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    require_real("Prometheus server (Debian package prometheus)", os.access(PROMETHEUS, os.X_OK))
    tmp = tmp_path_factory.mktemp("report")
    processes: list = []
    try:
        compression = Compression(for_scale=1 / SPEED, range_scale=1 / SPEED, min_range=1)
        for name, rendered in render.render_rule_files(compression).items():
            groups = yaml.safe_load(rendered)["groups"]
            for group in groups:
                group["rules"] = [
                    r
                    for r in group["rules"]
                    if "record" in r or ("time()" not in r["expr"] and r["alert"] not in AGENT_HEALTH)
                ]
            (tmp / Path(name).name).write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
        config = tmp / "lockstep.yml"
        config.write_text(
            yaml.safe_dump(
                {
                    "collectors": {
                        c: {"interval": "1s", "deadline": "10s"}
                        for c in {*COLLECTORS, *(c for extra in EXTRA_COLLECTORS.values() for c in extra)}
                    }
                }
            )
        )
        (tmp / "targets.json").write_text("[]")  # the demos' (below), once their ports are known
        prometheus_config = {
            "global": {"scrape_interval": "1500ms", "scrape_timeout": "1500ms", "evaluation_interval": "1500ms"},
            "rule_files": [str(tmp / Path(name).name) for name in render.RULE_FILES.values()],
            "scrape_configs": [
                {
                    "job_name": T.AGENT_JOB,
                    "file_sd_configs": [{"files": [str(tmp / "targets.json")], "refresh_interval": "1s"}],
                }
            ],
        }
        (tmp / "prometheus.yml").write_text(yaml.safe_dump(prometheus_config))
        # The admin API: the recorded NCCL series deleted for the counters' report (below).
        url = start_prometheus(tmp, free_port(), processes, ("--web.enable-admin-api",))
        demos = {}
        for scenario in SCENARIOS:
            port = free_port()
            args = [*LOCKSTEP, "demo", "--scenario", scenario, "--speed", str(SPEED), "--config", str(config)]
            enabled = (*COLLECTORS, *EXTRA_COLLECTORS.get(scenario, ()))
            args += ["--collector.disable-defaults", *(f"--collector.{c}" for c in enabled)]
            log = tmp / f"demo-{scenario}.log"
            processes.append(start_logged([*args, "--listen", f"127.0.0.1:{port}"], log))
            demos[scenario] = (f"http://127.0.0.1:{port}/healthz", processes[-1], log, port)
        # Every demo a target before it serves (LockstepAgentDown is left out above), so that its
        # first scrape comes within an interval of its simulated clock's start: 0.3-1.4 s after
        # it served, measured.  Added once it served, as tests/alerts do, the first scrape came
        # 3.1-4.7 s after (Prometheus' discovery passes new targets on every 5 s).  hang-steps'
        # job makes its last steps in the 6 s after it serves: a first scrape after them saw no
        # step made, and left its report without a step time (CI at f966419).
        targets = [{"targets": [f"127.0.0.1:{port}"], "labels": {"cluster": s}} for s, (*_, port) in demos.items()]
        (tmp / "targets.json.tmp").write_text(json.dumps(targets))
        os.replace(tmp / "targets.json.tmp", tmp / "targets.json")
        ready: dict[str, float] = {}
        give_up = time.monotonic() + 120
        while len(ready) < len(demos):
            assert time.monotonic() < give_up, f"not serving after 120 s: {sorted(set(demos) - set(ready))}"
            for scenario, (health, proc, log, _port) in demos.items():
                if scenario not in ready and is_ready(health, proc, log):
                    ready[scenario] = time.monotonic()
            time.sleep(0.2)
        time.sleep(max(0.0, max(ready.values()) + OBSERVE - time.monotonic()))
        # Every report as Prometheus saw its job at one moment, the demos stopped from then on (the
        # reports are then made on a quiet machine, in any order, each from the same data).
        at = time.time()
        stop_all(processes[1:])
        del processes[1:]
        result = Run(store=tmp / "store")
        result.recorded_per_op = recorded_per_cluster(url, at)
        for scenario in SCENARIOS:
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
            result.recorded_suspects[scenario] = suspects_recorded_for(url, result.reports[scenario])
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
        got = report_cli(
            "4242",
            *("--prometheus", url, "--cluster", "nccl-straggler", "--time-scale", str(SPEED), "--refresh"),
            *("--at", f"{at:.3f}"),
            *("--format", "json", "--store", str(tmp / "counted-store")),
        )
        result.counted_nccl = got
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
        stop_all(processes)
        processes.clear()
        result.stored_text = report_cli(
            "4242", "--cluster", "hang-killed", "--prometheus", url, "--store", str(result.store)
        )
        yield result
    finally:
        stop_all(processes)
        # Prometheus' data and the agents' nodes: 22 MB that would stay until the session ends
        # (the suite's machine check allows 50 MB in all).
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.mark.golden("report-{scenario}.txt", "report-{scenario}.json")
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_each_scenarios_report_matches_its_golden_files(
    run: Run, scenario: str, request: pytest.FixtureRequest
) -> None:
    assert scenario not in run.errors, run.errors.get(scenario)
    stable = canonical(run.reports[scenario], OBSERVE * SPEED)
    report_goldens(f"report-{scenario}", stable, bool(request.config.getoption("--update-golden")))


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_each_report_fits_100_columns_and_names_the_job(run: Run, scenario: str) -> None:
    lines = run.texts[scenario].splitlines()
    assert [line for line in lines if len(line) > 100] == []
    assert lines[0] == f"Lockstep report: job 4242 (cluster {scenario})"
    report = run.reports[scenario]
    assert (report.job.job_id, report.job.cluster, report.job.user, report.job.ranks) == ("4242", scenario, "alice", 16)


@dataclass(frozen=True)
class Expected:
    stragglers: tuple[tuple[str, str, str, str], ...] = ()  # kind, rank, gpu, the first evidence's start
    suspects: tuple[str, ...] = ()  # the first straggler's suspects (lockstep/suspects.py names)
    stopped_first: tuple[str, str] | None = None  # rank, GPU
    hang_alerts: tuple[str, ...] = ()
    checkpoint_stalls: int = 0


EXPECTED = {
    "healthy": Expected(),
    "straggler": Expected(
        stragglers=(("training", "3", "3", "GPU 3 throttled (hw_slowdown)"),), suspects=("gpu_throttle",)
    ),
    "straggler-thermal": Expected(
        stragglers=(("training", "3", "3", "GPU 3 throttled (sw_thermal_slowdown)"),), suspects=("gpu_throttle",)
    ),
    "straggler-data": Expected(stragglers=(("training", "3", "", "data loader: "),), suspects=("data_wait",)),
    "straggler-nfs": Expected(
        stragglers=(("training", "3", "", "mount /home hung"),), suspects=("hung_mount", "data_wait")
    ),
    "straggler-pfc": Expected(
        stragglers=(("training", "3", "", "PFC pause on ens3f0np0 priority 3"),), suspects=("pfc_pause",)
    ),
    "nccl-straggler": Expected(stragglers=(("nccl", "5", "5", ""),)),
    "hang-steps": Expected(stopped_first=("", "6"), hang_alerts=("LockstepTrainingHung",)),
    "hang-nccl": Expected(stopped_first=("6", "6"), hang_alerts=("LockstepNCCLRankStuck",)),
    "hang-killed": Expected(stopped_first=("6", "6"), hang_alerts=("LockstepNCCLRankStuck", "LockstepJobEndedHung")),
    "checkpoint-stall": Expected(checkpoint_stalls=1),
}


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_each_report_names_what_went_wrong(run: Run, scenario: str) -> None:
    report = run.reports[scenario]
    wanted = EXPECTED[scenario]
    print(f"report-e2e: {scenario}: {report.job}")  # shown when the test fails
    stragglers = tuple(
        (s.kind, s.rank, s.gpu, s.evidence[0][: len(e)] if s.evidence else "")
        for s, (_, _, _, e) in zip(report.stragglers, wanted.stragglers)
    )
    assert (stragglers, len(report.stragglers)) == (wanted.stragglers, len(wanted.stragglers))
    assert tuple(report.stragglers[0].suspects if report.stragglers else ()) == wanted.suspects
    pm = report.post_mortem
    assert (None if pm is None else (pm.rank, pm.gpu)) == wanted.stopped_first
    assert [h.alert for h in report.hangs if h.alert in wanted.hang_alerts] == list(wanted.hang_alerts)
    assert sum(len(root.stalls) for root in report.checkpoints) == wanted.checkpoint_stalls
    if scenario == "healthy":
        assert report.notes == [
            "Nothing to report: no straggler, stall, hang, throttling, idle GPU or alert during the job."
        ]
        assert report.alerts == []


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_each_stragglers_suspects_are_those_the_rules_recorded_for_its_rank(run: Run, scenario: str) -> None:
    """The report never contradicts the alert: a straggler's suspects are exactly those the
    shipped rules recorded while it straggled: its rank's (RANK_SUSPECT, NCCL_RANK_SUSPECT: what
    LockstepTrainingStragglerSustained's and LockstepNCCLStraggler's annotations read), its
    node's and a throttled GPU of its job there; the data wait, which the rules record only for
    a rank slow over 30 minutes, the report may judge itself.  Each suspect has a line of what
    its node showed.  Before the suspects were shared (lockstep/suspects.py), the report judged
    a hung mount by two unresponsive scrapes where the rule names it at one."""
    report = run.reports[scenario]
    recorded = run.recorded_suspects[scenario]
    named = {s.rank: set(s.suspects) for s in report.stragglers}
    assert {rank: names - {"data_wait"} for rank, names in named.items()} == {
        rank: names - {"data_wait"} for rank, names in recorded.items()
    }
    assert all(recorded[rank] <= names for rank, names in named.items()), (named, recorded)
    for straggler in report.stragglers:
        assert len(straggler.evidence) >= len(straggler.suspects), straggler


def test_the_hung_jobs_report_says_no_step_completed_from_its_last_step_on(run: Run) -> None:
    """hang-steps' ranks on this node hold their logs open while hung, as a real rank's process
    does (simulation/workloads.py), so the agent keeps their series and Prometheus their step
    counts: one step stall, from the job's last step to the end of its range (the job hung
    about 6 s after its demo served, and was watched OBSERVE from then or longer).  Without the
    held logs the agent dropped them a minute into the hang, and the report told of no stall."""
    report = run.reports["hang-steps"]
    assert len(report.steps.stalls) == 1, report.steps.stalls
    stall = report.steps.stalls[0]
    assert stall.start == report.steps.last_step
    assert report.job.end - stall.end <= 3.0  # two scrapes
    assert stall.seconds >= (OBSERVE - 10) * SPEED
    assert [r.steps.stalls for name, r in run.reports.items() if name != "hang-steps"] == [[]] * (len(SCENARIOS) - 1)


def test_the_collective_straggler_is_found_in_what_the_rules_record(run: Run) -> None:
    """With the shipped rules loaded, Prometheus records each NCCL rank's time per collective
    (a series a rank and communicator: the node's 8 ranks of one communicator), and the report
    reads it where it exists (test_report_queries.py): the collective straggler above was found
    in the recorded series, not the counters."""
    assert run.recorded_per_op.get("nccl-straggler") == 8, run.recorded_per_op
    assert [(s.kind, s.rank) for s in run.reports["nccl-straggler"].stragglers] == [("nccl", "5")]


def test_the_collective_straggler_is_found_in_the_counters_where_nothing_is_recorded(run: Run) -> None:
    """The report's other path (test_report_queries.py): the same Prometheus, the recorded
    series deleted, reads each rank's two NCCL counters and finds the same rank, as long."""
    assert run.recorded_after_delete == {}, run.recorded_after_delete
    assert run.counted_nccl is not None and (run.counted_nccl.returncode, run.counted_nccl.stderr) == (0, "")
    (counted,) = from_json(run.counted_nccl.stdout).stragglers
    (recorded,) = run.reports["nccl-straggler"].stragglers
    same = ("kind", "rank", "host", "node", "gpu", "comm", "ratio", "end", "evidence")
    assert [getattr(counted, f) for f in same] == [getattr(recorded, f) for f in same], (counted, recorded)
    # The recorded series is a rule's 5-minute mean, the counters' quotient a rate per point (over
    # 4 scrapes): the counters' first rate can come a point (a scrape, 1.5 s: 15 simulated s)
    # before the rule's first record, and where scrapes failed on the loaded machine the counters
    # have no rate for a few points that the rule's window bridges.  So the two start within two
    # points of each other; the counters hold no longer than the rule (two points at most) and at
    # least 90 % of it; and the share lost, for the time each held, agrees within 0.005.  Measured:
    # the counters began 1.5 s earlier and held 15.1, 15.1 and 30.2 simulated s less (of about
    # 2,066 s) in three runs, and 129.2 s less (6.2 %) in a CI-style run (f0b99e2).
    step = 1.5
    point = step * SPEED
    assert abs(recorded.start - counted.start) <= 2 * step + 0.1, (counted, recorded)
    assert 0.9 * recorded.seconds <= counted.seconds <= recorded.seconds + 2 * point + 0.5, (counted, recorded)
    held = counted.seconds / recorded.seconds
    assert counted.share_lost == pytest.approx(recorded.share_lost * held, abs=0.005), (counted, recorded)


def test_the_epilog_stores_the_report_of_the_job_killed_while_hung(run: Run) -> None:
    assert run.epilog is not None and run.stored_text is not None
    assert (run.epilog.returncode, run.epilog.stderr) == (0, "")
    stored = run.store / "hang-killed" / "4242.json"
    body = stored.read_text()
    assert "\n" not in body and body.startswith('{"schema":"lockstep.report/v1",')
    report = from_json(body)
    assert report.job.state == "ended"
    assert report.post_mortem is not None and (report.post_mortem.rank, report.post_mortem.gpu) == ("6", "6")
    # Read back from the store with Prometheus gone: the stored report, as text.
    assert (run.stored_text.returncode, run.stored_text.stderr) == (0, "")
    assert run.stored_text.stdout == text.render(report)
