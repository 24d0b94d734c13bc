"""`lockstep report` of the real DDP runs (issue 36): real PyTorch jobs (tests/fixtures/training/,
bench/ddp_runs.py: DDP over gloo on CPU, one rank given real extra compute) replayed at their own
timestamps through the real training collector, backfilled into a real Prometheus, and reported
by the real CLI, as a user runs it (`lockstep report JOB --prometheus URL --format json|text`).

What is real:
- the ranks' logs, written by lockstep.emitter during the runs (the machine's own jitter in them);
- the training collector (the agent's code) reading them as they were written: every step of
  every rank at its own time (`replay_as_written`, tests/support/training_replay.py: the run's
  first record at the replay's time 0, nothing stretched, looped or cut), scraped every 15 s, the
  job's end as the collector sees it (the logs closed, the ranks dropped), scraped for 90 s more;
- Prometheus (Debian `prometheus` 2.42) answering the report's queries over those samples;
- `lockstep report`, from its command line to its JSON and text.

What is not:
- the scrapes are taken in-process on the replay's clock and written to Prometheus' storage with
  `promtool tsdb create-blocks-from openmetrics`, not scraped over HTTP, so no staleness marker
  ends a series (the report asks for the last samples and counts, which need none);
- the whole run is shifted by a constant so that its last scrape is two minutes before now
  (every interval kept; the report is made as a user would, a few minutes after the job's end);
- no alert rules: ALERTS cannot be backfilled (`create-blocks-from rules` leaves alerting rules'
  series out) and the report reads no recorded series, so its alerts section is empty.  When
  LockstepTrainingStragglerSustained fires on these same replays, and that nothing fires in
  hour-then-slow-8's first hour (so the healthy run's all-clear is what production would say), is
  proven by tests/alerts/test_straggler_real_timing.py;
- the training collector alone: no Slurm (the job is found by its training series: no user, no
  GPUs), no GPU or node collectors (no evidence on the straggler's node).

One Prometheus serves every run, each under its own `cluster` label (the runs' logs are of one
node, node001).  The healthy run is hour-then-slow-8's first hour (cut at 60 minutes, before its
onset at 60.9): 8 healthy ranks, one of them persistently fast (rank 2, smaller batches).

Each report is compared with its golden files, tests/golden/report-ddp-<run>.txt and .json, in the
canonical form of test_report_e2e.py (tests/support/reports.py `canonical`: times, counts and
measured shares taken out); `pytest --update-golden` (./dev/regenerate) rewrites them.  Exact
assertions, against what the runs' own logs measured (tests/fixtures/training/README.md):
- the slow rank is named, and no other rank (none in the healthy hour);
- the time it held the job back starts at the run's known onset and lasts until the job's end,
  within 5 minutes (the report's ratio is the alert's 5-minute mean: a 10 % slowdown crosses the
  1.05x ratio up to 5 minutes after it began, and each flagged point stands for its window);
- the steps completed, exactly; the job's duration within two scrapes (30 s) of its logs' first
  to last record (the report sees a step at the first scrape after it); the median step time
  between the logs' median step and their mean step (the report sees the counters every 15 s:
  means of a few steps, weighted by steps, not single steps);
- the verdict, word for word.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from lockstep.report import text
from lockstep.report.model import Report, from_json
from tests.support import free_port, require_promtool, require_real
from tests.support.prometheus import PROMETHEUS, backfill, start_prometheus, stop_all
from tests.support.reports import canonical, report_cli, report_goldens
from tests.support.training_replay import WrittenReplays, load_written, onset_seconds, openmetrics

# Tier: a real Prometheus (tests/conftest.py).
pytestmark = pytest.mark.e2e

SCRAPE = 15  # seconds between scrapes, as in production
# Scrapes after the job's end (its logs closed): the collector drops a finished rank's series 60
# to 75 s after its last step, when it sees the rank's process gone.  Less than the report's
# TRAINING_STEPPED_WITHIN (2 minutes), so that a rank dropped late on a loaded machine (the
# close seen late, the writers not countable without root) still ends within it.
AFTER_MINUTES = 1.5
BEFORE_NOW = 120  # the last scrape, this long before the reports are made (the job has ended)
WINDOW = 300  # the straggler ratio's window (lockstep/report/stragglers.py STRAGGLER_RATE_WINDOW_SECONDS)


@dataclass(frozen=True)
class Run:
    fixture: str  # tests/fixtures/training/<fixture>
    until: float | None = None  # cut that many seconds after the first record (the job's end)
    straggler: str | None = None  # the slow rank, None for a healthy run
    verdict: str = ""


RUNS = {
    "slow-from-start-4": Run(
        "slow-from-start-4",
        straggler="2",
        verdict="job ddp-slow-from-start-4 ran 50 min on 1 node, 4 ranks; lost about 8% to rank 2 on node001.",
    ),
    "hour-then-slow-8": Run(
        "hour-then-slow-8",
        straggler="5",
        verdict="job ddp-hour-then-slow-8 ran 1 h 36 m on 1 node, 8 ranks; lost about 2% to rank 5 on node001.",
    ),
    "hour-then-slow-8-first-hour": Run(
        "hour-then-slow-8",
        until=3600.0,
        verdict="job ddp-hour-then-slow-8 ran 60 min on 1 node, 8 ranks; nothing wrong found.",
    ),
    "slow-from-start-2": Run(
        "slow-from-start-2",
        straggler="1",
        verdict="job ddp-slow-from-start-2 ran 50 min on 1 node, 2 ranks; lost about 10% to rank 1 on node001.",
    ),
    "slight-from-start-4": Run(
        "slight-from-start-4",
        straggler="2",
        verdict="job ddp-slight-from-start-4 ran 45 min on 1 node, 4 ranks; lost about 5% to rank 2 on node001.",
    ),
}


@dataclass(frozen=True)
class Logged:
    """What a run's own logs say (its first `until` seconds)."""

    job_id: str
    ranks: int
    steps: int
    seconds: float  # first record to last
    onset: float | None  # the straggler's first slow step, seconds after the first record
    median_step: float
    mean_step: float
    fast_rank: str | None


