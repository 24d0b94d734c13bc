"""When LockstepTrainingStragglerSustained names the slow rank of the real DDP runs, replayed at
their own timestamps: the table of time to fire by job size and slowdown in docs/alerting.md.

    .venv/bin/python bench/straggler_timing.py [RUN ...] [--compose 64 1024]

For each run of tests/fixtures/training/ that has an onset in seconds (issue 34's: made by
bench/ddp_runs.py), the run is replayed through the real training collector at its own
timestamps (tests/support/training_replay.py: every step written when it was logged, scraped
every 15 s), promtool evaluates the shipped rule files every 15 s, and this prints: the
straggler's slowdown as measured from its log (its own time per step, compute plus data wait,
over its peers' median, after the onset), when the alert first fired after the onset, whether
it fired at every evaluation from then to the job's end, when it last fired after the job's end,
and what else fired.

`--compose N` also makes an N-rank job of the 8-rank run at its real timing: the collector's
series of its straggler once, and of its 7 healthy ranks copied under new rank numbers until
there are N ranks.  Copies of a rank step in phase with it (the same jitter), so this measures
the rules at that size, not new statistics of a larger job.  Prints figures; no pass/fail.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # alerts/ and tests/ are repository packages, not installed

from alerts import render  # noqa: E402
from tests.support.training_replay import (  # noqa: E402
    TRAINING_FIXTURES,
    Series,
    firing_timeline,
    load_written,
    onset_seconds,
    replay_as_written,
)

SCRAPE = 15
AFTER_MINUTES = 10
SUSTAINED = "LockstepTrainingStragglerSustained"


def measured_slowdown(name: str) -> float:
    """The straggler's own time per step over its peers' median, after the onset."""
    meta, ranks = load_written(name)
    onset = int(meta["onset_step"] or 0)

    def work(rank: int) -> float:
        steps = ranks[rank][onset:]
        return statistics.fmean(s.values["compute_time_sec"] + s.values.get("data_time_sec", 0.0) for s in steps)

    straggler = int(meta["straggler_rank"])
    peers = [work(r) for r in range(len(ranks)) if r != straggler]
    return work(straggler) / statistics.median(peers)


def compose(series: Series, ranks: int, straggler: int, size: int) -> Series:
    """The series of a `size`-rank job: the run's ranks, then copies of its healthy ones."""
    healthy = [r for r in range(ranks) if r != straggler]
    out: Series = {}
    for labels, values in series.items():
        pairs = dict(labels)
        if "rank" not in pairs:
            out[labels] = values
            continue
        rank = int(pairs["rank"])
        out[labels] = values
        if rank == straggler:
            continue
        for new_rank in range(ranks + healthy.index(rank), size, len(healthy)):
            out[frozenset({**pairs, "rank": str(new_rank)}.items())] = values
    return out


def measure(name: str, size: int | None, work: Path) -> str:
    meta, written = load_written(name)
    started = time.monotonic()
    series, ended, _origin = replay_as_written(name, work / "logs", SCRAPE, AFTER_MINUTES)
    ranks = int(meta["ranks"])
    if size is not None:
        series = compose(series, ranks, int(meta["straggler_rank"]), size)
    points = max(max(values) for values in series.values()) + 1
    rule_files = [str(REPO / path) for path in render.RULE_FILES.values()]
    timeline = firing_timeline(series, points, SCRAPE, rule_files, SCRAPE, work)
    onset, end = onset_seconds(meta, written), ended * SCRAPE
    straggler = f"{SUSTAINED} {meta['job_id']} {meta['straggler_rank']}"
    named = sorted(t for t, alerts in timeline.items() if straggler in alerts)
    others = sorted({a for alerts in timeline.values() for a in alerts} - {straggler})
    first = f"{(named[0] - onset) / 60:.1f} min" if named else "never"
    held = bool(named) and all(straggler in timeline[t] for t in range(named[0], end, SCRAPE))
    last = f"{(named[-1] - end) / 60:+.1f} min" if named else "-"
    onset_text = "first step" if onset == 0 else f"{onset / 60:.0f} min in"
    return (
        f"| `{name}`{f' composed to {size}' if size else ''} | {size or ranks} | {onset_text} "
        f"| {measured_slowdown(name):.3f}x | {first} | {'yes' if held else 'no'} | {last} "
        f"| {', '.join(others) or 'nothing'} | {time.monotonic() - started:.0f} s |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="*", metavar="RUN")
    parser.add_argument("--compose", type=int, nargs="*", default=[], metavar="N", help="N-rank jobs of the 8-rank run")
    args = parser.parse_args()
    runs = args.runs or sorted(
        p.parent.name
        for p in TRAINING_FIXTURES.glob("*/case.json")
        if load_written(p.parent.name)[0].get("onset_seconds") is not None
    )
    print("| run | ranks | slow from | slowdown (own work / peers' median) | fires after the onset "
          "| held to the end | last firing after the job's end | anything else fired | bench time |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="lockstep-straggler-timing-") as directory:
        for index, name in enumerate(runs):
            print(measure(name, None, Path(directory) / str(index)), flush=True)
        for size in args.compose:
            print(measure("hour-then-slow-8", size, Path(directory) / f"compose-{size}"), flush=True)


if __name__ == "__main__":
    main()
