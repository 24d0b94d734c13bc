"""Hangs named while the job still hangs, before its own watchdog ends it, and remembered after
(issue 35).

PyTorch's ProcessGroupNCCL aborts a job whose collective has not completed in 10 minutes, and
LockstepTrainingStalled (10 minutes without a step, then 5) and LockstepNCCLHang (15 minutes
without a collective, then 2) come after that: with the defaults a hang was never paged.  What a
node shows within a minute or two of a hang:

- RAS (NCCL jobs): the communicator's furthest rank launches nothing more, and the ranks behind
  it (or missing) are those the others wait for;
- the GPUs: the waiting ranks' GPUs run NCCL's kernel, polling for a peer that never comes, at
  every sample (utilization ~100 %) at near-idle power, while the rank that stopped leaves its
  GPU idle (or lost);
- the step logs: no rank completes a step.

Each alone has a twin that is no hang: a synchronous checkpoint save (the ranks that wrote their
shards wait in a collective for the coordinator, their GPUs spin, the coordinator is behind in
RAS), a long evaluation (no step and maybe no collective, but the GPUs do real work at high
power) and the job's end (nothing steps, the GPUs idle, RAS and Slurm forget the job).  So the
alerts need the stop (RAS or steps) and no GPU of the job doing real work and no save in
progress for the job; the step-log alert also needs the GPUs spinning (its only sign that the
ranks wait in a collective rather than, say, load data).

When the hung job ends (the watchdog, scancel), its communicators, ranks and GPUs' job series
go: LockstepJobEndedHung, made from the hang alerts' own ALERTS history, says that it ended hung
and names what the hang alert named (rank, node, GPU), with no state in the agent.
"""

from __future__ import annotations

from alerts.framework import FRAMEWORK_STOPPED
from alerts.model import Alert, Group, Recording
from alerts.nccl import STUCK_RANKS, STUCK_SUSPECT
from alerts.promql import WHERE, label, num, on, percent
from alerts.training import GPU_SUSPECTS
from lockstep import thresholds as T

HW = T.HANG_WINDOW
JOB = "(cluster, job_id)"
SPINNING = f"job_gpu:lockstep_gpu_spinning:held{HW}"
WORKING = f"job_gpu:lockstep_gpu_working:any{HW}"
SAVING = "job:lockstep_checkpoint_save:in_progress"
STEPS_STOPPED = f"job:lockstep_training_steps:stopped{HW}"
COLLECTIVES_STOPPED = f"job_comm:lockstep_nccl_collectives:stopped{HW}"
SPIN_POWER = f"{num(T.GPU_SPIN_POWER_RATIO)} * lockstep_gpu_power_limit_watts"


OF_A_JOB, OF_NO_JOB = '{job_id!=""}', '{job_id=""}'


def _in_progress(info_selector: str) -> str:
    return (
        f"lockstep_checkpoint_info{info_selector}\n  * {on('root')} group_left ()\n"
        "  (lockstep_checkpoint_in_progress_seconds > 0)"
    )