def logged(run: Run) -> Logged:
    meta, ranks = load_written(run.fixture)
    origin = min(steps[0].ts for steps in ranks)
    kept = [[s for s in steps if run.until is None or s.ts - origin <= run.until] for steps in ranks]
    walls = [s.values["step_time_sec"] for s in kept[0]]
    onset = onset_seconds(meta, ranks)
    return Logged(
        job_id=meta["job_id"],
        ranks=len(ranks),
        steps=len(kept[0]),
        seconds=max(steps[-1].ts for steps in kept) - origin,
        onset=onset if run.until is None or onset < run.until else None,
        median_step=statistics.median(walls),
        mean_step=statistics.fmean(walls),
        fast_rank=str(meta["fast_rank"]) if "fast_rank" in meta else None,
    )


@dataclass
class Made:
    report: Report
    json: str
    text: str
    logged: Logged


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory, written_replays: WrittenReplays) -> Iterator[dict[str, Made]]:
    require_real("Prometheus server (Debian package prometheus)", os.access(PROMETHEUS, os.X_OK))
    require_promtool()
    tmp = tmp_path_factory.mktemp("report-ddp")
    processes: list = []
    try:
        now = int(time.time())
        source = tmp / "runs.om"
        with open(source, "w") as out:
            for cluster, run in RUNS.items():
                # The session's one replay of the run (tests/alerts/test_straggler_real_timing.py
                # reads it too), as far as AFTER_MINUTES after the job's end.
                replayed = written_replays.get(run.fixture, run.until)
                assert replayed.scrape == SCRAPE
                series = replayed.after(AFTER_MINUTES)
                last = max(max(values) for values in series.values())
                out.writelines(openmetrics(series, SCRAPE, now - BEFORE_NOW - last * SCRAPE, {"cluster": cluster}))
            out.write("# EOF\n")
        backfill(source, tmp / "tsdb")
        source.unlink()
        (tmp / "prometheus.yml").write_text("global: {}\n")  # it scrapes nothing and has no rules
        url = start_prometheus(tmp, free_port(), processes)
        result = {}
        for cluster, run in RUNS.items():
            facts = logged(run)
            # --cluster only where the job id is in two clusters (hour-then-slow-8 and its first hour).
            where = ["--cluster", cluster] if sum(r.fixture == run.fixture for r in RUNS.values()) > 1 else []
            common = [facts.job_id, "--prometheus", url, *where, "--store", str(tmp / "store")]
            as_json, as_text = report_cli(*common, "--format", "json"), report_cli(*common, "--format", "text")
            for got in (as_json, as_text):
                assert (got.returncode, got.stderr) == (0, ""), f"{cluster}: {got.stderr}"
            result[cluster] = Made(from_json(as_json.stdout), as_json.stdout, as_text.stdout, facts)
        yield result
    finally:
        stop_all(processes)
        # Prometheus' data: removed now, not when the session ends (the suite's machine check
        # allows 50 MB in pytest's base temporary directory).
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.mark.golden("report-ddp-{cluster}.txt", "report-ddp-{cluster}.json")
@pytest.mark.parametrize("cluster", RUNS)
def test_each_runs_report_matches_its_golden_files(
    made: dict[str, Made], cluster: str, request: pytest.FixtureRequest
) -> None:
    report = made[cluster].report
    stable = canonical(report, report.job.duration_seconds)
    report_goldens(f"report-ddp-{cluster}", stable, bool(request.config.getoption("--update-golden")))


