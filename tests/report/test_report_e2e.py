"""`lockstep report` end to end: a real Prometheus scrapes the real agent on the demo scenarios,
with the alert rules loaded, and the report of each scenario's job is read back through the CLI.

The run (tests/support/report_run.py, the conftest's session fixture `report_run`, which
tests/alerts/test_hangs_e2e.py reads too): one Prometheus scrapes one `lockstep demo --speed 10`
per scenario, each target labelled cluster=<scenario>, every 1.5 s (15 simulated seconds); the
rules are rendered with every `for:` and range window divided by the same 10
(alerts/compression.py), leaving out the alerts that read time() (the simulated clock runs ten
times as fast as Prometheus').  The report is made with `--time-scale 10`, so its durations are
the simulated job's.

Each scenario's report is compared with its golden files, tests/golden/report-<scenario>.txt
and .json: the report with what depends on scrape timing taken out (tests/support/reports.py
`canonical`); `pytest --update-golden` (./dev/regenerate) rewrites them.  Exact assertions
name, per scenario, the rank held responsible, its evidence and the rank that stopped first.
The Slurm epilog script stores the report of the job killed while hung, which is then read back
with Prometheus gone.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from lockstep.report import text
from lockstep.report.model import from_json
from tests.support.report_run import OBSERVE, REPORTED, SPEED, Run
from tests.support.reports import canonical, report_goldens

# Tier: a real Prometheus scrapes the real agent (tests/conftest.py).
pytestmark = pytest.mark.e2e

SCENARIOS = REPORTED


@pytest.fixture
def run(report_run: Run) -> Run:
    """The session's one run of the scenarios (tests/support/report_run.py)."""
    return report_run


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
    # least 90 % of it; and the share lost, for the time each held, agrees within 10 %.  Measured:
    # the counters began 1.5 s earlier and held 15.1, 15.1 and 30.2 simulated s less (of about
    # 2,066 s) in three runs, and 129.2 s less (6.2 %) in a CI-style run (f0b99e2); the shares
    # 0.2183 against 0.2120 (3 %) and 0.2078 against 0.1961 (6 %) in two-worker runs (the points
    # the counters miss are not a fair sample of the rule's: a missed scrape is a loaded moment's).
    step = 1.5
    point = step * SPEED
    assert abs(recorded.start - counted.start) <= 2 * step + 0.1, (counted, recorded)
    assert 0.9 * recorded.seconds <= counted.seconds <= recorded.seconds + 2 * point + 0.5, (counted, recorded)
    held = counted.seconds / recorded.seconds
    assert counted.share_lost == pytest.approx(recorded.share_lost * held, rel=0.1), (counted, recorded)


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
