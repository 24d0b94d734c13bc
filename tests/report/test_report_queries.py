"""The report's code around its queries, fed chosen answers by a stand-in for Prometheus' API on
a loopback socket (tests/support/fake_prometheus.py): the steps' fallback to the framework_logs
collector's series, how a job is found, and the flat runs that make stalls.  The queries
themselves are proven on a real Prometheus by test_report_e2e.py."""

from __future__ import annotations

import gc
import math
import re
from collections.abc import Callable
from typing import Any

import pytest

from alerts.straggler_recording import PEERS_5M
from lockstep.report.build import build_report
from lockstep.report.checkpoints import stalled_saves
from lockstep.report.gpus import gpu_section
from lockstep.report.job import find_job, job_section
from lockstep.report.model import Interval, Point
from lockstep.report.prometheus import Prometheus, ReportError
from lockstep.report.scope import Scope, increase_over_job
from lockstep.report.steps import flat_runs, steps_section, weighted_median
from lockstep.report.stragglers import STRAGGLER_RATE_WINDOW_SECONDS, nccl_stragglers, training_stragglers
from tests.support.fake_prometheus import FakePrometheus, Request, Rule, matrix, series, serving, vector

T = 1_800_000_000.0


def test_steps_fall_back_to_the_framework_logs_series_when_the_job_has_no_training_series() -> None:
    rules = [
        Rule(
            r"^avg\(rate\(lockstep_framework_iteration_seconds_total.*lockstep_framework_iterations_total",
            matrix(({}, [(T, 2.0), (T + 60, 2.5), (T + 120, 3.0)])),
        ),
        Rule(r"^sum\(rate\(lockstep_framework_tokens_total", matrix(({}, [(T, 4000.0), (T + 60, 3000.0)]))),
        Rule(
            r"^max\(max_over_time\(lockstep_framework_iterations_total",
            matrix(({}, [(T + 60 * i, v) for i, v in enumerate([10, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 30])])),
            when=lambda times: "step" in times,
        ),
        # One more step counted after the last window's end, in the job's last step's worth.
        Rule(r"^max\(max_over_time\(lockstep_framework_iterations_total", vector(({}, 31.0))),
    ]
    with serving(FakePrometheus(rules)) as fake:
        scope = Scope(Prometheus(fake.url), "4242", "c1", start=T, end=T + 720, step=60, window=60)
        scope.labels = [{"__name__": "lockstep_framework_iterations_total", "job_id": "4242", "cluster": "c1"}]
        steps = steps_section(scope)
    assert steps.source == "framework"
    assert steps.steps == 31
    assert steps.timeline == [Point(T, 2.0), Point(T + 60, 2.5), Point(T + 120, 3.0)]
    assert steps.median_step_seconds == 2.5
    assert steps.tokens_per_second == [Point(T, 4000.0), Point(T + 60, 3000.0)]
    assert steps.stalls == [Interval(T + 60, T + 720, 660.0)]  # 20 from T+60 until 30 at T+720
    assert steps.last_step == T + 720
    # Only the framework's series were asked for (the source is chosen from the job's series' labels).
    assert [q for q in fake.seen if "lockstep_training" in q] == []


def test_the_training_timeline_is_the_ranks_mean_step_time_from_their_counters_rates() -> None:
    """Each rank's step and step-seconds rates, one query each (rank_rates, kept for the
    stragglers): the wall seconds per step at a point is the mean over the ranks that stepped; a
    rank's two series (an extra label) count as one, summed."""
    rank = {"cluster": "c1", "instance": "n1:12400", "job_id": "4242", "host": "n1"}
    rules = [
        Rule(
            r"^rate\(lockstep_training_steps_total",
            matrix(
                ({**rank, "rank": "0"}, [(T, 0.5), (T + 60, 0.5), (T + 120, 0.0)]),
                ({**rank, "rank": "1", "log": "a"}, [(T, 0.25), (T + 60, 0.25), (T + 120, 0.0)]),
                ({**rank, "rank": "1", "log": "b"}, [(T, 0.25), (T + 60, 0.25), (T + 120, 0.0)]),
            ),
        ),
        Rule(
            r"^rate\(lockstep_training_step_seconds_total",
            matrix(
                ({**rank, "rank": "0"}, [(T, 1.0), (T + 60, 1.0), (T + 120, 1.0)]),
                ({**rank, "rank": "1"}, [(T, 1.0), (T + 60, 2.0), (T + 120, 1.0)]),
            ),
        ),
    ]
    with serving(FakePrometheus(rules)) as fake:
        scope = Scope(Prometheus(fake.url), "4242", "c1", start=T, end=T + 120, step=60, window=60)
        scope.labels = [{"__name__": "lockstep_training_steps_total", **rank, "rank": "0"}]
        steps = steps_section(scope)
    # Rank 1 steps at 0.25 + 0.25 a second; at T+120 no rank stepped: no point.
    assert steps.timeline == [Point(T, 2.0), Point(T + 60, 3.0)]
    assert len([q for q in fake.seen if q.startswith("rate(lockstep_training_steps_total")]) == 1


