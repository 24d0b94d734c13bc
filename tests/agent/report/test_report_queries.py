"""The report's code around its queries, fed chosen answers by a stand-in for Prometheus' API on
a loopback socket (tests/support/fake_prometheus.py): the steps' fallback to the framework_logs
collector's series, how a job is found, and the flat runs that make stalls.  The queries
themselves are proven on a real Prometheus by test_report_e2e.py."""

from __future__ import annotations

import pytest

from alerts.straggler_recording import PEERS_5M
from lockstep.agent.report.build import (
    STRAGGLER_RATE_WINDOW_SECONDS,
    Scope,
    find_job,
    flat_runs,
    job_section,
    stalled_saves,
    steps_section,
    training_stragglers,
    weighted_median,
)
from lockstep.agent.report.model import Interval, Point
from lockstep.agent.report.prometheus import Prometheus, ReportError
from tests.support.fake_prometheus import FakePrometheus, Rule, matrix, serving, vector

T = 1_800_000_000.0


def test_steps_fall_back_to_the_framework_logs_series_when_the_job_has_no_training_series() -> None:
    rules = [
        Rule(r"^count\(last_over_time\(lockstep_framework_iterations_total", vector(({}, 1.0))),
        Rule(r"^max\(max_over_time\(lockstep_framework_iterations_total", vector(({}, 120.0))),
        Rule(
            r"^avg\(rate\(lockstep_framework_iteration_seconds_total.*lockstep_framework_iterations_total",
            matrix(({}, [(T, 2.0), (T + 60, 2.5), (T + 120, 3.0)])),
        ),
        Rule(r"^sum\(rate\(lockstep_framework_tokens_total", matrix(({}, [(T, 4000.0), (T + 60, 3000.0)]))),
        Rule(
            r"^max\(lockstep_framework_iterations_total",
            matrix(({}, [(T + 60 * i, v) for i, v in enumerate([10, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 30])])),
        ),
    ]
    with serving(FakePrometheus(rules)) as fake:
        scope = Scope(Prometheus(fake.url), "4242", "c1", start=T, end=T + 720, step=60, window=60)
        steps = steps_section(scope)
    assert steps.source == "framework"
    assert steps.steps == 120
    assert steps.timeline == [Point(T, 2.0), Point(T + 60, 2.5), Point(T + 120, 3.0)]
    assert steps.median_step_seconds == 2.5
    assert steps.tokens_per_second == [Point(T, 4000.0), Point(T + 60, 3000.0)]
    assert steps.stalls == [Interval(T + 60, T + 720, 660.0)]  # 20 from T+60 until 30 at T+720
    assert steps.last_step == T + 720
    # The training series were asked for first, the rest only of the framework's.
    assert fake.seen[0] == 'count(last_over_time(lockstep_training_steps_total{job_id="4242",cluster="c1"}[780000ms]))'
    assert [q for q in fake.seen[1:] if "lockstep_training" in q] == []


def test_a_job_without_step_series_has_an_empty_steps_section() -> None:
    with serving(FakePrometheus()) as fake:
        steps = steps_section(Scope(Prometheus(fake.url), "4242", None, start=T, end=T + 600, step=60))
    assert (steps.source, steps.steps, steps.timeline) == ("", 0, [])
    assert fake.seen == [
        'count(last_over_time(lockstep_training_steps_total{job_id="4242"}[660000ms]))',
        'count(last_over_time(lockstep_framework_iterations_total{job_id="4242"}[660000ms]))',
    ]


def test_an_unknown_job_is_one_line_naming_it() -> None:
    with serving(FakePrometheus()) as fake:
        scope = Scope(Prometheus(fake.url), "77", None)
        with pytest.raises(ReportError) as caught:
            find_job(scope, T)
    assert str(caught.value) == f"job 77 is unknown to Prometheus at {fake.url} (last 31 days)"


def test_a_job_in_two_clusters_asks_for_one() -> None:
    rules = [Rule(r"^count by \(cluster\)", vector(({"cluster": "b"}, 3.0), ({"cluster": "a"}, 5.0)))]
    with serving(FakePrometheus(rules)) as fake:
        with pytest.raises(ReportError, match=r"^job 77 ran in clusters a, b: choose one with --cluster$"):
            find_job(Scope(Prometheus(fake.url), "77", None), T)


COARSE = r"\[5356800ms\]\)\)$"  # the lookback's 500 buckets
FINE = r"\[10714ms\]\)\)$"  # an edge bucket's 500 windows


