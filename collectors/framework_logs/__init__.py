"""framework_logs collector: step timing from the training frameworks' own output, with no change to the job.

Megatron-LM, NeMo 2 and torchtitan print their iteration number and step timing by default;
that output lands in files the node already holds: a Slurm job's StdOut/StdErr and a
container's log under /var/log/pods.  This collector follows those files (configured globs,
and the ones it finds: discovery.py) with collectors/toolkit/followed_logs.py and follow.py
(rotation, truncation, bounded bytes and files, watchdog events plus a sweep every round),
recognises the frameworks' lines by their format strings (parsers.py, with the sources'
versions), and turns them into per-job counters (jobs.py): iterations, the framework's seconds
of training, tokens or samples, checkpoint saves and their durations, Megatron's straggler
report.  Only the matched numbers leave the agent, never a line's text.

Files: collector.py (options, the round, the output), discovery.py (Slurm and pod output
files), parsers.py (lines into events), jobs.py (events into counters), metrics.py.
"""

from lockstep.collectors.framework_logs.collector import FrameworkLogsCollector, FrameworkLogsOptions

__all__ = ["FrameworkLogsCollector", "FrameworkLogsOptions"]
