"""Training alerts: ranks and GPUs slower than their job's peers (now and sustained: the
lockstep-stragglers.alerts group), and jobs that stopped stepping (lockstep-workloads.alerts;
alerts/rules.py)."""

from __future__ import annotations

from alerts.model import Alert
from alerts.promql import JOB_ON, VALUE_2F, VALUE_DURATION, VALUE_PERCENT, WHERE, job_by, label, num, percent
from alerts.straggler_recording import (
    EVIDENCE,
    EW,
    GPU_THROTTLE,
    HOLD,
    HOST_INFO,
    INSTANCE_SUSPECT,
    RANK_SUSPECT,
    SLOWER,
    W,
    sequential_threshold,
)
from lockstep import thresholds as T

# What the straggler alerts say about suspects.
# Annotations run a query at evaluation (Prometheus' template function `query`), so the suspects
# are those of the moment the alert is sent, and a change of suspect does not make a new alert.


def _list(var: str, label_name: str) -> str:
    """A Go template listing label_name of the query results in var, comma-separated, by name."""
    return (
        f'{{{{ range $i, $s := sortByLabel "{label_name}" {var} }}}}{{{{ if $i }}}}, {{{{ end }}}}'
        f"{{{{ $s.Labels.{label_name} }}}}{{{{ end }}}}"
    )


RANK_SUSPECTS = (
    f'{{{{ $suspects := printf "{RANK_SUSPECT}{{cluster=%q, job_id=%q, rank=%q}}" '
    "$labels.cluster $labels.job_id $labels.rank | query }}"
    "{{ if $suspects }}" + _list("$suspects", "suspect") + "{{ else }}none found{{ end }}"
)
GPU_SUSPECTS = (
    f'{{{{ $throttle := printf "{GPU_THROTTLE}{{cluster=%q, instance=%q, uuid=%q}}" '
    "$labels.cluster $labels.instance $labels.uuid | query }}"
    f'{{{{ $node := printf "{INSTANCE_SUSPECT}{{cluster=%q, instance=%q}}" '
    "$labels.cluster $labels.instance | query }}"
    "{{ if $throttle }}gpu_throttle ("
    + _list("$throttle", "reason")
    + "){{ if $node }}, {{ end }}{{ end }}"
    + _list("$node", "suspect")
    + "{{ if not (or $throttle $node) }}none found{{ end }}"
)


def _dashboard_url(panel_id: int) -> str:
    return (
        f"{T.GRAFANA_URL}/d/{T.SLURM_JOB_DASHBOARD_UID}/?var-cluster={{{{ $labels.cluster | urlquery }}}}"
        f"&var-job_id={{{{ $labels.job_id | urlquery }}}}&viewPanel={panel_id}"
    )


def on_the_ranks_node(condition: str) -> str:
    """A rank alert's condition, labelled with the instance (and node) of the agent on the rank's
    host where that is known, else of the agent that exports the rank (on a shared filesystem,
    maybe another node's): Alertmanager inhibits a straggler by its node's own alerts."""
    return (
        f"(\n{condition}\n)\n* on (cluster, host) group_left (instance, node) {HOST_INFO}\n"
        f"or on (cluster, job_id, rank)\n(\n{condition}\n)"
    )


# The job still runs: it stepped in the last 2 minutes, or it pauses (a checkpoint save) while
# Slurm runs it or its ranks' processes still hold their logs open.  A job that ended keeps
# its 5- and 30-minute windows for a while after, and neither may keep (or start) a straggler
# alert about it.
STEPPING = (
    f"{JOB_ON} (\n  max {job_by()} (\n"
    f"    changes(lockstep_training_last_step_timestamp_seconds[{T.TRAINING_STEPPED_WITHIN}])\n  ) > 0\n"
    f"  or group {job_by()} (lockstep_slurm_job_info)\n"
    f"  or group {job_by()} (lockstep_training_log_writer_processes > 0)\n)"
)

EW_WORDS = f"{int(EW.removesuffix('m'))} minutes"  # the evidence window as the alert's text says it


def _sequential_words() -> str:
    """The sequential test's windows and thresholds as the slower-than-peers alert says them,
    longest first: "20 minutes (more than 4.75 %) or 5 (more than 7 %)"."""
    longest, *shorter = reversed(T.STRAGGLER_SEQUENTIAL_WINDOWS)
    parts = [f"{w.removesuffix('m')} (more than {percent(sequential_threshold(w) - 1)})" for w in shorter]
    first = f"{longest.removesuffix('m')} minutes (more than {percent(sequential_threshold(longest) - 1)})"
    return ", ".join([first, *parts[:-1]]) + " or " + parts[-1]