def test_the_job_range_is_its_first_and_last_sample() -> None:
    bucket = 31 * 86400 / 500
    rules = [
        Rule(r"^count by \(cluster\)", vector(({"cluster": "a"}, 5.0))),
        Rule(
            r"^count\(count_over_time\(\{__name__.*" + COARSE, matrix(({}, [(T - 2 * bucket, 1.0), (T - bucket, 3.0)]))
        ),
        # The windows of either edge bucket that hold samples: the first of the first, the last of the last.
        Rule(
            r"^count\(count_over_time\(\{__name__.*" + FINE,
            matrix(({}, [(T - 2 * bucket - 50, 1.0), (T - bucket - 3, 2.0)])),
        ),
        Rule(r"^min\(min_over_time\(timestamp\(\{__name__.*\[12714ms:1s\]\)\)$", vector(({}, T - 2 * bucket - 60))),
        Rule(r"^max\(max_over_time\(timestamp\(\{__name__.*\[12714ms:1s\]\)\)$", vector(({}, T - bucket - 5))),
        Rule(r"^max\(count_over_time", vector(({}, 101.0))),
        Rule(r"^count by \(instance\)", vector(({"instance": "n2:12400"}, 1.0), ({"instance": "n1:12400"}, 1.0))),
    ]
    with serving(FakePrometheus(rules)) as fake:
        scope = Scope(Prometheus(fake.url), "77", None)
        find_job(scope, T)
    assert scope.cluster == "a"
    assert (scope.start, scope.end) == (T - 2 * bucket - 60, T - bucket - 5)
    assert scope.step == pytest.approx((bucket - 5 + 60) / 100)  # a scrape interval: 101 samples
    assert scope.instances == ["n1:12400", "n2:12400"]


def test_a_job_with_a_recent_sample_is_running_unless_it_is_known_to_have_ended() -> None:
    rules = [
        Rule(r"^count by \(cluster\)", vector(({}, 5.0))),
        Rule(r"^count\(count_over_time\(.*" + COARSE, matrix(({}, [(T, 3.0)]))),
        Rule(r"^count\(count_over_time\(.*" + FINE, matrix(({}, [(T - 20, 1.0), (T, 2.0)]))),
        Rule(r"^min\(min_over_time\(timestamp", vector(({}, T - 25))),
        Rule(r"^max\(max_over_time\(timestamp", vector(({}, T - 5))),
    ]
    with serving(FakePrometheus(rules)) as fake:
        for ended, end, state in ((False, T, "running"), (True, T - 5, "ended")):
            scope = Scope(Prometheus(fake.url), "77", None)
            find_job(scope, T, ended)
            assert (scope.start, scope.end, job_section(scope, T, ended).state) == (T - 25, end, state)


def job_ending_at(end: float, counts: list[tuple[float, float]], brought: float = 0.0) -> list[Rule]:
    """A job without Slurm's record whose series end at `end`; its step counters' maximum on the
    grid last_progress asks for, and the time of the scrape that brought the last count."""
    bucket = 31 * 86400 / 500
    return [
        Rule(r"^min\(timestamp\(\{__name__=~\"lockstep_training_steps_total\|", vector(({}, brought))),
        Rule(r"^count by \(cluster\)", vector(({}, 5.0))),
        Rule(
            r"^count\(count_over_time\(\{__name__.*" + COARSE, matrix(({}, [(T - 2 * bucket, 1.0), (T - bucket, 3.0)]))
        ),
        Rule(
            r"^count\(count_over_time\(\{__name__.*" + FINE, matrix(({}, [(T - 2 * bucket - 50, 1.0), (end + 2, 2.0)]))
        ),
        Rule(r"^min\(min_over_time\(timestamp", vector(({}, T - 2 * bucket - 60))),
        Rule(r"^max\(max_over_time\(timestamp", vector(({}, end))),
        Rule(r"^max\(count_over_time", vector(({}, 101.0))),
        Rule(r"^max\(\{__name__=~\"lockstep_training_steps_total\|", matrix(({}, counts))),
    ]


def test_a_job_that_ended_without_slurms_record_ends_at_its_last_step() -> None:
    """The agent keeps a finished rank's series until it sees the rank's process gone (a minute
    or two): the job ended when its step count last moved, not when its series did."""
    end = T - 31 * 86400 / 500 - 5
    counts = [(end - 120 + 15 * i, v) for i, v in enumerate([100, 107, 114, 121, 125, 125, 125, 125, 125])]
    with serving(FakePrometheus(job_ending_at(end, counts, brought=end - 62.5))) as fake:
        scope = Scope(Prometheus(fake.url), "77", None)
        find_job(scope, T)
    # 125 first seen at end - 60 on the grid; the scrape that brought it, at end - 62.5.
    assert scope.end == end - 62.5
    counters = '{__name__=~"lockstep_training_steps_total|lockstep_framework_iterations_total",job_id="77"}'
    assert [q for q in fake.seen if counters in q and "count_over_time" not in q] == [
        f"max({counters})",
        f"min(timestamp({counters}) and {counters} >= 125.0)",
    ]