def test_the_clock_event_share_is_read_only_for_reasons_some_gpu_does_not_time() -> None:
    """A reason's time comes from its counter where the GPU keeps one; the share of samples
    active is read only for the reasons that some GPU of the job has no counter for (here GPU 1,
    an older driver's, counts none), and never overrides a counter.  Idle and a display's clocks
    cost no work: not read."""
    node = {"cluster": "c1", "instance": "n1:12400"}
    gpus = [{**node, "gpu": str(g), "uuid": f"GPU-{g}"} for g in range(2)]
    timed = ("sw_power_cap", "hw_thermal_slowdown")
    counters = [{"__name__": "lockstep_gpu_clock_event_seconds_total", **gpus[0], "reason": r} for r in timed]
    rules = [
        Rule(r"^series lockstep_gpu_clock_event_seconds_total", series(*counters)),
        Rule(
            r"^increase\(lockstep_gpu_clock_event_seconds_total",
            vector(({**gpus[0], "reason": "hw_thermal_slowdown"}, 120.0)),
        ),
        Rule(
            r"^avg_over_time\(lockstep_gpu_clock_event_active",
            vector(
                ({**gpus[0], "reason": "hw_thermal_slowdown"}, 0.5),  # its counter's 120 s stand
                ({**gpus[0], "reason": "hw_slowdown"}, 0.25),
                ({**gpus[1], "reason": "hw_thermal_slowdown"}, 0.1),
            ),
        ),
    ]
    with serving(FakePrometheus(rules)) as fake:
        scope = Scope(Prometheus(fake.url), "4242", "c1", start=T, end=T + 3600, step=60, window=60)
        scope.instances = ["n1:12400"]
        scope.labels = [{"__name__": "lockstep_slurm_job_gpu_info", **g, "job_id": "4242"} for g in gpus]
        found = gpu_section(scope)
    assert [g.throttle_seconds for g in found] == [
        {"hw_thermal_slowdown": 120.0, "hw_slowdown": 900.0},
        {"hw_thermal_slowdown": 360.0},
    ]
    shares = [q for q in fake.seen if q.startswith("avg_over_time(lockstep_gpu_clock_event_active")]
    # GPU 1 times nothing: every reason but those that cost no work.
    assert len(shares) == 1 and 'reason!~"display_clock_setting|idle"' in shares[0], shares
    # Both GPUs timing both reasons: those two are left out of the shares read.
    counters += [{**c, **gpus[1]} for c in counters]
    rules[0] = Rule(r"^series lockstep_gpu_clock_event_seconds_total", series(*counters))
    with serving(FakePrometheus(rules)) as fake:
        scope = Scope(Prometheus(fake.url), "4242", "c1", start=T, end=T + 3600, step=60, window=60)
        scope.instances = ["n1:12400"]
        scope.labels = [{"__name__": "lockstep_slurm_job_gpu_info", **g, "job_id": "4242"} for g in gpus]
        gpu_section(scope)
    shares = [q for q in fake.seen if q.startswith("avg_over_time(lockstep_gpu_clock_event_active")]
    assert len(shares) == 1 and 'reason!~"display_clock_setting|hw_thermal_slowdown|idle|sw_power_cap"' in shares[0]


def test_a_counters_increase_over_the_job_is_read_at_its_edges_and_again_where_they_miss() -> None:
    """Its value at the job's end less its value at the start (two lookups), for every series;
    a series with no sample at an edge (n2's port, begun inside the job) or lower at the end
    (n3's, reset) is asked for again with increase(), on those nodes only."""
    ports = [{"cluster": "c1", "instance": f"n{n}:12400", "device": "mlx5_0", "port": "1"} for n in (1, 2, 3)]
    name = "lockstep_ib_port_symbol_errors_total"
    rules = [
        Rule(rf"^series {name}", series(*({"__name__": name, **p} for p in ports))),
        Rule(rf"^{name}\{{.*\}} - {name}\{{.*\}} offset 3600000ms$", vector((ports[0], 2.0), (ports[2], -7.0))),
        Rule(
            rf'^increase\({name}\{{.*instance=~"n2:12400\|n3:12400"\}}\[3660000ms\]\)$',
            vector((ports[1], 1.0), (ports[2], 5.0)),
        ),
    ]
    with serving(FakePrometheus(rules)) as fake:
        scope = Scope(Prometheus(fake.url), "4242", "c1", start=T, end=T + 3600, step=60, window=60)
        scope.instances = ["n1:12400", "n2:12400", "n3:12400"]
        found = increase_over_job(scope, name)
        asked = list(fake.seen)
    assert sorted((s.labels["instance"], s.value) for s in found) == [
        ("n1:12400", 2.0),
        ("n2:12400", 1.0),
        ("n3:12400", 5.0),
    ]
    assert len(asked) == 3, asked


def test_a_job_without_step_series_has_an_empty_steps_section() -> None:
    with serving(FakePrometheus()) as fake:
        steps = steps_section(Scope(Prometheus(fake.url), "4242", None, start=T, end=T + 600, step=60))
    assert (steps.source, steps.steps, steps.timeline) == ("", 0, [])
    assert fake.seen == []  # which step series the job has is known from its series' labels


