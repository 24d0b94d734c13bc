"""Jobs seen through their training framework's own output (the framework_logs collector, issue 37):
Megatron-LM, NeMo and torchtitan print a step report every few iterations, and that is all a job
without per-rank step logs or NCCL telemetry shows.

- LockstepFrameworkStalled: no step report for 10 minutes and for 3 times the job's usual time
  between reports, while Slurm still runs the job or the agent still sees it running (its
  process on the node, its pod on a GPU: the collector keeps a quiet job's series only then).
- The hang alert (alerts/hang.py, LockstepTrainingHung) takes such a job as stopped when it
  printed no report for the hang window and 2 report intervals, with the node's GPU evidence as
  for step logs.
- LockstepFrameworkSlowdown: the job's time per iteration (the framework's own timing) over the
  last 15 minutes is 1.25x its own level over the hour before, with the suspects of every node
  the job runs on.
"""

from __future__ import annotations

from alerts.model import Alert, Group, Recording
from alerts.promql import JOB_ON, VALUE_2F, VALUE_DURATION, job_by, label, num, percent
from alerts.straggler_recording import INSTANCE_SUSPECT
from lockstep import thresholds as T

LAST = "lockstep_framework_last_iteration_timestamp_seconds"
RW = T.FRAMEWORK_REPORTS_WINDOW
# The job's usual time between step reports: the window over the reports in it.
REPORT_INTERVAL = f"job:lockstep_framework_report_interval_seconds:avg{RW}"
# Seconds since the job's last step report (its last value seen: the agent drops a quiet job's
# series when it cannot see it running).  Inline, not recorded: an alert reading a recording of
# the same moment would see it one evaluation late, or not, as the groups happen to run.
SINCE_REPORT = f"( time() - max {job_by()} (last_over_time({LAST}[{T.TRAINING_STALL_LOOKBACK}])) )"
FRAMEWORK_STOPPED = f"job:lockstep_framework_reports:stopped{T.HANG_WINDOW}"
RECENT, BASELINE = T.FRAMEWORK_SLOWDOWN_RECENT, T.FRAMEWORK_SLOWDOWN_BASELINE
_UNITS = {"s": 1, "m": 60, "h": 3600}


def seconds(duration: str) -> int:
    """'2m' -> 120."""
    return int(duration[:-1]) * _UNITS[duration[-1]]


def per_iteration(window: str, offset: str = "") -> str:
    """The job's seconds per iteration over the window, by its framework's timing (the highest
    where several agents read the same output)."""
    off = f" offset {offset}" if offset else ""
    return (
        f"max by (cluster, job_id, framework) (\n"
        f"    rate(lockstep_framework_iteration_seconds_total[{window}]{off})\n"
        f"    / (rate(lockstep_framework_iterations_total[{window}]{off}) > 0)\n  )"
    )


FRAMEWORK_RECORDING = Group(
    "lockstep-framework.recording",
    (
        Recording(REPORT_INTERVAL, f"max {job_by()} (\n  {seconds(RW)} / (changes({LAST}[{RW}]) > 0)\n)"),
        # Jobs that printed no report for the hang window and FRAMEWORK_HANG_REPORTS intervals:
        # the step-log jobs' STEPS_STOPPED (alerts/hang.py), for jobs seen by their output.
        Recording(
            FRAMEWORK_STOPPED,
            f"{SINCE_REPORT} > {seconds(T.HANG_WINDOW)}\n"
            f"unless {JOB_ON} {SINCE_REPORT} <= {T.FRAMEWORK_HANG_REPORTS} * {REPORT_INTERVAL}",
        ),
    ),
)