def test_a_job_that_stopped_stepping_before_its_series_ended_ends_with_them() -> None:
    """No step in the 2 minutes (TRAINING_STEPPED_WITHIN) before its series ended: it hung, then
    was killed; it ended when its series did."""
    end = T - 31 * 86400 / 500 - 5
    counts = [(end - 120 + 15 * i, 125.0) for i in range(9)]
    with serving(FakePrometheus(job_ending_at(end, counts))) as fake:
        scope = Scope(Prometheus(fake.url), "77", None)
        find_job(scope, T)
    assert scope.end == end


def test_the_median_step_time_weighs_each_moment_by_the_steps_made_in_it() -> None:
    """Evenly spaced in time, the timeline holds more points of slow steps than their share of
    the steps: a job of 2 minutes at 1-s steps and 3 minutes at 4-s steps made 120 + 45 steps,
    and its median step lasted 1 s, not 4."""
    points = [(T + 60 * i, v) for i, v in enumerate([1.0, 1.0, 4.0, 4.0, 4.0])]
    rules = [
        Rule(r"^count\(last_over_time\(lockstep_training_steps_total", vector(({}, 2.0))),
        Rule(r"^avg\(rate\(lockstep_training_step_seconds_total", matrix(({}, points))),
        Rule(r"^avg\(rate\(lockstep_training_steps_total", matrix(({}, [(t, 1 / v) for t, v in points]))),
    ]
    with serving(FakePrometheus(rules)) as fake:
        steps = steps_section(Scope(Prometheus(fake.url), "4242", None, start=T, end=T + 300, step=60, window=60))
    assert steps.median_step_seconds == 1.0


def test_weighted_median() -> None:
    assert weighted_median([(2.0, 1.0), (3.0, 1.0), (1.0, 1.0)]) == 2.0
    assert weighted_median([(2.0, 1.0), (3.0, 1.0)]) == 2.5  # as statistics.median
    assert weighted_median([(1.0, 3.0), (5.0, 1.0), (9.0, 1.0)]) == 1.0
    assert weighted_median([(1.0, 0.0), (5.0, 1.0)]) == 5.0


def test_flat_runs_longer_than_the_stall_window_on_the_jobs_clock() -> None:
    scope = Scope(Prometheus("http://unused"), "1", None, scale=10.0)
    points = [(T, 1.0), (T + 30, 2.0), (T + 60, 2.0), (T + 90, 2.0), (T + 120, 3.0), (T + 150, 3.0)]
    # At 10x, 2.0 held for 90 s of Prometheus time is 15 minutes of the job's: a stall; 3.0's 30 s is 5.
    assert flat_runs(points, scope) == [Interval(T + 30, T + 120, 900.0)]


def test_a_save_in_progress_longer_than_its_limit_is_a_stall_each_time() -> None:
    points = [(T, 0.0), (T + 1, 100.0), (T + 2, 700.0), (T + 3, 0.0), (T + 4, 50.0), (T + 5, 20.0), (T + 6, 900.0)]
    assert stalled_saves(points, 600.0) == [Interval(T + 1, T + 2, 700.0), Interval(T + 5, T + 6, 900.0)]


def test_the_job_ends_with_slurms_record_of_it_not_with_what_outlives_it() -> None:
    bucket = 31 * 86400 / 500
    rules = [
        Rule(r"^count by \(cluster\)", vector(({}, 5.0))),
        Rule(
            r"^count\(count_over_time\(\{__name__.*" + COARSE, matrix(({}, [(T - 3 * bucket, 1.0), (T - bucket, 3.0)]))
        ),
        Rule(r"^count\(count_over_time\(lockstep_slurm_job_info.*" + COARSE, matrix(({}, [(T - 3 * bucket, 1.0)]))),
        Rule(
            r"^count\(count_over_time\(\{__name__.*" + FINE,
            matrix(({}, [(T - 3 * bucket - 50, 1.0), (T - bucket, 1.0)])),
        ),
        Rule(r"^count\(count_over_time\(lockstep_slurm_job_info.*" + FINE, matrix(({}, [(T - 3 * bucket - 8, 1.0)]))),
        Rule(r"^min\(min_over_time\(timestamp\(\{__name__", vector(({}, T - 3 * bucket - 60))),
        Rule(r"^max\(max_over_time\(timestamp\(lockstep_slurm_job_info", vector(({}, T - 3 * bucket - 10))),
        Rule(r"^max\(max_over_time\(timestamp\(\{__name__", vector(({}, T - bucket - 1))),
    ]
    with serving(FakePrometheus(rules)) as fake:
        scope = Scope(Prometheus(fake.url), "77", None)
        find_job(scope, T)
    assert (scope.cluster, scope.start, scope.end) == (None, T - 3 * bucket - 60, T - 3 * bucket - 10)
    assert scope.instances == []