@pytest.mark.parametrize("cluster", RUNS)
def test_the_slow_rank_is_named_and_no_other(made: dict[str, Made], cluster: str) -> None:
    report, facts = made[cluster].report, made[cluster].logged
    expected = [] if RUNS[cluster].straggler is None else [("training", RUNS[cluster].straggler, "node001")]
    assert [(s.kind, s.rank, s.host) for s in report.stragglers] == expected
    if facts.fast_rank is not None:  # hour-then-slow-8's rank 2: persistently fast, healthy
        assert facts.fast_rank not in {s.rank for s in report.stragglers}


@pytest.mark.parametrize("cluster", [c for c, run in RUNS.items() if run.straggler is not None])
def test_the_time_the_slow_rank_held_the_job_back_is_from_its_onset_to_the_jobs_end(
    made: dict[str, Made], cluster: str
) -> None:
    report, facts = made[cluster].report, made[cluster].logged
    assert facts.onset is not None
    (straggler,) = report.stragglers
    job = report.job
    print(
        f"{cluster}: held back from {(straggler.start - job.start) / 60:.2f} min (onset {facts.onset / 60:.2f}) "
        f"to {(straggler.end - job.start) / 60:.2f} min (job's end {job.duration_seconds / 60:.2f}), "
        f"{straggler.seconds / 60:.2f} min (expected {(facts.seconds - facts.onset) / 60:.2f})"
    )
    assert straggler.start - job.start == pytest.approx(facts.onset, abs=WINDOW)
    assert straggler.end == pytest.approx(job.end, abs=WINDOW)
    assert straggler.seconds == pytest.approx(facts.seconds - facts.onset, abs=WINDOW)


@pytest.mark.parametrize("cluster", RUNS)
def test_steps_duration_and_median_step_are_the_logs(made: dict[str, Made], cluster: str) -> None:
    report, facts = made[cluster].report, made[cluster].logged
    job, steps = report.job, report.steps
    assert (job.job_id, job.state, job.ranks, job.hosts) == (facts.job_id, "ended", facts.ranks, ["node001"])
    assert (steps.source, steps.steps) == ("training", facts.steps)
    assert job.duration_seconds == pytest.approx(facts.seconds, abs=2 * SCRAPE)
    assert steps.median_step_seconds is not None
    print(f"{cluster}: median step {steps.median_step_seconds:.4f} s; logs: {facts.median_step:.4f} (median), "
          f"{facts.mean_step:.4f} (mean)")  # fmt: skip
    assert 0.98 * facts.median_step <= steps.median_step_seconds <= facts.mean_step


@pytest.mark.parametrize("cluster", RUNS)
def test_the_verdict_says_so(made: dict[str, Made], cluster: str) -> None:
    report = made[cluster].report
    assert report.verdict == RUNS[cluster].verdict
    if RUNS[cluster].straggler is None:
        assert report.notes == [
            "Nothing to report: no straggler, stall, hang, throttling, idle GPU or alert during the job."
        ]


@pytest.mark.parametrize("cluster", RUNS)
def test_the_text_is_the_json_report_rendered_in_100_columns(made: dict[str, Made], cluster: str) -> None:
    got = made[cluster]
    assert json.loads(got.json)["schema"] == "lockstep.report/v1"
    assert got.text == text.render(got.report)
    assert [line for line in got.text.splitlines() if len(line) > 100] == []
