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

from lockstep.agent.report.build import (
    Scope,
    build_report,
    find_job,
    flat_runs,
    stalled_saves,
    steps_section,
    training_stragglers,
)
from lockstep.agent.report.model import Interval, Point
from lockstep.agent.report.prometheus import Prometheus, ReportError
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
PART = BUCKET / 50  # the edge bucket's parts
TICK = PART / 50  # the edge part's lookups


def test_the_job_range_is_its_first_and_last_sample() -> None:
    """Coarse buckets, then the edge bucket's parts, then lookups across the edge part every 2 s:
    the job's first and last samples' own timestamps, from small queries whatever its length."""
    first_part, last_part = T - 3 * BUCKET + 10 * PART, T - BUCKET - 5 * PART
    first, last = first_part - PART + 2.5 * TICK, last_part - 1.5 * TICK
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
            r"^count\(count_over_time\(\{__name__.*\[5356800ms\]",
            matrix(({}, [(T - 2 * BUCKET, 1.0), (T - BUCKET, 3.0)])),
        ),
        Rule(
            r"^count\(count_over_time\(\{__name__.*\[10713\dms\]",
            matrix(({}, [(first_part, 1.0), (first_part + PART, 3.0)])),
            when=lambda times: times["end"] < T - 1.5 * BUCKET,
        ),
        Rule(
            r"^count\(count_over_time\(\{__name__.*\[10713\dms\]",
            matrix(({}, [(last_part - PART, 3.0), (last_part, 1.0)])),
        ),
        Rule(r"^min\(timestamp", matrix(({}, [(first_part - PART + 3 * TICK, first), (first_part, first + 15)]))),
        Rule(r"^max\(timestamp", matrix(({}, [(last_part - PART + TICK, last - 100), (last_part, last)]))),
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
    lookup = [r for r in fake.requests if r.query.startswith("max(timestamp")][-1]  # across the last part, every TICK
    assert (lookup.times["start"], lookup.times["step"]) == pytest.approx((last_part - PART + TICK, TICK), abs=1e-3)
    counted = [r for r in fake.requests if r.query.startswith("max(count_over_time")]
    assert [r.times["time"] for r in counted] == pytest.approx([last])
    assert fake.requests[0].times == {"start": T - 31 * 86400, "end": T}  # the lookback: in the index, not samples


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
        Rule(r"^count\(count_over_time\(lockstep_slurm_job_info.*\[5356800ms\]", matrix(({}, [(T - 3 * BUCKET, 1.0)]))),
        Rule(
            r"^count\(count_over_time\(\{__name__.*\[5356800ms\]",
            vector(({}, 2.0)),
            when=lambda times: times.get("time") == T - 4 * BUCKET,
        ),
        Rule(r"^count\(count_over_time\(\{__name__.*\[10713\dms\]", matrix(({}, [(T - 5 * BUCKET + PART, 1.0)]))),
        Rule(r"^count\(count_over_time\(lockstep_slurm_job_info.*\[10713\dms\]", matrix(({}, [(slurm_part, 1.0)]))),
        Rule(r"^min\(timestamp", matrix(({}, [(T - 5 * BUCKET + PART, T - 5 * BUCKET + 60)]))),
        Rule(r"^max\(timestamp\(lockstep_slurm_job_info", matrix(({}, [(slurm_part, slurm_part - 10)]))),
        Rule(r"^max\(timestamp\(\{__name__", matrix(({}, [(T - BUCKET, T - BUCKET - 1)]))),
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


