"""Real DDP runs of 35 to 95 minutes and 2 to 16 ranks (issues 34, 44; tests/fixtures/training/,
made by bench/ddp_runs.py: torch on CPU, gloo, one rank given real extra compute) replayed through the
real training collector **at their own timestamps**: every step of every rank is written when
the run logged it (the run's first record at the replay's time 0), the collector is scraped
every 15 s and promtool evaluates the production rule files every 15 s.  Nothing is stretched,
looped or cut.  Then the job ends (its logs are closed, as its rank processes' were when they
exited) and the scrapes go on for 10 minutes.

What a user relies on, for each run:
- before the onset, nothing fires;
- the slow rank is named by LockstepTrainingStragglerSustained (it holds its job back) within 30
  minutes of its onset (of the job's first step, for a rank slow from the start), and by
  LockstepTrainingSlowerThanPeers (issue 44's sequential test: it is slower than its peers) within
  10 minutes for the runs slowed by 10 % or more, 25 for the slighter ones (7.4 %, 6.5 % and
  5 %); no other rank ever is (the 8-rank run's rank 2 runs persistently fast);
- once named, it stays named at every evaluation until the job ends (no resolve and fire again);
- nothing fires about the job once its last step is 2 minutes old.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from alerts import render
from tests.support import REPO
from tests.support.training_replay import (
    WRITTEN_AFTER_MINUTES,
    WrittenReplays,
    WrittenStep,
    firing_timeline,
    load_written,
    onset_seconds,
)

SCRAPE = 15  # seconds between scrapes and between rule evaluations, as in production
AFTER_MINUTES = 10
DEADLINE = 30 * 60  # issue 34's: named within 30 minutes of the onset
# Issue 44's, for the sequential test: a 10 % straggler within 10 minutes of its onset, a 5 % one
# within 25.  slight-from-start-4's rank computes 8.9 % more than its peers (case.json), its own
# work (compute and data wait) 7.4 % more: held to the slighter bound.
SLOWER_DEADLINES = {"slow-from-start-2": 10 * 60, "slow-from-start-4": 10 * 60, "slight-from-start-4": 25 * 60,
                    "hour-then-slow-8": 10 * 60, "paced-skewed-4": 10 * 60,
                    "five-percent-from-start-4": 25 * 60, "later-five-percent-16": 25 * 60,
                    "later-five-percent-4": 25 * 60}  # fmt: skip
# Nothing may fire about a job once its last step is this old (TRAINING_STEPPED_WITHIN, 2
# minutes, plus one evaluation).
QUIET_AFTER_END = 120 + SCRAPE
SUSTAINED = "LockstepTrainingStragglerSustained"
SLOWER = "LockstepTrainingSlowerThanPeers"
RUNS = ["slow-from-start-2", "slow-from-start-4", "slight-from-start-4", "hour-then-slow-8"]


def judged(name: str, tmp_path: Path, written_replays: WrittenReplays) -> tuple[dict[int, set[str]], int]:
    """The production rules' firing alerts at each evaluation of the run's one replay (the
    session's), and the first evaluation after the job's last step (seconds from the replay's
    start)."""
    replayed = written_replays.get(name)
    series = replayed.series
    points = max(max(values) for values in series.values()) + 1
    rule_files = [str(REPO / path) for path in render.RULE_FILES.values()]
    return firing_timeline(series, points, SCRAPE, rule_files, SCRAPE, tmp_path), replayed.ended * SCRAPE


def own_work(ranks: list[list[WrittenStep]], rank: int, steps: range) -> float:
    """A rank's own time per step (compute and data wait), averaged over the steps."""
    return statistics.fmean(
        ranks[rank][k].values["compute_time_sec"] + ranks[rank][k].values["data_time_sec"] for k in steps
    )


@pytest.mark.parametrize("name", RUNS)
@pytest.mark.real
def test_the_slow_rank_is_named_within_30_minutes_held_until_the_end_and_nothing_else_fires(
    name: str, tmp_path: Path, written_replays: WrittenReplays
) -> None:
    meta, ranks = load_written(name)
    assert (written_replays.get(name).scrape, WRITTEN_AFTER_MINUTES) == (SCRAPE, AFTER_MINUTES)
    timeline, end = judged(name, tmp_path, written_replays)
    onset = onset_seconds(meta, ranks)
    # The slow rank's two verdicts: it holds its job back (each of these jobs waits for it), and
    # it is slower than its peers.
    verdicts = [f"{alert} {meta['job_id']} {meta['straggler_rank']}" for alert in (SUSTAINED, SLOWER)]

    named = [t for t, alerts in timeline.items() if alerts]
    assert named, f"{name}: nothing fired"
    last = max(named)
    # Only the slow rank, ever, and nothing before its onset.
    assert {alert for alerts in timeline.values() for alert in alerts} == set(verdicts)
    for verdict in verdicts:
        first = min(t for t, alerts in timeline.items() if verdict in alerts)
        print(f"{name}: {verdict} fires {(first - onset) / 60:.2f} min after the onset, "
              f"last firing evaluation {(last - end) / 60:.2f} min after the job's end")  # fmt: skip
        assert first >= onset
        # Within its deadline after the onset, then at every evaluation until the job's end.
        assert first <= onset + (SLOWER_DEADLINES[name] if verdict.startswith(SLOWER) else DEADLINE)
        assert [t for t in range(first, end, SCRAPE) if verdict not in timeline[t]] == []
    # Silent once the job's last step is 2 minutes old.
    assert last < end + QUIET_AFTER_END


PACED = "paced-skewed-4"


@pytest.mark.real
def test_a_slow_rank_nothing_waits_for_is_slower_than_its_peers_and_holds_no_one_back(
    tmp_path: Path, written_replays: WrittenReplays
) -> None:
    """Issue 44, on a real run at its own timestamps: paced-skewed-4's rank 2 computes 12 % more
    than its peers from its first step, but the job paces its steps and rank 3 starts each one
    last, so rank 3 arrives last at the all-reduce and nothing waits for rank 2.  Only the second
    verdict names it (LockstepTrainingSlowerThanPeers), within 10 minutes of the first step, held
    to the job's end; the paging one (LockstepTrainingStragglerSustained) names no one."""
    meta, _ = load_written(PACED)
    timeline, end = judged(PACED, tmp_path, written_replays)
    slower = f"{SLOWER} {meta['job_id']} {meta['straggler_rank']}"
    assert {alert for alerts in timeline.values() for alert in alerts} == {slower}
    named = [t for t, alerts in timeline.items() if slower in alerts]
    first, last = min(named), max(named)
    print(f"{PACED}: {slower} fires {first / 60:.2f} min after the first step")
    assert first <= SLOWER_DEADLINES[PACED]
    assert [t for t in range(first, end, SCRAPE) if slower not in timeline[t]] == []
    assert last < end + QUIET_AFTER_END


FIVE = "five-percent-from-start-4"


@pytest.mark.real
def test_a_five_percent_slow_rank_is_slower_than_its_peers_within_25_minutes(
    tmp_path: Path, written_replays: WrittenReplays
) -> None:
    """Issue 44's slowest bound on a real run at its own timestamps: five-percent-from-start-4's
    rank 2 does about 5 % more of its own work per step than its peers from its first step (the
    next test).  LockstepTrainingSlowerThanPeers names it within 25 minutes of the first step and
    holds it to the job's end; no other rank is ever named, and nothing once the job ended.  The
    page (LockstepTrainingStragglerSustained, 5 % over 20 minutes) is at its margin here: it may
    name the same rank, never another."""
    meta, _ = load_written(FIVE)
    timeline, end = judged(FIVE, tmp_path, written_replays)
    slower, page = (f"{alert} {meta['job_id']} {meta['straggler_rank']}" for alert in (SLOWER, SUSTAINED))
    assert {alert for alerts in timeline.values() for alert in alerts} <= {slower, page}
    for verdict in (slower, page):
        named = [t for t, alerts in timeline.items() if verdict in alerts]
        print(f"{FIVE}: {verdict} " + (f"fires {min(named) / 60:.2f} min after the first step" if named else "never"))
    named = [t for t, alerts in timeline.items() if slower in alerts]
    assert named, f"{FIVE}: {SLOWER} never named rank {meta['straggler_rank']}"
    first = min(named)
    assert first <= SLOWER_DEADLINES[FIVE]
    assert [t for t in range(first, end, SCRAPE) if slower not in timeline[t]] == []
    assert max(t for t, alerts in timeline.items() if alerts) < end + QUIET_AFTER_END


# Runs slowed slightly after 10 healthy minutes (issue 44): the ranks, the slow rank, and the
# bounds of its own work per step over its peers' median after the onset (case.json's target: 5 %;
# on 16 ranks sharing the 2 cores the feedback overshot).
LATER_RUNS = {"later-five-percent-16": (16, 11, 1.05, 1.07), "later-five-percent-4": (4, 2, 1.045, 1.065)}


@pytest.mark.parametrize("name", LATER_RUNS)
@pytest.mark.real
def test_a_rank_slowed_slightly_after_10_minutes_is_slower_than_its_peers_within_25_minutes(
    name: str, tmp_path: Path, written_replays: WrittenReplays
) -> None:
    """Issue 44 on real jobs of 4 and 16 ranks (more than 8: later-five-percent-16's ranks share
    the 2 cores, each rank's compute moving with the others' scheduling), each healthy for 10
    minutes and then one rank doing 5-6.5 % more of its own work per step (the next test): under
    the 5-minute window's threshold (7 %), so only the 20-minute window can name it, and after a
    later onset that window must first hold 18 minutes of the slowdown (its floor), at its own
    timestamps.  Nothing fires before the onset; LockstepTrainingSlowerThanPeers names the slow
    rank within 25 minutes of it and holds it to the job's end; no other rank is ever named;
    nothing once the job ended.  The page may name the same rank, never another."""
    meta, ranks = load_written(name)
    timeline, end = judged(name, tmp_path, written_replays)
    onset = onset_seconds(meta, ranks)
    slower, page = (f"{alert} {meta['job_id']} {meta['straggler_rank']}" for alert in (SLOWER, SUSTAINED))
    assert {alert for alerts in timeline.values() for alert in alerts} <= {slower, page}
    assert [t for t, alerts in timeline.items() if alerts and t < onset] == []
    for verdict in (slower, page):
        named = [t for t, alerts in timeline.items() if verdict in alerts]
        print(
            f"{name}: {verdict} " + (f"fires {(min(named) - onset) / 60:.2f} min after the onset" if named else "never")
        )
    named = [t for t, alerts in timeline.items() if slower in alerts]
    assert named, f"{name}: {SLOWER} never named rank {meta['straggler_rank']}"
    first = min(named)
    assert first <= onset + SLOWER_DEADLINES[name]
    assert [t for t in range(first, end, SCRAPE) if slower not in timeline[t]] == []
    last = max(t for t, alerts in timeline.items() if alerts)
    print(f"{name}: last firing evaluation {(last - end) / 60:.2f} min after the job's end")
    assert last < end + QUIET_AFTER_END


# In-process: the unit tier (no marker; tests/conftest.py), in the quick loop.
@pytest.mark.parametrize("name", LATER_RUNS)
def test_the_later_runs_slow_rank_does_5_to_7_percent_more_of_its_own_work_after_10_minutes(name: str) -> None:
    """What each of LATER_RUNS is, from its own logs: its slow rank's own work per step (compute
    and data wait) within 1 % of its peers' median for the first 10 minutes, then over it by the
    run's bounds (later-five-percent-16: 1.065x, later-five-percent-4: 1.054x), under the
    sequential test's 5-minute threshold (1.07)."""
    count, slow, low, high = LATER_RUNS[name]
    meta, ranks = load_written(name)
    onset = int(meta["onset_step"])
    assert (len(ranks), int(meta["straggler_rank"])) == (count, slow)
    assert 9 * 60 <= onset_seconds(meta, ranks) <= 11 * 60
    for steps, lowest, highest in ((range(onset), 0.99, 1.01), (range(onset, len(ranks[0])), low, high)):
        peers = statistics.median(own_work(ranks, r, steps) for r in range(count) if r != slow)
        assert lowest <= own_work(ranks, slow, steps) / peers <= highest


# In-process: the unit tier (no marker; tests/conftest.py), in the quick loop.
def test_the_five_percent_runs_slow_rank_does_about_5_percent_more_of_its_own_work() -> None:
    """What five-percent-from-start-4 is, from its own logs: rank 2's own work per step (compute
    and data wait) 4-6.5 % over its peers' median over the whole run."""
    meta, ranks = load_written(FIVE)
    slow, steps = int(meta["straggler_rank"]), range(len(ranks[0]))
    peers = statistics.median(own_work(ranks, r, steps) for r in range(4) if r != slow)
    assert 1.04 <= own_work(ranks, slow, steps) / peers <= 1.065


# In-process: the unit tier (no marker; tests/conftest.py), in the quick loop.
def test_the_paced_runs_slow_rank_computes_more_and_another_arrives_last() -> None:
    """What paced-skewed-4 is, from its own logs: rank 2's own work per step (compute and data
    wait) at least 8 % over its peers' median, and rank 3 the one that waits least at the
    all-reduce (the last to arrive) in most steps, rank 2 in few."""
    meta, ranks = load_written(PACED)
    slow, last = int(meta["straggler_rank"]), 3
    steps = range(len(ranks[0]))
    peers = statistics.median(own_work(ranks, r, steps) for r in range(4) if r != slow)
    assert own_work(ranks, slow, steps) / peers > 1.08
    arrived_last = [min(range(4), key=lambda r: ranks[r][k].values["comm_wait_time_sec"]) for k in steps]
    assert arrived_last.count(last) / len(arrived_last) > 0.6
    assert arrived_last.count(slow) / len(arrived_last) < 0.25


# In-process: the unit tier (no marker; tests/conftest.py), in the quick loop.
def test_the_8_rank_run_has_a_persistently_fast_healthy_rank_and_a_slow_one_after_an_hour() -> None:
    """What the 8-rank run is, from its own logs: rank 2 (a smaller batch) computes at least 3 %
    less than the job's median rank for the whole run, the straggler (rank 5) at least 5 % more
    after its onset, an hour into the job."""
    meta, ranks = load_written("hour-then-slow-8")
    onset = int(meta["onset_step"])
    assert float(meta["onset_seconds"]) >= 3600

    whole, after = range(len(ranks[0])), range(onset, len(ranks[0]))
    median_whole = statistics.median(own_work(ranks, r, whole) for r in range(8))
    median_after = statistics.median(own_work(ranks, r, after) for r in range(8))
    assert own_work(ranks, int(meta["fast_rank"]), whole) / median_whole < 0.97
    assert own_work(ranks, int(meta["straggler_rank"]), after) / median_after > 1.05