SEQUENTIAL_WORDS = _sequential_words()
SUSTAINED = "LockstepTrainingStragglerSustained"
SLOWER_THAN_PEERS = "LockstepTrainingSlowerThanPeers"
RANK_ANNOTATIONS = (("suspects", RANK_SUSPECTS), ("dashboard_url", _dashboard_url(T.RANK_SUSPECTS_PANEL_ID)))
GPU_ANNOTATIONS = (("suspects", GPU_SUSPECTS), ("dashboard_url", _dashboard_url(T.GPU_DEVIATION_PANEL_ID)))
GPU_30M = f"job_gpu:lockstep_gpu_sm_clock_hertz:avg{W}"

STRAGGLER_ALERTS = (
    Alert(
        "LockstepTrainingStraggler",
        "warning",
        "10m",
        on_the_ranks_node(
            "job_rank:lockstep_training_compute_seconds:ratio_to_median5m"
            f" > {num(T.TRAINING_STRAGGLER_COMPUTE_RATIO)}\n"
            f"and {JOB_ON} job:lockstep_training_ranks:count >= {T.STRAGGLER_MIN_PEERS}\n"
            f"and {STEPPING}"
        ),
        f"Rank {label('rank')} of job {label('job_id')} is a straggler",
        f"Rank {label('rank')} of job {label('job_id')} on {WHERE} takes {VALUE_2F}x its job's median compute "
        "time per step (5 min average). Its peers wait for it in communication, so the whole job runs at "
        "its pace. Suspects on its node in the last 30 minutes: " + RANK_SUSPECTS + ".",
        RANK_ANNOTATIONS,
    ),
    Alert(
        SUSTAINED,
        "warning",
        T.STRAGGLER_EVIDENCE_FOR,
        on_the_ranks_node(
            # The value is the rank's ratio to its peers, averaged over the evidence window.  The
            # verdicts are recorded (lockstep-stragglers-evidence.recording): the condition is
            # written twice here, and judging the evidence twice cost a second at fleet scale.
            f"(\n  {EVIDENCE}\n  or\n  (\n    {HOLD}\n"
            f'    and on (cluster, job_id, rank) ALERTS{{alertname="{SUSTAINED}", alertstate="firing"}}\n  )\n)\n'
            f"and {STEPPING}"
        ),
        f"Rank {label('rank')} of job {label('job_id')} has been slower than its peers for {EW_WORDS}",
        f"Rank {label('rank')} of job {label('job_id')} (host {label('host')}) has taken {VALUE_2F}x its peers' "
        f"time per step of its own work (compute and data wait) over the last {EW_WORDS}: more than "
        f"{percent(T.TRAINING_STRAGGLER_EVIDENCE_RATIO - 1)} on average, and over "
        f"{percent(T.TRAINING_STRAGGLER_EVIDENCE_FLOOR - 1)} in {percent(1 - T.STRAGGLER_EVIDENCE_SPARE)} of the "
        "window's 5-minute means; where its job reports waiting in collectives, it is the rank the others wait "
        "for. The whole job runs at its pace. Suspects on its node in the last 30 minutes: " + RANK_SUSPECTS + ".",
        RANK_ANNOTATIONS,
    ),
    # The second verdict (issue 44): the same evidence without the witness.  A rank slower than
    # its peers that nothing waits for (a paced job, launch skew: another rank arrives last) costs
    # its job nothing yet, and the next job on its node, unpaced, will wait for it.  It fires for
    # the rank that holds its job back too (the node's record counts both); Alertmanager
    # inhibits its notification by that rank's LockstepTrainingStragglerSustained.
    Alert(
        SLOWER_THAN_PEERS,
        "warning",
        T.STRAGGLER_SLOWER_FOR,
        on_the_ranks_node(
            f"(\n  {SLOWER}\n  or\n  (\n    {HOLD}\n"
            f'    and on (cluster, job_id, rank) ALERTS{{alertname="{SLOWER_THAN_PEERS}", alertstate="firing"}}\n'
            "  )\n)\n"
            f"and {STEPPING}"
        ),
        f"Rank {label('rank')} of job {label('job_id')} computes slower than its peers",
        f"Rank {label('rank')} of job {label('job_id')} (host {label('host')}) has taken {VALUE_2F}x its peers' "
        "time per step of its own work (compute and data wait) on average over the last "
        f"{SEQUENTIAL_WORDS}, and more than {percent(T.TRAINING_SLOWER_REFERENCE_RATIO - 1)} now. "
        "Where the others wait for it, LockstepTrainingStragglerSustained says so; "
        "where nothing does (a paced job, or another rank starts its steps later), the job loses no time to "
        "it, but its node is slower than its peers' and an unpaced job there will wait for it. Suspects on "
        "its node in the last 30 minutes: " + RANK_SUSPECTS + ".",
        RANK_ANNOTATIONS,
    ),
    Alert(
        "LockstepGPUStraggler",
        "warning",
        "10m",
        f"job_gpu:lockstep_gpu_sm_clock_hertz:ratio_to_median5m < {num(T.GPU_STRAGGLER_SM_CLOCK_RATIO)}\n"
        f"and {JOB_ON} job:lockstep_gpus_busy:count >= {T.STRAGGLER_MIN_PEERS}",
        f"GPU {label('gpu')} on {WHERE} is slower than the rest of job {label('job_id')}",
        f"GPU {label('gpu')} ({label('uuid')}) on {WHERE} runs its SM clock at {VALUE_PERCENT} of the median "
        f"of job {label('job_id')}'s busy GPUs (5 min average). A synchronous job runs at its slowest GPU's "
        "pace. Suspects in the last 30 minutes: " + GPU_SUSPECTS + ".",
        GPU_ANNOTATIONS,
    ),
    Alert(
        "LockstepGPUStragglerSustained",
        "warning",
        T.STRAGGLER_SUSTAINED_FOR,
        "(\n"
        # In percent, so the description's rounded value does not flicker in its last digit.
        f"  100 * job_gpu:lockstep_gpu_sm_clock_hertz:ratio_to_median{W}"
        f" < {num(100 * T.GPU_STRAGGLER_SUSTAINED_RATIO)}\n"
        "  and\n  job_gpu:lockstep_gpu_sm_clock_hertz:ratio_to_median5m"
        f" < {num(T.GPU_STRAGGLER_SUSTAINED_NOW_RATIO)}\n"
        f"  and\n  job:lockstep_gpu_sm_clock_hertz:median{W} - {JOB_ON} group_right () {GPU_30M}\n"
        f"  > {JOB_ON} group_left ()\n"
        f"  {num(T.STRAGGLER_SUSTAINED_MADS)} * job:lockstep_gpu_sm_clock_hertz:mad{W}\n)\n"
        f"and {JOB_ON} job:lockstep_gpus_busy:count >= {T.STRAGGLER_SUSTAINED_MIN_PEERS}",
        f"GPU {label('gpu')} on {WHERE} has been slower than the rest of job {label('job_id')} for 30 minutes",
        f"GPU {label('gpu')} ({label('uuid')}) on {WHERE} has run its SM clock at "
        '{{ printf "%.0f" $value }} % of the '
        f"median of job {label('job_id')}'s busy GPUs over 30 minutes, more than "
        f"{percent(1 - T.GPU_STRAGGLER_SUSTAINED_RATIO)} and {num(T.STRAGGLER_SUSTAINED_MADS)} times the job's "
        "spread (MAD) below the median, and is still slower now. Suspects in the last 30 minutes: "
        + GPU_SUSPECTS
        + ".",
        GPU_ANNOTATIONS,
    ),
)