def work_rules(job: str, work: dict[str, list[float]]) -> list[Rule]:
    """Each rank's counters' rates for the work per step given (a point a minute from T): half a
    step a second, one second of data wait a step, the rest computing."""
    labels = {r: {"cluster": "c1", "instance": "n1:12400", "job_id": job, "rank": r, "host": "n1"} for r in work}

    def rates(value: Callable[[float], float]) -> list[dict[str, Any]]:
        return matrix(*((labels[r], [(T + 60 * i, value(v)) for i, v in enumerate(vs)]) for r, vs in work.items()))

    return [
        Rule(r"^rate\(lockstep_training_steps_total", rates(lambda v: 0.5)),
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
    wall = [Point(T + 60 * i, 20.0) for i in range(5)]  # the steps section's timeline
    with serving(FakePrometheus(rules)) as fake:
        scope = Scope(Prometheus(fake.url), "4242", "c1", start=T, end=T + 300, step=60, window=60)
        found = training_stragglers(scope, wall)
    assert [(s.rank, s.start, s.end, s.seconds, s.ratio, s.share_lost) for s in found] == [
        # At T+60 rank 2's 11 makes the median 10.5: a ratio of 1.333 and 3.5 s of a 20-s step lost.
        ("3", T + 60, T + 180, 180.0, 1.378, round((3.5 / 20 + 4 / 20 + 4 / 20) * 60 / 300, 4))
    ]
    # Each counter's rates asked for once, alone (summing or dividing them is done here).
    assert sorted(fake.seen) == [
        f'rate(lockstep_training_{name}_total{{job_id="4242",cluster="c1"}}[60000ms])'
        for name in ("compute_seconds", "data_wait_seconds", "steps")
    ]


def test_a_2_rank_jobs_straggler_is_judged_against_its_one_peer_as_the_alert_does() -> None:
    """In a 2-rank job the median is the mean of the two: a rank 10 % slower than its peer is
    4.8 % above it.  As LockstepTrainingStragglerSustained, the report compares it with its one
    peer (1.1x), and names it."""
    rules = work_rules("7", {"0": [10.0] * 4, "1": [11.0] * 4})
    with serving(FakePrometheus(rules)) as fake:
        scope = Scope(Prometheus(fake.url), "7", "c1", start=T, end=T + 240, step=60, window=60)
        found = training_stragglers(scope, [Point(T + 60 * i, 20.0) for i in range(4)])
    assert [(s.rank, s.ratio) for s in found] == [("1", 1.1)]


# --- what a day's report costs Prometheus --------------------------------------------------------

DAY_END = T - 1800  # a 24-hour job, a sample every 15 s (the production scrape), ended half an hour ago
DAY_START = DAY_END - 86400
SCRAPE = 15.0
# A selector of one of these names has a series per rank or per GPU: what a 1,024-rank job's report
# pays for (a selector of the job's series by __name__ regex counts once per such name in it).
PER_RANK = re.compile(r"lockstep_(training|nccl|gpu|framework)_\w+|lockstep_slurm_job_gpu_info")
SELECTOR = re.compile(r"(?P<name>lockstep_\w+)?\{(?P<labels>[^{}]*)\}(?:\[(?P<ms>\d+)ms\])?")


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


def stamped(times: dict[str, float]) -> list[dict[str, Any]]:
    """min or max(timestamp(job)) over a range: the latest sample within Prometheus' 5-minute lookback."""
    points = []
    for t in evaluations(times):
        latest = DAY_START + SCRAPE * ((min(t, DAY_END) - DAY_START) // SCRAPE)
        if t >= DAY_START and t - latest <= 300:
            points.append((t, latest))
    return matrix(({}, points))


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
        Rule(r"^(min|max)\(timestamp\(", stamped),
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
        Rule(r"^sum by .*lockstep_nccl_collectives_total", each(nccl, lambda r, t: 4.0)),
        Rule(
            r"^sum by .*lockstep_nccl_collective_seconds_total",
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
    windowed = [r.query.split("{")[0] for r in ranged if r.query.startswith("max_over_time(")]
    assert windowed == [
        "max_over_time(lockstep_checkpoint_in_progress_seconds",
        "max_over_time(ALERTS",
        "max_over_time(ALERTS",
    ]
    reads = sorted(((job_ranges_read(r), r.query[:110]) for r in fake.requests), reverse=True)
    shown = "\n".join(f"{n:6.2f}  {q}" for n, q in reads if n >= 0.05)
    # Each query reads each of its counters once (the most: a rank's work, three counters); the
    # job's edges are found in Slurm's record, not by counting its every series' every bucket.
    assert reads[0][0] <= 3.01, shown
    # 9 for the GPUs, 9 for the steps and stragglers, 1 for the communicators' sizes, 2 for the hang's
    # post-mortem, 0.6 for the rest.
    assert sum(n for n, _ in reads) <= 22, shown
