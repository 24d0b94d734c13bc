"""Reports for the report's tests: a hand-made one with something in every section, the
canonical form of a report read from a live Prometheus (its golden files compare that), the
comparison with a golden file, and `lockstep report` as the tests run it."""

from __future__ import annotations

import copy
import difflib
import re
import subprocess

from lockstep.report import text
from lockstep.report.build import grafana_link
from lockstep.report.model import (
    Alert,
    CheckpointRoot,
    Event,
    Gpu,
    Hang,
    Interval,
    Job,
    Point,
    PostMortem,
    Report,
    Steps,
    Straggler,
    to_json,
)
from lockstep.report.notes import notes_for, verdict_for
from tests.support import GOLDEN, LOCKSTEP, REPO

T0 = 1767225600.0  # 2026-01-01T00:00:00Z
GIB = 2**30


def sample_report() -> Report:
    job = Job(
        job_id="4242",
        cluster="h100-a",
        state="ended",
        start=T0,
        end=T0 + 14 * 3600 + 120,
        duration_seconds=14 * 3600 + 120,
        user="alice",
        account="llm-pretrain",
        partition="h100",
        job_name="llama-70b-pretrain",
        nodes=["n12:12400", "n25:12400"],
        hosts=["n12", "n25"],
        ranks=16,
        gpus=16,
    )
    gpus = [
        Gpu("n12", "5", "GPU-5", 0.97, 70 * GIB, 80 * GIB, 610.0, 700.0, {"hw_thermal_slowdown": 18000.0}),
        Gpu("n25", "3", "GPU-3", 0.004, 1 * GIB, 80 * GIB, 71.0, 75.0, idle=True),
        Gpu("n25", "6", "GPU-6", 0.95, 70 * GIB, 80 * GIB, 150.0, 690.0, xid_errors={"79": 1}),
    ]
    steps = Steps(
        source="training",
        steps=2400,
        median_step_seconds=21.0,
        timeline=[Point(T0 + i * 60, v) for i, v in enumerate([21.0, 21.0, 22.0, 29.0, 29.0, 21.0, 21.0, 20.0])],
        stalls=[Interval(T0 + 13 * 3600, T0 + 14 * 3600, 3600.0)],
        tokens_per_second=[Point(T0 + i * 60, v) for i, v in enumerate([1000.0, 1010.0, 800.0, 790.0, 1000.0])],
        last_step=T0 + 13 * 3600,
    )
    stragglers = [
        Straggler(
            kind="training",
            rank="5",
            host="n12",
            node="n12:12400",
            gpu="5",
            start=T0 + 3600,
            end=T0 + 5 * 3600,
            seconds=4 * 3600,
            ratio=1.4,
            share_lost=0.09,
            evidence=["GPU 5 throttled (hw_thermal_slowdown) 62% of the time"],
        )
    ]
    checkpoints = [
        CheckpointRoot(
            root="/lustre/ckpt/job=4242",
            node="n12",
            saves=12,
            expected_interval_seconds=3600.0,
            cadence_seconds=3600.0,
            durations_seconds=[40.0, 2460.0],
            stalls=[Interval(T0 + 6 * 3600, T0 + 6 * 3600 + 2460, 2460.0)],
            last_success=T0 + 12 * 3600,
            work_at_risk_seconds=2 * 3600 + 120,
        )
    ]
    hangs = [Hang("LockstepTrainingHung", T0 + 13 * 3600 + 300, rank="", host="", gpu="6")]
    alerts = [
        Alert("LockstepTrainingHung", "critical", T0 + 13 * 3600 + 300, T0 + 14 * 3600, {"gpu": "6", "job_id": "4242"}),
        Alert("LockstepGPUFellOffBus", "critical", T0 + 13 * 3600, T0 + 14 * 3600, {"gpu": "6"}),
    ]
    events = [Event("fabric", "n25", "IB mlx5_0/1 link down", 2)]
    report = Report(
        job=job,
        verdict="",
        generated_at=T0 + 15 * 3600,
        prometheus="http://prometheus:9090",
        grafana_url=grafana_link("http://grafana.example.com", job),
        gpus=gpus,
        steps=steps,
        stragglers=stragglers,
        checkpoints=checkpoints,
        hangs=hangs,
        post_mortem=PostMortem(rank="6", host="n25", gpu="6", stopped_at=T0 + 13 * 3600, how="named by X"),
        alerts=alerts,
        events=events,
    )
    report.notes = notes_for(report)
    report.verdict = verdict_for(report)
    return report


