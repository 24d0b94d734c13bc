"""A job's events (parsers.py) into its counters.

Iterations and seconds: a step report says where the job is (its iteration number) and how
long its iterations took since the previous report (Megatron, NeMo: the mean time per
iteration; torchtitan: nothing, so the time between the two lines' timestamps).  So the first
report of a job is where counting starts, and each later one adds the iterations between the
two numbers and their time.  A number that does not move on (the same report printed by
several ranks, a NeMo epoch boundary, a job restarted from an earlier checkpoint) adds
nothing and, when it went back, is where counting starts again: nothing is guessed.

A report that says the job moved further than a real job can between two reports (over a
million iterations, a month of training, tokens or samples beyond any hardware's) is refused
(the collector counts it ``bad_value``) and is where counting starts again: a counter written
1 -> 10^12 -> 1 -> 10^12 adds nothing, where it added 2x10^12 iterations.

When several ranks print (torchrun's ``[rankN]:`` prefixes, ``srun --label``), the lowest
rank seen speaks for the job; lines without a prefix come before any rank's.

Checkpoint saves: NeMo and torchtitan print the duration; Megatron prints the start and the
end, and the duration is the time between them (their timestamps, else the times they were read).
"""

from __future__ import annotations

from dataclasses import dataclass

from lockstep.collectors.framework_logs.parsers import Event, Iteration, SaveDone, SaveStarted, Straggler

# A save's start is forgotten after this long without its end (the job died during it).
MAX_SAVE_SECONDS = 24 * 3600.0
# What one report may add at most, far above what a real job does between two reports:
# Megatron reports every 100 iterations by default, NeMo every one, torchtitan every 10; a
# job's time limit is days; a GPU processes 10^4-10^6 tokens a second; a global batch holds
# 10^2-10^5 samples.
MAX_ITERATIONS_PER_REPORT = 1_000_000
MAX_SECONDS_PER_REPORT = 30 * 24 * 3600.0
MAX_TOKENS_PER_SECOND_PER_DEVICE = 1e8
MAX_SAMPLES_PER_ITERATION = 10_000_000


@dataclass
class JobState:
    iterations: int = 0
    iteration_seconds: float = 0.0
    last_iteration_at: float | None = None  # Unix time the last step report was written (or read)
    seconds_per_iteration: float | None = None  # the framework's, over its last report's interval
    tokens: float | None = None  # torchtitan: per device
    samples: float | None = None
    saves: int = 0
    save_seconds: float = 0.0
    save_started_at: float | None = None
    straggler: Straggler | None = None
    last_line_at: float = 0.0  # the agent's monotonic clock
    # Whether its files' owner is the job's user, once Slurm said who that is (collector._labels).
    owner_is_user: bool | None = None
    # Where counting stands: the speaking rank (-1 for no prefix), its last report's
    # iteration, printed time (or None) and consumed samples.
    speaker: int | None = None
    last_iteration: int | None = None
    last_printed_at: float | None = None
    last_samples: int | None = None

    def add(self, event: Event, rank: int | None, stamped_at: float, line_time: float | None) -> bool:
        """``stamped_at``: when the line was written, as well as is known (its CRI timestamp, else
        when it was read); ``line_time``: a timestamp the framework or the runtime printed, for
        spans between lines (None: none printed).  False: the report was refused (it says the
        job moved further than a job can), for the caller to count."""
        if isinstance(event, Iteration):
            return self._iteration(event, -1 if rank is None else rank, stamped_at, line_time)
        if isinstance(event, SaveStarted):
            self.save_started_at = event.printed_at if event.printed_at is not None else stamped_at
        elif isinstance(event, SaveDone):
            seconds = event.seconds
            if seconds is None:
                end = event.printed_at if event.printed_at is not None else stamped_at
                started, self.save_started_at = self.save_started_at, None
                if started is not None and 0 <= end - started <= MAX_SAVE_SECONDS:
                    seconds = end - started
            self.saves += 1
            self.save_seconds += seconds or 0.0
        elif isinstance(event, Straggler):
            self.straggler = event
        return True

    def _iteration(self, event: Iteration, rank: int, stamped_at: float, line_time: float | None) -> bool:
        if self.speaker is not None and rank > self.speaker:
            return True  # another rank's copy of what the speaking rank reports
        if self.speaker is not None and rank < self.speaker:
            self.last_iteration = None  # a lower rank speaks from now on: count from its reports
        self.speaker = rank
        previous, self.last_iteration = self.last_iteration, event.iteration
        previous_time, self.last_printed_at = self.last_printed_at, line_time
        previous_samples = self.last_samples
        if event.consumed_samples is not None:
            self.last_samples = event.consumed_samples
        if previous is not None and event.iteration == previous:
            self.last_printed_at = previous_time  # the same report again: keep the first's time
            return True
        if previous is None or event.iteration < previous:
            # The first report, or one after a restart: the job moves, counting starts here.
            self.last_iteration_at = max(self.last_iteration_at or stamped_at, stamped_at)
            return True
        done = event.iteration - previous
        seconds = None
        if event.seconds_per_iteration is not None:
            seconds = event.seconds_per_iteration * done
        elif line_time is not None and previous_time is not None and line_time >= previous_time:
            seconds = line_time - previous_time
        samples = None
        if event.consumed_samples is not None and previous_samples is not None:
            if event.consumed_samples >= previous_samples:
                samples = event.consumed_samples - previous_samples
        if (
            done > MAX_ITERATIONS_PER_REPORT
            or (seconds is not None and seconds > MAX_SECONDS_PER_REPORT)
            or (event.tokens_per_second_per_device or 0.0) > MAX_TOKENS_PER_SECOND_PER_DEVICE
            or (samples is not None and samples > MAX_SAMPLES_PER_ITERATION * done)
        ):
            return False  # no job moves so far: counting starts again from this report, which adds nothing
        # A later report: the job moved.
        self.last_iteration_at = max(self.last_iteration_at or stamped_at, stamped_at)
        self.iterations += done
        if seconds is not None:
            self.iteration_seconds += seconds
            self.seconds_per_iteration = seconds / done
        if event.tokens_per_second_per_device is not None and seconds is not None:
            self.tokens = (self.tokens or 0.0) + event.tokens_per_second_per_device * seconds
        if samples is not None:
            self.samples = (self.samples or 0.0) + samples
        return True