def test_an_unknown_job_is_one_line_naming_it() -> None:
    with serving(FakePrometheus()) as fake:
        scope = Scope(Prometheus(fake.url), "77", None)
        with pytest.raises(ReportError) as caught:
            find_job(scope, T)
    assert str(caught.value) == f"job 77 is unknown to Prometheus at {fake.url} (last 31 days)"


def test_the_garbage_collector_is_paused_while_a_report_is_made_and_only_then() -> None:
    assert gc.isenabled()
    seen: list[bool] = []
    rules = [Rule(r"^series ", lambda times: seen.append(gc.isenabled()) or [])]
    with serving(FakePrometheus(rules)) as fake, pytest.raises(ReportError):
        build_report(Prometheus(fake.url), "77", None, now=T)  # unknown: an error on the way out
    assert seen == [False]  # (the fake answers in a thread of this process, while the report is made)
    assert gc.isenabled()


def test_a_job_in_two_clusters_asks_for_one() -> None:
    rules = [Rule(r"^series ", series({"__name__": "lockstep_slurm_job_info", "cluster": "b"}, {"cluster": "a"}))]
    with serving(FakePrometheus(rules)) as fake:
        with pytest.raises(ReportError, match=r"^job 77 ran in clusters a, b: choose one with --cluster$"):
            find_job(Scope(Prometheus(fake.url), "77", None), T)


BUCKET = 31 * 86400 / 500  # find_job's coarse buckets over its 31-day lookback
PART = BUCKET / 50  # an edge bucket's parts
WINDOW = 10.714  # an edge part's windows (a 500th of the bucket, in whole milliseconds)
COARSE = r"\[5356800ms\]\)\)$"
PARTS = r"\[107136ms\]\)\)$"
FINE = r"\[10714ms\]\)\)$"
EXACT = r"\[12714ms:1s\]\)\)$"  # the edge window and a second either side, at 1-s resolution


def test_the_job_range_is_its_first_and_last_sample() -> None:
    """Coarse buckets, then the edge bucket's parts, then the edge part's windows (count_over_time:
    raw samples), then the edge window at 1-s resolution: the job's first and last samples' own
    timestamps, from small queries whatever its length."""
    first_part, last_part = T - 3 * BUCKET + 10 * PART, T - BUCKET - 5 * PART
    first_window, last_window = first_part - 7 * WINDOW, last_part - 2 * WINDOW
    first, last = first_window - 5, last_window - 3

    def early(times: dict[str, float]) -> bool:
        return times["end"] < T - 1.5 * BUCKET

    rules = [
        Rule(
            r"^series .*lockstep_nccl_rank_info",  # the job's series over its range
            series(
                {"__name__": "lockstep_training_steps_total", "instance": "n2:12400", "rank": "0"},
                {"__name__": "lockstep_slurm_job_info", "instance": "n1:12400"},
                {"__name__": "lockstep_nccl_rank_info", "instance": "n3:12400"},  # names no agent of the job
            ),
        ),
        Rule(r"^series ", series({"__name__": "lockstep_slurm_job_info", "cluster": "a"})),
        Rule(
            r"^count\(count_over_time\(\{__name__.*" + COARSE, matrix(({}, [(T - 2 * BUCKET, 1.0), (T - BUCKET, 3.0)]))
        ),
        Rule(
            r"^count\(count_over_time\(\{__name__.*" + PARTS,
            matrix(({}, [(first_part, 1.0), (first_part + PART, 3.0)])),
            when=early,
        ),
        Rule(
            r"^count\(count_over_time\(\{__name__.*" + PARTS, matrix(({}, [(last_part - PART, 3.0), (last_part, 1.0)]))
        ),
        # The windows of either edge part that hold samples: the first of the first, the last of the last.
        Rule(
            r"^count\(count_over_time\(\{__name__.*" + FINE,
            matrix(({}, [(first_window, 1.0), (first_window + WINDOW, 2.0)])),
            when=early,
        ),
        Rule(
            r"^count\(count_over_time\(\{__name__.*" + FINE,
            matrix(({}, [(last_window - WINDOW, 2.0), (last_window, 1.0)])),
        ),
        Rule(r"^min\(min_over_time\(\(timestamp\(\{__name__.*" + EXACT, vector(({}, first))),
        Rule(r"^max\(max_over_time\(\(timestamp\(\{__name__.*" + EXACT, vector(({}, last))),
        Rule(r"^max\(count_over_time", vector(({}, 101.0))),
    ]
    with serving(FakePrometheus(rules)) as fake:
        scope = Scope(Prometheus(fake.url), "77", None)
        find_job(scope, T)
    assert scope.cluster == "a"
    assert (scope.start, scope.end) == (first, last)
    assert scope.step == pytest.approx((last - first) / 240)  # the timeline's 240 points
    assert scope.window == pytest.approx(4 * 3600 / 100)  # 4 scrape intervals: 101 samples in the job's last hour
    assert scope.instances == ["n1:12400", "n2:12400"]
    exact = [r.times["time"] for r in fake.requests if re.search(EXACT, r.query)]
    assert exact == pytest.approx([first_window + 1, last_window + 1])  # each ending a second after its window
    counted = [r for r in fake.requests if r.query.startswith("max(count_over_time")]
    assert [r.times["time"] for r in counted] == pytest.approx([last])
    assert fake.requests[0].times == {"start": T - 31 * 86400, "end": T}  # the lookback: in the index, not samples
    # The job's series counted at 50 parts of an edge bucket and 10 windows of a part, not at 500.
    assert sorted(
        round((r.times["end"] - r.times["start"]) / r.times["step"])
        for r in fake.requests
        if "{__name__" in r.query
        and "step" in r.times
        and "count_over_time" in r.query
        and not re.search(COARSE, r.query)
    ) == [10, 10, 50, 50]