def canonical(report: Report, duration_seconds: float) -> Report:
    """The report with what depends on when Prometheus scraped taken out: every time is T0, the
    job lasted `duration_seconds`; counts, measured durations, utilization, power and alerts are
    dropped or coarsened; what the report concludes (who straggled, with what evidence, what
    stalled, who stopped first) stays.  Notes and the verdict are made again from the result, so
    the text stays consistent with itself."""
    r = copy.deepcopy(report)
    duration_seconds = float(duration_seconds)
    r.generated_at = T0
    r.prometheus = "http://prometheus"
    job = r.job
    job.start, job.end, job.duration_seconds = T0, T0 + duration_seconds, duration_seconds
    job.nodes = ["agent" for _ in job.nodes]
    r.grafana_url = grafana_link("http://grafana.example.com", job)
    for gpu in r.gpus:
        # Utilization and idleness left out: a GPU that idles after a hang averages 1-5 % over the
        # job depending on how much of its busy first minute was scraped (the idle threshold is 1 %).
        gpu.utilization_avg, gpu.idle = None, False
        gpu.memory_peak_bytes = None if gpu.memory_peak_bytes is None else round(gpu.memory_peak_bytes / GIB) * GIB
        # Power: a hung GPU's peak is its busy first minute or not, as it was scraped.
        gpu.power_avg_watts = gpu.power_max_watts = None
        # Throttling as its reasons only: a GPU throttled from 25 minutes into a 35-minute run is
        # right at the alert's 25 % (the straggler's evidence and the alerts keep what matters).
        gpu.throttle_seconds = {reason: 0.0 for reason in gpu.throttle_seconds}
        gpu.xid_errors = {k: 1 for k in gpu.xid_errors}
        gpu.ecc_errors = {k: 1 for k in gpu.ecc_errors}
    steps = r.steps
    steps.steps = 0
    steps.median_step_seconds = None if steps.median_step_seconds is None else round(steps.median_step_seconds)
    steps.timeline, steps.tokens_per_second = [], []
    steps.stalls = [Interval(T0, T0, 0.0) for _ in steps.stalls]
    steps.last_step = None
    for s in r.stragglers:
        s.node = "agent" if s.node else ""
        s.start = s.end = T0
        s.seconds = 0.0
        s.ratio = round(s.ratio, 1)
        s.share_lost = 0.0  # grows with the time observed after the fault
        s.evidence = [coarse(e) for e in s.evidence]
    for root in r.checkpoints:
        root.saves = 0
        root.cadence_seconds = None
        root.durations_seconds = []
        root.stalls = [Interval(T0, T0, 0.0) for _ in root.stalls]
        root.last_success = None
        root.work_at_risk_seconds = None
    # The alerts (and the hangs, which are alerts) left out: on a loaded machine an alert whose
    # 'for' ends near the end of the run fires in one run and not the next.  test_report_e2e.py
    # checks the hang alerts each scenario must have by name.
    r.hangs, r.alerts = [], []
    if r.post_mortem is not None:
        r.post_mortem.stopped_at = None
    for e in r.events:
        e.count = 0
    r.notes = notes_for(r)
    r.verdict = verdict_for(r)
    return r


def coarse(evidence: str) -> str:
    """A piece of evidence without its measured share or count."""
    evidence = re.sub(r"\s*\(?\d+(\.\d+)?%[^;)]*\)?", "", evidence)
    return re.sub(r": [\d.]+(e[+-]?\d+)?( s)? ", ": ", evidence)


def golden_check(name: str, output: str, update: bool) -> None:
    """output equals tests/golden/<name>; with update (pytest --update-golden, ./dev/regenerate)
    it is written there first."""
    golden = GOLDEN / name
    if update:
        golden.write_text(output)
    assert golden.exists(), f"{golden} missing: run pytest --update-golden"
    expected = golden.read_text()
    if output != expected:
        # The diff itself in the message: CI prints the message, and pytest truncates long strings.
        diff = "".join(difflib.unified_diff(expected.splitlines(True), output.splitlines(True), str(golden), "report"))
        raise AssertionError(f"report differs from {golden} (pytest --update-golden rewrites it):\n{diff}")


def report_goldens(name: str, stable: Report, update: bool) -> None:
    """The canonical report equals its two golden files, tests/golden/<name>.json and .txt."""
    golden_check(f"{name}.json", to_json(stable), update)
    golden_check(f"{name}.txt", text.render(stable), update)


def report_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`lockstep report ARGS` from the checkout, its output captured."""
    return subprocess.run([*LOCKSTEP, "report", *args], capture_output=True, text=True, timeout=120, cwd=REPO, env=env)