TRAINING_ALERTS = (
    Alert(
        "LockstepTrainingStalled",
        "critical",
        "5m",
        # The last step's time, not rate(steps): the agent may drop a hung rank's series
        # (where it cannot see the rank's process: idle_timeout), so last_over_time keeps the
        # last value seen; changes() over the window tells whether a step came in it.  A hung
        # job and a finished one both stop logging: what tells them apart, and what the alert
        # names in running_per, is Slurm still running the job, else the ranks' processes
        # still holding their logs open (the training collector counts them for an idle rank,
        # and drops a rank whose process exited).  A job that logged its first step less than
        # the window ago has had no change in the window yet either: only a job seen stepping
        # before the window (offset) can have stopped.
        f"(\n  time() - max {job_by()} (\n"
        f"    last_over_time(lockstep_training_last_step_timestamp_seconds[{T.TRAINING_STALL_LOOKBACK}])\n"
        "  )\n)\n"
        f"* {JOB_ON} group_left (running_per) (\n"
        f'  label_replace(group {job_by()} (lockstep_slurm_job_info), "running_per", "slurm", "", "")\n'
        f"  or {JOB_ON}\n"
        f"  label_replace(\n    group {job_by()} (lockstep_training_log_writer_processes > 0),\n"
        '    "running_per", "rank_processes", "", ""\n  )\n)\n'
        f"unless {JOB_ON} max {job_by()} (\n"
        f"  changes(lockstep_training_last_step_timestamp_seconds[{T.TRAINING_STALL_WINDOW}])\n"
        ") > 0\n"
        f"and {JOB_ON} group {job_by()} (\n"
        "  last_over_time(lockstep_training_last_step_timestamp_seconds"
        f"[{T.TRAINING_STALL_LOOKBACK}] offset {T.TRAINING_STALL_WINDOW})\n"
        ")",
        f"Training job {label('job_id')} makes no progress",
        f"No rank of job {label('job_id')} completed a training step for {VALUE_DURATION}, and "
        '{{ if eq $labels.running_per "slurm" }}Slurm still runs the job{{ else }}its ranks\' processes still '
        "hold their logs open (the agent on their node sees them){{ end }}. A hung collective (NCCL), a dead "
        "rank, a lost GPU or a stalled filesystem holds every rank while the allocation burns.",
    ),
)