def work_of(rank: str, values: list[float], job: str = "4242", first: float = T + 300, every: float = 60
            ) -> tuple[dict[str, str], list[tuple[float, float]]]:  # fmt: skip
    """A rank's work per step at first, first + every, ..."""
    labels = {"cluster": "c1", "instance": "n1:12400", "job_id": job, "rank": rank, "host": "n1"}
    return labels, [(first + every * i, v) for i, v in enumerate(values)]


WORK_QUERY = r"^\(sum by \(cluster, instance, job_id, rank, host\) \(rate\(lockstep_training_compute"
WALL_QUERY = r"^sum\(rate\(lockstep_training_step_seconds_total"


def test_a_rank_above_the_sustained_ratio_at_three_points_or_more_is_a_straggler() -> None:
    rules = [
        Rule(
            WORK_QUERY,
            matrix(
                work_of("0", [10.0, 10.0, 10.0, 10.0, 10.0]),
                work_of("1", [10.0, 10.0, 10.0, 10.0, 10.0]),
                work_of("2", [10.0, 11.0, 10.0, 10.0, 10.0]),  # one point at 1.1x: jitter
                work_of("3", [10.0, 14.0, 14.0, 14.0, 10.0]),  # three points at 1.4x
            ),
        ),
        Rule(WALL_QUERY, matrix(({}, [(T + 300 + 60 * i, 20.0) for i in range(5)]))),
    ]
    with serving(FakePrometheus(rules)) as fake:
        scope = Scope(Prometheus(fake.url), "4242", "c1", start=T, end=T + 600, step=60, window=60)
        found = training_stragglers(scope)
    assert [(s.rank, s.start, s.end, s.seconds, s.ratio, s.share_lost) for s in found] == [
        # At T+360 rank 2's 11 makes the median 10.5: a ratio of 1.333 and 3.5 s of a 20-s step lost.
        # Each flagged point stands for its 5-minute window: T+60..T+360 to T+180..T+480.
        ("3", T + 60, T + 480, 420.0, 1.378, round((3.5 / 20 + 4 / 20 + 4 / 20) * 60 / 600, 4))
    ]


def test_ranks_are_compared_over_the_alerts_5_minutes_and_only_once_the_job_has_run_that_long() -> None:
    """Over the timeline's window (4 scrapes: 60 s) every healthy rank of a real 8-rank DDP run
    was above the ratio at 3 points or more, and a real 2-rank run's healthy rank was 1.37x its
    peer over its first minute (warm-up): the ratio is the alert's 5-minute one (on the job's
    clock: 30 s of Prometheus' at 10x), judged where that window lies within the job."""
    rules = [
        Rule(
            WORK_QUERY,
            matrix(
                work_of("0", [10.0] * 8, first=T + 60),
                work_of("1", [10.0] * 8, first=T + 60),
                work_of("2", [14.0, 14.0, 14.0, 14.0, 10.0, 10.0, 10.0, 10.0], first=T + 60),  # the first 4 minutes
            ),
        ),
    ]
    with serving(FakePrometheus(rules)) as fake:
        found = training_stragglers(Scope(Prometheus(fake.url), "4242", "c1", start=T, end=T + 540, step=60, window=60))
        assert found == []
        assert "[300000ms]" in fake.seen[0] and "[60000ms]" not in fake.seen[0]
        fake.seen.clear()
        training_stragglers(Scope(Prometheus(fake.url), "4242", "c1", start=T, end=T + 54, step=6, window=6, scale=10))
        assert "[30000ms]" in fake.seen[0]


def test_the_ratio_window_is_the_alerts() -> None:
    assert PEERS_5M.endswith(f"ratio_to_peers{STRAGGLER_RATE_WINDOW_SECONDS / 60:.0f}m")


def test_a_2_rank_jobs_straggler_is_judged_against_its_one_peer_as_the_alert_does() -> None:
    """In a 2-rank job the median is the mean of the two: a rank 10 % slower than its peer is
    4.8 % above it.  As LockstepTrainingStragglerSustained, the report compares it with its one
    peer (1.1x), and names it."""
    rules = [
        Rule(WORK_QUERY, matrix(work_of("0", [10.0] * 4, job="7"), work_of("1", [11.0] * 4, job="7"))),
        Rule(WALL_QUERY, matrix(({}, [(T + 300 + 60 * i, 20.0) for i in range(4)]))),
    ]
    with serving(FakePrometheus(rules)) as fake:
        scope = Scope(Prometheus(fake.url), "7", "c1", start=T, end=T + 540, step=60, window=60)
        found = training_stragglers(scope)
    assert [(s.rank, s.ratio) for s in found] == [("1", 1.1)]