# Every node the job runs on (Slurm's view, else the agent that reads its output), and each
# one's suspects (alerts/straggler_recording.py: throttled GPUs, PFC storms, link errors, ...).
JOB_NODES = (
    "group by (cluster, instance) (lockstep_slurm_job_info{cluster=%q, job_id=%q}"
    " or lockstep_framework_iterations_total{cluster=%q, job_id=%q})"
)
NODE_SUSPECTS = (
    '{{ $s := printf "max by (instance, suspect) ('
    + INSTANCE_SUSPECT
    + " * on (cluster, instance) group_left () "
    + JOB_NODES
    + ')" $labels.cluster $labels.job_id $labels.cluster $labels.job_id | query }}'
    '{{ if $s }}{{ range $i, $x := sortByLabel "instance" $s }}{{ if $i }}, {{ end }}'
    "{{ $x.Labels.instance }}: {{ $x.Labels.suspect }}{{ end }}{{ else }}none found{{ end }}"
)
DASHBOARD_URL = (
    f"{T.GRAFANA_URL}/d/{T.SLURM_JOB_DASHBOARD_UID}/?var-cluster={{{{ $labels.cluster | urlquery }}}}"
    f"&var-job_id={{{{ $labels.job_id | urlquery }}}}"
)
RUNNING = (
    f'label_replace(group {job_by()} (lockstep_slurm_job_info), "running_per", "slurm", "", "")\n'
    f"  or {JOB_ON}\n"
    f'  label_replace(group {job_by()} (lockstep_framework_iterations_total), "running_per", "agent", "", "")'
)

FRAMEWORK_ALERTS = (
    Alert(
        "LockstepFrameworkStalled",
        "critical",
        "5m",
        # Jobs with per-rank step logs have LockstepTrainingStalled.
        # A job without a usual interval (one report seen in the hour: the agent started after
        # the job stopped) is held to the window alone.
        f"(\n  {SINCE_REPORT} > {seconds(T.TRAINING_STALL_WINDOW)}\n"
        f"  unless {JOB_ON} {SINCE_REPORT} <= {T.FRAMEWORK_STALL_REPORTS} * {REPORT_INTERVAL}\n)\n"
        f"* {JOB_ON} group_left (running_per) (\n  {RUNNING}\n)\n"
        f"unless {JOB_ON} group {job_by()} (lockstep_training_steps_total)",
        f"Training job {label('job_id')} prints no progress",
        f"Job {label('job_id')}'s framework has printed no step report for {VALUE_DURATION}, more than "
        f"{T.FRAMEWORK_STALL_REPORTS} times its usual time between reports (where one is known), and "
        '{{ if eq $labels.running_per "slurm" }}Slurm still runs the job{{ else }}the agent still sees it '
        "running (its process, or its pod on a GPU){{ end }}. A hung collective, a dead rank, a lost GPU or a "
        "stalled filesystem holds every rank while the allocation burns. Suspects on the job's nodes in the last "
        "30 minutes: " + NODE_SUSPECTS + ".",
        (("suspects", NODE_SUSPECTS), ("dashboard_url", DASHBOARD_URL)),
    ),
    Alert(
        "LockstepFrameworkSlowdown",
        "warning",
        T.FRAMEWORK_SLOWDOWN_FOR,
        f"(\n  {per_iteration(RECENT)}\n)\n/ (\n  {per_iteration(BASELINE, RECENT)}\n)\n"
        f"> {num(T.FRAMEWORK_SLOWDOWN_RATIO)}",
        f"Training job {label('job_id')} slowed down",
        f"Job {label('job_id')} ({label('framework')}) takes {VALUE_2F}x its own time per iteration of the hour "
        f"before, by its framework's timing ({RECENT} against the {BASELINE} before; alert above "
        f"{percent(T.FRAMEWORK_SLOWDOWN_RATIO - 1)} more). A synchronous job runs at its slowest rank's, link's "
        "or disk's pace. Suspects on the job's nodes in the last 30 minutes: " + NODE_SUSPECTS + ".",
        (("suspects", NODE_SUSPECTS), ("dashboard_url", DASHBOARD_URL)),
    ),
)
