"""Storage alerts: checkpoint saves stalled or overdue (in the lockstep-workloads.alerts group,
alerts/rules.py), and filesystems hung or almost full and I/O stalls (lockstep-storage.alerts)."""

from __future__ import annotations

from alerts.model import Alert, Group
from alerts.promql import VALUE_DURATION, VALUE_PERCENT, WHERE, by, label, num, on
from alerts.recording import EXPECTED_INTERVAL
from lockstep import thresholds as T

CHECKPOINT_ALERTS = (
    Alert(
        "LockstepCheckpointStalled",
        "critical",
        "5m",
        f"lockstep_checkpoint_in_progress_seconds\n> {num(T.CHECKPOINT_STALL_INTERVALS)} * {EXPECTED_INTERVAL}",
        f"Checkpoint save under {label('root')} is stalled",
        f"A save under {label('root')} on {WHERE} has been in progress for {VALUE_DURATION}, longer than the "
        "root's save interval, and has not completed: the job may be blocked writing it and everything since "
        "the last completed save is at risk. Check the filesystem and the job's ranks.",
    ),
    Alert(
        "LockstepCheckpointOverdue",
        "warning",
        "5m",
        # The age is computed here, not taken from the recording rule, which lags by an evaluation.
        "(\n  time() - lockstep_checkpoint_last_success_timestamp_seconds\n"
        f"  > {num(T.CHECKPOINT_OVERDUE_INTERVALS)} * {EXPECTED_INTERVAL}\n)\n"
        "unless\n(\n  lockstep_checkpoint_in_progress_seconds\n"
        f"  > {num(T.CHECKPOINT_STALL_INTERVALS)} * {EXPECTED_INTERVAL}\n)\n"
        # A root whose job is known (its job_id) is judged only while the job runs: Slurm runs
        # it, or the agent still exports its training ranks (it drops a rank a minute after
        # its process exited).  A finished job's directory stays under the root for good, and
        # its last save only gets older.  A root without a job_id cannot be told apart.
        f"unless {on('root')} (\n"
        '  lockstep_checkpoint_info{job_id!=""}\n'
        "  unless on (cluster, job_id) (\n"
        "    group by (cluster, job_id) (lockstep_slurm_job_info)\n"
        "    or group by (cluster, job_id) (lockstep_training_last_step_timestamp_seconds)\n"
        "  )\n)",
        f"No checkpoint completed under {label('root')} for too long",
        f"The last completed save under {label('root')} on {WHERE} finished {VALUE_DURATION} ago, more than "
        f"{num(T.CHECKPOINT_OVERDUE_INTERVALS)} save intervals, and no save is stuck in progress (that would be "
        "LockstepCheckpointStalled): saves fail, or the job stopped saving. (A root whose job the agents know "
        "by its job_id is judged only while Slurm runs the job or its ranks log steps.)",
    ),
)


def almost_full(local: bool) -> str:
    """Local (shared=False) or shared filesystems with < 5 % available, or < 15 % and full within a
    day at the last 6 hours' rate; read-only mounts left out (nothing writes to them)."""
    fstype = f'{{fstype{"!~" if local else "=~"}"{T.SHARED_FSTYPES}"}}'
    ratio = f"mountpoint:lockstep_filesystem_available_bytes:ratio{fstype}"
    return (
        f"(\n  {ratio} < {num(T.FILESYSTEM_AVAILABLE_CRITICAL_RATIO)}\n  or\n  (\n"
        f"    {ratio} < {num(T.FILESYSTEM_AVAILABLE_PREDICT_RATIO)}\n"
        f"    and predict_linear(lockstep_filesystem_available_bytes{fstype}[{T.FILESYSTEM_PREDICT_WINDOW}], "
        f"{T.FILESYSTEM_PREDICT_HORIZON_SECONDS}) < 0\n  )\n)\n"
        f"unless {on('mountpoint')} lockstep_filesystem_readonly == 1"
    )


STORAGE_ALERTS = Group(
    "lockstep-storage.alerts",
    (
        Alert(
            "LockstepFilesystemHung",
            "critical",
            "1m",
            f"lockstep_filesystem_responsive == 0\nor {on('mountpoint')}\n"
            f"sum {by('mountpoint')} (rate(lockstep_nfs_major_timeouts_total[5m])) > 0",
            f"Filesystem {label('mountpoint')} on {WHERE} does not answer",
            f"{label('mountpoint')} on {WHERE} does not answer: statfs on it did not return within the agent's "
            "deadline, or its NFS requests time out (server not responding). Processes touching it hang in D "
            "state; check the server and the network path to it.",
        ),
        Alert(
            "LockstepFilesystemAlmostFull",
            "warning",
            "30m",
            f"{almost_full(local=True)}\nor\n"
            # A shared filesystem is one alert per cluster, not one per node that mounts it:
            # the fullest node's view, among those that mount it writable.
            f"min by (cluster, mountpoint, fstype) (\n{almost_full(local=False)}\n)",
            f"Filesystem {label('mountpoint')} is almost full",
            f"{label('mountpoint')} ({label('fstype')}){{{{ with $labels.instance }}}} on {WHERE}{{{{ end }}}} "
            f"has {VALUE_PERCENT} of its space left"
            f"{{{{ if lt $value {num(T.FILESYSTEM_AVAILABLE_CRITICAL_RATIO)} }}}}{{{{ else }}}} and fills up within "
            "a day at the rate of the last 6 hours{{ end }}. Checkpoint saves and logs fail when it is full.",
        ),
        Alert(
            "LockstepIOStall",
            "warning",
            "10m",
            f"instance:lockstep_host_io_full_pressure:ratio5m > {num(T.IO_FULL_PRESSURE_RATIO)}",
            f"I/O stalls every task on {WHERE}",
            f"For {VALUE_PERCENT} of the time (5 min average) every non-idle task on {WHERE} waited for I/O "
            "(pressure stall information, io full). Training stalls on data loading or checkpoint writes: "
            "check the filesystems' latency and blocked processes.",
        ),
    ),
)