HANG_RECORDING = Group(
    "lockstep-hang.recording",
    (
        # Each GPU of a Slurm job that spun through the whole window: a kernel at every sample at
        # near-idle power (NCCL's kernel polling for a peer).  Value: its lowest utilization.
        Recording(
            SPINNING,
            f"lockstep_slurm_job_gpu_info\n* {on('uuid')} group_left ()\n(\n"
            f"  min_over_time(lockstep_gpu_utilization_ratio[{HW}]) >= {num(T.GPU_SPIN_UTILIZATION)}\n"
            f"  and {on('uuid')}\n"
            f"  max_over_time(lockstep_gpu_power_watts[{HW}]) < {SPIN_POWER}\n)",
        ),
        # Each GPU of a Slurm job that did real work at some sample of the window (power at or
        # above the spin ceiling): an evaluation, a rank still computing.  Value: its highest power.
        Recording(
            WORKING,
            f"lockstep_slurm_job_gpu_info\n* {on('uuid')} group_left ()\n"
            f"(max_over_time(lockstep_gpu_power_watts[{HW}]) >= {SPIN_POWER})",
        ),
        # Jobs with a checkpoint save in progress: under a root of the job (its job_id from the
        # path), or under a root of no known job on a node the job runs on.
        Recording(
            SAVING,
            f"group by {JOB} (\n  {_in_progress(OF_A_JOB)}\n)\n"
            f"or\ngroup by {JOB} (\n  lockstep_slurm_job_info\n  * {on()} group_left ()\n"
            f"  group by (cluster, instance, node) (\n  {_in_progress(OF_NO_JOB)}\n  )\n)",
        ),
        # Jobs whose ranks (step logs) completed no step in the window, having stepped before it.
        # The last value seen (last_over_time), not the series: the agent drops a rank idle for
        # a minute whose log no process on its node holds open (another node's rank on a shared
        # filesystem), as TrainingStalled reads it.
        Recording(
            STEPS_STOPPED,
            f"group by {JOB} (last_over_time(lockstep_training_last_step_timestamp_seconds[{T.HANG_STEPS_LOOKBACK}]"
            f" offset {HW}))\n"
            f"unless on {JOB}\nmax by {JOB} (changes(lockstep_training_last_step_timestamp_seconds[{HW}])) > 0",
        ),
        # Communicators (RAS) whose furthest rank launched no collective in the window, having
        # launched some before it.
        Recording(
            COLLECTIVES_STOPPED,
            f"max by (cluster, job_id, comm) (changes(lockstep_nccl_communicator_collectives_total[{HW}])) == 0\n"
            "and on (cluster, job_id, comm)\n"
            f"max by (cluster, job_id, comm) (lockstep_nccl_communicator_collectives_total offset {HW}) > 0",
        ),
    ),
)

# No GPU of the job does real work and no save of the job is in progress: the twins' signs.
NOT_A_TWIN = f"unless on {JOB} group by {JOB} ({WORKING})\nunless on {JOB} {SAVING}"
# A job of step logs that hangs: no step, its GPUs spin (somewhere), none works, no save.
# Or a job seen through its framework's output alone (alerts/framework.py) that printed no report.
HUNG_STEPS = (
    f"(\n  {STEPS_STOPPED}\n  or {FRAMEWORK_STOPPED}\n)\nand on {JOB} group by {JOB} ({SPINNING})\n{NOT_A_TWIN}"
)
HANG_ALERT_NAMES = ("LockstepTrainingHung", "LockstepNCCLRankStuck")
_HANG_ALERTS = f'ALERTS{{alertname=~"{"|".join(HANG_ALERT_NAMES)}", alertstate="firing"}}'
# A job the agents still see: Slurm runs it, RAS knows its communicators, or its ranks'
# processes hold their logs open.
JOB_PRESENT = (
    f"group by {JOB} (lockstep_slurm_job_info)\n"
    f"or group by {JOB} (lockstep_nccl_communicator_ranks)\n"
    f"or group by {JOB} (lockstep_training_log_writer_processes > 0)"
)

RANK_STUCK_SUSPECTS = (
    f'{{{{ $suspects := printf "{STUCK_SUSPECT}{{cluster=%q, job_id=%q, comm=%q, rank=%q}}" '
    "$labels.cluster $labels.job_id $labels.comm $labels.rank | query }}"
    '{{ if $suspects }}{{ range $i, $s := sortByLabel "suspect" $suspects }}{{ if $i }}, {{ end }}'
    "{{ $s.Labels.suspect }}{{ end }}{{ else }}none found{{ end }}"
)
HUNG_GPU_SUSPECTS = "{{ if $labels.uuid }}" + GPU_SUSPECTS + "{{ else }}none found (no idle GPU of the job){{ end }}"


def _dashboard_url() -> str:
    return (
        f"{T.GRAFANA_URL}/d/{T.SLURM_JOB_DASHBOARD_UID}/?var-cluster={{{{ $labels.cluster | urlquery }}}}"
        f"&var-job_id={{{{ $labels.job_id | urlquery }}}}"
    )


