"""Training collector: per-rank step telemetry from the ranks' JSON-lines metric logs.

Each rank of a training job appends records to its own log (the format of
lockstep/emitter.py and of docs/workloads.md): one JSON object per line, one
metric per line, e.g. ``{"ts": "...", "job_id": "4242", "rank": 3, "host": "node001",
"step": 120, "metric": "compute_time_sec", "value": 1.3}``.  This collector follows the
files matching ``--training.logs`` globs (collectors/toolkit/followed_logs.py: watchdog events
plus a sweep every round), groups each rank's records into steps and turns them into counters, so
any scrape interval and ``rate()`` window works.

Files: collector.py (the options, the round, the output), records.py (one log line into a
record), steps.py (a rank's records into steps, and steps into its counters), metrics.py (the
declarations).  Following the files by glob is the toolkit's (collectors/toolkit/followed_logs.py
and follow.py, which know no record format).
"""

from lockstep.collectors.training.collector import TrainingCollector, TrainingOptions

__all__ = ["TrainingCollector", "TrainingOptions"]