def test_a_job_with_a_recent_sample_is_running_unless_it_is_known_to_have_ended() -> None:
    rules = [
        Rule(r"^series ", series({"__name__": "lockstep_slurm_job_info"})),
        Rule(r"^count\(count_over_time\(.*" + COARSE, matrix(({}, [(T, 3.0)])), when=lambda times: "step" in times),
        Rule(r"^count\(count_over_time\(.*" + PARTS, matrix(({}, [(T - 30, 1.0), (T, 2.0)]))),
        Rule(r"^count\(count_over_time\(.*" + FINE, matrix(({}, [(T - 20, 1.0), (T, 2.0)]))),
        Rule(r"^min\(min_over_time\(\(timestamp", vector(({}, T - 25))),
        Rule(r"^max\(max_over_time\(\(timestamp", vector(({}, T - 5))),
    ]
    with serving(FakePrometheus(rules)) as fake:
        for ended, end, state in ((False, T, "running"), (True, T - 5, "ended")):
            scope = Scope(Prometheus(fake.url), "77", None)
            find_job(scope, T, ended)
            assert (scope.start, scope.end, job_section(scope, T, ended).state) == (T - 25, end, state)


def job_ending_at(end: float, counts: list[tuple[float, float]], brought: float = 0.0) -> list[Rule]:
    """A job without Slurm's record whose series end at `end`; its step counters' maximum on the
    grid last_progress asks for, and the time of the scrape that brought the last count."""
    return [
        Rule(r"^min\(timestamp\(\{__name__=~\"lockstep_training_steps_total\|", vector(({}, brought))),
        Rule(r"^series ", series({"__name__": "lockstep_slurm_job_info"})),
        Rule(
            r"^count\(count_over_time\(\{__name__.*" + COARSE, matrix(({}, [(T - 2 * BUCKET, 1.0), (T - BUCKET, 3.0)]))
        ),
        Rule(
            r"^count\(count_over_time\(\{__name__.*" + PARTS,
            matrix(({}, [(T - 2 * BUCKET - 40, 1.0), (end + 30, 2.0)])),
        ),
        Rule(
            r"^count\(count_over_time\(\{__name__.*" + FINE, matrix(({}, [(T - 2 * BUCKET - 50, 1.0), (end + 2, 2.0)]))
        ),
        Rule(r"^min\(min_over_time\(\(timestamp", vector(({}, T - 2 * BUCKET - 60))),
        Rule(r"^max\(max_over_time\(\(timestamp", vector(({}, end))),
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
    rank = {"cluster": "c1", "instance": "n1:12400", "job_id": "4242", "rank": "0", "host": "n1"}
    rules = [
        Rule(r"^rate\(lockstep_training_step_seconds_total", matrix((rank, [(t, 1.0) for t, _ in points]))),
        Rule(r"^rate\(lockstep_training_steps_total", matrix((rank, [(t, 1 / v) for t, v in points]))),
    ]
    with serving(FakePrometheus(rules)) as fake:
        scope = Scope(Prometheus(fake.url), "4242", None, start=T, end=T + 300, step=60, window=60)
        scope.labels = [{"__name__": "lockstep_training_steps_total", **rank}]
        steps = steps_section(scope)
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
    """Slurm's record (a series a node) finds the job's buckets; its series a rank or a GPU are
    read only in the buckets before Slurm's first that hold some (here a rank's log seen a bucket
    before Slurm's record), never over the whole lookback."""
    slurm_part = T - 3 * BUCKET - 7 * PART
    rules = [
        Rule(r"^series ", series({"__name__": "lockstep_slurm_job_info"})),
        Rule(r"^count\(count_over_time\(lockstep_slurm_job_info.*" + COARSE, matrix(({}, [(T - 3 * BUCKET, 1.0)]))),
        Rule(
            r"^count\(count_over_time\(\{__name__.*\[5356800ms\]",
            vector(({}, 2.0)),
            when=lambda times: times.get("time") == T - 4 * BUCKET,
        ),
        Rule(r"^count\(count_over_time\(\{__name__.*" + PARTS, matrix(({}, [(T - 5 * BUCKET + PART, 1.0)]))),
        Rule(r"^count\(count_over_time\(\{__name__.*" + FINE, matrix(({}, [(T - 5 * BUCKET + 70, 1.0)]))),
        Rule(r"^count\(count_over_time\(lockstep_slurm_job_info.*" + PARTS, matrix(({}, [(slurm_part, 1.0)]))),
        Rule(r"^count\(count_over_time\(lockstep_slurm_job_info.*" + FINE, matrix(({}, [(slurm_part - 8, 1.0)]))),
        Rule(r"^min\(min_over_time\(\(timestamp\(\{__name__", vector(({}, T - 5 * BUCKET + 60))),
        Rule(r"^max\(max_over_time\(\(timestamp\(lockstep_slurm_job_info", vector(({}, slurm_part - 10))),
        Rule(r"^max\(max_over_time\(\(timestamp\(\{__name__", vector(({}, T - BUCKET - 1))),
    ]
    with serving(FakePrometheus(rules)) as fake:
        scope = Scope(Prometheus(fake.url), "77", None)
        find_job(scope, T)
    assert (scope.cluster, scope.start, scope.end) == (None, T - 5 * BUCKET + 60, slurm_part - 10)
    assert scope.instances == []
    walked = [r.times["time"] for r in fake.requests if r.endpoint == "query" and "5356800ms" in r.query]
    assert walked == [T - 4 * BUCKET, T - 5 * BUCKET]
    coarse = [r for r in fake.requests if r.endpoint == "query_range" and "5356800ms" in r.query]
    assert [r.query.split("{")[0] for r in coarse] == ["count(count_over_time(lockstep_slurm_job_info"]


def work_rules(job: str, work: dict[str, list[float]], first: float = T + 300, every: float = 60) -> list[Rule]:
    """Each rank's counters' rates for the work per step given (at first, first + every, ...):
    half a step a second, one second of data wait a step, the rest computing; 20 s of wall time
    a step."""
    labels = {r: {"cluster": "c1", "instance": "n1:12400", "job_id": job, "rank": r, "host": "n1"} for r in work}

    def rates(value: Callable[[float], float]) -> list[dict[str, Any]]:
        return matrix(
            *((labels[r], [(first + every * i, value(v)) for i, v in enumerate(vs)]) for r, vs in work.items())
        )

    return [
        Rule(r"^rate\(lockstep_training_steps_total", rates(lambda v: 0.5)),
        Rule(r"^rate\(lockstep_training_step_seconds_total", rates(lambda v: 10.0)),
        Rule(r"^rate\(lockstep_training_data_wait_seconds_total", rates(lambda v: 0.5)),
        Rule(r"^rate\(lockstep_training_compute_seconds_total", rates(lambda v: (v - 1) * 0.5)),
    ]


def test_a_rank_above_the_sustained_ratio_at_three_points_or_more_is_a_straggler() -> None:
    rules = work_rules(
        "4242",
        {
            "0": [10.0, 10.0, 10.0, 10.0, 10.0],
            "1": [10.0, 10.0, 10.0, 10.0, 10.0],
            "2": [10.0, 11.0, 10.0, 10.0, 10.0],  # one point at 1.1x: jitter
            "3": [10.0, 14.0, 14.0, 14.0, 10.0],  # three points at 1.4x
        },
    )
    with serving(FakePrometheus(rules)) as fake:
        scope = Scope(Prometheus(fake.url), "4242", "c1", start=T, end=T + 600, step=60, window=60)
        found = training_stragglers(scope)
    assert [(s.rank, s.start, s.end, s.seconds, s.ratio, s.share_lost) for s in found] == [
        # At T+360 rank 2's 11 makes the median 10.5: a ratio of 1.333 and 3.5 s of a 20-s step lost.
        # Each flagged point stands for its 5-minute window: T+60..T+360 to T+180..T+480.
        ("3", T + 60, T + 480, 420.0, 1.378, round((3.5 / 20 + 4 / 20 + 4 / 20) * 60 / 600, 4))
    ]
    # Each counter's rates asked for once, alone (summing or dividing them is done here).
    assert sorted(fake.seen) == [
        f'rate(lockstep_training_{name}_total{{job_id="4242",cluster="c1"}}[300000ms])'
        for name in ("compute_seconds", "data_wait_seconds", "step_seconds", "steps")
    ]


def test_ranks_are_compared_over_the_alerts_5_minutes_and_only_once_the_job_has_run_that_long() -> None:
    """Over the timeline's window (4 scrapes: 60 s) every healthy rank of a real 8-rank DDP run
    was above the ratio at 3 points or more, and a real 2-rank run's healthy rank was 1.37x its
    peer over its first minute (warm-up): the ratio is the alert's 5-minute one (on the job's
    clock: 30 s of Prometheus' at 10x), judged where that window lies within the job."""
    rules = work_rules(
        "4242",
        {
            "0": [10.0] * 8,
            "1": [10.0] * 8,
            "2": [14.0, 14.0, 14.0, 14.0, 10.0, 10.0, 10.0, 10.0],
        },  # its first 4 minutes
        first=T + 60,
    )
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
    rules = work_rules("7", {"0": [10.0] * 4, "1": [11.0] * 4})
    with serving(FakePrometheus(rules)) as fake:
        scope = Scope(Prometheus(fake.url), "7", "c1", start=T, end=T + 540, step=60, window=60)
        found = training_stragglers(scope)
    assert [(s.rank, s.ratio) for s in found] == [("1", 1.1)]


# --- what a day's report costs Prometheus --------------------------------------------------------

DAY_END = T - 1800  # a 24-hour job, a sample every 15 s (the production scrape), ended half an hour ago
DAY_START = DAY_END - 86400
SCRAPE = 15.0
# A selector of one of these names has a series per rank or per GPU: what a 1,024-rank job's report
# pays for (a selector of the job's series by __name__ regex counts once per such name in it).
PER_RANK = re.compile(r"lockstep_(training|nccl|gpu|framework)_\w+|lockstep_slurm_job_gpu_info")
SELECTOR = re.compile(r"(?P<name>lockstep_\w+)?\{(?P<labels>[^{}]*)\}(?:\[(?P<ms>\d+)ms\])?")


def test_a_ranks_collectives_in_a_communicator_are_summed_before_it_is_compared() -> None:
    """Rank 3 spends as long as its peers in each AllReduce but no time in AllGather (it arrives
    last): over the communicator's collectives together it waits half as long as the median peer
    (the straggler's share 0.5); AllReduce alone would clear it.  A second communicator where all
    is even names no one."""
    node = {"cluster": "c1", "instance": "n1:12400", "job_id": "4242", "host": "n1"}
    series_of = [
        ({**node, "rank": str(r), "comm": comm, "collective": collective}, r, collective)
        for comm in ("0x1", "0x2")
        for collective in ("AllReduce", "AllGather")
        for r in range(4)
    ]

    def seconds(r: int, collective: str, comm: str) -> float:
        return 0.0 if (r, collective, comm) == (3, "AllGather", "0x1") else 2.0

    def answer(value: Callable[[dict[str, str], int, str], float]) -> Answer:
        return lambda times: matrix(
            *((ls, [(t, value(ls, r, c)) for t in evaluations(times)]) for ls, r, c in series_of)
        )

    rules = [
        Rule(r"^rate\(lockstep_nccl_collectives_total", answer(lambda ls, r, c: 4.0)),
        Rule(r"^rate\(lockstep_nccl_collective_seconds_total", answer(lambda ls, r, c: seconds(r, c, ls["comm"]))),
    ]
    with serving(FakePrometheus(rules)) as fake:
        scope = Scope(Prometheus(fake.url), "4242", "c1", start=T, end=T + 600, step=60, window=60)
        found = nccl_stragglers(scope)
        asked = list(fake.seen)
    assert [(s.comm, s.rank, s.host, s.ratio, s.seconds) for s in found] == [("0x1", "3", "n1", 0.5, 660.0)]
    # Nothing recorded by the rules here: each counter then read once.
    assert [q.split("{")[0] for q in asked] == [
        "avg_over_time(job_comm_rank:lockstep_nccl_collective_seconds:per_op5m",
        "rate(lockstep_nccl_collectives_total",
        "rate(lockstep_nccl_collective_seconds_total",
    ]


def test_where_the_rules_record_the_time_per_collective_it_is_read_and_the_counters_only_for_the_flagged() -> None:
    """The recorded series (a rank and communicator; no agent label): rank 3 takes half the
    median's time per collective in 0x1 from the job's 4th minute.  Its share of the job lost
    needs its collectives per second, asked for rank 3 in 0x1 alone; its agent is the one its
    host ran on."""
    job = {"cluster": "c1", "job_id": "4242", "host": "n1"}
    recorded = [({**job, "rank": str(r), "comm": "0x1"}, r) for r in range(4)]

    def per_op(times: dict[str, float]) -> list[dict[str, Any]]:
        return matrix(
            *((ls, [(t, 0.25 if r == 3 and t >= T + 180 else 0.5) for t in evaluations(times)]) for ls, r in recorded)
        )

    rules = [
        Rule(r"^avg_over_time\(job_comm_rank:lockstep_nccl_collective_seconds:per_op5m\{", per_op),
        Rule(
            r'^rate\(lockstep_nccl_collectives_total\{rank=~"3",comm=~"0x1",job_id="4242",cluster="c1"\}',
            each(
                [
                    {**job, "instance": "n1:12400", "rank": "3", "comm": "0x1", "collective": c}
                    for c in ("AllReduce", "AllGather")
                ],
                lambda r, t: 2.0,
            ),
        ),
        Rule(r"^last_over_time\(lockstep_slurm_node_info", vector(({"instance": "n1:12400", "slurm_node": "n1"}, 1.0))),
    ]
    with serving(FakePrometheus(rules)) as fake:
        scope = Scope(Prometheus(fake.url), "4242", "c1", start=T, end=T + 600, step=60, window=60)
        scope.instances = ["n1:12400"]
        found = nccl_stragglers(scope)
        asked = [q.split("{")[0] for q in fake.seen]
    # 8 points from T+180; the median peer waits 0.25 s for it per collective, 4 collectives a second.
    assert [(s.comm, s.rank, s.node, s.ratio, s.seconds, s.share_lost) for s in found] == [
        ("0x1", "3", "n1:12400", 0.5, 480.0, round(8 * 1.0 * 60 / 600, 4))
    ]
    assert "rate(lockstep_nccl_collective_seconds_total" not in asked, asked
    assert asked.count("rate(lockstep_nccl_collectives_total") == 1, asked


def job_ranges_read(request: Request) -> float:
    """How many times a request reads the day's job range of per-rank and per-GPU series: Prometheus
    decodes every sample a selector covers, once per evaluation whose window covers it (a range
    query of rate(x[w]) at step s reads each sample w / s times; a plain selector in a range query
    decodes every sample between its evaluations; one in an instant query, one sample)."""
    total = 0.0
    for m in SELECTOR.finditer(request.query if request.endpoint != "series" else ""):
        if m["name"]:
            kinds = 1 if PER_RANK.fullmatch(m["name"]) else 0
        else:
            kinds = len(PER_RANK.findall(m["labels"]))
        window = int(m["ms"]) / 1000 if m["ms"] else None
        if request.endpoint == "query":
            if window is not None:
                at = request.times["time"]
                total += kinds * overlap(at - window, at)
        else:
            start, end, step = request.times["start"], request.times["end"], request.times["step"]
            total += kinds * (
                overlap(start - step, end) if window is None else overlap(start - window, end) * window / step
            )
    return total / (DAY_END - DAY_START)


def overlap(a: float, b: float) -> float:
    return max(0.0, min(b, DAY_END) - max(a, DAY_START))


def evaluations(times: dict[str, float]) -> list[float]:
    count = int((times["end"] - times["start"]) / times["step"] + 1e-9) + 1
    return [times["start"] + i * times["step"] for i in range(count)]


def samples_in(a: float, b: float) -> int:
    """The day's job's samples in [a, b]."""
    a, b = max(a, DAY_START), min(b, DAY_END)
    return 0 if b < a else int((b - DAY_START) // SCRAPE) - int(math.ceil((a - DAY_START) / SCRAPE)) + 1


def counted(times: dict[str, float]) -> list[dict[str, Any]]:
    """count(count_over_time(job[step])) over a range: its buckets with samples."""
    points = [(t, samples_in(t - times["step"], t)) for t in evaluations(times)]
    return matrix(({}, [(t, float(n)) for t, n in points if n]))


def coarse_count(at: float) -> list[dict[str, Any]]:
    """count(count_over_time(job[bucket])) at one instant: empty when the bucket holds no sample."""
    n = samples_in(at - BUCKET, at)
    return vector(({}, float(n))) if n else []


def exact_sample(at: float, edge: Callable[[list[float]], float]) -> list[dict[str, Any]]:
    """min or max(min or max_over_time((timestamp(job) <= now)[12714ms:1s])) at an instant: the first or
    last of the job's samples in the 12.7 s before it (each looked up within 5 minutes)."""
    found = [DAY_START + SCRAPE * n for n in range(int(86400 / SCRAPE) + 1)]
    seen = [s for s in found if at - 12.714 - 300 <= s <= at]
    if not seen:
        return []
    return vector(({}, edge([s for s in seen if s >= at - 12.714] or seen[-1:])))


Answer = Callable[[dict[str, float]], list[dict[str, Any]]]


def per_eval(labels: dict[str, str], value: Callable[[int, float], float]) -> Answer:
    """One series over a range query's evaluations: value(its index, its time)."""
    return lambda times: matrix((labels, [(t, value(i, t)) for i, t in enumerate(evaluations(times))]))


def each(labels: list[dict[str, str]], value: Callable[[int, float], float]) -> Answer:
    """A series per label set over a range query's evaluations: value(the set's index, the time)."""
    return lambda times: matrix(*((ls, [(t, value(r, t)) for t in evaluations(times)]) for r, ls in enumerate(labels)))


def day_job() -> FakePrometheus:
    """A day's job of 4 ranks on one node, rank 3 slow (in its own work and to its NCCL peers) in
    its first hour, hung at its end: every section of the report asks its questions."""
    node = {"cluster": "c1", "instance": "n1:12400", "job_id": "4242"}
    ranks = [{**node, "rank": str(r), "host": "n1"} for r in range(4)]

    def slow(t: float) -> bool:
        return t < DAY_START + 3600

    labels = [
        {"__name__": "lockstep_slurm_job_info", **node, "user": "alice"},
        {"__name__": "lockstep_checkpoint_info", **node, "root": "/ckpt"},
        *({"__name__": "lockstep_slurm_job_gpu_info", **node, "gpu": str(g), "uuid": f"GPU-{g}"} for g in range(4)),
        *({"__name__": "lockstep_training_steps_total", **r} for r in ranks),
        *(
            {"__name__": "lockstep_nccl_collectives_total", **r, "comm": "0x1", "collective": "AllReduce"}
            for r in ranks
        ),
    ]
    nccl = [{**r, "comm": "0x1"} for r in ranks]
    rules = [
        Rule(r"^series .*lockstep_nccl_rank_info", series(*labels)),
        Rule(r"^series ", series({"__name__": "lockstep_slurm_job_info", "cluster": "c1"})),
        Rule(r"^count\(count_over_time\(", counted, when=lambda times: "step" in times),
        Rule(r"^count\(count_over_time\(", lambda times: coarse_count(times["time"])),
        Rule(r"^min\(min_over_time\(\(timestamp\(", lambda times: exact_sample(times["time"], min)),
        Rule(r"^max\(max_over_time\(\(timestamp\(", lambda times: exact_sample(times["time"], max)),
        Rule(r"^max\(count_over_time\(", vector(({}, 3600 / SCRAPE + 1))),
        Rule(r"^rate\(lockstep_training_step_seconds_total", each(ranks, lambda r, t: 5.0)),
        Rule(r"^rate\(lockstep_training_steps_total", each(ranks, lambda r, t: 0.5)),
        Rule(r"^rate\(lockstep_training_data_wait_seconds_total", each(ranks, lambda r, t: 0.5)),
        Rule(
            r"^rate\(lockstep_training_compute_seconds_total",
            each(ranks, lambda r, t: 4.5 if r == 3 and slow(t) else 3.0),
        ),
        Rule(r"^sum\(rate\(lockstep_training_tokens_total", per_eval({}, lambda i, t: 4000.0)),
        Rule(
            r"^max\(max_over_time\(lockstep_training_steps_total",
            per_eval({}, lambda i, t: 10.0 + i),
            when=lambda times: "step" in times,
        ),
        Rule(r"^max\(max_over_time\(lockstep_training_steps_total", vector(({}, 731.0))),  # after the last window
        Rule(r"^rate\(lockstep_nccl_collectives_total", each(nccl, lambda r, t: 4.0)),
        Rule(
            r"^rate\(lockstep_nccl_collective_seconds_total",
            each(nccl, lambda r, t: 1.0 if r == 3 and slow(t) else 2.0),
        ),
        Rule(
            r'^max_over_time\(ALERTS\{alertstate="firing",job_id=',
            matrix(({"alertname": "LockstepTrainingHung", "severity": "critical", **node}, [(DAY_END - 60, 1.0)])),
        ),
    ]
    return FakePrometheus(rules)


def test_a_days_report_at_15_s_samples_reads_each_ranks_series_a_bounded_number_of_times() -> None:
    """bench/report.py measures it (a 1,024-rank day at 15-s samples within 10 s); this holds the
    queries to the form measured.  find_job asks the series API which ranks, GPUs and agents the
    job has (no sample read), the range queries step and window alike at 360 s (each sample read
    once), and no section asks again for what another has read."""
    with serving(day_job()) as fake:
        report = build_report(Prometheus(fake.url), "4242", "c1", now=T)
    # Every section asked its questions.
    assert (report.job.start, report.job.end) == (DAY_START, DAY_END)
    assert (report.job.ranks, report.job.gpus, report.steps.steps) == (4, 4, 731)
    assert [(s.kind, s.rank) for s in report.stragglers] == [("training", "3"), ("nccl", "3")]
    assert report.post_mortem is not None
    # At 15-s samples a day's timeline has a point every 360 s, and its rates a 360-s window; the
    # step count (for stalls) a point every 2 minutes, its windows 2 minutes too.
    ranged = [r for r in fake.requests if r.endpoint == "query_range" and r.times["start"] == DAY_START]
    counts = [r for r in ranged if r.query.startswith("max(max_over_time(lockstep_training_steps_total")]
    assert [(r.times["step"], re.findall(r"\[(\d+)ms\]", r.query)) for r in counts] == [(120.0, ["120000"])]
    ranged = [r for r in ranged if r not in counts]
    assert {r.times["step"] for r in ranged} == {360.0}
    assert {m for r in ranged for m in re.findall(r"\[(\d+)ms\]", r.query)} == {"360000"}
    # What happens between two points is read too, not only at them: an alert that fired for less
    # than a step, a save in progress a little longer than its limit.
    windowed = sorted(r.query.split("{")[0] for r in ranged if r.query.startswith("max_over_time("))
    assert windowed == [  # (sorted: the sections ask side by side)
        "max_over_time(ALERTS",
        "max_over_time(ALERTS",
        "max_over_time(lockstep_checkpoint_in_progress_seconds",
    ]
    reads = sorted(((job_ranges_read(r), r.query[:110]) for r in fake.requests), reverse=True)
    shown = "\n".join(f"{n:6.2f}  {q}" for n, q in reads if n >= 0.05)
    # Each query reads each of its counters once (the most: a rank's work, three counters); the
    # job's edges are found in Slurm's record, not by counting its every series' every bucket.
    assert reads[0][0] <= 3.01, shown
    # 9 for the GPUs, 9 for the steps and stragglers, 1 for the communicators' sizes, 2 for the hang's
    # post-mortem, 0.6 for the rest.
    assert sum(n for n, _ in reads) <= 22, shown