HANG_ALERTS = (
    Alert(
        "LockstepTrainingHung",
        "critical",
        T.HANG_FOR,
        # One alert per suspect GPU: a GPU of the job that does not spin while the others do
        # (its rank stopped: idle, or lost); the job alone where every GPU spins.
        f"(\n  lockstep_slurm_job_gpu_info\n  unless {on('job_id', 'uuid')} {SPINNING}\n)\n"
        f"and on {JOB}\n(\n{HUNG_STEPS}\n)\n"
        f"or on {JOB}\n(\n{HUNG_STEPS}\n)",
        f"Training job {label('job_id')} hangs",
        f"No rank of job {label('job_id')} completed a step for {HW}, its GPUs spin in a collective "
        f"(a kernel at every sample, under {percent(T.GPU_SPIN_POWER_RATIO)} of their power limit) and none "
        "does real work, and no checkpoint save of the job is in progress. "
        "{{ if $labels.uuid }}"
        f"GPU {label('gpu')} ({label('uuid')}) on {WHERE} does not spin with the others: its rank stopped "
        "first (step logs do not say which rank runs on it)."
        "{{ else }}Every GPU of the job seen spins: a link or a peer outside the agents' view.{{ end }}"
        " Suspects on that node in the last 30 minutes: "
        + HUNG_GPU_SUSPECTS
        + ". With PyTorch's default timeout its watchdog ends the job 10 minutes after the stop.",
        (("suspects", HUNG_GPU_SUSPECTS), ("dashboard_url", _dashboard_url())),
    ),
    Alert(
        "LockstepNCCLRankStuck",
        "critical",
        T.HANG_FOR,
        # One alert per rank the others wait for (RAS: behind the furthest rank, or missing),
        # with its node's instance where an agent reports its RAS address.
        f"{STUCK_RANKS}\nand on (cluster, job_id, comm) {COLLECTIVES_STOPPED}\n{NOT_A_TWIN}",
        f"Job {label('job_id')} hangs on rank {label('rank')}",
        f"Communicator {label('comm')} of job {label('job_id')} launched no collective for {HW} (NCCL RAS), and "
        f"rank {label('rank')} is the one the others wait for: behind them, or missing. It runs on "
        "{{ with $labels.instance }}{{ . }} ({{ $labels.address }}){{ else }}{{ $labels.address }}{{ end }}, "
        f"GPU {label('gpu')}. No GPU of the job does real work and no checkpoint save of the job is in "
        "progress. Suspects on its node in the last 30 minutes: "
        + RANK_STUCK_SUSPECTS
        + ". With PyTorch's default timeout its watchdog ends the job 10 minutes after the stop.",
        (("suspects", RANK_STUCK_SUSPECTS), ("dashboard_url", _dashboard_url())),
    ),
    Alert(
        "LockstepJobEndedHung",
        "warning",
        "0m",
        # The hang alerts' own history: a series that fired in the last HANG_ENDED_WITHIN, of a
        # job whose hang alerts fire no more and that the agents no longer see.  It carries the
        # hang alert's labels (rank, instance, GPU) and its name (hang_alert), and resolves
        # HANG_ENDED_WITHIN after the hang alert's last firing evaluation: the ALERTS series of
        # this alert is the record a job report reads.
        "max without (alertname, alertstate, severity) (\n"
        "  label_replace(\n    max_over_time(" + _HANG_ALERTS + f"[{T.HANG_ENDED_WITHIN}]),\n"
        '    "hang_alert", "$1", "alertname", "(.+)"\n  )\n)\n'
        f"unless on {JOB} {_HANG_ALERTS}\n"
        f"unless on {JOB} (\n{JOB_PRESENT}\n)",
        f"Job {label('job_id')} ended while it hung",
        f"Job {label('job_id')} ended while {label('hang_alert')} fired for it: it did not recover, its own "
        "watchdog (PyTorch's NCCL timeout) or a person ended it. "
        "What stopped first, as the hang alert named it: "
        "{{ if or $labels.rank $labels.gpu }}{{ with $labels.rank }}rank {{ . }}, {{ end }}"
        "{{ with $labels.gpu }}GPU {{ . }} {{ end }}on "
        "{{ with $labels.instance }}{{ . }}{{ else }}{{ $labels.address }}{{ end }}"
        "{{ else }}not named (every GPU of the job spun){{ end }}. "
        "Check that node before the scheduler gives it the next job.",
    ),
)
